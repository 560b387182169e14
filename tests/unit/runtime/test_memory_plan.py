"""The memory plan's arithmetic against bytes computed by hand, and its activation model against
what autograd really keeps.

The tiny qwen2 below has, by hand (hidden 64, MLP 128, 4 heads of 16, 2 KV heads, vocab 259,
untied head, q/k/v biases):
  embedding 259*64 = 16,576; per layer q 64*64+64 = 4,160, k and v 64*32+32 = 2,080 each,
  o 64*64 = 4,096, gate/up/down 3*64*128 = 24,576, two norms 128 -> 37,120; two layers 74,240;
  final norm 64; head 16,576. Total 107,456.
LoRA rank 4 on q_proj and v_proj: per layer 4*(64+64) + 4*(64+32) = 896; two layers 1,792.
"""

import pytest
import torch

from rlkube.runtime.contract.config import LoraSpec, ModelSpec
from rlkube.runtime.trainers.memory_plan import (
    GIB,
    MIN_RESERVE,
    DoesNotFit,
    HeldModel,
    ModelShape,
    PlanRequest,
    make_plan,
)
from rlkube.runtime.trainers.plan_request import held_model

TINY = {"model_type": "qwen2", "vocab_size": 259, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False}
PARAMS = 16_576 + 2 * 37_120 + 64 + 16_576
LORA_PARAMS = 2 * (4 * (64 + 64) + 4 * (64 + 32))
SHAPE = ModelShape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=259)


def spec(**kw) -> ModelSpec:
    return ModelSpec(config=dict(TINY), dtype=kw.pop("dtype", "bfloat16"), **kw)


def test_parameters_are_counted_on_the_meta_device():
    full = held_model("actor", spec(), shards=1, trains=True)
    assert (full.params, full.trainable, full.dtype_bytes, full.shape) == (PARAMS, PARAMS, 2, SHAPE)
    lora = held_model("actor", spec(lora=LoraSpec(rank=4, target_modules=["q_proj", "v_proj"])), 1, True)
    assert (lora.params, lora.trainable) == (PARAMS + LORA_PARAMS, LORA_PARAMS)
    frozen = held_model("reference", spec(dtype="float32"), shards=2, trains=False)
    assert (frozen.trainable, frozen.weights, frozen.gradients) == (0, PARAMS * 4 // 2, 0)
    part = held_model("actor", spec(), 1, True, trainable_modules=["lm_head"])
    assert part.trainable == 16_576


def test_per_token_bytes_by_hand():
    # bf16: norms 2*(2*4*64 + 2*64) = 1,280; attention 2*(5*64 + 3*32) = 832; MLP 2*(64 + 4*128) = 1,152
    assert SHAPE.layer_activation_bytes(2) == 1_280 + 832 + 1_152
    # two layers saved, one more for the backward, embedding/final norm/hidden (8 + 6) * 64
    assert SHAPE.activation_bytes_per_token(2, checkpointing=False) == 3 * 3_264 + 14 * 64
    # checkpointing: each layer's input (2 * 2 * 64), one layer recomputed, one for the backward
    assert SHAPE.activation_bytes_per_token(2, checkpointing=True) == 2 * 128 + 2 * 3_264 + 14 * 64
    assert SHAPE.kv_bytes_per_token(2) == 2 * 2 * 2 * 16 * 2
    # one layer's transients 2*(3*128 + 4*64 + 2*32) = 1,408, the fp32 norm 8*64, the kept hidden 2*64
    assert SHAPE.forward_bytes_per_token(2) == 1_408 + 512 + 128 == 2_048
    assert SHAPE.head_bytes(2, chunk=4096) == 4096 * 259 * (2 + 4)


def request(models, **kw) -> PlanRequest:
    base = dict(capacity=4 * GIB, fraction=0.9, in_use=300 << 20, models=tuple(models), row_tokens=512)
    base.update(kw)
    return PlanRequest(**base)


def test_full_fine_tune_with_a_reference_by_hand():
    actor = HeldModel("actor", SHAPE, PARAMS, PARAMS, 2)
    reference = HeldModel("reference", SHAPE, PARAMS, 0, 2)
    plan = make_plan(request([actor, reference], decode_rows=64, prompt_tokens=64, new_tokens=128))
    weights, grads, adamw = PARAMS * 2, PARAMS * 2, 2 * PARAMS * 2
    head = 4096 * 259 * 6
    reserve = max(MIN_RESERVE, int(0.03 * 4 * GIB))
    snapshot = weights + adamw  # the trained actor's state, copied on the GPU at a save
    assert plan.terms == {"cudaContext": 300 << 20, "actorWeights": weights, "actorGradients": grads,
                          "actorAdamW": adamw, "headChunk": head, "referenceWeights": weights,
                          "reserve": reserve, "checkpointSnapshot": snapshot, "decodeCache": plan.terms["decodeCache"]}
    assert plan.snapshot_on_device and plan.resident == 2 * weights + grads + adamw
    room = int(0.9 * 4 * GIB) - (300 << 20) - 2 * weights - grads - adamw - head - reserve - snapshot
    # one decode row: 2 copies x (64 + 128 + 72 slots) x 256 B, its prefill 64 x 2,048 B, 2 x 2 x 259 fp32 logits
    per_row = 2 * 264 * 256 + 64 * 2_048 + 2 * 2 * 259 * 4
    assert plan.decode_rows == 64 and plan.terms["decodeCache"] == 64 * per_row
    left = room - 64 * per_row
    assert plan.left == left
    assert plan.train_tokens == left // (3 * 3_264 + 14 * 64)
    assert plan.forward_tokens == left // 2_048
    described = plan.describe()
    assert described["termsGiB"]["actorAdamW"] == round(adamw / GIB, 2) and described["decodeRows"] == 64
    assert "decode rows 64" in described["summary"] and f"micro-batches of {plan.train_tokens} tokens" in described["summary"]


def test_lora_plan_holds_no_gradients_for_the_base_and_no_second_copy():
    lora = HeldModel("actor", SHAPE, PARAMS + LORA_PARAMS, LORA_PARAMS, 2, checkpointing=True)
    plan = make_plan(request([lora], train_tokens_cap=2048))
    assert plan.terms["actorWeights"] == (PARAMS + LORA_PARAMS) * 2
    assert plan.terms["actorGradients"] == LORA_PARAMS * 2
    assert plan.terms["actorAdamW"] == 2 * LORA_PARAMS * 2
    assert "referenceWeights" not in plan.terms and "decodeCache" not in plan.terms
    assert plan.terms["checkpointSnapshot"] == (PARAMS + LORA_PARAMS) * 2 + 2 * LORA_PARAMS * 2
    assert plan.train_tokens == 2048  # capped by batching.maxTokensPerGpu
    assert plan.train_bytes_per_token == 2 * 128 + 2 * 3_264 + 14 * 64


def test_decode_rows_shrink_to_their_share_of_the_room():
    big = ModelShape(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128, vocab=151_936)
    actor = HeldModel("actor", big, 1_540_000_000, 1_540_000_000, 2)
    plan = make_plan(request([actor], capacity=40 * GIB, decode_rows=1024, prompt_tokens=256, new_tokens=4096,
                             row_tokens=4352))
    assert 1 <= plan.decode_rows < 1024 and plan.notes
    assert plan.terms["decodeCache"] <= 0.5 * (plan.left + plan.terms["decodeCache"])


def test_a_snapshot_that_would_take_half_the_room_stages_on_the_host():
    big = ModelShape(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128, vocab=151_936)
    actor = HeldModel("actor", big, 1_540_000_000, 1_540_000_000, 2)
    roomy = make_plan(request([actor], capacity=80 * GIB, row_tokens=1024))
    tight = make_plan(request([actor], capacity=30 * GIB, row_tokens=1024))
    assert roomy.snapshot_on_device and roomy.terms["checkpointSnapshot"] == 3 * 1_540_000_000 * 2
    assert not tight.snapshot_on_device and "checkpointSnapshot" not in tight.terms and tight.notes
    # a batcher may grow from later peaks only where no snapshot's room is kept free in them
    assert not roomy.grows_from_peaks and tight.grows_from_peaks


def test_what_cannot_fit_names_the_terms_and_what_would():
    big = ModelShape(layers=28, hidden=3072, intermediate=8192, heads=24, kv_heads=8, head_dim=128, vocab=128_256)
    actor = HeldModel("actor", big, 3_200_000_000, 3_200_000_000, 2)
    with pytest.raises(DoesNotFit) as info:
        make_plan(request([actor], capacity=24 * GIB))
    message = str(info.value)
    assert info.value.field_path() == "model"
    for words in ("actorWeights 6.0", "actorAdamW 11.9", "model.lora", "roles.<role>.gpus",
                  "model.gradientCheckpointing", "batching.memoryFraction 0.90"):
        assert words in message, (words, message)


def test_activation_model_bounds_what_autograd_saves():
    """The model must not undercount (the plan would run out of memory) nor be absurdly high.
    Counted without the head's logits, which the runtime never materialises (fused head)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{**TINY, "vocab_size": 259})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).train()
    body = model.model
    tokens = 256
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, 259, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        body(input_ids=ids).last_hidden_state.sum()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    measured = sum(n for ptr, n in storages.items() if ptr not in params) / tokens
    modelled = SHAPE.activation_bytes_per_token(4, checkpointing=False)
    assert measured <= modelled <= 3 * measured, (measured, modelled)


def test_a_multi_turn_row_is_planned_for_its_whole_episode(monkeypatch):
    """Decode rows of a multi-turn rollout hold up to maxEpisodeTokens of response (turns and tool
    outputs), not one turn's maxNewTokens: the plan's decode cache is sized for the episode."""
    import yaml

    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.infra.distributed import DistContext
    from rlkube.runtime.trainers import plan_request

    raw = yaml.safe_load(open("examples/runtime/grpo-multi-turn-cpu.yaml"))
    monkeypatch.setattr(plan_request, "device_memory", lambda device: (4 * GIB, 200 << 20))
    model = held_model("actor", spec(), shards=1, trains=True)

    def decode_cache(rollout: dict) -> int:
        cfg = RuntimeConfig.model_validate({**raw, "rollout": {**raw["rollout"], **rollout}})
        plan = plan_request.plan_memory(cfg, DistContext(), [model], decode_rows=8, prompt_tokens=32)
        return next(v for k, v in plan.terms.items() if k.startswith("decode"))

    single = {"maxTurns": 1, "maxEpisodeTokens": None, "tools": None}
    episode = decode_cache({})  # maxNewTokens 48 a turn, maxEpisodeTokens 160
    assert episode == decode_cache({**single, "maxNewTokens": 160}) > decode_cache(single) > 0
