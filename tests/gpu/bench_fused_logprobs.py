"""Fused lm head + log-prob (engine/fused_head.py) next to the unfused head, side by side in one run:
time and peak memory of the head alone, forward + backward, at the Qwen2.5-1.5B shape.

On a machine with a CUDA GPU, from the repository root (a few minutes on an H200, estimated: not
run there yet; 15 cases of ~16 passes each, plus torch.compile's first compilations):
    PYTHONPATH=runtime python3 tests/gpu/bench_fused_logprobs.py              # 32k tokens x 151,936, bf16
    PYTHONPATH=runtime python3 tests/gpu/bench_fused_logprobs.py --cpu --tiny # CPU dry run (seconds)

Setup, the same for every case: hidden states [N, d] and a head weight [V, d] in bf16 (random:
speed and memory do not depend on values; the weight at HF's init scale, std 0.02), N = 32,768
tokens, d = 1536, V = 151,936 (Qwen2.5-1.5B; its head is tied to the embedding, which changes
nothing here), targets uniform over the vocabulary, a random per-token upstream gradient (DPO's
and PPO's losses weigh tokens differently). Cases:
- unfused: logits = h @ W.T (bf16), fp32 log_softmax, gather; autograd for the backward, i.e. what
  `training.fusedLogprobs: false` runs;
- fused-C: the chunked autograd Function, C tokens a chunk (--chunks); on CUDA its per-chunk
  softmax and gradient run through torch.compile (compiled in the first, untimed pass);
- eager-C: the same without torch.compile (what runs when compiling fails, and on a CPU), at the
  middle chunk size;
- each again `+entropy` (PPO/GRPO with training.entropyCoef > 0), unless --no-entropy, and
  `+frozen-head` (the head weight needs no gradient, as with LoRA: the fused path then computes
  each row's gradient direction in the forward pass and needs no logits in the backward, two
  head matmuls instead of three), unless --no-frozen;
- liger: liger-kernel's fused linear cross-entropy with reduction="none" (its -log-prob), only
  when liger_kernel imports.
Measured per case: forward + backward milliseconds (median of --repeats after --warmup, CUDA
events), the forward alone under no_grad (the reference model's and the old log-probs' pass),
the peak memory allocated above the inputs (torch.cuda.max_memory_allocated; on CPU not
measured), and the largest single tensor any op created (a TorchDispatchMode over one untimed
pass, run eagerly: the number that must not scale with N x V; the compiled chunk functions keep
their fp32 intermediates in registers, so theirs is at most this). `compiled` says whether the
fused cases really ran compiled (false after a compile failure, which the runtime warns about),
`fallbacks` which other fast paths failed. A case that runs out of memory is reported as such,
and the others still run.

Self-check (printed, and the exit code is 1 when a fused case fails it): every case against the
unfused one, same inputs: log-probs and entropy max abs difference <= 2e-3 (bf16; 1e-4 in fp32),
gradients of hidden and weight within 2e-2 relative L2 (5e-5 in fp32). Prints one JSON object per
case, then a table with the ratio to the unfused case.
"""

from __future__ import annotations

import sys

if "--cpu" in sys.argv:  # before torch sees a GPU
    import os

    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from rlkube.runtime.engine import fused_head  # noqa: E402
from rlkube.runtime.engine.fused_head import head_logprobs  # noqa: E402

GIB = 2**30
TOLERANCE = {torch.bfloat16: (2e-3, 2e-2), torch.float32: (1e-4, 5e-5)}  # (values abs, grads rel L2)


class LargestTensor(TorchDispatchMode):
    """Bytes of the largest tensor any aten op creates while active."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.bytes = max(self.bytes, t.numel() * t.element_size())
        return out


def make_inputs(args, device):
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    hidden = torch.randn(args.tokens, args.hidden, generator=g).to(device, dtype)
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * 0.02).to(device, dtype)
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g).to(device)
    upstream = torch.randn(args.tokens, generator=g).to(device)
    upstream_entropy = torch.randn(args.tokens, generator=g).to(device)
    return hidden, weight, targets, upstream, upstream_entropy


def case_fn(name: str, chunk: int | None, entropy: bool):
    """(hidden, weight, targets) -> (log-probs, entropy or None) for one case."""
    if name == "liger":
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        def liger(h, w, y):
            out = LigerFusedLinearCrossEntropyFunction.apply(h, w, y, None, None, -100, 0.0, 0.0, "none")
            loss = out[0] if isinstance(out, tuple) else out
            return -loss, None

        return liger
    fused = name != "unfused"

    def ours(h, w, y):
        compiled_on = fused_head.COMPILED_ON
        if name == "eager":  # the fallback when torch.compile fails, and what a CPU runs
            fused_head.COMPILED_ON = ()
        try:
            return head_logprobs(h, w, y, chunk=chunk or 1, with_entropy=entropy, fused=fused)
        finally:
            fused_head.COMPILED_ON = compiled_on

    return ours


def one_pass(fn, inputs, backward: bool, frozen: bool = False):
    hidden, weight, targets, up, up_ent = inputs
    if not backward:
        with torch.no_grad():
            return fn(hidden, weight, targets)
    h = hidden.detach().requires_grad_()
    w = weight.detach().requires_grad_(not frozen)
    logps, ent = fn(h, w, targets)
    loss = (up * logps).sum() + ((up_ent * ent).sum() if ent is not None else 0.0)
    loss.backward()
    return logps.detach(), None if ent is None else ent.detach(), h.grad, w.grad


def timed_ms(fn, inputs, backward: bool, args, cuda: bool, frozen: bool = False) -> float:
    times = []
    for i in range(args.warmup + args.repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            one_pass(fn, inputs, backward, frozen)
            end.record()
            torch.cuda.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            one_pass(fn, inputs, backward, frozen)
            elapsed = (time.perf_counter() - t0) * 1e3
        if i >= args.warmup:
            times.append(elapsed)
    return statistics.median(times)


def run_case(name, chunk, variant, inputs, args, cuda) -> tuple[dict, tuple | None]:
    label = name + (f"-{chunk}" if chunk else "") + variant
    entropy, frozen = variant == "+entropy", variant == "+frozen-head"
    row = {"case": label, "chunk": chunk, "variant": variant}
    fn = case_fn(name, chunk, entropy)
    try:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        outputs = one_pass(fn, inputs, True, frozen)
        if cuda:
            torch.cuda.synchronize()
            row["peak_gib"] = round((torch.cuda.max_memory_allocated() - base) / GIB, 3)
        # eager for this pass: a dispatch mode around compiled code could send it to the fallback
        compiled_on, fused_head.COMPILED_ON = fused_head.COMPILED_ON, ()
        try:
            with LargestTensor() as largest:
                one_pass(fn, inputs, True, frozen)
        finally:
            fused_head.COMPILED_ON = compiled_on
        row["largest_tensor_gib"] = round(largest.bytes / GIB, 4)
        row["fwd_bwd_ms"] = round(timed_ms(fn, inputs, True, args, cuda, frozen), 2)
        row["fwd_nograd_ms"] = round(timed_ms(fn, inputs, False, args, cuda), 2)
        if name == "fused":
            row["compiled"] = cuda and not fused_head._COMPILED.get("failed", False)
            row["fallbacks"] = sorted(fused_head._FALLBACKS)  # fast paths that failed (warned) in this run
        return row, outputs
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
        return row, None
    except Exception as e:  # liger's signature moves between releases: report, go on
        if name != "liger":
            raise
        row["error"] = f"{type(e).__name__}: {e}"[:200]
        return row, None


def self_check(row: dict, outputs, reference, dtype) -> bool:
    """Fills row['check'] with the differences to the unfused case; True when within tolerance."""
    if outputs is None or reference is None:
        return True
    value_tol, grad_tol = TOLERANCE[dtype]
    diffs = {"logp_max_abs": float((outputs[0] - reference[0]).abs().max())}
    if outputs[1] is not None and reference[1] is not None:
        diffs["entropy_max_abs"] = float((outputs[1] - reference[1]).abs().max())
    for i, name in ((2, "grad_hidden_rel_l2"), (3, "grad_weight_rel_l2")):
        if reference[i] is None:  # a frozen head has no gradient
            continue
        got, want = outputs[i].float(), reference[i].float()
        diffs[name] = float((got - want).norm() / want.norm())
    ok = all(v <= value_tol for k, v in diffs.items() if k.endswith("max_abs")) and all(
        v <= grad_tol for k, v in diffs.items() if k.endswith("rel_l2"))
    row["check"] = {k: float(f"{v:.3g}") for k, v in diffs.items()} | {"ok": ok}
    return ok


def table(rows: list[dict]) -> str:
    base = {r["variant"]: r for r in rows if r["case"].startswith("unfused") and "error" not in r}
    lines = [f"{'case':<22}{'fwd+bwd ms':>12}{'vs unfused':>12}{'no-grad ms':>12}{'peak GiB':>10}"
             f"{'largest GiB':>13}  check"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<22}{r['error']:>12}")
            continue
        ref = base.get(r["variant"])
        ratio = f"{ref['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}x" if ref else "-"
        peak = f"{r['peak_gib']:.2f}" if "peak_gib" in r else "-"
        check = "ok" if r.get("check", {}).get("ok", True) else "FAIL"
        lines.append(f"{r['case']:<22}{r['fwd_bwd_ms']:>12.2f}{ratio:>12}{r['fwd_nograd_ms']:>12.2f}{peak:>10}"
                     f"{r['largest_tensor_gib']:>13.3f}  {check}")
    return "\n".join(lines)


def cases(args) -> list[tuple[str, int | None, bool]]:
    out = []
    variants = [""] + ([] if args.no_entropy else ["+entropy"]) + ([] if args.no_frozen else ["+frozen-head"])
    for variant in variants:
        out.append(("unfused", None, variant))
        out += [("fused", c, variant) for c in args.chunks]
        if args.eager:
            out.append(("eager", args.chunks[len(args.chunks) // 2], variant))
    try:
        import liger_kernel  # noqa: F401

        out.append(("liger", None, ""))
    except ImportError:
        pass
    return out


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is visible (dry run)")
    p.add_argument("--tiny", action="store_true", help="512 tokens, vocab 1000, hidden 64, chunks 100,256")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--chunks", default="2048,4096,8192", help="tokens a chunk of the fused cases, comma-separated")
    p.add_argument("--no-entropy", action="store_true", help="skip the +entropy cases")
    p.add_argument("--no-frozen", action="store_true", help="skip the +frozen-head cases")
    p.add_argument("--no-eager", dest="eager", action="store_false",
                   help="skip the eager-C cases (the fused path without torch.compile, middle chunk size)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.tokens, args.vocab, args.hidden, args.chunks = 512, 1000, 64, "100,256"
    args.chunks = [int(c) for c in args.chunks.split(",")]
    return args


def main(argv=None) -> int:
    args = parse(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if cuda else "cpu")
    setup = {"event": "setup", "tokens": args.tokens, "vocab": args.vocab, "hidden": args.hidden,
             "dtype": args.dtype, "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
             "torch": torch.__version__, "warmup": args.warmup, "repeats": args.repeats}
    print(json.dumps(setup), flush=True)
    inputs = make_inputs(args, device)
    if not cuda:
        fused_head.COMPILED_ON = ()  # a dry run: no minutes of CPU compilation
    rows, reference, ok, t0 = [], {}, True, time.perf_counter()
    for name, chunk, variant in cases(args):
        row, outputs = run_case(name, chunk, variant, inputs, args, cuda)
        if name == "unfused":
            reference[variant] = outputs
        else:
            # liger is a peer: its differences are printed, only ours decide the exit code
            checked = self_check(row, outputs, reference.get(variant), getattr(torch, args.dtype))
            ok &= checked or name == "liger"
        del outputs
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"event": "done", "seconds": round(time.perf_counter() - t0, 1), "self_check_ok": ok}))
    print(table(rows))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"setup": setup, "rows": rows}, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
