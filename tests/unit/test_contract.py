"""The operator<->runtime contract (`rlkube.runtime.contract`): both sides use its names, and
nothing is set on a pod that the runtime does not read."""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path

import pytest
import yaml
from rltj_builders import ROLES, spec

from rlkube.operator import render
from rlkube.operator.api import ProgressStatus, parse_spec
from rlkube.operator.api.observed import JobRef
from rlkube.operator.planning.placement import Placement, PodPlan
from rlkube.operator.render.status import DERIVED_PROGRESS, progress_status
from rlkube.runtime.contract import pod, progress
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.contract.field_path import field_path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime" / "rlkube" / "runtime"
OPERATOR = ROOT / "operator" / "rlkube" / "operator"
CONTRACT = RUNTIME / "contract"


def rendered_pods(cache: render.CompileCacheVolume | None = None) -> list[dict]:
    """The two pods of a PPO job: actor+reference [0, 1] on one, critic [2] and reward [3] on the
    other; the job has an environment (its URL is set on the trainer pods); `cache`: the cluster's
    compile cache volume."""
    roles = {**ROLES["ppo"], "environment": {"image": "localhost/rlkube/environment:dev"}}
    job_spec = parse_spec(spec("ppo", placement={"gpusPerPod": 2}, roles=roles))
    placement = Placement(
        pods=(PodPlan(0, "gpu-a", (0, 1), ("actor", "reference")), PodPlan(1, "gpu-b", (2, 3), ("critic", "reward"))),
        device_map={"actor": [0, 1], "critic": [2], "reward": [3], "reference": [0, 1]},
        domains={},
        fallback=False,
        messages=(),
    )
    objs = render.render(JobRef(name="tiny", namespace="team", uid="u-1"), job_spec, placement, attempt=2, cache=cache)
    return objs


def sources(root: Path, skip: Path | None = None) -> list[tuple[Path, ast.Module]]:
    files = sorted(p for p in root.rglob("*.py") if skip is None or skip not in p.parents)
    return [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in files]


def contract_name(value: str) -> str:
    """The constant of `rlkube.runtime.contract.pod` that holds `value` (ENV_... for an env variable)."""
    names = [name for name, v in vars(pod).items() if name.isupper() and v == value]
    assert names, f"{value!r} is not a name of rlkube.runtime.contract.pod"
    return names[0]


def reads(tree: ast.Module, constant: str) -> bool:
    """`tree` uses `constant` in an expression (an import alone is no read)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == constant and isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.Attribute) and node.attr == constant:
            return True
    return False


def literals(tree: ast.Module) -> set[str]:
    """Every string constant of `tree` (docstrings are never equal to a bare name, so they pass)."""
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def env_names(objs: list[dict]) -> set[str]:
    return {
        env["name"]
        for p in objs if p["kind"] == "Pod"
        for container in (*p["spec"]["containers"], *p["spec"].get("initContainers", ()))
        for env in container.get("env", ())
    }


def test_every_env_var_on_a_pod_is_a_contract_name_read_by_the_runtime():
    assert env_names(rendered_pods()) == set(pod.OPERATOR_ENV)
    set_on_pods = env_names(rendered_pods(render.CompileCacheVolume("/cache", claim_name="c")))
    assert set_on_pods == {*pod.OPERATOR_ENV, *pod.OPERATOR_ENV_OPTIONAL}
    runtime = sources(RUNTIME, skip=CONTRACT)
    for name in sorted(set_on_pods):
        constant = contract_name(name)
        readers = [path.relative_to(ROOT) for path, tree in runtime if reads(tree, constant)]
        assert readers, f"the operator sets {name} on every pod, but nothing in runtime/ reads {constant}"


def test_no_file_outside_the_contract_spells_its_names():
    names = {*pod.OPERATOR_ENV, *pod.OPERATOR_ENV_OPTIONAL, *pod.RUNTIME_ENV, pod.CONFIG_PATH, pod.LABEL_JOB, pod.LABEL_ATTEMPT, pod.LABEL_POD_INDEX}
    found = {
        str(path.relative_to(ROOT)): sorted(names & literals(tree))
        for path, tree in (*sources(RUNTIME, skip=CONTRACT), *sources(OPERATOR))
    }
    assert {path: spelled for path, spelled in found.items() if spelled} == {}


def test_runtime_derives_each_process_roles_from_the_device_map():
    """What RLKUBE_LOCAL_ROLES used to carry: the roles of each local process of a pod, which the
    runtime reads from run.yaml's device map and its rank (RLKUBE_RANK_BASE + local rank)."""
    from rlkube.runtime.infra.distributed import DistContext

    objs = rendered_pods()
    config = RuntimeConfig.model_validate(yaml.safe_load(objs[1]["data"][pod.CONFIG_FILE]))
    roles = []
    for p in objs[2:]:
        env = {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]}
        base, local = int(env[pod.ENV_RANK_BASE]), int(env[pod.ENV_LOCAL_WORLD_SIZE])
        roles.append([
            sorted(DistContext(rank=base + i, world_size=4, role_ranks=config.device_map).roles_here())
            for i in range(local)
        ])
    assert roles == [[["actor", "reference"], ["actor", "reference"]], [["critic"], ["reward"]]]


def test_the_pods_serve_and_are_probed_on_the_contract_port():
    objs = rendered_pods()
    config = RuntimeConfig.model_validate(yaml.safe_load(objs[1]["data"][pod.CONFIG_FILE]))
    assert config.progress_port == pod.PROGRESS_PORT
    # A run.yaml without the field (a workstation's) serves on the same port.
    assert RuntimeConfig.model_fields["progress_port"].default == pod.PROGRESS_PORT
    container = objs[2]["spec"]["containers"][0]
    assert {"name": pod.PROGRESS_PORT_NAME, "containerPort": pod.PROGRESS_PORT, "protocol": "TCP"} in container["ports"]
    assert container["startupProbe"]["httpGet"] == {"path": pod.HEALTH_PATH, "port": pod.PROGRESS_PORT_NAME}
    assert container["command"][-1] == pod.CONFIG_PATH
    assert render.progress_port(parse_spec(spec("dpo"))) == pod.PROGRESS_PORT


def test_permanent_exit_codes_fail_the_job_by_default():
    assert parse_spec(spec("dpo")).run_policy.fail_on_exit_codes == list(pod.PERMANENT_EXIT_CODES)
    assert set(pod.PERMANENT_EXIT_CODES) < set(pod.EXIT_MEANINGS) and pod.EXIT_OK not in pod.PERMANENT_EXIT_CODES
    assert pod.EXIT_TERMINATED == 128 + 15  # SIGTERM, as the kubelet and a shell report it


def test_progress_fields_map_onto_status_progress():
    wire = {info.alias for info in ProgressStatus.model_fields.values()} - {"updatedAt", *DERIVED_PROGRESS}
    mapped = {field for field in progress.STATUS_PROGRESS.values() if field}
    assert mapped == wire  # every status.progress field is fed by one /progress field, and no more
    assert not set(DERIVED_PROGRESS) & mapped  # derived fields are the operator's, never copied
    assert set(progress.REPORT_FIELDS) == set(progress.STATUS_PROGRESS)
    report = {key: 1 for key in progress.REPORT_FIELDS} | {progress.PHASE: progress.PHASE_TRAINING,
                                                           progress.MEMORY_PLAN: "71.3 of 79.2 GiB: ...",
                                                           progress.STARTUP_SECONDS: {"total": 1.0}}
    written = progress_status(report, dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc), gpus=1)
    # the trainer's phase and its attempt stay out
    assert set(written) == mapped | {"updatedAt", *DERIVED_PROGRESS}


def test_the_runtime_reports_every_field_and_its_attempt(monkeypatch):
    from rlkube.runtime.infra.progress import Progress

    monkeypatch.setenv(pod.ENV_ATTEMPT, "4")
    snapshot = Progress(total_steps=10).snapshot()
    assert tuple(snapshot) == progress.REPORT_FIELDS
    assert snapshot[progress.ATTEMPT] == 4 and snapshot[progress.PHASE] == progress.PHASE_STARTING
    monkeypatch.delenv(pod.ENV_ATTEMPT)
    assert Progress(total_steps=10).snapshot()[progress.ATTEMPT] is None  # a workstation run


@pytest.mark.parametrize("loc, path", [
    (("spec", "tolerations", 0, "key"), "spec.tolerations[0].key"),
    ((), ""),
    (("roles", "actor", "gpus"), "roles.actor.gpus"),
    # pydantic's step for a validator function names no field
    (("training", "function-after[_check(), TrainingSpec]", "lr"), "training.lr"),
    (("spec", "nodeSelector", "function-x"), "spec.nodeSelector.function-x"),  # a user's key stays
])
def test_field_path(loc, path):
    assert field_path(loc) == path


def test_the_config_and_the_job_spec_take_the_registered_algorithms_in_order():
    from rlkube.operator.api.spec_types import RLTrainingJobSpec
    from rlkube.runtime.contract.algorithms import ALGORITHM_NAMES

    for model in (RuntimeConfig, RLTrainingJobSpec):
        assert model.model_json_schema()["properties"]["algorithm"]["enum"] == list(ALGORITHM_NAMES), model


def test_the_job_spec_and_the_config_share_one_declaration_of_the_sections():
    """The run's sections are declared once (`RunSections`); the job spec hands them to the
    trainer's config as they are, not copied field by field."""
    from rlkube.operator.api.spec_types import RLTrainingJobSpec
    from rlkube.runtime.contract.config import RunSections

    sections = list(RunSections.model_fields)
    assert list(RLTrainingJobSpec.model_fields)[: len(sections)] == sections
    assert list(RuntimeConfig.model_fields)[: len(sections)] == sections
    for model in (RLTrainingJobSpec, RuntimeConfig):
        assert all(repr(model.model_fields[name]) == repr(RunSections.model_fields[name]) for name in sections)
    job_spec = parse_spec(spec("ppo", placement={"gpusPerPod": 2}))
    config = job_spec.runtime_config()
    assert all(getattr(config, name) is getattr(job_spec, name) for name in sections)
