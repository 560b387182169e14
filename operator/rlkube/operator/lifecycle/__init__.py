"""The lifecycle decision: given what is observed, what the operator does next. Pure.

`decide(job, pods, now, cluster, progress, settings)` looks at the job (spec and the status the
operator wrote last), the pods it owns, and, when it asks for it, the cluster's GPU inventory,
and returns a `Decision`: the new status, the objects to create, the pods to delete or to ungate,
Events to post, and when to look again. The handlers apply it in a fixed order (status first,
with a resourceVersion precondition, then deletes, creates, ungates), so a crash between any two
steps leaves a state from which the next reconcile continues: intent is recorded before it is
acted on, and every action is idempotent.

One policy, one file. `rules.decide` asks them in this order; the first that decides ends it:

- invalid spec (`rules`): the spec does not parse: Failed (InvalidSpec), naming every field path
- finished, TTL (`ttl`): Succeeded/Failed are final: remaining running pods are deleted; after
  ttlSecondsAfterFinished the job is deleted (its children go by ownerReference GC)
- deadline (`deadline`): activeDeadlineSeconds since startTime: Failed (DeadlineExceeded)
- suspend (`suspend`): runPolicy.suspend tears the gang down, Suspended; clearing it resumes with a
  new plan
- Kueue (`queue`): a job labelled kueue.x-k8s.io/queue-name waits (Pending, QueuedInKueue) until
  Kueue admits its Workload; evicted, its gang is torn down and the quota handed back; no plan goes
  above the pods Kueue admitted
- earlier attempts (`rules`, `node_loss`): pods of an older attempt are deleted and waited for (pod
  names are reused, so at most one pod per index ever exists); those stranded on a lost node are
  force-deleted
- restart backoff (`restart`): after a counted restart, wait until nextAttemptTime
- admission (`admission`): no plan: plan the largest gang that fits, after older waiting jobs of
  its priority class (planning/fifo.py), create it gated and admit it; a plan not admitted yet:
  create what is missing, ungate every pod at once if the plan still fits, else re-plan. With
  Volcano or Kueue admission is theirs: no gate, no gang timeout
- node loss (`node_loss`): a node of the admitted gang gone, out-of-service, or not Ready past its
  grace: its pods force-deleted, the gang re-planned (counted only with Settings.node_lost_counts)
- repair (`repair`): an admitted gang not whole: finish creates (while the plan still fits the
  free GPUs, else re-plan) and gate removals cut short; a vanished pod re-plans; pods not created
  within gangTimeoutSeconds re-plan
- outcome (`outcome`): an exit code in failOnExitCodes fails the job; another failure is a restart
  (`restart`); an eviction re-plans, not counted; all Succeeded is success; pods not all bound
  within gangTimeoutSeconds re-plan
- restart (`restart`): "backoffLimit reached: fail, else restart": the one place a failure counts,
  attempt+1 with exponential backoff
- elastic (`elastic`): an elastic gang running below maxWorkers whose larger gang fits now re-plans
  larger (ElasticGrow, not counted); one that lost a node shrinks (ElasticShrink)
- rejected child (`rejection`): a child the API server refuses (422): Failed at once, naming the
  field

A gang teardown always bumps `attempt` in the same status write that records why, before any
pod is deleted; pods carry their attempt as a label, so "stale" is a fact anyone can check.
`decider` holds the state being decided and the outcome builders every policy ends with
(finish, fail, teardown); `decision` the `Decision` and the operator's timing settings. What
planning sees (`planning.cluster`) and the order of waiting jobs (`planning.fifo`) are planning's.
"""

from rlkube.operator.lifecycle.decision import Decision, Event, Settings, Ungate
from rlkube.operator.lifecycle.restart import backoff_seconds
from rlkube.operator.lifecycle.rules import decide

__all__ = [
    "Decision",
    "Event",
    "Settings",
    "Ungate",
    "backoff_seconds",
    "decide",
]
