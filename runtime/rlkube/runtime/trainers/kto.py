"""KTO's objective for the preference trainer (trainers/dpo.py: batcher, packing, OOM redo,
checkpoints, shared with DPO): unpaired data, KTO's loss (algorithms/kto.py).

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
from rlkube.runtime.data.packing import TokenBatch
from rlkube.runtime.data.preferences import SPECIALS, PreferenceData, fit_to_length
from rlkube.runtime.data.synthetic import synthetic_pairs
from rlkube.runtime.data.tokenizer import Tokenizer
from rlkube.runtime.data.unpaired import UnpairedData, load_unpaired_data
from rlkube.runtime.infra.distributed import DistContext, all_reduce_sum
from rlkube.runtime.trainers.base import TrainerHooks, TrainResult
from rlkube.runtime.trainers.batching import SampleCost
from rlkube.runtime.trainers.dpo import DpoObjective, train_preferences


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


class KtoObjective:
    """KTO: completions labelled desirable or not, each against the KL reference point z0 of its
    micro-batch's mismatched pairs (the module's docstring)."""

    SUMS = (*DpoObjective.SUMS, "desirable", "undesirable_reward", "kl_sum", "kl_count")
    # kl_sum and kl_count are job-wide already: each micro-batch's z0 is all-reduced in `score`.
    REDUCED = (*DpoObjective.SUMS, "desirable", "undesirable_reward")

    def __init__(self, config: RuntimeConfig, ctx: DistContext) -> None:
        self.config, self.ctx = config, ctx

    def load(self, tokenizer: Tokenizer) -> tuple[UnpairedData, UnpairedData | None]:
        spec = self.config.data
        data = synthetic_unpaired(spec, tokenizer) if spec.format == "synthetic" else load_unpaired_data(spec, tokenizer)
        return split_eval(spec, data, lambda eval_spec: load_unpaired_data(eval_spec, tokenizer))

    def costs(self, data: UnpairedData) -> list[SampleCost]:
        specials = SPECIALS if data.specials else 0
        costs = []
        for i in range(len(data)):
            n = len(data.prompts[i]) + len(data.completions[i]) + specials
            costs.append(SampleCost(index=i, tokens=2 * n, rows=2, longest=n))
        return costs

    def pairs(self, data: UnpairedData, ids: list[int]) -> tuple[PreferenceData, list[int]]:
        return mismatched_view(data, ids), list(range(len(ids)))

    def labelled(self, batch: TokenBatch, data: UnpairedData, ids: list[int]) -> KtoBatch:
        labels = torch.tensor([data.labels[i] for i in ids], dtype=torch.bool)
        return KtoBatch(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(TokenBatch)},
                        desirable=labels)

    def score(self, pol: torch.Tensor, ref: torch.Tensor, batch: KtoBatch, counted: bool
              ) -> tuple[torch.Tensor, dict]:
        cfg = self.config.training
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
        }

    def step_fields(self, sums: dict[str, float]) -> dict:
        """Accuracy, the desirable and undesirable completions' mean rewards and their difference
        (margin), and kl, the step's mean z0 (kl_sum/kl_count are job-wide per micro-batch)."""
        good, bad = self._reward_means(sums)
        return {"accuracy": sums["correct"] / sums["pairs"], "margin": good - bad, "rewardChosen": good,
                "rewardRejected": bad, "kl": sums["kl_sum"] / sums["kl_count"] if sums["kl_count"] else 0.0}

    def eval_summary(self, sums: dict[str, float]) -> dict:
        """KTO's accuracy (reward on the side of z0 its label says) and margin (mean desirable
        minus mean undesirable reward) over the eval completions."""
        samples = max(sums["pairs"], 1.0)
        good, bad = self._reward_means(sums)
        return {"samples": int(sums["pairs"]), "loss": sums["loss"] / samples, "accuracy": sums["correct"] / samples,
                "margin": good - bad, "rewardMean": good}

    @staticmethod
    def _reward_means(sums: dict[str, float]) -> tuple[float, float]:
        """The mean implicit reward of the desirable completions and of the undesirable ones."""
        desirable = sums["desirable"]
        undesirable = sums["pairs"] - desirable
        good = sums["chosen"] / desirable if desirable else 0.0
        bad = sums["undesirable_reward"] / undesirable if undesirable else 0.0
        return good, bad

    def start_fields(self, data: UnpairedData) -> dict:
        return {"algorithm": "kto", "samples": len(data), "desirable": sum(data.labels)}


def train(config: RuntimeConfig, ctx: DistContext | None = None, hooks: TrainerHooks | None = None) -> TrainResult:
    """Run KTO training described by `config` in this process (one rank)."""
    return train_preferences(KtoObjective, config, ctx, hooks)
