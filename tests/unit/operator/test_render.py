"""Rendering: job + placement -> Service, ConfigMap, Pods (names, env, affinity, gates, volumes)."""

from __future__ import annotations

import pytest
import yaml
from operator_builders import spec

from rlkube.operator import render
from rlkube.operator.api import MAX_JOB_NAME_LEN, parse_spec
from rlkube.operator.api.observed import JobRef
from rlkube.operator.planning.placement import Placement, PodPlan
from rlkube.runtime.contract.config import RuntimeConfig

JOB = JobRef(name="tiny", namespace="team", uid="u-1")


def ppo_placement() -> Placement:
    # actor [0,1] colocated reference, critic [2], reward [3]; 2 GPUs per pod on two nodes.
    return Placement(
        pods=(PodPlan(0, "gpu-a", (0, 1), ("actor", "reference")), PodPlan(1, "gpu-b", (2, 3), ("critic", "reward"))),
        device_map={"actor": [0, 1], "critic": [2], "reward": [3], "reference": [0, 1]},
        domains={"actor": "kubernetes.io/hostname=gpu-a"},
        fallback=False,
        messages=(),
    )


def objects(job: JobRef = JOB, **overrides):
    s = parse_spec(spec("ppo", gpus_per_pod=2, **overrides))
    return s, render.render(job, s, ppo_placement(), attempt=3)


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_objects_and_deterministic_names():
    s, objs = objects()
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("Service", "tiny"), ("ConfigMap", "tiny-config"), ("Pod", "tiny-actor-0"), ("Pod", "tiny-critic-1"),
    ]
    assert render.pod_names("tiny", s) == ["tiny-actor-0", "tiny-critic-1"]
    assert objects()[1] == objs  # pure: same inputs, same objects


def test_longest_job_name_gives_dns_label_pod_names():
    name = "j" * MAX_JOB_NAME_LEN
    s = parse_spec(spec("ppo", roles={"actor": {"gpus": 1}, "critic": {"gpus": 1},
                                      "reward": {"gpus": 1, "model": {"path": "/models/reward"}},
                                      "reference": {"gpus": 1}}))
    for pod_name in render.pod_names(name, s):
        assert len(pod_name) <= 63
    assert render.pod_names(name, s)[-1].endswith("-reference-3")


def test_every_child_is_owned_and_labelled():
    _, objs = objects()
    for obj in objs:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "rlkube.io/v1alpha1", "kind": "RLTrainingJob", "name": "tiny", "uid": "u-1",
                       "controller": True, "blockOwnerDeletion": True}
        assert obj["metadata"]["labels"]["rlkube.io/job"] == "tiny"
        assert obj["metadata"]["namespace"] == "team"
    pod = objs[3]
    assert pod["metadata"]["labels"]["rlkube.io/attempt"] == "3"
    assert pod["metadata"]["labels"]["rlkube.io/pod-index"] == "1"


def test_headless_service_resolves_pods_before_ready():
    _, objs = objects()
    svc = objs[0]["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    # Pod 0 alone: its name is MASTER_ADDR, the only one resolved; no endpoint churn per pod.
    assert svc["selector"] == {"rlkube.io/job": "tiny", "rlkube.io/pod-index": "0"}
    assert [p["metadata"]["labels"]["rlkube.io/pod-index"] for p in objs[2:]][0] == "0"
    env0 = {e["name"]: e["value"] for e in objs[2]["spec"]["containers"][0]["env"]}
    assert env0["MASTER_ADDR"].startswith(f"{objs[2]['metadata']['name']}.tiny.")
    for pod in objs[2:]:
        assert pod["spec"]["hostname"] == pod["metadata"]["name"]
        assert pod["spec"]["subdomain"] == "tiny"


def test_env_follows_the_runtime_contract():
    _, objs = objects()
    e0, e1 = env_of(objs[2]), env_of(objs[3])
    assert e0["MASTER_ADDR"] == e1["MASTER_ADDR"] == "tiny-actor-0.tiny.team.svc"
    assert e0["MASTER_PORT"] == "29500"
    assert e0["WORLD_SIZE"] == e1["WORLD_SIZE"] == "4"
    assert (e0["RLKUBE_RANK_BASE"], e0["LOCAL_WORLD_SIZE"]) == ("0", "2")
    assert (e1["RLKUBE_RANK_BASE"], e1["LOCAL_WORLD_SIZE"]) == ("2", "2")
    assert e0["RLKUBE_CONFIG"] == "/etc/rlkube/run.yaml" and e0["RLKUBE_ATTEMPT"] == "3"
    # Nothing the runtime does not read: a pod's roles come from run.yaml's device map and its
    # ranks, its index and name from its labels and hostname (tests/unit/test_contract.py).
    for unread in ("NODE_RANK", "RLKUBE_LOCAL_ROLES", "RLKUBE_JOB", "POD_NAME"):
        assert unread not in e0 and unread not in e1
    assert objs[2]["spec"]["containers"][0]["command"] == ["python", "-m", "rlkube.runtime", "run", "/etc/rlkube/run.yaml"]


def test_configmap_is_the_runtime_config_with_device_map():
    s, objs = objects()
    text = objs[1]["data"]["run.yaml"]
    config = RuntimeConfig.model_validate(yaml.safe_load(text))
    assert config.device_map == {"actor": [0, 1], "critic": [2], "reward": [3], "reference": [0, 1]}
    assert config.algorithm == "ppo" and config.roles == s.roles
    assert "deviceMap:" in text and "device_map" not in text  # camelCase on the wire
    assert config.progress_port == 8080  # the port the operator probes and polls, not a default
    # tracker files and the data cache on the checkpoint volume, which the pod mounts: they outlive it
    assert config.output_dir == f"{s.checkpoint.dir.rstrip('/')}/output"
    mounts = objs[2]["spec"]["containers"][0]["volumeMounts"]
    assert any(config.output_dir.startswith(m["mountPath"].rstrip("/") + "/") for m in mounts if m["name"] == "checkpoints")


def test_pod_is_pinned_to_its_planned_node_with_gpus_and_gate():
    _, objs = objects()
    for pod, node in ((objs[2], "gpu-a"), (objs[3], "gpu-b")):
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        res = pod["spec"]["containers"][0]["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "2"
        assert pod["spec"]["schedulingGates"] == [{"name": "rlkube.io/gang"}]
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("overrides, labels, gated", [
    ({}, {}, True),
    ({"schedulerName": "volcano"}, {}, False),
    ({}, {"kueue.x-k8s.io/queue-name": "gpu"}, False),
    ({"schedulerName": "my-scheduler"}, {}, True),
])
def test_gate_is_left_to_volcano_and_kueue(overrides, labels, gated):
    s = parse_spec(spec("ppo", gpus_per_pod=2, **overrides))
    job = JobRef("tiny", "team", "u-1", labels=labels)
    pod = render.render_pod(job, s, ppo_placement(), ppo_placement().pods[0], 0)
    assert ("schedulingGates" in pod["spec"]) is gated
    if overrides.get("schedulerName"):
        assert pod["spec"]["schedulerName"] == overrides["schedulerName"]


def test_user_resources_selector_tolerations_and_classes():
    _, objs = objects(
        resources={"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        nodeSelector={"pool": "gpu"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        priorityClassName="training", serviceAccountName="trainer",
    )
    pod = objs[2]
    res = pod["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"}
    assert res["limits"] == {"memory": "8Gi", "nvidia.com/gpu": "2"}
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["spec"]["priorityClassName"] == "training" and pod["spec"]["serviceAccountName"] == "trainer"


def test_restricted_security_context_by_default():
    _, objs = objects()
    pod = objs[2]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False,
                                                       "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}


def test_security_override_root_drops_non_root_and_the_chown_init():
    _, objs = objects(securityContext={"runAsUser": 0})
    pod = objs[2]["spec"]
    assert pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    assert "initContainers" not in pod
    _, objs = objects(securityContext={"runAsUser": 2000, "fsGroup": 3000})
    ctx = objs[2]["spec"]["securityContext"]
    assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (2000, 2000, 3000)


def test_volumes_shm_config_and_host_checkpoints():
    _, objs = objects(checkpoint={"dir": "/ckpt"})
    pod = objs[2]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert vols["config"]["configMap"] == {"name": "tiny-config"}
    assert vols["checkpoints"]["hostPath"] == {"path": "/var/lib/rlkube/team/tiny-u-1", "type": "DirectoryOrCreate"}
    # a job re-created under the same name (a new UID) starts fresh instead of resuming
    _, again = objects(checkpoint={"dir": "/ckpt"}, job=JobRef(name="tiny", namespace="team", uid="u-2"))
    assert {v["name"]: v for v in again[2]["spec"]["volumes"]}["checkpoints"]["hostPath"]["path"].endswith("tiny-u-2")
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts == {"config": "/etc/rlkube", "dshm": "/dev/shm", "checkpoints": "/ckpt"}
    (init,) = pod["initContainers"]  # hostPath is created root-owned: hand it to uid 1000
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert "os.chown('/ckpt', 1000, 1000)" in init["command"][-1]


def test_checkpoint_claim_and_extra_volumes():
    _, objs = objects(checkpoint={"volumeClaim": "ckpts"},
                      volumes=[{"name": "weights", "mountPath": "/models", "claimName": "hf-cache"}])
    pod = objs[2]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpts"}
    assert vols["weights"]["persistentVolumeClaim"] == {"claimName": "hf-cache", "readOnly": True}
    assert "initContainers" not in pod
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["weights"] == {"name": "weights", "mountPath": "/models", "readOnly": True}


def test_the_clusters_compile_cache_volume_is_mounted_and_named_to_the_runtime():
    from rlkube.operator.lifecycle.decider import Decider
    from rlkube.operator.lifecycle.decision import Settings
    from rlkube.runtime.contract.pod import ENV_COMPILE_CACHE

    s = parse_spec(spec("ppo", gpus_per_pod=2))
    for cache, source in [
        (render.CompileCacheVolume("/var/cache/rlkube/compile", claim_name="compile-cache"),
         {"persistentVolumeClaim": {"claimName": "compile-cache"}}),
        (render.CompileCacheVolume("/cache", host_path="/var/lib/rlkube-compile"),
         {"hostPath": {"path": "/var/lib/rlkube-compile", "type": "DirectoryOrCreate"}}),
    ]:
        pods = render.render(JOB, s, ppo_placement(), attempt=3, cache=cache)[2:]
        for pod in pods:
            volume = {v["name"]: v for v in pod["spec"]["volumes"]}["rlkube-compile-cache"]
            assert volume == {"name": "rlkube-compile-cache", **source}
            mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
            assert mounts["rlkube-compile-cache"] == cache.mount_path
            assert env_of(pod)[ENV_COMPILE_CACHE] == cache.mount_path
    # none offered: no volume, no variable
    pod = render.render(JOB, s, ppo_placement(), attempt=3)[2]
    assert "rlkube-compile-cache" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert ENV_COMPILE_CACHE not in env_of(pod)
    # what the operator's settings offer
    assert Decider.compile_cache(type("D", (), {"settings": Settings()})()) is None
    offered = Decider.compile_cache(type("D", (), {"settings": Settings(compile_cache_claim="c")})())
    assert offered == render.CompileCacheVolume("/var/cache/rlkube/compile", claim_name="c")


def test_probes_on_healthz():
    _, objs = objects()
    container = objs[2]["spec"]["containers"][0]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert container["imagePullPolicy"] == "Never"
