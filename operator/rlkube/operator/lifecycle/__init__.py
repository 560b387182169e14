"""The lifecycle decision: given what is observed, what the operator does next. Pure.

`decide(job, pods, now, cluster, progress, settings)` looks at the job (spec and the status the
operator wrote last), the pods it owns, and, when it asks for it, the cluster's GPU inventory,
and returns a `Decision`: the new status, the objects to create, the pods to delete or to ungate,
Events to post, and when to look again. The handlers apply it in a fixed order (status first,
with a resourceVersion precondition, then deletes, creates, ungates), so a crash between any two
steps leaves a state from which the next reconcile continues: intent is recorded before it is
acted on, and every action is idempotent.

The rules, in the order they are checked:
1. The spec does not parse: Failed (InvalidSpec), naming every field path.
2. Succeeded/Failed are final: remaining running pods are deleted; after
   ttlSecondsAfterFinished the job itself is deleted (its children go by ownerReference GC).
3. activeDeadlineSeconds since startTime: Failed (DeadlineExceeded).
4. runPolicy.suspend: the gang is torn down, Suspended. Clearing it resumes with a new plan.
   4b. A job labelled kueue.x-k8s.io/queue-name waits (Pending, QueuedInKueue) until Kueue
   admits its Workload; evicted by Kueue, its gang is torn down and the quota handed back.
   No plan or elastic grow goes above the pods Kueue admitted (partial admission).
5. Pods of an older attempt are deleted and waited for (pod names are reused by the next
   attempt, so at most one pod per index ever exists; those stranded on a lost node are
   force-deleted). Then the restart backoff is waited out.
6. No plan for this attempt: plan (`placement.plan_placement`; an elastic job at the largest
   pod count in [minWorkers, maxWorkers] that fits), after older waiting jobs of its priority
   class (first come, first served). A job without checkpoint.volumeClaim gets only plans on
   one node, unless the hostPath root is shared (Settings.host_path_shared): checkpoints in one
   node's hostPath are not seen from another. Unplaceable: Pending (Unschedulable, naming what the nodes
   lack: selector, taint, readiness, capacity), retried later. Placed: Service, ConfigMap and
   pods are created, gated.
7. Before admission: missing pods are created; once all exist, and the plan still fits the free
   GPUs, every gate is removed at once (admission). If the plan no longer fits: re-plan.
   With Volcano or Kueue admission is theirs: no gate, no gang timeout.
8. After admission: an exit code in failOnExitCodes fails the job at once; another failure
   restarts the whole gang with attempt+1 (counted against backoffLimit, exponential backoff);
   an eviction, a vanished pod or a lost node (gone, out-of-service, or not Ready past its
   grace; its pods force-deleted) re-plans (attempt+1, not counted); all pods
   Succeeded is success; pods not all bound within gangTimeoutSeconds re-plan. An elastic job
   running below maxWorkers whose larger gang fits now re-plans (ElasticGrow, not counted).

A gang teardown always bumps `attempt` in the same status write that records why, before any
pod is deleted; pods carry their attempt as a label, so "stale" is a fact anyone can check.

Where each rule lives: `rules` (the entry point, rules 1-5), `queue` (4b), `admission` (6, 7), `repair` and
`outcome` (8: an admitted gang that is not whole, then what its pods add up to), `nodes` (lost
nodes, and why nothing fits), `rejection` (a child the API server refuses: Failed at once).
`decider` holds the state being decided and the outcome builders they share. What planning sees
(`planning.cluster`) and the order of waiting jobs (`planning.fifo`) are planning's.
"""

from rlkube.operator.lifecycle.decision import Decision, Event, Settings, Ungate, backoff_seconds
from rlkube.operator.lifecycle.rules import decide

__all__ = [
    "Decision",
    "Event",
    "Settings",
    "Ungate",
    "backoff_seconds",
    "decide",
]
