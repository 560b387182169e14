"""`volumes`: the extra volumes mounted into every pod (model weights, data sets), each with its
rules: one source, a name the pod does not use itself, paths in normal form outside the config
mount, and a unique mountPath in the list.
"""

from __future__ import annotations

from pydantic import Field

from rlkube.operator.api.limits import DNS_LABEL_MAX, DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN
from rlkube.operator.api.validation.paths import (
    IN_CONFIG_DIR,
    NOT_NORMAL,
    RESERVED_VOLUME_NAMES,
    path_form_cel,
    path_form_problem,
    under_config_dir,
)
from rlkube.runtime.contract.pod import CONFIG_DIR
from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.rule import cel_entry as rule
from rlkube.runtime.contract.spec import MAX_NAME_LEN, MAX_PATH_LEN, Spec


def volume_problems(name: str, mount_path: str, host_path: str | None) -> list[str]:
    """One extra volume: a name the pod does not use itself, paths in normal form, the mount
    outside the config mount. Paths relative to the volume ('mountPath: ...')."""
    problems = []
    if name in RESERVED_VOLUME_NAMES:
        problems.append(f"name: {name!r} is reserved: the pod's own volumes are {', '.join(RESERVED_VOLUME_NAMES)}")
    for where, path in (("mountPath", mount_path), ("hostPath", host_path)):
        if path is not None and (problem := path_form_problem(path)) is not None:
            problems.append(f"{where}: {problem}")
    if under_config_dir(mount_path):
        problems.append(f"mountPath: {IN_CONFIG_DIR}")
    return problems


VOLUME_SOURCE = Rule("exactly one of claimName and hostPath must be set", "has(self.claimName) != has(self.hostPath)",
                     lambda v: when((v.claim_name is None) == (v.host_path is None)))


def volume_cel() -> list[dict]:
    """CEL on VolumeSpec: one source, and the twins of `volume_problems`."""
    names = " && ".join(f"self.name != '{name}'" for name in RESERVED_VOLUME_NAMES)
    return [
        VOLUME_SOURCE.crd(),
        rule(names, f"name: reserved: the pod's own volumes are {', '.join(RESERVED_VOLUME_NAMES)}", ".name"),
        rule(path_form_cel("self.mountPath"), f"mountPath: {NOT_NORMAL}", ".mountPath"),
        rule(f"!has(self.hostPath) || ({path_form_cel('self.hostPath')})", f"hostPath: {NOT_NORMAL}", ".hostPath"),
        rule(f"!self.mountPath.startsWith('{CONFIG_DIR}/')", f"mountPath: {IN_CONFIG_DIR}", ".mountPath"),
    ]


# The list of volumes: names are the list's map keys (unique, merge-friendly); mountPaths unique.
VOLUMES_CEL = [rule("self.all(v, self.exists_one(w, w.mountPath == v.mountPath))", "each mountPath must be unique")]


class VolumeSpec(Spec):
    """A volume mounted read-only or read-write into every pod (model weights, data sets)."""

    RULES = (VOLUME_SOURCE,)

    name: str = Field(
        max_length=DNS_LABEL_MAX, pattern=DNS_LABEL_PATTERN, description="Volume name (a DNS label)."
    )
    mount_path: str = Field(
        max_length=MAX_PATH_LEN, pattern=r"^/", description="Absolute path where it is mounted in the pod."
    )
    claim_name: str | None = Field(
        default=None, max_length=MAX_NAME_LEN, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim to mount. Exactly one of claimName and hostPath is set.",
    )
    host_path: str | None = Field(
        default=None, max_length=MAX_PATH_LEN, pattern=r"^/",
        description="Directory on the node to mount. Exactly one of claimName and hostPath is set.",
    )
    read_only: bool = Field(default=True, description="Mount read-only.")

    def problems(self) -> list[str]:
        return [*super().problems(), *volume_problems(self.name, self.mount_path, self.host_path)]
