"""One memory plan per GPU: what the card holds, and what is left for batches, in bytes.

Made before the first step (before any weight is loaded) from what this GPU will hold: each
role's weights (dtype, LoRA, frozen parts, FSDP shard), the trained roles' gradients and AdamW
moments, the KV cache per decode row-token, activation bytes per training token, the language
model head's chunk, the decode graphs' pools, what the CUDA context already holds, and a reserve
for the caching allocator. `batching.memoryFraction` of the card is what the plan may fill; the
rest of it is divided among the phases of a step, which run one after the other:

- decode rows: as many as the step has (per actor GPU) when their KV cache, its compaction copy
  and their prefill take at most `DECODE_SHARE` of the room; else as many as fit in that share.
  The cache stays resident between steps, so the decode graphs are captured once;
- training micro-batches: the room left, divided by the activation bytes of one token;
- forward-only passes (old log-probs, reference, values, reward model): the same room divided by
  what a token costs without autograd (one layer's transients), so their budget is larger;
- the checkpoint's device snapshot (the trained roles' weights and AdamW state, copied on the GPU
  at a save and moved to the host while the next steps run): counted when it leaves at least
  half of the room to batches, else checkpoints stage in host memory (`snapshot_on_device`).

The activation bytes are a model of a decoder layer (norms upcast to fp32, the projections'
inputs and outputs, the MLP's gate/up/product) on the conservative side: compiled layers save
less. The adaptive batcher corrects the training budget from each step's measured peak, and an
out-of-memory error halves it (batching.py), so the model only has to start safely.

Pure arithmetic over numbers passed in: `plan_request.py` reads them from the config and the
device; the tests check each term against bytes computed by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkube.runtime.infra.errors import ConfigError

GIB = 1 << 30
RESERVE_FRACTION = 0.03  # of the card: allocator fragments, cuBLAS/NCCL workspaces
MIN_RESERVE = 1 << 30
DECODE_SHARE = 0.5  # at most this share of the room goes to the decode rows' caches
DECODE_COPIES = 2.0  # compaction keeps smaller batches (own caches) beside the full one
ADAMW_MOMENTS = 2  # exp_avg and exp_avg_sq, in the parameters' dtype (torch's AdamW)
FP32 = 4


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that its memory depends on."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config) -> ModelShape:
        """From a Hugging Face config object (or anything with its attribute names)."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            layers=config.num_hidden_layers, hidden=config.hidden_size,
            intermediate=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
            heads=heads, kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim, vocab=config.vocab_size,
        )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def layer_activation_bytes(self, b: int) -> int:
        """What autograd keeps of one token through one decoder layer (dtype of `b` bytes):
        two RMSNorms (input upcast to fp32, the fp32 normalised copy, the scaled output),
        attention (normed input, q, k, v, rotated q and k, attention output, o_proj input) and
        the MLP (normed input, gate, up, activation, product)."""
        h, kv, i = self.hidden, self.kv_heads * self.head_dim, self.intermediate
        norms = 2 * (2 * FP32 * h + b * h)
        attention = b * (5 * h + 3 * kv)
        mlp = b * (h + 4 * i)
        return norms + attention + mlp

    def activation_bytes_per_token(self, b: int, checkpointing: bool) -> int:
        """Training bytes of one token: every layer's saved activations (only each layer's input
        with gradient checkpointing, then one layer recomputed), one more layer's worth for the
        backward's working set, and the embedding / final norm / gathered hidden state."""
        per_layer = self.layer_activation_bytes(b)
        saved = self.layers * b * self.hidden + per_layer if checkpointing else self.layers * per_layer
        return saved + per_layer + (2 * FP32 + 3 * b) * self.hidden

    def forward_bytes_per_token(self, b: int) -> int:
        """Bytes of one token in a pass without autograd: one layer's transients at a time (the
        MLP's gate, up and product, q/k/v, the residual stream, the fp32 norm) and the hidden
        states kept for the head."""
        h, kv, i = self.hidden, self.kv_heads * self.head_dim, self.intermediate
        return b * (3 * i + 4 * h + 2 * kv) + 2 * FP32 * h + b * h

    def head_bytes(self, b: int, chunk: int) -> int:
        """The fused head's chunk of logits: the matmul's output and its fp32 working copy,
        in the forward and again, recomputed, in the backward."""
        return chunk * self.vocab * (b + FP32)


@dataclass(frozen=True)
class HeldModel:
    """One role's model as this GPU holds it."""

    role: str
    shape: ModelShape
    params: int  # parameters of the whole model (before sharding)
    trainable: int  # of them, those with gradients and AdamW moments (0: frozen)
    dtype_bytes: int
    shards: int = 1  # ranks the role is FSDP-sharded over
    checkpointing: bool = False

    @property
    def weights(self) -> int:
        return self.params * self.dtype_bytes // self.shards

    @property
    def gradients(self) -> int:
        return self.trainable * self.dtype_bytes // self.shards

    @property
    def optimizer(self) -> int:
        return ADAMW_MOMENTS * self.trainable * self.dtype_bytes // self.shards


@dataclass(frozen=True)
class PlanRequest:
    """Everything the plan is made from."""

    capacity: int  # bytes of the card
    fraction: float  # batching.memoryFraction
    in_use: int  # bytes the card already holds before any model (CUDA context, other processes)
    models: tuple[HeldModel, ...]
    row_tokens: int  # the longest row (data.maxSeqLen): one must always fit in a micro-batch
    decode_rows: int = 0  # rows this GPU's actor generates per step (0: it does not generate)
    prompt_tokens: int = 0  # the prompt block's width
    new_tokens: int = 0  # rollout.maxNewTokens
    decode_rows_cap: int | None = None  # rollout.decodeRows
    train_tokens_cap: int | None = None  # batching.maxTokensPerGpu
    head_chunk: int = 4096
    sampler_copies: int = 2  # [rows, vocab] buffers a decode step's sampling holds


@dataclass
class MemoryPlan:
    """The plan's terms (bytes) and the budgets it leaves."""

    capacity: int
    usable: int
    terms: dict[str, int]
    train_tokens: int  # one training micro-batch on this GPU
    forward_tokens: int  # one forward-only micro-batch on this GPU
    decode_rows: int  # concurrent decode rows of this GPU's actor (0: none)
    left: int  # bytes left for batches after every fixed term
    train_bytes_per_token: int
    forward_bytes_per_token: int
    snapshot_on_device: bool = False  # the checkpoint snapshot is counted (infra/checkpoint.py staging "device")
    notes: list[str] = field(default_factory=list)

    @property
    def grows_from_peaks(self) -> bool:
        """Whether a batcher may grow its budget from later steps' peaks. Not when the checkpoint's
        device snapshot is counted: most steps' peaks do not show its room (it is on the GPU only
        in the steps after a save), and grown into, a 1.5B PPO reached 93% of an H100 after a
        save. The budget then grows once, at the first step's calibration."""
        return not self.snapshot_on_device

    @property
    def resident(self) -> int:
        """Bytes the caching allocator surely holds during a step besides its batches: weights,
        gradients and AdamW state (what a measured peak is compared with)."""
        return sum(v for k, v in self.terms.items() if k.endswith(("Weights", "Gradients", "AdamW")))

    @property
    def forward_ratio(self) -> float:
        """Forward-only tokens per training token of the same memory."""
        return self.train_bytes_per_token / max(self.forward_bytes_per_token, 1)

    def summary(self) -> str:
        """One line for /progress, status.progress.memoryPlan and the job's MemoryPlan Event."""
        held = ", ".join(f"{name} {value / GIB:.1f}" for name, value in self.terms.items() if value >= GIB // 20)
        rows = f", decode rows {self.decode_rows}" if self.decode_rows else ""
        return (f"{self.usable / GIB:.1f} of {self.capacity / GIB:.1f} GiB: {held}; {self.left / GIB:.1f} GiB left "
                f"for batches: micro-batches of {self.train_tokens} tokens, forward passes of "
                f"{self.forward_tokens}{rows}")

    def describe(self) -> dict:
        """The start record's `memoryPlan`: each term in GiB, what is left, the budgets."""
        gib = {name: round(value / GIB, 2) for name, value in self.terms.items()}
        return {"capacityGiB": round(self.capacity / GIB, 2), "usableGiB": round(self.usable / GIB, 2),
                "termsGiB": gib, "leftGiB": round(self.left / GIB, 2),
                "trainBytesPerToken": self.train_bytes_per_token,
                "forwardBytesPerToken": self.forward_bytes_per_token,
                "trainTokens": self.train_tokens, "forwardTokens": self.forward_tokens,
                "decodeRows": self.decode_rows, "checkpointSnapshotOnDevice": self.snapshot_on_device,
                "notes": list(self.notes), "summary": self.summary()}


class DoesNotFit(ConfigError):
    """The job's fixed memory (weights, gradients, optimizer state) and one row do not fit the
    GPU: a permanent error (exit 3) raised before any weight is loaded."""


def _fixed_terms(req: PlanRequest) -> dict[str, int]:
    terms = {"cudaContext": req.in_use}
    for m in req.models:
        terms[f"{m.role}Weights"] = m.weights
        if m.trainable:
            terms[f"{m.role}Gradients"] = m.gradients
            terms[f"{m.role}AdamW"] = m.optimizer
    trained = [m for m in req.models if m.trainable]
    if trained:
        terms["headChunk"] = max(m.shape.head_bytes(m.dtype_bytes, req.head_chunk) for m in trained)
    actor = _actor(req)
    if actor is not None and actor.shards > 1 and req.decode_rows:
        terms["actorUnsharded"] = actor.params * actor.dtype_bytes - actor.weights  # gathered to generate
    terms["reserve"] = max(MIN_RESERVE, int(RESERVE_FRACTION * req.capacity))
    return terms


def _actor(req: PlanRequest) -> HeldModel | None:
    return next((m for m in req.models if m.role in ("actor", "policy")), None)


def _decode_row_bytes(req: PlanRequest, actor: HeldModel) -> int:
    """One decode row: its cache slots (and compaction's copy), its prefill's transients and its
    share of the sampling buffers the captured graphs hold."""
    shape, b = actor.shape, actor.dtype_bytes
    slots = req.prompt_tokens + req.new_tokens + 72  # rounded up to 64, plus spare slots
    cache = int(DECODE_COPIES * slots * shape.kv_bytes_per_token(b))
    prefill = req.prompt_tokens * shape.forward_bytes_per_token(b)
    sampling = int(DECODE_COPIES * req.sampler_copies * shape.vocab * FP32)
    return cache + prefill + sampling


def _does_not_fit(req: PlanRequest, terms: dict[str, int], need_row: int, usable: int) -> DoesNotFit:
    fixed = sum(terms.values())
    listed = " + ".join(f"{name} {value / GIB:.1f}" for name, value in terms.items() if value)
    trained = [m for m in req.models if m.trainable]
    options = ["model.lora (trains adapters only: no gradients or AdamW moments for the base weights)",
               "more GPUs for the role (roles.<role>.gpus: FSDP divides weights, gradients and AdamW state)",
               "a smaller model"]
    if any(not m.checkpointing for m in trained):
        options.insert(1, "model.gradientCheckpointing: true (activations of one layer instead of all)")
    return DoesNotFit(
        f"model: the job does not fit on one GPU of {req.capacity / GIB:.1f} GiB at batching.memoryFraction "
        f"{req.fraction:.2f} ({usable / GIB:.1f} GiB): {listed} = {fixed / GIB:.1f} GiB held before any batch, "
        f"and one row of {req.row_tokens} tokens needs {need_row / GIB:.2f} GiB more. What would fit: "
        + "; ".join(options))


def make_plan(req: PlanRequest) -> MemoryPlan:
    """The plan for `req`; DoesNotFit when the fixed terms and one row exceed the usable memory."""
    usable = int(req.fraction * req.capacity)
    terms = _fixed_terms(req)
    trained = [m for m in req.models if m.trainable]
    # Training bytes per token: the largest trained role's (roles train one after the other).
    train_tok = max((m.shape.activation_bytes_per_token(m.dtype_bytes, m.checkpointing) for m in trained),
                    default=0)
    forward_tok = max(m.shape.forward_bytes_per_token(m.dtype_bytes) for m in req.models)
    need_row = max(train_tok, forward_tok) * req.row_tokens
    room = usable - sum(terms.values())
    if room < need_row:
        raise _does_not_fit(req, terms, need_row, usable)
    notes: list[str] = []
    snapshot = sum(m.weights + m.optimizer for m in trained)
    snapshot_on_device = bool(trained) and room - snapshot >= max(need_row, room // 2)
    if snapshot_on_device:
        terms["checkpointSnapshot"] = snapshot
        room -= snapshot
    elif trained:
        notes.append("checkpoints stage in host memory: a device snapshot would leave less than half the room")
    decode_rows = 0
    actor = _actor(req)
    if req.decode_rows and actor is not None:
        per_row = _decode_row_bytes(req, actor)
        wanted = min(req.decode_rows, req.decode_rows_cap or req.decode_rows)
        fit = max(1, int((room - need_row) * DECODE_SHARE) // per_row)
        decode_rows = min(wanted, fit)
        if decode_rows < wanted:
            notes.append(f"decode rows {decode_rows} of {wanted}: their caches would take more than "
                         f"{DECODE_SHARE:.0%} of the room; the rest stream through them (rollout.refill)")
        terms["decodeCache"] = decode_rows * per_row
        room -= terms["decodeCache"]
    train_tokens = room // train_tok if train_tok else 0
    if req.train_tokens_cap is not None and train_tokens > req.train_tokens_cap:
        train_tokens = req.train_tokens_cap
        notes.append(f"training micro-batches capped at batching.maxTokensPerGpu = {req.train_tokens_cap}")
    forward_tokens = room // forward_tok
    return MemoryPlan(capacity=req.capacity, usable=usable, terms=terms,
                      train_tokens=max(train_tokens, req.row_tokens) if train_tok else 0,
                      forward_tokens=max(forward_tokens, req.row_tokens), decode_rows=decode_rows, left=room,
                      train_bytes_per_token=train_tok, forward_bytes_per_token=forward_tok,
                      snapshot_on_device=snapshot_on_device, notes=notes)
