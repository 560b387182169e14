"""DPO training speed, side by side in one run: rlkube's trainer vs TRL's DPOTrainer.

On a machine with a CUDA GPU, from the repository root (the default --token-budget 32768 peaked
at 111 GiB on an H200 of 140 GiB; use a smaller budget on a smaller card):
    pip install -e '.[runtime]' trl datasets      # docs/benchmarks.md names the versions measured
    PYTHONPATH=runtime python3 tests/gpu/bench_dpo.py            # Qwen2.5-1.5B shape, both regimes
    PYTHONPATH=runtime python3 tests/gpu/bench_dpo.py --cases fixed   # one regime (or longTailed)
    PYTHONPATH=runtime python3 tests/gpu/bench_dpo.py --shape tiny --steps 2 --warmup 1   # CPU smoke

Same for both: a Qwen2.5-1.5B-shaped model from its config (random init: speed does not depend
on weight values), bf16 parameters, sdpa attention, the same synthetic pairs (same seed, same
token counts; TRL sees them through a word-level tokenizer "w0".."w255" mapping each byte token
to one word), the same pairs per optimizer step. Two regimes: fixed lengths (every sequence
maxSeqLen) and long-tailed lengths (log-normal, median ~300, tail past 2,000, capped at 4,096).

Measured over the timed steps after warm-up: tokens/s of real (non-pad) tokens each trainer
processed, MFU from the FLOPs the step *needs* (rlkube.runtime.infra.metrics.FlopModel, same formula
for both) against 989 TFLOP/s (H100/H200 datasheet bf16 dense) and against the bf16 matmul ceiling
measured on the card at the start of the run (`measure_peak`: ~800 TFLOP/s on an H200 in earlier
runs; setup.measured_peak_tflops), peak memory, set-up time.
TRL runs twice per case: its defaults (gradient checkpointing on) and tuned as a user with an H200
sets it (checkpointing off); both pad to the batch's longest, and the ratio is against the faster.
rlkube runs once per `--ours` attention setting (auto: flex_attention packing on CUDA without
flash-attn; sdpa: one sequence a row, grouped by length), with a token budget, no gradient
checkpointing; the loss of every step is printed for each, so two settings can be compared.
Prints one JSON object per case, then a table.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_shapes import SHAPES  # noqa: E402

PEAK_DATASHEET = 989e12
# The card's bf16 matmul ceiling, measured once at the start of the run (main); None on CPU.
PEAK_MEASURED: float | None = None


def measure_peak(reps: int = 50) -> float | None:
    """The best bf16 matmul rate (FLOP/s) of this card over square and wide matmuls of sizes an
    MFU is read against, timed with CUDA events after a warm-up; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    best = 0.0
    for m, k, n in ((8192, 8192, 8192), (16384, 8192, 8192), (8192, 16384, 8192)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            a @ b
        end.record()
        end.synchronize()
        best = max(best, 2 * m * k * n * reps / (start.elapsed_time(end) / 1e3))
        del a, b
    torch.cuda.empty_cache()
    return best


def of_measured_peak(flops_per_second: float | None) -> float | None:
    return flops_per_second / PEAK_MEASURED if flops_per_second and PEAK_MEASURED else None


def runtime_config(args, case: dict, out: str, attention: str = "auto", compile_mode: str = "auto"):
    from rlkube.runtime.contract.config import RuntimeConfig

    cuda = torch.cuda.is_available()
    return RuntimeConfig.model_validate({
        "algorithm": "dpo",
        "model": {"config": SHAPES[args.shape], "dtype": "bfloat16" if cuda else "float32", "attention": attention,
                  "compile": compile_mode},
        "roles": {"actor": {"gpus": 1}, "reference": {"colocateWith": "actor"}},
        "data": {"source": "bench", "format": "synthetic", "numSamples": args.global_batch * (args.warmup + args.steps),
                 "maxSeqLen": case["max_len"], "lengthMix": case["mix"], "seed": args.seed},
        "batching": {"globalBatch": args.global_batch, "maxTokensPerGpu": args.token_budget, "maxMicroBatch": 4096},
        "training": {"steps": args.warmup + args.steps, "lr": 1e-6, "seed": args.seed},
        "checkpoint": {"dir": os.path.join(out, "ckpt"), "everySteps": 10**6},
        "progressPort": 0,
        "outputDir": out,
    })


def run_ours(args, case: dict, setting: str) -> dict:
    """One run of ours; `setting` is a model.attention value, optionally '+' a model.compile value
    ('auto', 'sdpa+off')."""
    from rlkube.runtime.infra.distributed import init_from_env
    from rlkube.runtime.trainers.dpo import DPOTrainer

    attention, _, compile_mode = setting.partition("+")
    out = tempfile.mkdtemp(prefix="bench-ours-")
    t0 = time.perf_counter()
    config = runtime_config(args, case, out, attention, compile_mode or "auto")
    trainer = DPOTrainer(config, init_from_env({"actor": [0], "reference": [0]}))
    setup = time.perf_counter() - t0
    recs = [trainer.end_step(trainer.step(s)).log_line() for s in range(args.warmup + args.steps)]
    timed = recs[args.warmup:]
    seconds = sum(r["seconds"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    mfu = [r["mfu"] for r in timed if r["mfu"] is not None]
    # MFU of the timed window: needed FLOPs / time (per-step MFUs weighted by their time)
    window_mfu = sum(m * r["seconds"] for m, r in zip(mfu, timed, strict=False)) / seconds if mfu else None
    peak = max((r["peakMemoryFraction"] or 0) for r in recs)
    total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0
    res = {
        "tokens_per_s": tokens / seconds,
        "mfu_datasheet": window_mfu * trainer.peak / PEAK_DATASHEET if window_mfu else None,
        "mfu_measured_peak": of_measured_peak(window_mfu * trainer.peak if window_mfu else None),
        "peak_memory_gib": peak * total / 2**30,
        "setup_s": setup,
        "step_s": [r["seconds"] for r in timed],
        "warmup_step_s": [r["seconds"] for r in recs[:args.warmup]],  # compiles are paid here
        "compiled": trainer.compiled,
        "micro_batches": [r["microBatches"] for r in timed],
        "attention": trainer.attention,
        "loss": [r["loss"] for r in recs],
    }
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return res


def pair_flops_per_pair(args, case: dict) -> float:
    """Mean FLOPs one pair needs (FlopModel over the dataset), for TRL's MFU."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlkube.runtime.data.preferences import tokenise_pairs
    from rlkube.runtime.data.synthetic import synthetic_pairs
    from rlkube.runtime.data.tokenizer import ByteTokenizer
    from rlkube.runtime.infra.metrics import FlopModel

    fields = dict(SHAPES[args.shape])
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    fm = FlopModel.of(lm)
    n = args.global_batch * (args.warmup + args.steps)
    pairs = synthetic_pairs(n, case["max_len"], case["mix"], args.seed)
    data = tokenise_pairs([(p.prompt, p.chosen, p.rejected) for p in pairs], ByteTokenizer(), case["max_len"])
    total = 0.0
    for i in range(len(data)):
        c, r = data.seq_lengths(i)
        total += fm.dpo_step_flops([c, r], len(data.chosen[i]) + len(data.rejected[i]) + 2)
    return total / n


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(256)}
    vocab.update({"<pad>": 256, "<bos>": 257, "</s>": 258})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<bos>")


def run_trl(args, case: dict, batch: int, checkpointing: bool) -> dict:
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from rlkube.runtime.data.synthetic import synthetic_pairs

    n = args.global_batch * (args.warmup + args.steps)
    words = lambda text: "".join(f"w{b} " for b in text.encode())  # noqa: E731  (trailing space: TRL appends "</s>")
    pairs = synthetic_pairs(n, case["max_len"], case["mix"], args.seed)
    ds = Dataset.from_list([{"prompt": words(p.prompt), "chosen": words(p.chosen), "rejected": words(p.rejected)}
                            for p in pairs])
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    fields = dict(SHAPES[args.shape])
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    with torch.device("cuda" if cuda else "cpu"):  # initialised on the GPU, as ours is
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields),
                                                 dtype=dtype, attn_implementation="sdpa")
    ref = copy.deepcopy(model).eval()
    times: list[float] = []
    tokens: list[int] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)
            tokens.append(counter.tokens)

    class CountingDPOTrainer(DPOTrainer):
        tokens = 0

        def compute_loss(self, model, inputs, *a, **kw):
            CountingDPOTrainer.tokens += int(inputs["attention_mask"].sum())
            return super().compute_loss(model, inputs, *a, **kw)

    counter = CountingDPOTrainer
    cfg = DPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), per_device_train_batch_size=batch,
        gradient_accumulation_steps=args.global_batch // batch, max_steps=args.warmup + args.steps,
        max_length=case["max_len"] + 2, logging_steps=10**6, save_strategy="no", report_to="none",
        bf16=cuda, seed=args.seed, dataloader_num_workers=0, use_cpu=not cuda,
        gradient_checkpointing=checkpointing,
    )
    trainer = CountingDPOTrainer(model=model, ref_model=ref, args=cfg, train_dataset=ds,
                                 processing_class=word_tokenizer(), callbacks=[Timer()])
    setup = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    step_tokens = [b - a for a, b in zip([0, *tokens[:-1]], tokens, strict=True)]
    seconds = sum(times[args.warmup:])
    res = {
        "tokens_per_s": sum(step_tokens[args.warmup:]) / seconds,
        "seconds_timed": seconds,
        "peak_memory_gib": peak,
        "setup_s": setup,
        "step_s": times[args.warmup:],
        "per_device_batch": batch,
        "gradient_checkpointing": cfg.gradient_checkpointing,
    }
    if cuda:
        flops = pair_flops_per_pair(args, case) * args.global_batch * args.steps
        res["mfu_datasheet"] = flops / seconds / PEAK_DATASHEET
        res["mfu_measured_peak"] = of_measured_peak(flops / seconds)
    del trainer, model, ref
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return res


def trl_with_backoff(args, case: dict, checkpointing: bool) -> dict:
    """TRL at the largest per-device batch (from --trl-batch down) that fits in memory."""
    batch = args.trl_batch
    while True:
        try:
            return run_trl(args, case, batch, checkpointing)
        except torch.OutOfMemoryError:
            gc.collect()
            torch.cuda.empty_cache()
            if batch == 1:
                return {"error": "out of memory at per-device batch 1"}
            batch //= 2
        except Exception as e:  # report the peer's failure, keep our numbers
            return {"error": repr(e)[:2000]}


def versions() -> dict:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import trl

        out["trl"] = trl.__version__
    except ImportError:
        out["trl"] = None
    out["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen1.5b", choices=sorted(SHAPES))
    p.add_argument("--cases", default="fixed,longTailed")
    p.add_argument("--global-batch", type=int, default=32, help="pairs per optimizer step")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--fixed-len", type=int, default=1024)
    p.add_argument("--long-len", type=int, default=4096)
    p.add_argument("--token-budget", type=int, default=32768)
    p.add_argument("--trl-batch", type=int, default=8, help="TRL per-device batch (pairs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--ours", default="auto",
                   help="settings to run ours with: model.attention[+model.compile], e.g. auto,auto+off,sdpa")
    p.add_argument("--trl-checkpointing", default="on,off",
                   help="TRL's gradient checkpointing settings to run (its default is on; off is tuned)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    global PEAK_MEASURED
    PEAK_MEASURED = measure_peak()
    cases = {"fixed": {"mix": "fixed", "max_len": args.fixed_len},
             "longTailed": {"mix": "longTailed", "max_len": args.long_len}}
    results = []
    for name in args.cases.split(","):
        case = cases[name]
        row = {"case": name, "setup": {"shape": args.shape, "model": SHAPES[args.shape], "pairs_per_step": args.global_batch,
               "max_len": case["max_len"], "length_mix": case["mix"], "dtype": "bfloat16", "timed_steps": args.steps,
               "warmup_steps": args.warmup, "token_budget": args.token_budget, **versions(),
               "measured_peak_tflops": round(PEAK_MEASURED / 1e12, 1) if PEAK_MEASURED else None}}
        for setting in args.ours.split(","):
            row[f"ours_{setting}"] = run_ours(args, case, setting)
        row["ours"] = max((v for k, v in row.items() if k.startswith("ours_")), key=lambda r: r["tokens_per_s"])
        if not args.skip_trl:
            for mode in args.trl_checkpointing.split(","):
                row[f"trl_gc_{mode}"] = trl_with_backoff(args, case, mode == "on")
            measured = [v for k, v in row.items() if k.startswith("trl_gc_") and "tokens_per_s" in v]
            if measured:  # the ratio is against the stronger TRL setting of this run
                row["trl"] = max(measured, key=lambda r: r["tokens_per_s"])
                row["ratio"] = row["ours"]["tokens_per_s"] / row["trl"]["tokens_per_s"]
        print(json.dumps(row), flush=True)
        results.append(row)
    print()
    print(f"{'case':<11} {'ours tok/s':>11} {'TRL tok/s':>10} {'ratio':>6} {'MFU ours':>9} {'MFU TRL':>8} "
          f"{'mem ours':>9} {'mem TRL':>8}   (MFU vs measured "
          f"{PEAK_MEASURED / 1e12 if PEAK_MEASURED else float('nan'):.0f} TF on this card / datasheet 989 TF)")
    for r in results:
        o, t = r["ours"], r.get("trl", {})
        f = lambda v, spec="{:.0f}": "-" if v is None else spec.format(v)  # noqa: E731
        mfu = lambda d: "-" if d.get("mfu_measured_peak") is None else (  # noqa: E731
            f"{d['mfu_measured_peak']:.0%}/{d['mfu_datasheet']:.0%}")
        print(f"{r['case']:<11} {f(o['tokens_per_s']):>11} {f(t.get('tokens_per_s')):>10} "
              f"{f(r.get('ratio'), '{:.2f}x'):>6} {mfu(o):>9} {mfu(t):>8} "
              f"{f(o['peak_memory_gib'], '{:.1f}G'):>9} {f(t.get('peak_memory_gib'), '{:.1f}G'):>8}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
