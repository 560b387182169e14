"""Every manifest of tests/data/bad is refused by a real API server naming its field; every one of
tests/data/good and examples/ is accepted.

tests/unit/test_corpus_verdicts.py gives `rlkube validate`'s verdict on the same files and the
CRD's through a model of the API server (crd_checker); this test asks kube-apiserver itself, with
the committed CRD installed, by a server-side dry run (`dryRun=All`: defaulting, schema, CEL and
admission run, nothing is stored) with strict field validation, as `kubectl apply` sends it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from rlkube.operator import api
from rlkube.operator.cli import load_documents
from tests.cluster.api import ApiError
from tests.integration.operator_env import Env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# Keys written twice are rlkube validate's to refuse: the API server gets JSON built from the YAML,
# one value per key (tests/unit/test_corpus_verdicts.py).
BAD = sorted(path for path in (ROOT / "tests" / "data" / "bad").glob("*.yaml")
             if not path.stem.startswith("duplicate-key-"))
GOOD = sorted([*(ROOT / "tests" / "data" / "good").glob("*.yaml"), *(ROOT / "examples").glob("*.yaml")])
# Refused before any schema applies, so no field is named: the document is routed by apiVersion
# and kind, and the name is required first.
ROUTED = {"wrong-api-version", "wrong-kind", "name-missing"}


def expected_field(path: Path) -> str:
    return path.read_text(encoding="utf-8").splitlines()[0].removeprefix("# expect: ").strip()


@pytest.fixture(scope="module")
def namespace(control_plane):
    Env(control_plane.kubeconfig, control_plane.kubectl, "corpus").install_crd()
    name = f"corpus-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


def dry_run(control_plane, namespace: str, path: Path) -> str:
    """The API server's error on creating the file's RLTrainingJob, or '' when it accepts it."""
    doc = load_documents(path.read_text(encoding="utf-8"))[0]
    if isinstance(doc.get("metadata"), dict) and "namespace" in doc["metadata"]:
        doc["metadata"]["namespace"] = namespace  # examples name their own; the request's must match
    try:
        control_plane.api.post(
            f"/apis/{api.API_VERSION}/namespaces/{namespace}/rltrainingjobs?dryRun=All&fieldValidation=Strict", doc)
    except ApiError as exc:
        return str(exc)
    return ""


def test_the_api_server_refuses_every_bad_manifest_naming_its_field(control_plane, namespace):
    started, wrong = time.monotonic(), []
    for path in BAD:
        error, field = dry_run(control_plane, namespace, path), expected_field(path)
        # Schema errors carry the full path (spec.roles.actor.gpus); CEL rules on a parent object
        # carry its path and name the field at the start of their message.
        named = field in error or field.removeprefix("spec.") in error
        if not error or (path.stem not in ROUTED and not named):
            wrong.append(f"{path.name} (expect {field}): {error or 'accepted'}")
    print(f"{len(BAD)} bad manifests through the API server in {time.monotonic() - started:.1f} s")
    assert len(BAD) >= 100
    assert not wrong, "\n".join(wrong)


def test_the_api_server_accepts_every_good_manifest(control_plane, namespace):
    refused = [f"{path.name}: {error}" for path in GOOD if (error := dry_run(control_plane, namespace, path))]
    assert not refused, "\n".join(refused)
