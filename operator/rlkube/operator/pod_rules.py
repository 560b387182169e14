"""Rules on what the spec puts into the rendered pods, each as a Python check and its CEL twin.

The API server validates a pod far more strictly than a CRD's schema says: a request above its
limit, a mount at a path another mount already holds, a label key with two slashes or a name part
longer than 63 characters, all come back as 422 only when the operator creates the pod, long
after `kubectl apply` said yes. These rules move those refusals to admission: the pydantic
validators of `spec_types` call the checks here (`rlkube validate`), and `crd_rules` puts the CEL
strings here into the CRD, so both say no to the same specs (tests/unit/test_corpus_verdicts.py).
tests/integration/test_render_fuzz.py found them by rendering what validation accepts and asking
the API server with a server-side dry run.
"""

from __future__ import annotations

import posixpath
import re
from decimal import Decimal, InvalidOperation

from rlkube.runtime.contract.pod import CONFIG_DIR

SHM_DIR = "/dev/shm"
# Paths the rendered pod mounts itself (run.yaml's ConfigMap, the shared-memory emptyDir); the
# checkpoint volume's path, checkpoint.dir, is the third reserved one.
RESERVED_MOUNT_PATHS = (CONFIG_DIR, SHM_DIR)
# Names of the volumes render.py gives every pod (run.yaml's ConfigMap, shared memory, the
# checkpoint store): a user volume of the same name would make the pod's volumes clash (422).
RESERVED_VOLUME_NAMES = ("config", "dshm", "checkpoints")

# A label key as the API server checks it (validation.IsQualifiedName): an optional DNS-subdomain
# prefix and '/', then a name of 1-63 characters, alphanumeric at both ends. No backslashes, so
# the same text serves as a CEL string literal.
LABEL_NAME = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_PREFIX = "[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY_REGEX = f"^({LABEL_PREFIX}/)?{LABEL_NAME}$"
LABEL_PREFIX_MAX = 253

_SUFFIXES = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]+)?$")


def quantity_value(text: str) -> Decimal | None:
    """The amount a Kubernetes quantity stands for ('500m' -> 0.5, '2Gi' -> 2147483648); None
    when `text` is not one (the field's own pattern reports that)."""
    match = _QUANTITY.match(text)
    if not match:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIXES[suffix]
    except (InvalidOperation, KeyError, ValueError):
        return None


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a valid label key, or None."""
    prefix, slash, _ = key.rpartition("/")
    if slash and len(prefix) > LABEL_PREFIX_MAX:
        return f"the prefix before '/' must be at most {LABEL_PREFIX_MAX} characters"
    if not re.match(LABEL_KEY_REGEX, key):
        return ("must be a label key: an optional DNS-subdomain prefix and '/', then a name of 1-63 "
                "characters (letters, digits, '-', '_', '.'), starting and ending alphanumeric")
    return None


def label_keys_cel() -> str:
    """CEL over a map: every key is a label key (the prefix length is left to the key's maxLength)."""
    return f"self.all(k, k.matches('{LABEL_KEY_REGEX}'))"


# -- resources: a request above its limit ---------------------------------------------------------

RESOURCE_FIELDS = (("cpu", "cpu"), ("memory", "memory"), ("ephemeral_storage", "ephemeralStorage"))


def request_above_limit(field: str, request: str | None, limit: str | None) -> str | None:
    """Why a request/limit pair is refused (the API server: request <= limit), or None."""
    if request is None or limit is None:
        return None
    req, lim = quantity_value(request), quantity_value(limit)
    if req is None or lim is None or req <= lim:
        return None
    return f"requests.{field}: must be <= limits.{field} ({limit}), got {request}"


def requests_within_limits_cel(field: str) -> str:
    """CEL on PodResources: the request of `field` is at most its limit, when both are set."""
    both = (f"has(self.requests) && has(self.requests.{field}) && "
            f"has(self.limits) && has(self.limits.{field})")
    return f"!({both}) || quantity(self.requests.{field}).compareTo(quantity(self.limits.{field})) <= 0"


# -- paths -----------------------------------------------------------------------------------------

# A path as the API server and the kubelet compare it: no empty, '.' or '..' segment and no
# trailing '/'. Mount paths are compared as written ('/dev/shm/' is not '/dev/shm' to the API
# server, yet both are the same directory in the container), so they must be written this way,
# and then comparing them as strings is comparing them normalised. No backslashes: CEL reads it.
_DOT_SEGMENT = "(^|/)[.][.]?(/|$)"


def path_form_problem(path: str) -> str | None:
    """Why the absolute `path` is not written in normal form, or None."""
    if "//" not in path and (path == "/" or not path.endswith("/")) and not re.search(_DOT_SEGMENT, path):
        return None
    normal = "/" + posixpath.normpath(path).lstrip("/")
    return f"must be written in normal form ({normal!r}): no '//', '.' or '..' segment and no trailing '/', got {path!r}"


def path_form_cel(value: str) -> str:
    """CEL: the string `value` is written in normal form (see path_form_problem)."""
    return (f"!{value}.contains('//') && ({value} == '/' || !{value}.endsWith('/')) && "
            f"!{value}.matches('{_DOT_SEGMENT}')")


def under_config_dir(path: str) -> bool:
    """`path` lies inside the read-only ConfigMap mount (a mount there could not be created)."""
    return path.startswith(CONFIG_DIR + "/")


def path_problems(checkpoint_dir: str, export_dir: str | None) -> list[str]:
    """checkpoint.dir and export.dir in normal form and outside the config mount (the volumes'
    own paths are VolumeSpec's to check)."""
    problems = []
    for where, path in (("checkpoint.dir", checkpoint_dir), ("export.dir", export_dir)):
        if path is None or not path.startswith("/"):
            continue  # unset, or refused as relative by mount_path_problems
        if (problem := path_form_problem(path)) is not None:
            problems.append(f"{where}: {problem}")
        elif under_config_dir(path):
            problems.append(f"{where}: must not be inside {CONFIG_DIR}, where the pod mounts run.yaml read-only")
    return problems


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
        problems.append(f"mountPath: must not be inside {CONFIG_DIR}, where the pod mounts run.yaml read-only")
    return problems


def volume_cel() -> list[tuple[str, str, str]]:
    """(rule, message, fieldPath) on VolumeSpec: the CEL twins of `volume_problems`."""
    names = " && ".join(f"self.name != '{name}'" for name in RESERVED_VOLUME_NAMES)
    return [
        (names, f"name: reserved: the pod's own volumes are {', '.join(RESERVED_VOLUME_NAMES)}", ".name"),
        (path_form_cel("self.mountPath"), "mountPath: must be written in normal form: no '//', '.' or '..' "
         "segment and no trailing '/'", ".mountPath"),
        (f"!has(self.hostPath) || ({path_form_cel('self.hostPath')})", "hostPath: must be written in normal "
         "form: no '//', '.' or '..' segment and no trailing '/'", ".hostPath"),
        (f"!self.mountPath.startsWith('{CONFIG_DIR}/')",
         f"mountPath: must not be inside {CONFIG_DIR}, where the pod mounts run.yaml read-only", ".mountPath"),
    ]


def dir_cel(field: str) -> list[tuple[str, str, str]]:
    """(rule, message, fieldPath) on CheckpointSpec / ExportSpec: `dir`, when absolute, in normal
    form and outside the config mount (the twins of `path_problems`)."""
    applies = "!has(self.dir) || !self.dir.startsWith('/') || "
    return [
        (applies + f"({path_form_cel('self.dir')})",
         f"{field}: must be written in normal form: no '//', '.' or '..' segment and no trailing '/'", ".dir"),
        (applies + f"!self.dir.startsWith('{CONFIG_DIR}/')",
         f"{field}: must not be inside {CONFIG_DIR}, where the pod mounts run.yaml read-only", ".dir"),
    ]


CHECKPOINT_DIR_CEL = "(has(self.checkpoint) && has(self.checkpoint.dir) ? self.checkpoint.dir : '/checkpoints')"


def mount_path_problems(checkpoint_dir: str, export_dir: str | None, mount_paths: list[str]) -> list[str]:
    """Paths the pod could not mount: a relative checkpoint or export dir, a checkpoint dir or an
    extra volume on a path the pod already mounts."""
    problems = []
    if not checkpoint_dir.startswith("/"):
        problems.append(f"checkpoint.dir: must be an absolute path, got {checkpoint_dir!r}")
    elif checkpoint_dir in RESERVED_MOUNT_PATHS:
        problems.append(f"checkpoint.dir: {checkpoint_dir} is reserved (the pod mounts "
                        f"{' and '.join(RESERVED_MOUNT_PATHS)} itself)")
    if export_dir is not None and not export_dir.startswith("/"):
        problems.append(f"export.dir: must be an absolute path, got {export_dir!r}")
    reserved = (*RESERVED_MOUNT_PATHS, checkpoint_dir)
    for index, path in enumerate(mount_paths):
        if path in reserved:
            problems.append(f"volumes[{index}].mountPath: {path} is reserved (the pod mounts run.yaml at "
                            f"{CONFIG_DIR}, shared memory at {SHM_DIR} and checkpoints at checkpoint.dir)")
    return problems


def mount_path_cel() -> list[tuple[str, str, str]]:
    """(rule, message, fieldPath) on the spec: the CEL twins of `mount_path_problems`."""
    ckpt = CHECKPOINT_DIR_CEL

    def outside(value: str, paths: tuple[str, ...]) -> str:
        return " && ".join(f"{value} != {path}" for path in paths)

    reserved = tuple(f"'{path}'" for path in RESERVED_MOUNT_PATHS)
    return [
        (f"{ckpt}.startsWith('/')", "checkpoint.dir: must be an absolute path", ".checkpoint"),
        (outside(ckpt, reserved),
         f"checkpoint.dir: {' and '.join(RESERVED_MOUNT_PATHS)} are reserved (the pod mounts them itself)",
         ".checkpoint"),
        ("!has(self.export) || !has(self.export.dir) || self.export.dir.startsWith('/')",
         "export.dir: must be an absolute path", ".export"),
        (f"!has(self.volumes) || self.volumes.all(v, {outside('v.mountPath', (*reserved, ckpt))})",
         f"volumes: a mountPath must not be {', '.join(RESERVED_MOUNT_PATHS)} or checkpoint.dir "
         "(the pod mounts run.yaml, shared memory and checkpoints there)", ".volumes"),
    ]


# -- security context ------------------------------------------------------------------------------

NON_ROOT_AS_ROOT = "runAsNonRoot: true contradicts runAsUser 0 (root); set a non-zero runAsUser or drop runAsNonRoot"
NON_ROOT_AS_ROOT_CEL = "!(has(self.runAsNonRoot) && self.runAsNonRoot && has(self.runAsUser) && self.runAsUser == 0)"
