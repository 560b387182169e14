"""A job's environment (roles.environment): its Deployment, Service and NetworkPolicy, owned by
the job and restricted like the trainers; the trainers' URL of it; and the reconcile that makes,
scales and reports it (status.environment)."""

from __future__ import annotations

import copy

from operator_builders import job, node
from test_cluster_state import FakeCluster, synced

from rlkube.operator import lifecycle, render
from rlkube.operator.api import RLTrainingJobStatus, parse_spec
from rlkube.operator.api.observed import JobRef, JobView
from rlkube.operator.controller.cluster_state import WatchedInventory
from rlkube.operator.controller.environment_sync import sync_environment
from rlkube.operator.controller.rbac import cluster_role_rules
from rlkube.operator.controller.reconcile import Reconciler
from rlkube.operator.lifecycle import Decision
from rlkube.operator.render import environment
from rlkube.runtime.contract.pod import ENV_ENVIRONMENT_URL, LABEL_ENVIRONMENT, LABEL_JOB

REF = JobRef(name="tiny", namespace="team", uid="u-1")
ENVIRONMENT = {"image": "localhost/rlkube/environment:dev", "replicas": 2, "port": 8100,
               "env": [{"name": "SANDBOX_CPU_SECONDS", "value": "2"}],
               "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}}}
GRPO_ROLES = {"actor": {"gpus": 1}, "reward": {"gpus": 0, "remote": True}, "environment": ENVIRONMENT}


def grpo_job(name: str = "tiny", **environment_fields) -> dict:
    roles = copy.deepcopy(GRPO_ROLES)
    roles["environment"].update(environment_fields)
    obj = job(name, algorithm="ppo")
    obj["spec"].update(algorithm="grpo", roles=roles, training={"kl": 0.0, "groupSize": 2})
    obj["metadata"].update(uid=f"uid-{name}", creationTimestamp="2026-12-06T00:00:00Z")
    return obj


def grpo_spec(**environment_fields):
    return parse_spec(grpo_job(**environment_fields)["spec"])


def test_deployment_and_service_are_owned_by_the_job_and_select_the_environment_pods():
    deployment, service, policy = environment.render_environment(REF, grpo_spec())
    for obj in (deployment, service, policy):
        assert obj["metadata"]["name"] == "tiny-environment" and obj["metadata"]["namespace"] == "team"
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("RLTrainingJob", "tiny", "u-1", True)
    assert deployment["apiVersion"] == "apps/v1" and deployment["spec"]["replicas"] == 2
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {LABEL_ENVIRONMENT: "tiny"} == service["spec"]["selector"]
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= template_labels.items()
    assert LABEL_JOB not in template_labels  # never counted as a trainer pod
    assert service["spec"]["ports"] == [{"name": "http", "port": 8100, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["clusterIP"] == "None"  # headless: the name resolves to the ready replicas
    assert not service["spec"].get("publishNotReadyAddresses")


def test_network_policy_lets_in_only_the_jobs_trainers_on_the_port_and_nothing_out():
    policy = environment.render_network_policy(REF, grpo_spec())
    deployment = environment.render_deployment(REF, grpo_spec())
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {LABEL_ENVIRONMENT: "tiny"}} == {
        "matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # One peer, a podSelector with no namespaceSelector: pods of the policy's own namespace only.
    assert spec["ingress"] == [{"from": [{"podSelector": {"matchLabels": {LABEL_JOB: "tiny"}}}],
                                "ports": [{"protocol": "TCP", "port": 8100}]}]
    assert spec["egress"] == []  # with Egress in policyTypes: every outbound connection denied
    # The trainer pods carry the label the peer selects.
    placement = render.Placement(pods=(render.PodPlan(0, "n1", (0,), ("actor", "reward")),),
                                 device_map={"actor": [0], "reward": [0]}, domains={}, fallback=False, messages=())
    trainer = next(o for o in render.render(REF, grpo_spec(), placement, 0) if o["kind"] == "Pod")
    assert trainer["metadata"]["labels"][LABEL_JOB] == "tiny"


def test_allow_egress_leaves_outbound_connections_alone():
    spec = grpo_spec(allowEgress=True)
    assert spec.roles.environment.allow_egress is True and grpo_spec().roles.environment.allow_egress is False
    policy = environment.render_network_policy(REF, spec)["spec"]
    assert policy["policyTypes"] == ["Ingress"] and "egress" not in policy
    assert policy["ingress"] == environment.render_network_policy(REF, grpo_spec())["spec"]["ingress"]


def test_environment_pods_run_restricted_with_a_read_only_root():
    deployment = environment.render_deployment(REF, grpo_spec())
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "runAsNonRoot": True, "readOnlyRootFilesystem": True}
    assert {"name": "scratch", "mountPath": "/tmp"} in container["volumeMounts"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["env"] == [{"name": "SANDBOX_CPU_SECONDS", "value": "2"}]
    assert container["resources"] == {"requests": {"cpu": "250m"}, "limits": {"memory": "512Mi"}}
    assert "command" not in container and "args" not in container  # the image's own entrypoint


def test_trainer_pods_get_the_environment_url():
    spec = grpo_spec()
    placement = render.Placement(pods=(render.PodPlan(0, "n1", (0,), ("actor", "reward")),),
                                 device_map={"actor": [0], "reward": [0]}, domains={}, fallback=False, messages=())
    pod = next(o for o in render.render(REF, spec, placement, 0) if o["kind"] == "Pod")
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env[ENV_ENVIRONMENT_URL] == "http://tiny-environment.team.svc:8100"
    without = parse_spec(job(algorithm="ppo")["spec"])
    assert environment.render_environment(REF, without) == [] and environment.environment_url(REF, without) is None


def test_status_reports_ready_replicas_and_none_are_wanted_once_the_job_finished():
    spec = grpo_spec()
    deployment = {"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}
    status = environment.environment_status(spec, REF, deployment, "Running")
    assert status == {"replicas": 2, "readyReplicas": 1, "url": "http://tiny-environment.team.svc:8100"}
    RLTrainingJobStatus.model_validate({"environment": status})  # fits the CRD's status schema
    assert environment.environment_status(spec, REF, None, "Pending")["readyReplicas"] == 0
    assert environment.wanted_replicas(spec, "Succeeded") == environment.wanted_replicas(spec, "Failed") == 0


def test_the_operator_may_make_and_scale_deployments():
    rules = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in cluster_role_rules(True)}
    assert rules[("apps", "deployments")] == {"get", "create", "patch"}
    assert "create" in rules[("", "services")]
    assert rules[("networking.k8s.io", "networkpolicies")] == {"get", "create"}  # GC deletes them with the job


def merge(target: dict, patch: dict) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class EnvironmentCluster(FakeCluster):
    """FakeCluster with Deployments, Services and NetworkPolicies: created, read, scaled."""

    def __init__(self, jobs):
        super().__init__(jobs)
        self.objects: dict[tuple[str, str], dict] = {}
        self.scaled: list[int] = []
        self.created: list[tuple[str, str]] = []
        self.gets: list[str] = []

    def create(self, obj):
        if obj["kind"] in ("Deployment", "Service", "NetworkPolicy"):
            key = (obj["kind"], obj["metadata"]["name"])
            if key in self.objects:
                return False
            self.objects[key] = copy.deepcopy(obj)
            self.created.append(key)
            return True
        return super().create(obj)

    def get(self, kind, namespace, name):
        self.gets.append(kind)
        return copy.deepcopy(self.objects.get((kind, name)))

    def patch_job_status(self, namespace, name, resource_version, patch):
        merge(self.jobs[name].setdefault("status", {}), patch)  # a JSON merge patch, as the API server does

    def request(self, method, path, body=None, **kwargs):
        # kubeapi.scale_deployment: a merge patch of the Deployment's replicas
        assert method == "PATCH" and path.startswith("/apis/apps/v1/namespaces/team/deployments/"), path
        replicas = body["spec"]["replicas"]
        self.scaled.append(replicas)
        self.objects[("Deployment", path.rsplit("/", 1)[1])]["spec"]["replicas"] = replicas


def test_reconcile_makes_the_environment_scales_it_with_the_spec_and_reports_it():
    obj = grpo_job("j1")
    api = EnvironmentCluster([obj])
    inventory = synced(WatchedInventory(api))
    inventory.nodes.replace([node("n1", 8)])
    inventory.pods.replace([])
    reconciler = Reconciler(api, lifecycle.Settings(host_path_shared=True), progress=lambda ip, port: None,
                            inventory=inventory)
    reconciler.reconcile("team", "j1")
    assert {("Deployment", "j1-environment"), ("Service", "j1-environment"),
            ("NetworkPolicy", "j1-environment")} <= set(api.objects)
    assert api.jobs["j1"]["status"]["environment"]["readyReplicas"] == 0
    api.objects[("Deployment", "j1-environment")]["status"] = {"readyReplicas": 2}
    reconciler.reconcile("team", "j1")
    assert api.jobs["j1"]["status"]["environment"] == {
        "replicas": 2, "readyReplicas": 2, "url": "http://j1-environment.team.svc:8100"}
    # The user scales the environment of the running job: the Deployment follows.
    api.jobs["j1"]["spec"]["roles"]["environment"]["replicas"] = 5
    api.jobs["j1"]["metadata"]["generation"] = 2
    reconciler.reconcile("team", "j1")
    assert api.scaled == [5] and api.jobs["j1"]["status"]["environment"]["replicas"] == 5
    reconciler.reconcile("team", "j1")
    assert api.scaled == [5]  # nothing to do once it matches


def environment_reconciler(api):
    inventory = synced(WatchedInventory(api))
    inventory.nodes.replace([node("n1", 8)])
    inventory.pods.replace([])
    return Reconciler(api, lifecycle.Settings(host_path_shared=True), progress=lambda ip, port: None,
                      inventory=inventory)


def test_an_environment_made_without_a_network_policy_gets_one_and_nothing_else():
    """A job whose environment an older operator made (Deployment and Service, no policy): the
    next reconcile makes the policy alone."""
    api = EnvironmentCluster([grpo_job("j1")])
    reconciler = environment_reconciler(api)
    reconciler.reconcile("team", "j1")
    made = {key for key in api.created if key[1] == "j1-environment"}
    assert made == {("Deployment", "j1-environment"), ("Service", "j1-environment"),
                    ("NetworkPolicy", "j1-environment")}
    del api.objects[("NetworkPolicy", "j1-environment")]
    api.created.clear()
    reconciler.reconcile("team", "j1")
    assert api.created == [("NetworkPolicy", "j1-environment")]
    policy = api.objects[("NetworkPolicy", "j1-environment")]
    assert policy == environment.render_network_policy(JobRef("j1", "team", "uid-j1"), grpo_spec())
    api.created.clear()
    api.gets.clear()
    reconciler.reconcile("team", "j1")
    assert api.created == [] and api.gets.count("NetworkPolicy") == 1  # it exists: read, not made again


def test_a_finished_job_does_not_read_its_environments_policy():
    """Once the job finished its environment is scaled to 0: one GET (the Deployment's), and no
    policy made for pods that are gone."""
    obj = grpo_job("j1")
    api = EnvironmentCluster([obj])
    job_view = JobView.from_object(obj)
    for made in environment.render_environment(job_view.ref, job_view.spec)[:2]:  # an older operator's
        api.create(made)
    api.gets.clear()
    api.created.clear()
    decision = sync_environment(api, job_view, Decision(status={"phase": "Succeeded"}), api.create)
    assert api.gets == ["Deployment"] and api.created == [] and api.scaled == [0]
    assert decision.status["environment"]["replicas"] == 0
    sync_environment(api, job_view, Decision(status={"phase": "Running"}), api.create)
    assert api.gets == ["Deployment", "Deployment", "NetworkPolicy"]
    assert api.created == [("NetworkPolicy", "j1-environment")]
