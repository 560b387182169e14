"""Rank 0's progress report: the `/progress` JSON fields and where each lands in `status.progress`.

The runtime serves the report (infra/progress.py) on pod.PROGRESS_PORT at pod.PROGRESS_PATH, and
writes its last one as the container's termination message `{"progress": {...}}` when training
ends. The operator polls it (progress_client.py) or reads that message, and copies the fields of
`STATUS_PROGRESS` into `status.progress` (status.py; status_types.ProgressStatus is the schema);
the exported model and the run's summary go to `status.outputs` and `status.summary`.
Fields mapped to None are reported for people and logs only: the trainer's own stage (`phase`;
the job's phase is the operator's), the restart attempt it runs as (`status.attempt` is the
operator's), and the breakdowns behind `gpuUtilization` (per-phase busy and seconds), which change
every step and would only churn the job's status. The start-up split is copied: the start sets it,
the first step completes it, and then it stays. docs/architecture.md
("The contract") draws the whole map.
"""

from __future__ import annotations

# /progress JSON keys.
PHASE = "phase"                        # starting, training, succeeded, failed
STEP = "step"                          # optimizer steps done
TOTAL_STEPS = "totalSteps"             # optimizer steps the run will do
TOKENS_PER_SECOND = "tokensPerSecond"  # real (non-pad) tokens trained per second, whole job
STEP_SECONDS = "stepSeconds"           # wall seconds of the latest optimizer step (the pace of status' ETA)
MFU = "mfu"                            # model FLOPs utilization, 0..1
GPU_UTILIZATION = "gpuUtilization"     # GPU busy ratio, 0..1
LOSS = "loss"                          # training loss of the latest step
REWARD_MEAN = "rewardMean"             # mean rollout reward (DPO: chosen implicit reward)
ATTEMPT = "attempt"                    # gang restart attempt, from the pod's env (pod.ENV_ATTEMPT)
GPU_BUSY_PHASES = "gpuBusyPhases"      # {phase: GPU busy ratio 0..1 within it, mean over ranks}, last step
PHASE_SECONDS = "phaseSeconds"         # {phase: seconds rank 0 spent in it}, last step
STARTUP_SECONDS = "startupSeconds"     # {import, dataLoad, dataWait, modelLoad, restore, firstStep, compile, decodeCapture, total}
# The keys of STARTUP_SECONDS (infra/startup.startup_split), seconds each.
STARTUP_PARTS: tuple[str, ...] = ("import", "dataLoad", "dataWait", "modelLoad", "restore", "firstStep", "compile",
                                  "decodeCapture", "total")
OUTPUTS = "outputs"                    # {"model"/"adapter": {"path", "step"}}: the latest export (infra/export.py)
MEMORY_PLAN = "memoryPlan"             # one line: rank 0's GPU memory plan (terms in GiB, budgets), from the start
MEMORY_PLAN_MAX_CHARS = 1024
# The latest evaluation on the eval set (trainers/evaluation.py), each None before the first.
EVAL_STEP = "evalStep"                 # optimizer steps done when it ran
EVAL_LOSS = "evalLoss"                 # DPO/KTO: the training loss on the eval samples
EVAL_ACCURACY = "evalAccuracy"         # DPO/KTO: implicit-reward accuracy on the eval samples, 0..1
EVAL_MARGIN = "evalMargin"             # DPO/KTO: mean implicit-reward margin (chosen - rejected)
EVAL_REWARD_MEAN = "evalRewardMean"    # PPO/GRPO: mean reward of greedy completions (DPO/KTO: chosen reward)
SUMMARY = "summary"                    # {SUMMARY_FIELDS}: the run's summary, once it succeeded (trainers/summary.py)

# The trainer's stages, the values of PHASE.
PHASE_STARTING = "starting"
PHASE_TRAINING = "training"
PHASE_SUCCEEDED = "succeeded"
PHASE_FAILED = "failed"

# Every /progress field -> its status.progress field (camelCase), None where it is not copied.
STATUS_PROGRESS: dict[str, str | None] = {
    PHASE: None,
    STEP: "step",
    TOTAL_STEPS: "totalSteps",
    TOKENS_PER_SECOND: "tokensPerSecond",
    STEP_SECONDS: "stepSeconds",
    MFU: "mfu",
    GPU_UTILIZATION: "gpuUtilization",
    LOSS: "loss",
    REWARD_MEAN: "rewardMean",
    ATTEMPT: None,
    GPU_BUSY_PHASES: None,
    PHASE_SECONDS: None,
    STARTUP_SECONDS: "startupSeconds",
    EVAL_STEP: "evalStep",
    EVAL_LOSS: None,  # for people and /metrics; accuracy and reward say what a status needs
    EVAL_ACCURACY: "evalAccuracy",
    EVAL_MARGIN: None,
    EVAL_REWARD_MEAN: "evalRewardMean",
    OUTPUTS: None,  # not status.progress: copied whole into status.outputs (STATUS_OUTPUTS)
    MEMORY_PLAN: "memoryPlan",  # the operator also posts it as a MemoryPlan Event when it changes
    SUMMARY: None,  # not status.progress: copied into status.summary (STATUS_SUMMARY)
}
REPORT_FIELDS: tuple[str, ...] = tuple(STATUS_PROGRESS)
# The fields the operator reads from a report: the trainer's phase and those it copies.
PROGRESS_FIELDS: tuple[str, ...] = (PHASE, *(key for key, field in STATUS_PROGRESS.items() if field))

# What the run left for users, copied from a report into the job's status field of that name
# (status.py outputs_status; status_types.OutputsStatus); the operator posts an Event `Exported`
# when it changes. OUTPUT_MODEL is the Hugging Face directory of the trained actor.
STATUS_OUTPUTS = "outputs"
OUTPUT_MODEL = "model"
OUTPUT_ADAPTER = "adapter"  # a LoRA run's adapter (PEFT's format), for PeftModel.from_pretrained(base, path)
OUTPUT_PATH = "path"
OUTPUT_STEP = "step"

# The run's summary (trainers/summary.py: the summary event less its "event" and "load" lines), as a
# report carries it and the operator copies it into the job's status field of that name (status.py
# summary_status; status_types.SummaryStatus). Counts are integers, paths strings, the rest numbers;
# any may be null (not measured, or nothing of its kind: no export, no step).
STATUS_SUMMARY = "summary"
SUMMARY_COUNTS = ("steps", "firstStep", "lastStep", "tokens", "gpus")
SUMMARY_NUMBERS = ("wallSeconds", "startupSeconds", "trainingSeconds", "tailSeconds", "tokensPerSecondPerGpu",
                   "gpuBusyMean", "peakMemoryFraction", "peakMemoryGiB")
SUMMARY_PATHS = ("checkpoint", "model", "adapter")
SUMMARY_FIELDS: tuple[str, ...] = SUMMARY_COUNTS + SUMMARY_NUMBERS + SUMMARY_PATHS

# The termination message: the kubelet copies this file into the pod's status, where the operator
# finds the last report even when the run ended between two polls.
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_MAX_BYTES = 4096  # the kubelet keeps at most this much of it
TERMINATION_MESSAGE_KEY = "progress"
