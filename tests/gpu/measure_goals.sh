#!/usr/bin/env bash
# The open GPU goals' measurements (docs/benchmarks.md), in groups that each fit one device call
# of <= 10 minutes on an H200. Each command is bounded by `timeout`; JSON and logs go to OUT.
#
#   tests/gpu/measure_goals.sh OUT GROUP...      GROUP: util-dpo dpo-pair util-rl grpo-trl grpo-trl-llama profile profile-rl dpo-trl nvml
#                                                  plan-3b plan-7b-lora plan-before tail-restart env-pair
#                                                  startup-profile image-bytecode dpo-restart
#
# util-dpo  busy, tokens/s and start-up of the DPO CLI path (~3 min)
# dpo-pair  util-dpo, then bench_dpo.py on the same config (long-tailed, 32 pairs, 32k-token budget) in the
#           same call: the 'CLI within 10% of bench_dpo' goal from one machine (~5 min)
# util-rl   busy, tokens/s and start-up of GRPO and PPO with EOS on (median 48), RL training compiled under
#           auto (~5 min)
# grpo-trl  one GRPO step against TRL's GRPOTrainer, EOS on (median 48), auto vs off (~6 min)
# grpo-trl-llama  one GRPO step against TRL on the Llama-3.2-1B shape, equal lengths (its RL forwards lost
#           a host wait each on 2026-12-05: transformers' packed-sequence check) (~6 min)
# profile   torch.profiler over a DPO, a GRPO and a PPO step: where the idle time inside steps goes (~4 min)
# profile-rl  profile_step.py for GRPO and PPO only (~4 min)
# dpo-trl   DPO against TRL tuned (checkpointing off) on fixed lengths: the last 3% to 1.3x (~4 min)
# nvml      what NVML counts as busy: workloads of known busy fraction against nvidia-smi (~1 min)
# plan-3b   the memory plan's GRPO Qwen2.5-3B case on an 80 GB card (busy >= 0.90, no OOM) (~4 min)
# plan-7b-lora  GRPO with LoRA on the Qwen2.5-7B shape, 10 steps on one 80 GB card (~5 min)
# plan-before  DPO Qwen2.5-1.5B under the plan, then the runtime before the plan (BEFORE_RUNTIME: another
#           checkout's runtime/ folder, 7492f9c) on the same card (~4 min)
# tail-restart  GRPO, 60 steps, a checkpoint every 20, the page cache emptied first (root), then a restart
#           of 5 steps from the checkpoint and its compile cache: cold start, tail, exit, busy to exit (~7 min)
# env-pair  GRPO with a 100 ms verifier in process, then the same verifier as the reference environment on
#           loopback with 16 slots: the step's busy fraction both ways (~5 min)
# startup-profile  profile_startup.py: GRPO started, restarted, and restarted under cProfile; each run's
#           start-up split (restore included) and the profile's top functions (~3 min)
# dpo-restart  DPO, 20 steps, a checkpoint at 20, the page cache emptied first, then a restart of 3 steps
#           from it and its compile cache: the 15 s DPO restart goal (~3 min)
# image-bytecode  compile the bytecode of every installed package beside its sources, as the runtime
#           image has it (pip compiles at install; images/runtime/Dockerfile makes sure): run it before
#           the groups above on a host whose install has none, so a cold start imports as a pod does (~1 min)
#
# The GPU machine has torch and transformers but not the rest: download the wheels here into .whl/
# (kept out of git; carried to the machine with the working tree), for its Python 3.12:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection liger-kernel==0.8.5 trl==1.16.0 datasets dill multiprocess
# and there, before this script, into the interpreter itself (bench_utilization's CLI processes get
# a PYTHONPATH of their own, so a `pip install --target` directory on PYTHONPATH does not reach them):
#   python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
# Each group needs ~25 GB of free disk at the Qwen2.5-1.5B shape (model, checkpoints; the scripts
# remove theirs when they end).
set -u
out=${1:?usage: $0 OUT GROUP...}
shift
mkdir -p "$out"
export PYTHONPATH="$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

run() {  # run NAME SECONDS CMD...: one bounded measurement, its output kept
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    tail -n 25 "$out/$name.log"
}

for group in "$@"; do
    case $group in
    util-dpo)
        run util-dpo 280 python3 tests/gpu/bench_utilization.py --cases dpo --steps 45 --every 20 \
            --json-out "$out/util-dpo.json" ;;
    dpo-pair)
        run util-dpo 280 python3 tests/gpu/bench_utilization.py --cases dpo --steps 45 --every 20 \
            --json-out "$out/util-dpo.json"
        run bench-dpo-long 280 python3 tests/gpu/bench_dpo.py --shape qwen1.5b --cases longTailed --skip-trl \
            --steps 5 --warmup 2 --json-out "$out/bench-dpo-long.json" ;;
    util-rl)
        run util-rl 560 python3 tests/gpu/bench_utilization.py --cases grpo,ppo --steps 40 --every 20 \
            --eos-median 48 --json-out "$out/util-rl.json" ;;
    grpo-trl)
        run grpo-trl 560 python3 tests/gpu/bench_grpo.py --shape qwen1.5b --eos-median 48 --warmup 2 --steps 2 \
            --compile auto,off --out "$out/grpo-trl.json" ;;
    grpo-trl-llama)
        run grpo-trl-llama 560 python3 tests/gpu/bench_grpo.py --shape llama1b --warmup 2 --steps 2 \
            --compile auto --out "$out/grpo-trl-llama.json" ;;
    profile)
        for case in dpo grpo ppo; do
            run "profile-$case" 190 python3 tests/gpu/profile_step.py --case "$case"
        done ;;
    profile-rl)
        for case in grpo ppo; do
            run "profile-$case" 190 python3 tests/gpu/profile_step.py --case "$case"
        done ;;
    dpo-trl)
        run dpo-trl 560 python3 tests/gpu/bench_dpo.py --shape qwen1.5b --cases fixed --trl-checkpointing off \
            --json-out "$out/dpo-trl.json" ;;
    nvml)
        run nvml 120 python3 tests/gpu/probe_nvml.py --json-out "$out/nvml.json" ;;
    plan-3b)
        run plan-3b 420 python3 tests/gpu/bench_memory_plan.py --as-card-gib 79.65 --cases grpo-qwen3b \
            --json-out "$out/plan-3b.json" ;;
    plan-7b-lora)
        run plan-7b-lora 560 python3 tests/gpu/bench_memory_plan.py --as-card-gib 79.65 --cases grpo-qwen7b-lora \
            --case-timeout 540 --json-out "$out/plan-7b-lora.json" ;;
    plan-before)
        run plan-dpo-qwen 200 python3 tests/gpu/bench_memory_plan.py --as-card-gib 79.65 --cases dpo-qwen1.5b \
            --json-out "$out/plan-dpo-qwen.json"
        run plan-dpo-qwen-before 200 python3 tests/gpu/bench_memory_plan.py --as-card-gib 79.65 --cases dpo-qwen1.5b \
            --steps 12 --runtime "${BEFORE_RUNTIME:?BEFORE_RUNTIME: a checkout of the runtime before the plan}" \
            --json-out "$out/plan-dpo-qwen-before.json" ;;
    tail-restart)
        run tail-restart 560 python3 tests/gpu/bench_utilization.py --cases grpo --steps 60 --every 20 --restart 5 \
            --cold --json-out "$out/tail-restart.json" ;;
    env-pair)
        run env-in-process 270 python3 tests/gpu/bench_utilization.py --cases grpo --steps 6 --every 100 \
            --reward-ms 100 --json-out "$out/env-in-process.json"
        run env-remote 270 python3 tests/gpu/bench_utilization.py --cases grpo --steps 6 --every 100 \
            --reward-ms 100 --remote-env 16 --json-out "$out/env-remote.json" ;;
    startup-profile)
        run startup-profile 400 python3 tests/gpu/profile_startup.py "$out/startup-profile" --case grpo ;;
    dpo-restart)
        run dpo-restart 400 python3 tests/gpu/bench_utilization.py --cases dpo --steps 20 --every 20 --restart 3 \
            --cold --json-out "$out/dpo-restart.json" ;;
    image-bytecode)
        run image-bytecode 300 python3 -c 'import compileall, importlib.util, os, sysconfig
paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
for name in ("torch", "transformers", "sympy", "numpy"):  # wherever the host installed them
    spec = importlib.util.find_spec(name)
    if spec and spec.origin:
        paths.add(os.path.dirname(os.path.dirname(spec.origin)))
ok = all(compileall.compile_dir(p, quiet=1, workers=0) for p in sorted(paths) if os.path.isdir(p))
print("compiled", sorted(paths), "ok" if ok else "with errors (modules that do not compile on this Python)")' ;;
    *)
        echo "unknown group $group (util-dpo dpo-pair util-rl grpo-trl grpo-trl-llama profile profile-rl dpo-trl nvml plan-3b plan-7b-lora plan-before tail-restart env-pair startup-profile image-bytecode dpo-restart)" >&2
        exit 2 ;;
    esac
done
