"""One GRPO step, side by side in one run: rlkube's RL trainer vs TRL's GRPOTrainer (no vLLM).

On a machine with a CUDA GPU, from the repository root:
    pip install -e '.[runtime]' trl datasets      # docs/benchmarks.md names the versions measured
    PYTHONPATH=runtime python3 tests/gpu/bench_grpo.py
    PYTHONPATH=runtime python3 tests/gpu/bench_grpo.py --shape tiny --prompts 2 --group 4 --new-tokens 8 --steps 1  # CPU smoke

Same for both: a Qwen2.5-1.5B-shaped model from its config (random init), bf16 parameters, sdpa
attention, the same prompts (`--prompts` per step, 128 tokens each: byte ids for rlkube, the
same ids as words "w<id>" of a word-level tokenizer for TRL; `--prompt-min-tokens` gives them lengths
spread down to that, left-padded by both), `--group` completions per prompt,
up to 256 new tokens sampled at temperature 1 (EOS is the same id for both; a random model
almost never emits it), one optimizer step per rollout (TRL: num_iterations 1, no reference
model since its default beta is 0; rlkube: ppoEpochs 1, miniBatches 1, kl 0), the same cheap
rule-based reward. A step is everything: generation, reward, log-probs, loss, backward,
optimizer. TRL runs with its defaults otherwise (gradient checkpointing on, HF `generate` with
the dynamic cache); rlkube with its own defaults (CUDA-graph decoding, chunked log-prob head, no
gradient checkpointing, micro-batches of `--micro` rows).

Timed: steps after `--warmup` warm-up steps, wall time per step (CUDA synchronised).

Rollout decode rows (`--refill`, a comma list, one rlkube run each, TRL once): `all` decodes every
row of the step at once (rollout.decodeRows unset, the default); `on` / `off` stream the rows
through `--decode-rows` rows with refill on (a finished row takes the next waiting prompt) or off
(waves). A random model never ends a completion, so refill has nothing to do unless `--eos-median
M` is given: a forward hook on the LM head then sets the EOS logit of the sampled position so that
each step ends a completion with probability exactly h = 1 - 0.5 ** (1 / M) (geometric lengths,
median M), for both sides (tests/gpu/eos_hazard.py). A fixed EOS bias, used before, gave the
sides different lengths (1.5B shape, M 48: TRL mean 140-150 tokens, 30% at the limit; rlkube
66-69): a random model's logits are not flat, so the hazard it gave depended on the weights, and
the two models differed (rlkube initialises on the GPU, TRL's was built on the CPU); both now
build on the same device from the same seed. Training log-probs read the head's weight without
calling the module on both sides (rlkube's fused head, TRL's fused_lm_head), so they miss the EOS
setting; with one optimizer step per rollout the ratio is 1 either way, and only time is
measured. Example for both settings on the GPU:
    PYTHONPATH=runtime python3 tests/gpu/bench_grpo.py --only ours --refill all,on,off --decode-rows 32 --eos-median 64
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tests.gpu.bench_rollout import SHAPES  # noqa: E402
from tests.gpu.eos_hazard import eos_hazard  # noqa: E402
from tests.gpu.rollout_options import rollout_settings  # noqa: E402

BOS, PAD, EOS = 257, 256, 258


def prompt_texts(n: int, chars: int, seed: int, min_chars: int | None = None) -> list[str]:
    """n random prompts of `chars` characters, or of lengths uniform in [min_chars, chars]."""
    rng = random.Random(seed)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;"
    lengths = [chars if min_chars is None else rng.randint(min_chars, chars) for _ in range(n)]
    return ["".join(rng.choice(alphabet) for _ in range(length)) for length in lengths]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_ours(args, texts: list[str], rollout: dict | None = None, compile_mode: str = "auto") -> dict:
    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.infra.distributed import init_from_env
    from rlkube.runtime.trainers.rl import RLTrainer

    out = tempfile.mkdtemp(prefix="bench-grpo-ours-")
    data = os.path.join(out, "prompts.jsonl")
    with open(data, "w") as f:
        for t in texts:
            f.write(json.dumps({"prompt": t}) + "\n")
    cuda = torch.cuda.is_available()
    config = RuntimeConfig.model_validate({
        "algorithm": "grpo",
        "model": {"config": SHAPES[args.shape], "dtype": "bfloat16" if cuda else "float32", "attention": "sdpa",
                  "compile": compile_mode},
        "roles": {"actor": {"gpus": 1}, "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"}},
        "data": {"source": data, "format": "jsonl", "maxSeqLen": args.prompt_tokens + args.new_tokens},
        "batching": {"globalBatch": args.prompts, "maxMicroBatch": args.micro, "mode": "fixed"},
        "training": {"steps": args.warmup + args.steps, "lr": 1e-6, "groupSize": args.group, "kl": 0.0,
                     "ppoEpochs": 1, "miniBatches": 1, "seed": 0},
        "rollout": {"maxNewTokens": args.new_tokens, "temperature": 1.0, **(rollout or {})},
        "checkpoint": {"dir": os.path.join(out, "ckpt"), "everySteps": 10**6},
        "progressPort": 0,
        "outputDir": out,
    })
    t0 = time.perf_counter()
    trainer = RLTrainer(config, init_from_env({"actor": [0], "reward": [0]}))
    setup = time.perf_counter() - t0
    if args.eos_median:
        eos_hazard(trainer.actor.model.lm, EOS, args.eos_median)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    recs = [trainer.end_step(trainer.step(s)).log_line() for s in range(args.warmup + args.steps)]
    timed = recs[args.warmup:]
    keys = ("seconds", "generationSeconds", "scoringSeconds", "trainingSeconds", "reshardSeconds",
            "generationTokensPerSecond", "trainingTokensPerSecond", "mfu", "responseLengthMean",
            "decodeRowOccupancy", "gpuUtilization")
    summary = {k: statistics.median([r[k] for r in timed]) for k in keys if timed[0].get(k) is not None}
    summary["setup_s"] = setup
    summary["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    del trainer
    return summary


class _StepTimer:
    """A TrainerCallback recording wall time of each optimizer step (generation included)."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self
        self.times: list[float] = []

        class CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                sync()
                timer._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                sync()
                timer.times.append(time.perf_counter() - timer._t0)

        self.callback = CB()


def word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token=f"w{PAD}"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=f"w{PAD}", eos_token=f"w{EOS}",
                                   bos_token=f"w{BOS}", unk_token=f"w{PAD}")


def run_trl(args, texts: list[str]) -> dict:
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from rlkube.runtime.data.tokenizer import ByteTokenizer
    from rlkube.runtime.rewards import target_pattern

    cuda = torch.cuda.is_available()
    fields = dict(SHAPES[args.shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    dtype = torch.bfloat16 if cuda else torch.float32
    # Built the way rlkube builds its model (engine/models.py): on the device, from seed 0, so the
    # two sides start from the same weights (a CPU-built model draws from another generator).
    with torch.random.fork_rng(devices=[]), torch.device("cuda" if cuda else "cpu"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if args.eos_median:
        eos_hazard(model, EOS, args.eos_median)
    tok = word_tokenizer(config.vocab_size)
    byte = ByteTokenizer()
    # The same 128 token ids rlkube feeds (bos + bytes), spelled as words.
    prompts = [" ".join(f"w{i}" for i in [BOS] + byte.encode(t)) for t in texts]
    dataset = Dataset.from_dict({"prompt": prompts})

    def reward(completions, **kw):
        return [target_pattern("", c) for c in completions]

    out = tempfile.mkdtemp(prefix="bench-grpo-trl-")
    cfg = GRPOConfig(
        output_dir=out, per_device_train_batch_size=args.prompts * args.group, num_generations=args.group,
        gradient_accumulation_steps=1, max_completion_length=args.new_tokens, temperature=1.0,
        learning_rate=1e-6, max_steps=args.warmup + args.steps, logging_steps=1, report_to="none",
        save_strategy="no", bf16=cuda, use_cpu=not cuda, use_vllm=False, seed=0, dataloader_num_workers=0,
    )
    timer = _StepTimer()
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=dataset,
                          processing_class=tok, callbacks=[timer.callback])
    setup = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    timed = timer.times[args.warmup:]
    return {
        "seconds": statistics.median(timed), "setup_s": setup,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "gradient_checkpointing": cfg.gradient_checkpointing, "loss_type": cfg.loss_type, "beta": cfg.beta,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen1.5b", choices=sorted(SHAPES))
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--prompt-min-tokens", type=int, default=None,
                    help="prompts of lengths uniform in [this, --prompt-tokens] (left-padded) instead of all equal")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--micro", type=int, default=32, help="rlkube micro-batch rows")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", choices=["ours", "trl"], default=None)
    ap.add_argument("--refill", default="all",
                    help="rlkube runs, comma list of: all (every row at once), on / off (--decode-rows rows, "
                    "refill on or in waves)")
    ap.add_argument("--decode-rows", type=int, default=None, help="rollout.decodeRows of the on/off runs")
    ap.add_argument("--eos-median", type=float, default=None,
                    help="bias EOS so completions end at geometric lengths of this median (both sides)")
    ap.add_argument("--compile", default="auto", help="rlkube's model.compile, a comma list: one rlkube run each "
                    "(auto and layers score and train through compiled layers on one GPU, off compiles nothing; "
                    "give --warmup 2 for the dynamic-shape compile)")
    args = ap.parse_args(argv)

    n = args.prompts * (args.warmup + args.steps)
    shortest = None if args.prompt_min_tokens is None else args.prompt_min_tokens - 1
    texts = prompt_texts(n, args.prompt_tokens - 1, seed=0, min_chars=shortest)  # + bos = prompt_tokens
    import transformers

    setup = {"model": args.shape, "dtype": "bfloat16" if torch.cuda.is_available() else "float32",
             "attention": "sdpa", "prompts_per_step": args.prompts, "group": args.group,
             "prompt_tokens": args.prompt_tokens, "prompt_min_tokens": args.prompt_min_tokens, "new_tokens": args.new_tokens, "torch": torch.__version__,
             "transformers": transformers.__version__, "eos_median": args.eos_median, "compile": args.compile,
             "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    by_rollout = {}
    if args.only != "trl":
        modes = args.compile.split(",")
        for label, rollout in rollout_settings(args.refill, args.decode_rows):
            for mode in modes:
                key = label if len(modes) == 1 else f"{label} compile={mode}"
                by_rollout[key] = run_ours(args, texts, rollout, mode) | {"rollout": rollout, "compile": mode}
                print(json.dumps({"ours": key} | by_rollout[key]), flush=True)  # kept if the peer fails
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    ours = next(iter(by_rollout.values()), None)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trl = None
    if args.only != "ours":
        import trl as trl_pkg

        setup["trl"] = trl_pkg.__version__
        trl = run_trl(args, texts)
    rec = {"case": f"grpo step {args.prompts}x{args.group}", "ours": ours, "ours_by_rollout": by_rollout, "trl": trl,
           "ratio": (trl["seconds"] / ours["seconds"]) if ours and trl else None, "setup": setup}
    print(json.dumps(rec), flush=True)
    print("\n| case | ours s/step | TRL s/step | ratio | ours gen / score / train s | ours gen tok/s | ours peak GiB | TRL peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    if ours and trl:
        print(f"| {rec['case']} | {ours['seconds']:.2f} | {trl['seconds']:.2f} | {rec['ratio']:.2f}x | "
              f"{ours['generationSeconds']:.2f} / {ours['scoringSeconds']:.2f} / {ours['trainingSeconds']:.2f} | "
              f"{ours.get('generationTokensPerSecond', 0):,.0f} | {ours['peak_gib'] or 0:.1f} | {trl['peak_gib'] or 0:.1f} |")
    if len(by_rollout) > 1 or args.only == "ours":
        print("\n| rlkube rollout | s/step | generate s | gen tok/s | response length mean | decode row occupancy |"
              " GPU busy |")
        print("|---|---|---|---|---|---|---|")
        for label, r in by_rollout.items():
            print(f"| {label} | {r['seconds']:.3f} | {r['generationSeconds']:.3f} | "
                  f"{r.get('generationTokensPerSecond', 0):,.0f} | {r.get('responseLengthMean', 0):.1f} | "
                  f"{r.get('decodeRowOccupancy', 'n/a')} | {r.get('gpuUtilization', 'n/a')} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
