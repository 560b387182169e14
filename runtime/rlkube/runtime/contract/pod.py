"""What a trainer pod is given and what it gives back: the operator<->runtime contract of one pod.

The operator renders these names into every pod (render.py); the runtime reads them (cli.py,
infra/launch.py, infra/distributed.py) and answers with an exit code the operator acts on.
- `OPERATOR_ENV`: every env variable the operator sets on every pod, `OPERATOR_ENV_OPTIONAL` those
  it sets where the job or the cluster asks for them (ENV_ENVIRONMENT_URL where the job has an
  environment, the compile cache where the chart mounts one); each one is read by the runtime (a
  unit test holds both sides to it). `RUNTIME_ENV`: set by launch.py or torchrun, not the operator.
- `CONFIG_PATH`: where run.yaml (a `RuntimeConfig`, from the job's ConfigMap) is mounted.
- Ports: `MASTER_PORT` (torch.distributed rendezvous on pod 0) and `PROGRESS_PORT` (HTTP on every
  pod: /healthz for the kubelet's probes; rank 0 also /progress for the operator, /metrics).
- Exit codes and what each means to the operator; the pod label keys it selects pods by.
docs/architecture.md ("The contract") draws the whole map; the /progress fields are in progress.py.
"""

from __future__ import annotations

# -- env variables --------------------------------------------------------------------------------

# Set by the operator on every trainer container.
ENV_MASTER_ADDR = "MASTER_ADDR"            # pod 0's DNS name under the job's headless Service
ENV_MASTER_PORT = "MASTER_PORT"            # its rendezvous port (MASTER_PORT below)
ENV_WORLD_SIZE = "WORLD_SIZE"              # the job's GPUs = trainer processes of the whole gang
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"  # trainer processes (GPUs) of this pod
ENV_RANK_BASE = "RLKUBE_RANK_BASE"         # global rank of this pod's first process
ENV_CONFIG = "RLKUBE_CONFIG"               # path of run.yaml (CONFIG_PATH)
ENV_ATTEMPT = "RLKUBE_ATTEMPT"             # gang restart attempt (also the pod label LABEL_ATTEMPT)
# Only on the pods of a job with roles.environment: the environment Service's URL, http://<name>.<ns>.svc:<port>
ENV_ENVIRONMENT_URL = "RLKUBE_ENVIRONMENT_URL"

OPERATOR_ENV: tuple[str, ...] = (
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_WORLD_SIZE,
    ENV_LOCAL_WORLD_SIZE,
    ENV_RANK_BASE,
    ENV_CONFIG,
    ENV_ATTEMPT,
    ENV_ENVIRONMENT_URL,
)

# Set by the operator only where its chart mounts a volume for torch.compile's caches into every
# trainer pod (values compileCache): the mount path, used when a job names no cache directory.
ENV_COMPILE_CACHE = "RLKUBE_COMPILE_CACHE"
OPERATOR_ENV_OPTIONAL: tuple[str, ...] = (ENV_COMPILE_CACHE,)

# Set per process by launch.py (a pod of several GPUs starts one worker per GPU) or by torchrun.
ENV_RANK = "RANK"
ENV_LOCAL_RANK = "LOCAL_RANK"

RUNTIME_ENV: tuple[str, ...] = (ENV_RANK, ENV_LOCAL_RANK)

# -- files and ports ------------------------------------------------------------------------------

CONFIG_DIR = "/etc/rlkube"
CONFIG_FILE = "run.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"

# torch's customary rendezvous port; the headless Service and each pod expose it as "dist".
MASTER_PORT = 29500
MASTER_PORT_NAME = "dist"
# One HTTP server per pod serves all three paths. The operator renders run.yaml with this port
# (`progressPort`), probes it and polls it; the runtime serves whatever run.yaml says.
PROGRESS_PORT = 8080
# The trainer's outputDir in a pod: this folder of checkpoint.dir (on the checkpoint volume).
OUTPUT_SUBDIR = "output"
PROGRESS_PORT_NAME = "http"
HEALTH_PATH = "/healthz"
PROGRESS_PATH = "/progress"
METRICS_PATH = "/metrics"

# -- exit codes -----------------------------------------------------------------------------------

EXIT_OK = 0
EXIT_CONFIG = 3
EXIT_NON_FINITE = 4
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended

EXIT_MEANINGS: dict[int, str] = {
    EXIT_OK: "finished",
    EXIT_CONFIG: "invalid config (permanent)",
    EXIT_NON_FINITE: "non-finite loss (permanent)",
    EXIT_TERMINATED: "stopped by SIGTERM after a checkpoint",
}
# Retrying cannot help these: the job's default runPolicy.failOnExitCodes. Any code not named in
# EXIT_MEANINGS is a crash, which the operator retries from the latest checkpoint.
PERMANENT_EXIT_CODES: tuple[int, ...] = (EXIT_CONFIG, EXIT_NON_FINITE)

# -- pod labels (set by the operator; it selects and tells apart a job's pods by them) ------------

LABEL_JOB = "rlkube.io/job"
LABEL_ATTEMPT = "rlkube.io/attempt"
LABEL_POD_INDEX = "rlkube.io/pod-index"
# On the environment's pods (roles.environment), value the job's name; its Deployment and Service
# select them by it. Not LABEL_JOB: the operator lists a job's trainer pods by that one.
LABEL_ENVIRONMENT = "rlkube.io/environment"
