"""What each of the three validators says of one RLTrainingJob: pydantic (`rlkube validate`), the
CRD's schema and CEL rules (offline, crd_checker) and the runtime's own config model."""

from __future__ import annotations

from crd_checker import admit, names
from pydantic import ValidationError

from rlkube.operator import api
from rlkube.operator.api import crd
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.contract.field_path import field_path

CRD = crd.crd_manifest()
RUNTIME_SECTIONS = ("algorithm", "model", "roles", "data", "batching", "training", "rollout")


def three_verdicts(obj: dict) -> tuple[list[str], list[str], str]:
    """(pydantic's error paths, the CRD's errors, the runtime's errors as 'path: problem' lines or "")."""
    pydantic_paths = [error.path for error in api.job_errors(obj)]
    crd_errors = admit(obj, CRD)
    try:
        RuntimeConfig.model_validate({key: obj["spec"][key] for key in RUNTIME_SECTIONS if key in obj["spec"]})
        runtime_error = ""
    except ValidationError as exc:
        # A model validator's line may start with a path below its location ('model' and
        # 'config.vocab_size: ...'): joined, as `rlkube validate` joins them.
        runtime_error = "\n".join(
            ".".join(part for part in (field_path(error["loc"]), line) if part)
            for error in exc.errors()
            for line in error["msg"].removeprefix("Value error, ").splitlines()
        )
    return pydantic_paths, crd_errors, runtime_error


def assert_one_verdict(obj: dict, refused: str | None) -> None:
    """`obj` is accepted by pydantic, the CRD and the runtime (`refused` None), or refused by all
    three naming the field `refused` (a spec path, e.g. 'spec.rollout.decodeRows')."""
    pydantic_paths, crd_errors, runtime_error = three_verdicts(obj)
    if refused is None:
        assert (pydantic_paths, crd_errors, runtime_error) == ([], [], "")
    else:
        assert pydantic_paths == [refused]
        assert crd_errors and all(names(error, refused) for error in crd_errors), crd_errors
        assert refused.removeprefix("spec.") in runtime_error
