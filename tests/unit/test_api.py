"""The RLTrainingJob API types: accepted specs, rejected specs with their paths, derived facts."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError
from rltj_builders import REWARD_FUNCTION, job, roles, spec

from rlkube.operator import api
from rlkube.operator.cli import load_documents
from rlkube.runtime.contract.config import RuntimeConfig

ROOT = Path(__file__).resolve().parents[2]


def paths(data: dict) -> list[str]:
    return [error.path for error in api.spec_errors(data)]


def messages(data: dict) -> list[str]:
    return [str(error) for error in api.spec_errors(data)]


@pytest.mark.parametrize("algorithm", ["dpo", "ppo", "grpo"])
def test_builder_specs_are_valid(algorithm):
    parsed = api.parse_spec(spec(algorithm))
    assert parsed.algorithm == algorithm
    assert parsed.placement.topology_keys == list(api.DEFAULT_TOPOLOGY_KEYS)
    assert parsed.run_policy.fail_on_exit_codes == [3, 4]


def test_device_map_and_pods_of_the_4_gpu_ppo_example():
    doc = load_documents((ROOT / "examples/ppo-7b-4gpu.yaml").read_text())[0]
    parsed = api.parse_job(doc).spec
    assert parsed.device_map() == {"actor": [0, 1], "critic": [2], "reward": [3], "reference": [0, 1]}
    assert (parsed.total_gpus(), parsed.pod_count()) == (4, 1)


def test_multinode_example_makes_two_pods_of_eight():
    parsed = api.parse_job(load_documents((ROOT / "examples/ppo-multinode.yaml").read_text())[0]).spec
    assert (parsed.total_gpus(), parsed.placement.gpus_per_pod, parsed.pod_count()) == (16, 8, 2)
    assert parsed.device_map()["reward"] == list(range(12, 16))


def test_runtime_config_round_trips_through_camel_case_yaml():
    parsed = api.parse_spec(spec("ppo"))
    config = parsed.runtime_config()
    wire = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert "deviceMap" in wire and "colocateWith" in wire["roles"]["reference"]
    again = RuntimeConfig.model_validate(wire)
    assert again.device_map == {"actor": [0, 1], "critic": [2], "reward": [3], "reference": [0, 1]}
    assert again.model_dump() == config.model_dump()


@pytest.mark.parametrize(
    "data, path, fragment",
    [
        (spec(roles=roles(actor={"gpus": 0})), "spec.roles.actor.gpus", ">= 1 (the actor trains and generates on GPUs of its own), got 0"),
        (spec(roles=roles(actor={"gpus": -2})), "spec.roles.actor.gpus", ">= 0, got -2"),
        (spec(roles=roles(actor={"gpus": 2}, judge={"gpus": 1})), "spec.roles.judge", "valid fields: actor"),
        (spec(roles=roles(actor={"gpus": 1}, reference={"colocateWith": "reference"})),
         "spec.roles.reference.colocateWith", "itself"),
        (spec(roles=roles(actor={"gpus": 1}, reference={"colocateWith": "critic"})),
         "spec.roles.reference.colocateWith", "must name a role that is set: got 'critic'"),
        (spec(roles=roles(actor={"gpus": 1}, critic={"gpus": 1})), "spec.roles.critic", "only ppo"),
        (spec("ppo", roles=roles(actor={"gpus": 1}, reward={"gpus": 0, "function": REWARD_FUNCTION})),
         "spec.roles.critic", "needs a critic"),
        (spec("grpo", roles=roles(actor={"gpus": 1})), "spec.roles.reward", "need a reward role (a model or a function), algorithm is grpo"),
        (spec("grpo", roles=roles(actor={"gpus": 1}, reward={"gpus": 1})), "spec.roles.reward", "function"),
        (spec("grpo", training={"kl": 0.1}, roles=roles(actor={"gpus": 1}, reward={"gpus": 0, "function": REWARD_FUNCTION})),
         "spec.training.kl", "needs roles.reference"),
        (spec("grpo", training={"groupSize": 1}), "spec.training.groupSize", "grpo needs >= 2 completions per prompt: advantages are rewards relative to the group's mean, so a "
         "group of one learns nothing (got 1)"),
        (spec("grpo", rollout={"temperature": 0.0}), "spec.rollout.temperature", "grpo needs > 0: greedy decoding makes every completion of a group the "
         "same, so every advantage is 0 (got 0)"),
        (spec("ppo", batching={"memoryFraction": 0.2}), "spec.batching.memoryFraction",
         "must be >= 0.3, got 0.2"),
        (spec("grpo", data={"source": "s", "format": "synthetic", "prefetch": 4}), "spec.data.prefetch",
         "accept only 2 or 0"),
        (spec(roles=roles(actor={"gpus": 3}), placement={"gpusPerPod": 2}),
         "spec.placement.gpusPerPod", "use one of [1, 3]"),
        (spec(elastic={"minWorkers": 2, "maxWorkers": 1}), "spec.elastic.maxWorkers", ">= minWorkers (2), got 1"),
        (spec(elastic={"minWorkers": 3, "maxWorkers": 3}), "spec.elastic.minWorkers", "job's 2 pods"),
        (spec(training={"lr": 0}), "spec.training.lr", "> 0"),
        (spec(training={"steps": 1.5}), "spec.training.steps", "integer"),
        (spec(model={"dtype": "float8", "config": {"model_type": "llama"}}), "spec.model.dtype", "one of"),
        (spec(model={"path": "/m", "config": {"model_type": "llama"}}), "spec.model", "exactly one of path"),
        (spec(runPolicy={"failOnExitCodes": [3, 3]}), "spec.runPolicy.failOnExitCodes", "repeat"),
        (spec(placement={"topologyKeys": []}), "spec.placement.topologyKeys", "at least 1"),
        (spec(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]), "spec.tolerations[0].value", "empty"),
        (spec(volumes=[{"name": "checkpoints", "hostPath": "/x", "mountPath": "/x"}]), "spec.volumes[0].name", "reserved"),
        (spec(resources={"limits": {"memory": "2 GB"}}), "spec.resources.limits.memory", "quantity"),
    ],
)
def test_rejected_with_path_and_what_is_valid(data, path, fragment):
    errors = api.spec_errors(data)
    assert [error.path for error in errors] == [path], errors
    assert fragment in errors[0].message


def test_a_colocation_cycle_is_reported_on_every_role_in_it_with_the_chain():
    errors = api.spec_errors(spec("ppo", roles=roles(actor={"gpus": 1}, critic={"colocateWith": "reward"},
                                                     reward={"colocateWith": "critic"})))
    assert [(error.path, error.message.rpartition(": ")[2]) for error in errors] == [
        ("spec.roles.critic.colocateWith", "critic -> reward -> critic"),
        ("spec.roles.reward.colocateWith", "reward -> critic -> reward"),
    ]
    assert all("must end at a role with gpus (no cycles)" in error.message for error in errors)


def test_every_field_error_is_reported_at_once():
    data = spec(training={"steps": 0, "lr": -1.0}, image=7, imagePullPolicy="Sometimes")
    assert sorted(paths(data)) == [
        "spec.image",
        "spec.imagePullPolicy",
        "spec.training.lr",
        "spec.training.steps",
    ]


def test_every_cross_field_problem_is_reported_at_once():
    data = spec(
        roles=roles(actor={"gpus": 3, "function": REWARD_FUNCTION}, critic={"gpus": 0}),
        placement={"gpusPerPod": 2},
    )
    assert paths(data) == ["spec.roles.critic", "spec.roles.actor.function", "spec.placement.gpusPerPod"]


def test_every_algorithm_setting_problem_is_reported_at_once():
    data = spec("grpo", training={"groupSize": 1}, rollout={"temperature": 0}, data={"source": "synthetic", "format": "synthetic", "prefetch": 8})
    assert paths(data) == ["spec.training.groupSize", "spec.rollout.temperature", "spec.data.prefetch"]


def test_dpo_only_fields_are_free_for_dpo():
    data = spec("dpo", batching={"mode": "fixed", "minMicroBatch": 2, "maxTokensPerGpu": 512, "memoryFraction": 0.5},
                data={"source": "s", "format": "synthetic", "prefetch": 9, "lengthMix": "longTailed", "packing": False})
    assert paths(data) == []


def test_parsing_is_strict_like_the_api_server():
    assert paths(spec(roles=roles(actor={"gpus": "2"}))) == ["spec.roles.actor.gpus"]
    assert paths(spec(roles=roles(actor={"gpus": True}))) == ["spec.roles.actor.gpus"]
    assert paths(spec(training={"lr": "1e-5"})) == ["spec.training.lr"]
    # Only the camelCase wire names: a snake_case key is an unknown field (the API server prunes it).
    assert paths(spec(roles=roles(actor={"gpus": 1}, reference={"colocate_with": "actor"}))) == [
        "spec.roles.reference.colocate_with"
    ]


def test_nulls_mean_unset_as_the_api_server_prunes_them():
    config = {"model_type": "llama", "rope_scaling": None}
    parsed = api.parse_spec(spec(placement=None, elastic=None, model={"config": config, "path": None}))
    assert parsed.placement.gpus_per_pod == 1 and parsed.elastic is None
    assert parsed.model.config == config  # free-form: kept as written
    assert paths(spec(image=None)) == ["spec.image"]


def test_unknown_field_suggests_the_closest_name():
    (error,) = api.spec_errors(spec(roles=roles(actor={"gpus": 1, "colocatewith": "critic"})))
    assert error.path == "spec.roles.actor.colocatewith"
    assert error.message.startswith("unknown field; did you mean 'colocateWith'? (valid fields: gpus,")


def test_scientific_notation_reads_as_a_number_as_kubectl_reads_it():
    (doc,) = load_documents("lr: 1e-5\nsteps: 10\nname: e5\n")
    assert doc == {"lr": 1e-5, "steps": 10, "name": "e5"}
    assert api.parse_spec(spec(training={"lr": doc["lr"]})).training.lr == 1e-5


@pytest.mark.parametrize(
    "name, ok",
    [
        ("a" * api.MAX_JOB_NAME_LEN, True),
        ("a" * (api.MAX_JOB_NAME_LEN + 1), False),
        ("dpo-7b", True),
        ("7b-dpo", False),  # the Service name must start with a letter
        ("dpo_7b", False),
        ("dpo-", False),
        ("Dpo", False),
    ],
)
def test_job_names(name, ok):
    errors = api.job_errors(job(name=name))
    assert (errors == []) is ok, errors
    if not ok:
        assert [error.path for error in errors] == ["metadata.name"]


def test_longest_derived_pod_name_fits_a_dns_label():
    longest_slot = max(["worker", *api.ROLE_NAMES], key=len)
    assert len(longest_slot) <= api.MAX_SLOT_NAME_LEN
    pod = f"{'a' * api.MAX_JOB_NAME_LEN}-{longest_slot}-{api.MAX_PODS - 1}"
    assert len(str(api.MAX_PODS - 1)) <= api.MAX_POD_INDEX_DIGITS
    assert len(pod) <= api.DNS_LABEL_MAX


def test_envelope_requires_api_version_and_kind():
    bad = job() | {"apiVersion": "rlkube.io/v1", "kind": "Job"}
    assert sorted(error.path for error in api.job_errors(bad)) == ["apiVersion", "kind"]


def test_status_dumps_camel_case_and_ignores_kopf_state():
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    status = api.RLTrainingJobStatus(
        phase="Running",
        conditions=[api.Condition(type="Placed", status="True", reason="Placed", last_transition_time=when)],
        observed_generation=2,
        gpus=4,
        placement=api.PlacementStatus(
            pods=[api.PodPlacementStatus(name="j-worker-0", index=0, node="n1", ranks=[0, 1, 2, 3],
                                         roles=["actor", "reference"])],
            device_map={"actor": [0, 1, 2, 3], "reference": [0, 1, 2, 3]},
        ),
        progress=api.ProgressStatus(step=3, total_steps=30, tokens_per_second=120.5),
        start_time=when,
    )
    wire = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert wire["placement"]["deviceMap"]["actor"] == [0, 1, 2, 3]
    assert wire["progress"] == {"step": 3, "totalSteps": 30, "tokensPerSecond": 120.5}
    again = api.RLTrainingJobStatus.model_validate(wire | {"kopf": {"progress": {}}})
    assert again == status
    with pytest.raises(ValidationError):
        api.RLTrainingJobStatus.model_validate({"phase": "Dancing"})

