"""The KTO trainer: the DPO trainer's machinery (batcher, packing, OOM redo, checkpoints) on
unpaired data, with KTO's loss (algorithms/kto.py).

A micro-batch of n completions becomes n "pairs" for the packer: sequence 2k is sample k's
prompt with its own completion (scored by the loss), sequence 2k+1 the same prompt with the
completion of the micro-batch's previous sample (k-1, wrapping), the mismatched pair whose
log-ratio estimates the KL reference point z0. A micro-batch of one sample takes the next sample
of the data as its partner, so the estimate never scores a completion against its own prompt.
z0 is averaged over the micro-batch on every rank (one all-reduce), detached, clamped at 0.

Step metrics: loss, accuracy (the share of completions whose reward lies on the side of beta*z0
their label says), margin (mean desirable reward minus mean undesirable reward), rewardChosen
(mean desirable reward), kl (the step's mean z0 before clamping).

Left out, as in the DPO trainer: learning-rate decay. Conversations are scored on their
assistant turns; a mismatched sequence is not cut to maxSeqLen (it is at most one completion
longer than the longest sample).
"""

from __future__ import annotations

import dataclasses

import torch

from rlkube.runtime.algorithms.kto import clamp_reference_point, kl_reference_point, kto_loss, kto_stats
from rlkube.runtime.contract.config import DataSpec, RuntimeConfig
from rlkube.runtime.data.eval_split import split_eval
from rlkube.runtime.data.packing import TokenBatch, pack_pairs, pad_pairs
from rlkube.runtime.data.preferences import SPECIALS, PreferenceData, fit_to_length
from rlkube.runtime.data.synthetic import synthetic_pairs
from rlkube.runtime.data.tokenizer import Tokenizer, load_tokenizer
from rlkube.runtime.data.unpaired import UnpairedData, load_unpaired_data
from rlkube.runtime.infra.distributed import DistContext, all_reduce_sum
from rlkube.runtime.trainers.base import TrainerHooks, TrainResult, run_trainer
from rlkube.runtime.trainers.batching import SampleCost
from rlkube.runtime.trainers.dpo import DPOTrainer


@dataclasses.dataclass
class KtoBatch(TokenBatch):
    """A packed micro-batch plus each sample's label (True: desirable)."""

    desirable: torch.Tensor | None = None

    def to(self, device, non_blocking: bool = False) -> KtoBatch:
        moved = super().to(device, non_blocking)
        return KtoBatch(**{f.name: getattr(moved, f.name) for f in dataclasses.fields(TokenBatch)},
                        desirable=self.desirable.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> KtoBatch:
        pinned = super().pin_memory()
        return KtoBatch(**{f.name: getattr(pinned, f.name) for f in dataclasses.fields(TokenBatch)},
                        desirable=self.desirable.pin_memory())


def synthetic_unpaired(spec: DataSpec, tokenizer: Tokenizer) -> UnpairedData:
    """The synthetic preference pairs as unpaired data: each chosen desirable, each rejected not."""
    pairs = synthetic_pairs(max(spec.num_samples // 2, 1), spec.max_seq_len, spec.length_mix, spec.seed)
    prompts, completions, labels = [], [], []
    for pair in pairs:
        for text, label in ((pair.chosen, True), (pair.rejected, False)):
            p, c = fit_to_length(tokenizer.encode(pair.prompt), tokenizer.encode(text), spec.max_seq_len)
            prompts.append(p)
            completions.append(c)
            labels.append(label)
    return UnpairedData(prompts, completions, [[1] * len(c) for c in completions], labels)


def mismatched_view(data: UnpairedData, ids: list[int]) -> PreferenceData:
    """Pairs for the packer: (prompt, own completion) and (prompt, another sample's completion)."""
    partners = [ids[k - 1] for k in range(len(ids))] if len(ids) > 1 else [(ids[0] + 1) % len(data)]
    return PreferenceData(
        prompts=[data.prompts[i] for i in ids],
        chosen=[data.completions[i] for i in ids],
        rejected=[data.completions[j] for j in partners],
        chosen_mask=[data.masks[i] for i in ids],
        rejected_mask=[data.masks[j] for j in partners],
        specials=data.specials,
    )


class KTOTrainer(DPOTrainer):
    """State of one KTO run in one process (one rank)."""

    TOTAL_KEYS = (*DPOTrainer.TOTAL_KEYS, "desirable", "undesirable_reward", "kl_sum", "kl_count")

    def load_data(self) -> None:
        config = self.config
        self.tokenizer = load_tokenizer(config.model.tokenizer)
        if config.data.format == "synthetic":
            data = synthetic_unpaired(config.data, self.tokenizer)
        else:
            data = load_unpaired_data(config.data, self.tokenizer)
        self.data, self.eval_data = split_eval(config.data, data,
                                               lambda spec: load_unpaired_data(spec, self.tokenizer))
        specials = SPECIALS if self.data.specials else 0
        self.costs = []
        for i in range(len(self.data)):
            n = len(self.data.prompts[i]) + len(self.data.completions[i]) + specials
            self.costs.append(SampleCost(index=i, tokens=2 * n, rows=2, longest=n))

    def collate(self, ids: list[int], data: UnpairedData | None = None) -> KtoBatch:
        data = data if data is not None else self.data
        tok, view = self.tokenizer, mismatched_view(data, ids)
        local = list(range(len(ids)))
        if self.config.data.packing and not self.rows_per_sequence:
            batch = pack_pairs(view, local, tok.bos_id, tok.eos_id, explicit_mask=self.explicit_mask,
                               row_tokens=self.row_tokens, pad=tok.pad_id,
                               multiple_of=self.row_multiple, min_width=self.row_min)
        else:
            batch = pad_pairs(view, local, tok.bos_id, tok.eos_id, tok.pad_id, padding_mask=False)
        labels = torch.tensor([data.labels[i] for i in ids], dtype=torch.bool)
        return KtoBatch(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(TokenBatch)},
                        desirable=labels)

    def score_batch(self, batch: KtoBatch, counted: bool) -> tuple[torch.Tensor, dict]:
        cfg = self.config.training
        with torch.no_grad():
            ref = self.reference(batch)
        pol = self.policy(batch)
        # z0 from the mismatched sequences, over every rank's micro-batch (each rank runs the same
        # number of micro-batches, padded with weight-0 ones, so the all-reduce always pairs up)
        kl_sum, kl_count = kl_reference_point(pol[1::2].detach(), ref[1::2]) if counted else (0.0, 0)
        kl_sum, kl_count = all_reduce_sum(self.ctx, [kl_sum, float(kl_count)])
        if not counted:  # a padding micro-batch: its own (weight-0) loss needs a z0 all the same
            kl_sum, kl_count = kl_reference_point(pol[1::2].detach(), ref[1::2])
        z0 = clamp_reference_point(kl_sum, int(kl_count))
        desirable = batch.desirable
        losses = kto_loss(pol[0::2], ref[0::2], desirable, z0, cfg.beta,
                          cfg.kto_desirable_weight, cfg.kto_undesirable_weight)
        s = kto_stats(pol[0::2], ref[0::2], desirable, losses, z0, cfg.beta)
        return losses, {
            "pairs": s.samples, "loss": s.loss_sum, "margin": 0.0, "correct": s.correct,
            "chosen": s.desirable_reward_sum, "desirable": s.desirable,
            "undesirable_reward": s.undesirable_reward_sum, "kl_sum": kl_sum, "kl_count": kl_count,
            "tokens": batch.real_tokens, "scored": int(batch.target_ids.numel()), "seq_lens": batch.seq_lens,
        }

    def eval_summary(self, sums: dict[str, float]) -> dict:
        """KTO's accuracy (reward on the side of z0 its label says) and margin (mean desirable
        minus mean undesirable reward) over the eval completions."""
        samples, desirable = max(sums["pairs"], 1.0), sums["desirable"]
        undesirable = sums["pairs"] - desirable
        good = sums["chosen"] / desirable if desirable else 0.0
        bad = sums["undesirable_reward"] / undesirable if undesirable else 0.0
        return {"samples": int(sums["pairs"]), "loss": sums["loss"] / samples, "accuracy": sums["correct"] / samples,
                "margin": good - bad, "rewardMean": good}

    def run_step(self, step: int):
        totals, plan = super().run_step(step)
        self.step_totals = totals
        return totals, plan

    def train_step(self, step: int, lr: float) -> dict:
        rec = super().train_step(step, lr)
        t = self.step_totals
        samples, desirable, good, bad = all_reduce_sum(
            self.ctx, [t["pairs"], t["desirable"], t["chosen"], t["undesirable_reward"]])
        undesirable = samples - desirable
        good_mean = good / desirable if desirable else 0.0
        bad_mean = bad / undesirable if undesirable else 0.0
        # kl_sum/kl_count are already job-wide per micro-batch; their ratio is the step's mean z0
        rec.update(rewardChosen=good_mean, rewardRejected=bad_mean, margin=good_mean - bad_mean,
                   kl=t["kl_sum"] / t["kl_count"] if t["kl_count"] else 0.0)
        return rec

    def start_event(self) -> dict:
        event = super().start_event()
        event.pop("pairs", None)
        return {**event, "algorithm": "kto", "samples": len(self.data),
                "desirable": sum(self.data.labels)}


def train(config: RuntimeConfig, ctx: DistContext | None = None, hooks: TrainerHooks | None = None) -> TrainResult:
    """Run KTO training described by `config` in this process (one rank)."""
    return run_trainer(KTOTrainer, config, ctx, hooks)
