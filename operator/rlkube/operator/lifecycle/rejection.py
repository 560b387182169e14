"""A child the API server refuses to create: the job fails, naming the field. Pure.

A rendered pod can be invalid for reasons the job's own validation cannot see: a request above
its limit, a mount path used twice, a LimitRange or an admission webhook of the cluster. The API
server answers 422 (Invalid) with the field path in its message, and retrying cannot help: the
same spec renders the same pod. Before this rule such a job stayed in Scheduling forever with no
Event; now the reconciler hands the refusal here and the job fails within the same reconcile,
with the API server's words in its Failed condition and a Warning Event.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from rlkube.operator.api.observed import JobView, PodView
from rlkube.operator.lifecycle.decider import AttemptState, Decider
from rlkube.operator.lifecycle.decision import Decision, Settings
from rlkube.operator.render.status import TERMINAL_PHASES

REASON = "CreateRejected"


def rejected(job: JobView, pods: Sequence[PodView], now: dt.datetime, kind: str, name: str, message: str,
             settings: Settings = Settings()) -> Decision | None:
    """The decision for a job whose `kind` `name` the API server refused with `message`; None
    when the job is finished already (nothing is created for it any more)."""
    state = AttemptState.from_status(job.status)
    if job.spec is None or state.phase in TERMINAL_PHASES:
        return None
    d = Decider(job, list(pods), now, None, None, settings, state)
    text = " ".join(message.split())
    return d.fail(REASON, f"the API server refused {kind} {name}: {text}")
