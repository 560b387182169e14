"""The rules of `rlkube.operator.api.validation` that have both halves there: each Python
check gives the same verdict as its CEL twin in the CRD, over grids wider than the corpus
(tests/data/bad and good hold one manifest per case; test_corpus_verdicts runs them)."""

from __future__ import annotations

import itertools

import pytest
from crd_checker import admit, evaluate
from rltj_builders import REWARD_FUNCTION, job, roles

from rlkube.operator import api
from rlkube.operator.api import crd
from rlkube.operator.api.observed import JobRef
from rlkube.operator.api.validation import elastic
from rlkube.operator.api.validation.paths import RESERVED_VOLUME_NAMES, path_form_cel, path_form_problem
from rlkube.operator.planning.inventory import NodeInventory
from rlkube.operator.planning.placement import plan_placement, request_from_spec
from rlkube.operator.render import CompileCacheVolume, render

CRD = crd.crd_manifest()


def verdicts(doc: dict, path: str) -> tuple[bool, bool]:
    """(rlkube validate names `path`, the CRD names `path`) for the job `doc`."""
    ours = any(error.path == path for error in api.job_errors(doc))
    theirs = any(error.partition(": ")[0] == f".{path}" for error in admit(doc, CRD))
    return ours, theirs


@pytest.mark.parametrize("path", [
    "/", "/a", "/a/b", "/dev/shm", "/dev/shm/", "/a//b", "//a", "/a/", "/a/./b", "/a/../b", "/..", "/.",
    "/a/..b", "/a/b..", "/.hidden", "/a/...", "/a/.b/c",
    # CEL's '$' is the end of the text; Python's re also matched it before a final newline
    "/a/..\n", "/..\n", "/a/.\n/b",
])
def test_path_form_agrees_with_its_cel(path):
    problem = path_form_problem(path)
    assert (problem is None) == evaluate(path_form_cel("self"), {"self": path}), problem
    if problem:
        assert path_form_problem(problem.split("'")[1]) is None, "the suggested normal form is normal"


def test_the_normal_forms_users_mean():
    assert path_form_problem("/dev/shm/") is not None and "'/dev/shm'" in path_form_problem("/dev/shm/")
    assert "'/etc/rlkube'" in path_form_problem("/etc/rlkube/../rlkube")
    assert "'/a/b'" in path_form_problem("//a//b/")


def test_every_volume_the_pod_has_of_its_own_is_reserved():
    for checkpoint in ({}, {"volumeClaim": "ckpt"}):
        doc = job(checkpoint=checkpoint, volumes=[{"name": "weights", "claimName": "w", "mountPath": "/models"}])
        spec = api.parse_job(doc).spec
        nodes = [NodeInventory("n0", 8, 0, {"kubernetes.io/hostname": "n0"})]
        placement = plan_placement(request_from_spec(spec), nodes)
        # with every volume the cluster may add (the chart's compile cache)
        objects = render(JobRef("tiny", "default", "uid-1", {}), spec, placement, attempt=0,
                         cache=CompileCacheVolume("/var/cache/rlkube/compile", claim_name="cache"))
        own = {volume["name"] for obj in objects if obj["kind"] == "Pod" for volume in obj["spec"]["volumes"]}
        assert own - {"weights"} == set(RESERVED_VOLUME_NAMES)


@pytest.mark.parametrize("name", [*RESERVED_VOLUME_NAMES, "configs", "shm", "checkpoint"])
def test_reserved_volume_names_are_refused_by_both_at_the_volume(name):
    doc = job(volumes=[{"name": "a", "claimName": "a", "mountPath": "/a"},
                       {"name": name, "claimName": "b", "mountPath": "/b"}])
    reserved = name in RESERVED_VOLUME_NAMES
    assert verdicts(doc, "spec.volumes[1].name") == (reserved, reserved)


def _elastic(algorithm: str, batch: int, minis: int, per_pod: int, low: int, high: int) -> dict:
    reward = {"gpus": 0, "function": REWARD_FUNCTION}
    extra = {"critic": {"colocateWith": "actor"}} if algorithm == "ppo" else {}
    return job(
        algorithm=algorithm,
        roles=roles(actor={"gpus": low * per_pod}, reward=reward, **extra),
        placement={"gpusPerPod": per_pod},
        elastic={"minWorkers": low, "maxWorkers": high},
        batching={"globalBatch": batch},
        training={"miniBatches": minis},
    )


def test_elastic_sizes_agree_with_the_unrolled_cel():
    seen = {True: 0, False: 0}
    grid = itertools.product(["grpo", "ppo"], [12, 60, 840, 5040], [1, 2, 3], [1, 2], [1, 2, 3, 5], [0, 1, 3, 6, 21, 22, 30])
    for algorithm, batch, minis, per_pod, low, width in grid:
        doc = _elastic(algorithm, batch, minis, per_pod, low, low + width)
        ours, theirs = verdicts(doc, "spec.elastic")
        assert ours == theirs, (algorithm, batch, minis, per_pod, low, width)
        seen[ours] += 1
    assert min(seen.values()) > 50, seen  # the grid has both verdicts, many times


def test_elastic_dpo_has_no_split_rule():
    doc = job(roles=roles(actor={"gpus": 2}, reference={"colocateWith": "actor"}),
              elastic={"minWorkers": 1, "maxWorkers": 7}, batching={"globalBatch": 32})
    assert api.job_errors(doc) == [] and admit(doc, CRD) == []


def test_the_cel_unrolls_enough_sizes_for_the_field_bounds():
    # A range of ELASTIC_SIZES_CHECKED + 1 sizes needs a mini-batch of at least lcm(1..23) rows.
    assert elastic.MAX_ROWS_PER_STEP == 1_048_576 * 1024
    doc = _elastic("grpo", 232_792_560 // 4, 1, 1, 1, 22)  # lcm(1..22) rows: every size 1..22 splits them
    assert verdicts(doc, "spec.elastic") == (False, False)


CRITIC_LAYOUTS = [
    # (critic, reward, reference) of a PPO job whose actor has 1 GPU
    ({"colocateWith": "reward"}, {"gpus": 2, "model": {"path": "/r"}}, None),
    ({"colocateWith": "reward"}, {"gpus": 0, "function": REWARD_FUNCTION}, None),
    ({"colocateWith": "reward"}, {"colocateWith": "reference", "function": REWARD_FUNCTION}, {"gpus": 3}),
    ({"colocateWith": "reference"}, {"gpus": 0, "function": REWARD_FUNCTION}, {"gpus": 2}),
    ({"colocateWith": "reference"}, {"gpus": 0, "function": REWARD_FUNCTION}, {"colocateWith": "actor"}),
    ({"colocateWith": "actor"}, {"gpus": 4, "model": {"path": "/r"}}, None),
    ({"gpus": 2}, {"gpus": 0, "function": REWARD_FUNCTION}, None),
    ({"gpus": 0}, {"gpus": 2, "model": {"path": "/r"}}, None),
]


@pytest.mark.parametrize("layout", range(len(CRITIC_LAYOUTS)))
def test_a_colocated_critic_is_checked_on_the_gpus_it_runs_on(layout):
    critic, reward, reference = CRITIC_LAYOUTS[layout]
    parts = {"critic": critic, "reward": reward, **({"reference": reference} if reference else {})}
    for batch, minis in itertools.product([1, 2, 3, 4, 6, 12, 36], [1, 2, 3, 4, 6]):
        doc = job(algorithm="ppo", roles=roles(actor={"gpus": 1}, **parts), batching={"globalBatch": batch},
                  training={"miniBatches": minis}, placement={"gpusPerPod": 1})
        ours = {error.path for error in api.job_errors(doc)}
        theirs = {error.partition(": ")[0] for error in admit(doc, CRD)}
        assert ("spec.training" in ours or "spec.training.miniBatches" in ours) == (".spec.training" in theirs), (
            batch, minis, ours, theirs)
        spec = api.parse_spec(doc["spec"]) if not ours else None
        if spec is not None:  # accepted: the trainer's own start-up check (rl/trainer.py) passes too
            ranks = spec.device_map()
            rows = batch
            assert all(rows % len(members) == 0 for members in ranks.values())
            assert all((rows // minis) % len(ranks[role]) == 0 for role in ("actor", "critic"))
