"""Parity with TRL 1.16: its own trainers' loss code and rlkube's, on the same model and batch.

Each test builds a real TRL trainer on the CPU (a 2-layer qwen2 of random weights, a word-level
tokenizer over "w0".."wN" built here, a two-prompt dataset, an explicit reference model, no
vLLM, report_to=[]), takes one batch through TRL's own path (DPO: its data collator and
`compute_loss`; GRPO: `_generate_and_score_completions`, which samples with `model.generate`,
scores with a reward function and computes the advantages and the reference's log-probs, then
`_compute_loss`), and backpropagates. rlkube then computes the same loss from the same token ids
through its own log-prob modules (SequenceLogprobs for DPO, the actor's PolicyModel for GRPO)
and its `algorithms` functions, starting from a copy of the same initial weights, and the loss
and every parameter's gradient are compared.

Tolerance: float32 (TRL's fused LM head computes log-probs in float32 whatever the model's dtype),
so losses at rtol 1e-5 and gradients at rtol 1e-4 / atol 1e-6 of the largest gradient entry:
both sides sum the same terms in different orders, nothing more.

Known, deliberate difference: GRPO's group std gets eps 1e-4 in TRL and 1e-6 in rlkube (verl's
value); the advantages are compared with rlkube's function called at TRL's eps, and equal up to
that constant otherwise. TRL 1.16 multiplies GRPO's k3 KL term by the importance ratio by default
(`use_bias_correction_kl=True`, DeepSeek-V3.2), which changes its gradient even on-policy;
rlkube's k3 loss is the DeepSeekMath term, so the comparison runs with that option off. TRL's GRPOTrainer has no ref_model argument: it loads the reference
from the policy's `name_or_path`, so the test saves the reference's weights there first.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

trl = pytest.importorskip("trl")

from rlkube.runtime.algorithms.advantages import group_normalized_advantages  # noqa: E402
from rlkube.runtime.algorithms.aggregation import SEQ_MEAN_TOKEN_MEAN, SEQ_MEAN_TOKEN_SUM, TOKEN_MEAN  # noqa: E402
from rlkube.runtime.algorithms.dpo import PairLogps, pair_loss  # noqa: E402
from rlkube.runtime.algorithms.ppo import actor_loss  # noqa: E402
from rlkube.runtime.data.packing import pad_pairs  # noqa: E402
from rlkube.runtime.data.preferences import PreferenceData  # noqa: E402
from rlkube.runtime.engine.logprobs import SequenceLogprobs  # noqa: E402
from rlkube.runtime.engine.policy import PolicyModel  # noqa: E402

WORDS = 24
PAD, EOS = WORDS, WORDS + 1
BETA = 0.1


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(WORDS)} | {"<pad>": PAD, "<eos>": EOS}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_lm(seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen2", vocab_size=WORDS + 2, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor]) -> None:
    assert theirs.keys() == ours.keys() and theirs
    scale = max(float(g.abs().max()) for g in theirs.values())
    assert scale > 0
    for name, grad in theirs.items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-6 * scale, msg=name)


def trainer_args(config_cls, out, **kw):
    return config_cls(output_dir=str(out), report_to=[], use_cpu=True, seed=0, bf16=False, **kw)


# -- DPO -----------------------------------------------------------------------------------
def preference_data_from(batch: dict) -> PreferenceData:
    """The pairs of a TRL DPO batch ([chosen..., rejected...] rows of prompt + completion ids)
    as rlkube's PreferenceData (specials=False: TRL already appended the eos to each completion)."""
    rows = []
    for ids, att, comp in zip(batch["input_ids"], batch["attention_mask"], batch["completion_mask"], strict=True):
        real = att.bool()
        rows.append((ids[real & ~comp.bool()].tolist(), ids[comp.bool()].tolist()))
    half = len(rows) // 2
    chosen, rejected = rows[:half], rows[half:]
    assert [p for p, _ in chosen] == [p for p, _ in rejected]
    return PreferenceData(prompts=[p for p, _ in chosen], chosen=[c for _, c in chosen],
                          rejected=[r for _, r in rejected], specials=False)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_loss_and_gradients_match_trl(loss_type, tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    policy, reference = tiny_lm(0), tiny_lm(1)
    ours, our_ref = SequenceLogprobs(copy.deepcopy(policy)), SequenceLogprobs(copy.deepcopy(reference))
    data = Dataset.from_dict({
        "prompt": ["w1 w2 w3", "w4 w5", "w6"],
        "chosen": [" w7 w8", " w9 w10 w11 w12", " w13"],
        "rejected": [" w14", " w15 w16", " w17 w18 w19 w20 w21"],
    })
    args = trainer_args(DPOConfig, tmp_path / "out", beta=BETA, loss_type=[loss_type], per_device_train_batch_size=3, max_length=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = DPOTrainer(policy, ref_model=reference, args=args, train_dataset=data, processing_class=tokenizer())
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    trl_loss = trainer.compute_loss(trainer.model, batch)
    trl_loss.backward()

    pairs = preference_data_from(batch)
    tokens = pad_pairs(pairs, list(range(len(pairs))), bos=EOS, eos=EOS, pad=PAD, padding_mask=False)
    with torch.no_grad():
        ref = our_ref(tokens)
    pol = ours(tokens)
    n = tokens.response_tokens
    logps = PairLogps(pol[0::2], pol[1::2], ref[0::2], ref[1::2], n[0::2], n[1::2])
    # the DPO trainer's scale: losses.sum() * world_size / global_batch, i.e. the batch mean
    loss = pair_loss(logps, BETA, loss_type).mean()
    loss.backward()

    torch.testing.assert_close(loss, trl_loss.to(loss.dtype), rtol=1e-5, atol=0.0)
    assert_same_gradients(gradients(trainer.model), {k.removeprefix("lm."): v for k, v in gradients(ours).items()})


# -- GRPO ----------------------------------------------------------------------------------
GROUP = 4
REWARDS = [0.0, 1.0, 3.0, 1.0, 2.0, 2.0, 0.5, -1.0, 1.0, 1.0, 1.0, 1.0]  # the last group has no signal
MAX_NEW = 6
TEMPERATURE = 0.7
KL = 0.05
CLIP, CLIP_HIGH = 0.2, 0.28


def reward(prompts, completions, **kwargs):
    assert len(completions) == len(REWARDS)
    return list(REWARDS)


def grpo_trainer(policy, reference, loss_type: str, scale_rewards: str, tmp):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    ref_dir = str(tmp / "reference")
    reference.save_pretrained(ref_dir)
    policy.config._name_or_path = ref_dir  # where GRPOTrainer loads its reference from
    args = trainer_args(
        GRPOConfig, tmp / "out", beta=KL, loss_type=loss_type, scale_rewards=scale_rewards, num_generations=GROUP,
        per_device_train_batch_size=len(REWARDS), generation_batch_size=len(REWARDS),
        max_completion_length=MAX_NEW, temperature=TEMPERATURE, epsilon=CLIP, epsilon_high=CLIP_HIGH,
        # TRL 1.16 multiplies the k3 term by the ratio by default (DeepSeek-V3.2's unbiased reverse-KL
        # gradient); rlkube's k3 is the DeepSeekMath GRPO term, TRL's with this off
        use_bias_correction_kl=False,
    )
    data = Dataset.from_dict({"prompt": ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=args, train_dataset=data,
                              processing_class=tokenizer())
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.training_step, which is not run here
    return trainer, [{"prompt": p} for p in data["prompt"] for _ in range(GROUP)]


# TRL loss_type -> (rlkube lossAggregation, the constant TRL divides by on top of it)
GRPO_LOSSES = {
    "grpo": (SEQ_MEAN_TOKEN_MEAN, 1.0),
    "bnpo": (TOKEN_MEAN, 1.0),
    "dapo": (TOKEN_MEAN, 1.0),  # tokens of the global batch: token-mean on one process
    "dr_grpo": (SEQ_MEAN_TOKEN_SUM, float(MAX_NEW)),  # Dr. GRPO's constant normaliser, max length
}


@pytest.mark.parametrize("loss_type, scale_rewards", [
    ("grpo", "group"), ("bnpo", "group"), ("dapo", "group"), ("dr_grpo", "none"),
])
def test_grpo_advantages_loss_and_gradients_match_trl(loss_type, scale_rewards, tmp_path):
    policy, reference = tiny_lm(0), tiny_lm(1)
    ours = PolicyModel(copy.deepcopy(policy), temperature=TEMPERATURE)
    our_ref = PolicyModel(copy.deepcopy(reference), temperature=TEMPERATURE)
    trainer, rows = grpo_trainer(policy, reference, loss_type, scale_rewards, tmp_path)
    trainer.model.train()
    torch.manual_seed(3)
    inputs = trainer._generate_and_score_completions(rows)

    # advantages: rlkube's estimator at TRL's eps (1e-4; rlkube's default is 1e-6)
    advantages = group_normalized_advantages(torch.tensor(REWARDS), GROUP, scale_by_std=scale_rewards == "group",
                                             eps=1e-4)
    torch.testing.assert_close(advantages, inputs["advantages"], rtol=1e-6, atol=1e-7)
    assert advantages[-GROUP:].abs().max() == 0 and advantages.abs().max() > 0.5

    # the rollout as rlkube lays it out: [left-padded prompt | right-padded response]
    prompt_len = inputs["prompt_ids"].shape[1]
    seq = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    resp = inputs["completion_mask"]
    with torch.no_grad():
        ref_logps, _ = our_ref(seq, att, prompt_len, resp)
        start_logps, _ = ours(seq, att, prompt_len, resp)
    torch.testing.assert_close(ref_logps * resp, inputs["ref_per_token_logps"] * resp, rtol=1e-5, atol=1e-5)
    # old log-probs off the current policy, so the ratio leaves [1 - clip, 1 + clipHigh] on some tokens
    g = torch.Generator().manual_seed(4)
    old = start_logps + 0.4 * torch.randn(start_logps.shape, generator=g)
    inputs["old_per_token_logps"] = old
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()

    aggregation, divisor = GRPO_LOSSES[loss_type]
    logps, _ = ours(seq, att, prompt_len, resp)
    loss, metrics = actor_loss(logps, old, advantages, resp.float(), CLIP, CLIP_HIGH, ref_logprobs=ref_logps,
                               kl_coef=KL, kl_estimator="k3", aggregate=aggregation)
    loss = loss / divisor
    loss.backward()
    assert metrics["clip_fraction"] > 0  # the clipped branch is exercised

    torch.testing.assert_close(loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert_same_gradients(gradients(trainer.model), {k.removeprefix("lm."): v for k, v in gradients(ours).items()})
