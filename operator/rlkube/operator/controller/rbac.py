"""The operator's RBAC needs, as data: every API verb it uses, with the reason it needs it.

One source for the Helm chart's ClusterRole/Role templates and for the test that checks them,
so a verb is never granted "just in case" and never missing. No wildcards, no secrets.

Scopes:
- `watched`: the namespaces whose RLTrainingJobs the operator reconciles. With a cluster-wide
  operator these rules go into the ClusterRole; with a namespaced one, into a Role per watched
  namespace.
- `cluster`: always a ClusterRole (cluster-scoped kinds, or reads across all namespaces).
- `operator`: a Role in the operator's own namespace (leader election).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Scope = Literal["watched", "cluster", "operator"]

GROUP = "rlkube.io"


@dataclass(frozen=True)
class Rule:
    """One (apiGroup, resource) with the verbs the operator uses on it and why each is needed."""

    api_group: str
    resource: str
    scope: Scope
    verbs: dict[str, str] = field(default_factory=dict)  # verb -> why

    def as_policy_rule(self) -> dict:
        """The rule in Kubernetes PolicyRule form (verbs sorted, for stable manifests)."""
        return {
            "apiGroups": [self.api_group],
            "resources": [self.resource],
            "verbs": sorted(self.verbs),
        }


RULES: tuple[Rule, ...] = (
    Rule(GROUP, "rltrainingjobs", "watched", {
        "get": "each reconcile reads the job fresh (spec, status, resourceVersion) before deciding",
        "list": "kopf's initial listing, the periodic resync that drives timeouts and progress, and the "
        "inventory's list of the jobs waiting for a plan (first come, first served)",
        "watch": "kopf's watch stream: a job change triggers its reconcile; the inventory keeps the "
        "waiting jobs from a watch (cluster_state.py)",
        "delete": "ttlSecondsAfterFinished: a finished job is deleted (children go by ownerReference GC)",
    }),
    Rule(GROUP, "rltrainingjobs/status", "watched", {
        "patch": "status (phase, conditions, placement, progress, attempt) is written with a "
        "resourceVersion precondition so a stale decision is never recorded",
    }),
    Rule("", "pods", "watched", {
        "list": "the pods of a job (label rlkube.io/job) are listed on every reconcile",
        "watch": "kopf's pod event handler: a pod change triggers its job's reconcile",
        "create": "one pod per planned slot, with deterministic names; and, when a job is deleted, one "
        "pod per node of its hostPath checkpoints that removes that folder (cleanup.py)",
        "delete": "gang restart, re-plan, suspend, deadline and failure tear the attempt down; finished "
        "checkpoint cleanup pods are removed",
        "patch": "removing the rlkube.io/gang scheduling gate once the whole gang fits (JSON patch "
        "with test ops: only that attempt's pod, only that gate)",
    }),
    Rule("", "services", "watched", {
        "create": "the headless Service that gives each pod a DNS name for torch rendezvous, and the "
        "Service in front of a job's environment (AlreadyExists counts as done: their names are deterministic)",
    }),
    Rule("apps", "deployments", "watched", {
        "get": "a job's environment (roles.environment): its ready replicas for status.environment, and "
        "whether its replicas match the spec",
        "create": "a job's environment runs as a Deployment owned by the job (removed with it by "
        "ownerReference GC)",
        "patch": "scaling the environment when roles.environment.replicas changes, and to 0 once the job "
        "finished",
    }),
    Rule("networking.k8s.io", "networkpolicies", "watched", {
        "get": "a job's environment whose Deployment exists: whether its NetworkPolicy does too (an "
        "environment made by an older operator gets one)",
        "create": "the NetworkPolicy around a job's environment pods: in only from the job's trainers, "
        "nothing out unless roles.environment.allowEgress (owned by the job, removed with it by "
        "ownerReference GC)",
    }),
    Rule("", "configmaps", "watched", {
        "get": "when the ConfigMap (or checkpoint record) exists already, comparing its data with the new one",
        "create": "the ConfigMap holding run.yaml (RuntimeConfig with the device map), and the job's "
        "checkpoint record (where its hostPath checkpoints are; cleanup.py)",
        "patch": "rewriting run.yaml when the spec changed it (applied at the next gang start); updating "
        "a job's checkpoint record when a re-plan adds a node",
        "list": "the checkpoint sweep lists the checkpoint records (label rlkube.io/checkpoint-record) "
        "to clean for jobs deleted while no operator ran (checkpoint_sweep.py)",
        "delete": "a checkpoint record is deleted once its job's cleanup pods are made",
    }),
    Rule("", "events", "watched", {
        "create": "an Event on the job for every decision (placed, admitted, restarted, failed...)",
    }),
    Rule("kueue.x-k8s.io", "workloads", "watched", {
        "get": "a job labelled kueue.x-k8s.io/queue-name: its Workload is read on every reconcile "
        "(admitted, evicted, or why it waits)",
        "create": "the Workload that queues such a job in Kueue (deterministic name rltj-<job>; "
        "removed with the job by ownerReference GC)",
    }),
    Rule("kueue.x-k8s.io", "workloads/status", "watched", {
        "patch": "handing the quota back: Finished when the job ends, admission cleared after Kueue "
        "evicted it and its pods are gone (with resourceVersion, never over Kueue's newer write)",
    }),
    Rule("scheduling.k8s.io", "priorityclasses", "cluster", {
        "get": "a queued job's Workload carries the value of its priorityClassName (Kueue orders "
        "and preempts by it)",
    }),
    Rule("", "nodes", "cluster", {
        "list": "GPU inventory: allocatable nvidia.com/gpu, readiness, taints and topology labels",
        "watch": "the GPU inventory is kept from a watch of nodes, not listed per plan (cluster_state.py)",
    }),
    Rule("", "pods", "cluster", {
        "list": "GPU inventory: GPUs requested by pods bound to each node, in any namespace, and "
        "GPUs reserved by other rlkube jobs' pods not bound yet",
        "watch": "the GPU inventory is kept from a watch of pods, not listed per plan "
        "(cluster_state.py)",
    }),
    Rule("apiextensions.k8s.io", "customresourcedefinitions", "cluster", {
        "list": "kopf's resource scan at startup finds the RLTrainingJob resource",
        "watch": "kopf notices the CRD being (re)installed while it runs",
    }),
    Rule("", "namespaces", "cluster", {
        "list": "kopf resolves the watched namespaces at startup",
        "watch": "kopf notices watched namespaces being created or deleted",
    }),
    Rule("coordination.k8s.io", "leases", "operator", {
        "get": "leader election: reading who holds the lease",
        "create": "leader election: the first replica creates the lease",
        "update": "leader election: renewing, or taking over an expired lease "
        "(with resourceVersion, so two replicas never both win)",
    }),
)


def rules_for(scope: Scope) -> list[dict]:
    """PolicyRules of one scope, merged per (apiGroup, resource), in a stable order."""
    return [rule.as_policy_rule() for rule in RULES if rule.scope == scope]


def cluster_role_rules(clusterwide: bool) -> list[dict]:
    """The ClusterRole: cluster rules, plus the watched-namespace rules when cluster-wide."""
    rules = rules_for("cluster")
    if clusterwide:
        watched = rules_for("watched")
        # pods appear in both scopes; a ClusterRole needs one rule with the union of verbs.
        merged: dict[tuple[str, str], set[str]] = {}
        for rule in rules + watched:
            key = (rule["apiGroups"][0], rule["resources"][0])
            merged.setdefault(key, set()).update(rule["verbs"])
        rules = [
            {"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}
            for (group, resource), verbs in merged.items()
        ]
    return rules
