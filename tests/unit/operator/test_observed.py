"""Reading the job and its pods from API objects (`observed`): what the lifecycle decides on."""

from __future__ import annotations

from operator_builders import World, at, job, node, with_status

from rlkube.operator.observed import JobView, PodView


def test_pod_view_reads_exit_code_gate_and_disruption():
    w = World(job(), [node("a", 4), node("b", 4)])
    w.step(at(0), crash_after=6)  # created, still gated
    pod = next(iter(w.pods.values()))
    v = PodView.from_object(pod)
    assert v.gated and v.gate_position == 0 and v.attempt == 0 and v.index is not None
    v = PodView.from_object(with_status(pod, "Failed", node_name="a", exit_code=4))
    assert v.failed and v.exit_code == 4 and not v.gated and not v.disrupted
    v = PodView.from_object(with_status(pod, "Failed", node_name="a", reason="Evicted"))
    assert v.disrupted and v.exit_code is None
    assert JobView.from_object(w.job).spec is not None
