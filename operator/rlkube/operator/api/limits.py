"""Identity and limits of the RLTrainingJob API: group, version and kind; the lengths and patterns
of the names, labels and quantities its fields hold; the most GPUs and pods a job may have.

Derived names: the job's pods are named `<job>-<slot>-<index>` and its headless Service `<job>`.
A pod's name is also its hostname under that Service, so it must be a DNS-1123 label (at most 63
characters). With slot names of at most 9 characters ("reference") and pod indexes of at most 5
digits (a job has at most 4 * 4096 GPUs), a job name of at most 40 characters leaves
63 - 40 - 1 - 9 - 1 - 5 = 7 characters spare for a restart-attempt suffix. The Service name must
be a DNS-1035 label, so the job name starts with a letter.
"""

from __future__ import annotations

import re

GROUP = "rlkube.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLTrainingJob"
LIST_KIND = "RLTrainingJobList"
PLURAL = "rltrainingjobs"
SINGULAR = "rltrainingjob"
SHORT_NAMES = ("rltj",)

# See the module docstring for how these add up to the 63-character DNS label of a pod name.
DNS_LABEL_MAX = 63
MAX_SLOT_NAME_LEN = 9
MAX_POD_INDEX_DIGITS = 5
MAX_JOB_NAME_LEN = 40
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
assert MAX_JOB_NAME_LEN + 1 + MAX_SLOT_NAME_LEN + 1 + MAX_POD_INDEX_DIGITS <= DNS_LABEL_MAX

DEFAULT_TOPOLOGY_KEYS = (
    "nvidia.com/gpu.clique",
    "kubernetes.io/hostname",
    "rlkube.io/rack",
    "topology.kubernetes.io/zone",
)
# A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_KEY_MAX = 317  # 253 (prefix) + 1 + 63 (name)
LABEL_VALUE_MAX = 63
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Kubernetes resource quantity, e.g. 500m, 2, 1.5, 16Gi, 1e3.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]+)?$"
QUANTITY_MAX_LEN = 64
MAX_GPUS_PER_POD = 64
MAX_PODS = 16384
MAX_TOTAL_GPUS = 4 * 4096


def job_name_problem(name: str) -> str | None:
    """Why `name` cannot be a job name (derived pod and Service names must be DNS labels), or None."""
    if len(name) > MAX_JOB_NAME_LEN:
        return (
            f"must be at most {MAX_JOB_NAME_LEN} characters, got {len(name)}: pods are named "
            f"<job>-<slot>-<index> and must fit a {DNS_LABEL_MAX}-character DNS label"
        )
    if not re.fullmatch(JOB_NAME_PATTERN, name):
        return (
            f"must be lower-case letters, digits and '-', start with a letter and end with a letter "
            f"or digit (it names the job's Service), got {name!r}"
        )
    return None
