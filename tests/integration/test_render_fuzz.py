"""Render fuzzer: whatever `rlkube validate` accepts renders into objects the API server accepts.

Hypothesis draws RLTrainingJob specs that vary what reaches the pods (job name, roles and GPUs,
gpusPerPod, resources, nodeSelector, tolerations, security context, volumes, checkpoint store,
scheduler, priority class, service account, image). A spec that `api.job_errors` refuses is
also created as an RLTrainingJob with dry-run, so the CRD's verdict must match; every accepted one is planned on fake nodes, rendered, and each object (Service,
ConfigMap, every Pod) is created with server-side dry-run (`dryRun=All`): the real API server
runs defaulting, validation and admission, and stores nothing. A 422 there means validation let
a mistake through to the pod (or render wrote something wrong): the test fails naming the field.

Bounded: MAX_EXAMPLES examples, and the whole run stops drawing after DEADLINE_S seconds.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlkube.operator import api
from rlkube.operator.api.observed import JobRef
from rlkube.operator.planning.inventory import NodeInventory
from rlkube.operator.planning.placement import plan_placement, request_from_spec
from rlkube.operator.render import render
from tests.cluster.api import ApiError
from tests.integration.operator_env import Env
from tests.unit.rltj_builders import TINY_CONFIG

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 120
DEADLINE_S = 45.0
PRIORITY_CLASS = "rlkube-fuzz-high"
SERVICE_ACCOUNT = "rl-trainer"

# Label keys and values, DNS names and quantities: well-formed ones, plus the near misses a user
# types (upper case, a slash too many, a leading dash, a unit the API server does not know).
NAME = st.from_regex(r"\A[a-z]([-a-z0-9]{0,38}[a-z0-9])?\Z")
LABEL_PART = st.from_regex(r"\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?\Z")
LABEL_KEY = st.one_of(
    LABEL_PART,
    st.builds(lambda p, n: f"{p}/{n}", st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,12}[a-z0-9])?\Z"), LABEL_PART),
    st.sampled_from(["kubernetes.io/hostname", "nvidia.com/gpu.product", "a/b/c", "-x", "x-", "Node Pool",
                     "UPPER.example.com/x", "/x", "x/", "a" * 64, "example.com/" + "a" * 63]),
)
LABEL_VALUE = st.one_of(st.just(""), LABEL_PART)
QUANTITY = st.one_of(
    st.sampled_from(["0", "1", "500m", "1.5", "2", "16", "100M", "512Mi", "2Gi", "64Gi", "1e3", "1E", "0.5",
                     ".5", "5.", "1Ki", "1n", "1k", "250u", "3e-2", "1Ti", "8"]),
    st.from_regex(r"\A[0-9]{1,4}(\.[0-9]{1,3})?(m|Mi|Gi|k|M|G)?\Z"),
)
RESOURCE_LIST = st.fixed_dictionaries(
    {}, optional={"cpu": QUANTITY, "memory": QUANTITY, "ephemeralStorage": QUANTITY}
)
PATH = st.one_of(
    st.from_regex(r"\A(/[A-Za-z0-9_.-]{1,12}){1,3}\Z"),
    st.sampled_from(["/", "/dev/shm", "/etc/rlkube", "/checkpoints", "/models", "/data", "/tmp/x/../y",
                     "/a//b", "/with space", "/a:b", "/x/./y", "relative/dir", "ckpt"]),
)
TOLERATION = st.one_of(
    st.fixed_dictionaries({"operator": st.just("Exists")},
                          optional={"key": LABEL_KEY, "effect": st.sampled_from(["NoSchedule", "NoExecute"])}),
    st.fixed_dictionaries(
        {"key": LABEL_KEY, "operator": st.just("Equal"), "value": LABEL_VALUE},
        optional={"effect": st.sampled_from(["NoSchedule", "PreferNoSchedule"])},
    ),
    st.fixed_dictionaries({"key": LABEL_KEY, "operator": st.just("Exists"), "effect": st.just("NoExecute"),
                           "tolerationSeconds": st.integers(0, 31_536_000)}),
)
SECURITY = st.fixed_dictionaries({}, optional={
    "runAsUser": st.sampled_from([0, 1, 1000, 65534, 2**31 - 1]),
    "runAsGroup": st.sampled_from([0, 1000, 2**31 - 1]),
    "fsGroup": st.sampled_from([0, 1000, 2**31 - 1]),
    "runAsNonRoot": st.booleans(),
})
VOLUME = st.fixed_dictionaries(
    {"name": st.from_regex(r"\A[a-z]([-a-z0-9]{0,10}[a-z0-9])?\Z"), "mountPath": PATH},
    optional={"readOnly": st.booleans()},
).flatmap(lambda v: st.one_of(
    st.just({**v, "claimName": "rl-models"}),
    PATH.map(lambda p: {**v, "hostPath": p}),
))


@st.composite
def roles_and_pods(draw: st.DrawFn) -> dict:
    algorithm = draw(st.sampled_from(["dpo", "kto", "ppo", "grpo"]))
    actor = draw(st.integers(1, 8))
    roles: dict = {"actor": {"gpus": actor}}
    if algorithm in ("dpo", "kto") or draw(st.booleans()):
        roles["reference"] = {"colocateWith": "actor"}
    if algorithm == "ppo":
        roles["critic"] = {"gpus": draw(st.integers(1, 4))}
    if algorithm in ("ppo", "grpo"):
        if draw(st.booleans()):
            roles["reward"] = {"gpus": draw(st.integers(1, 2)), "model": {"path": "/models/reward"}}
        else:
            roles["reward"] = {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"}
    total = sum(role.get("gpus", 0) for role in roles.values())
    per_pod = draw(st.sampled_from([d for d in range(1, min(total, 8) + 1) if total % d == 0]))
    return {"algorithm": algorithm, "roles": roles, "placement": {"gpusPerPod": per_pod}}


@st.composite
def jobs(draw: st.DrawFn) -> dict:
    spec: dict = {
        **draw(roles_and_pods()),
        "model": {"config": dict(TINY_CONFIG), "dtype": "float32"},
        "data": {"source": "synthetic", "format": "synthetic"},
        "image": draw(st.sampled_from(["localhost/rlkube/runtime-cpu:dev", "rlkube/runtime:0.1.0",
                                       "example.com:5000/a/b@sha256:" + "0" * 64, "UPPER/case:tag"])),
        "imagePullPolicy": draw(st.sampled_from(["Always", "IfNotPresent", "Never"])),
    }
    optional = {
        "resources": st.fixed_dictionaries({}, optional={"requests": RESOURCE_LIST, "limits": RESOURCE_LIST}),
        "nodeSelector": st.dictionaries(LABEL_KEY, LABEL_VALUE, max_size=3),
        "tolerations": st.lists(TOLERATION, max_size=3),
        "securityContext": SECURITY,
        "volumes": st.lists(VOLUME, max_size=3, unique_by=(lambda v: v["name"], lambda v: v["mountPath"])),
        "checkpoint": st.fixed_dictionaries({}, optional={"dir": PATH, "volumeClaim": st.just("rl-ckpt")}),
        "schedulerName": st.sampled_from(["default-scheduler", "volcano", "my-scheduler"]),
        "priorityClassName": st.just(PRIORITY_CLASS),
        "serviceAccountName": st.just(SERVICE_ACCOUNT),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            spec[key] = draw(strategy)
    labels = {"kueue.x-k8s.io/queue-name": "q"} if draw(st.booleans()) else {}
    metadata = {"name": draw(NAME), "labels": labels}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": metadata, "spec": spec}


def _nodes(count: int) -> list[NodeInventory]:
    return [NodeInventory(f"fuzz-node-{i}", 8, 0, {"kubernetes.io/hostname": f"fuzz-node-{i}"})
            for i in range(count)]


@pytest.fixture(scope="module")
def fuzz_namespace(control_plane):
    Env(control_plane.kubeconfig, control_plane.kubectl, "fuzz").install_crd()
    name = f"fuzz-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    control_plane.kubectl("-n", name, "create", "serviceaccount", SERVICE_ACCOUNT)
    # The Priority admission plugin refuses a pod whose class does not exist; the fuzzer names one.
    control_plane.kubectl("create", "priorityclass", PRIORITY_CLASS, "--value=1000", check=False)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")
    control_plane.kubectl("delete", "priorityclass", PRIORITY_CLASS, "--ignore-not-found")


def test_accepted_specs_render_into_objects_the_api_server_accepts(control_plane, fuzz_namespace):
    client = control_plane.api
    started = time.monotonic()
    seen = {"accepted": 0, "refused": 0, "objects": 0}

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(jobs())
    def check(doc: dict) -> None:
        if time.monotonic() - started > DEADLINE_S:
            return
        errors = api.job_errors(doc)
        # The CRD must give the same verdict as `rlkube validate` on the real API server.
        try:
            client.post(f"/apis/{api.API_VERSION}/namespaces/{fuzz_namespace}/rltrainingjobs?dryRun=All", doc)
            crd_error = ""
        except ApiError as exc:
            crd_error = str(exc)
        if bool(errors) != bool(crd_error):
            pytest.fail(f"rlkube validate says {[str(e) for e in errors] or 'ok'} but the API server says "
                        f"{crd_error or 'ok'}\nspec: {json.dumps(doc['spec'], sort_keys=True)}")
        if errors:
            seen["refused"] += 1
            return
        seen["accepted"] += 1
        spec = api.parse_job(doc).spec
        job = JobRef(doc["metadata"]["name"], fuzz_namespace, str(uuid.uuid4()), doc["metadata"]["labels"])
        placement = plan_placement(request_from_spec(spec), _nodes(spec.pod_count()))
        for obj in render(job, spec, placement, attempt=0):
            kind = obj["kind"].lower() + "s"
            path = f"/api/v1/namespaces/{fuzz_namespace}/{kind}?dryRun=All"
            try:
                client.post(path, obj)
            except ApiError as exc:
                pytest.fail(f"the API server refused a rendered {obj['kind']} of a spec rlkube validate "
                            f"accepts: {exc}\nspec: {json.dumps(doc['spec'], sort_keys=True)}")
            seen["objects"] += 1

    check()
    print(f"render fuzz: {seen} in {time.monotonic() - started:.1f} s")
    assert seen["accepted"] >= 20, f"too few accepted specs to mean anything: {seen}"
