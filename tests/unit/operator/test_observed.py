"""Reading the job and its pods from API objects (`observed`): what the lifecycle decides on."""

from __future__ import annotations

import pytest
from operator_builders import World, at, job, node, with_status

from rlkube.operator.api.observed import GANG_GATE, JobView, PodView, gang_gate_position, gang_gated


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


@pytest.mark.parametrize(("spec", "position"), [
    ({"schedulingGates": [{"name": GANG_GATE}]}, 0),
    ({"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}, {"name": GANG_GATE}]}, 1),
    ({"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}, None),  # another system's hold, not ours
    ({"schedulingGates": []}, None),
    ({"schedulingGates": None}, None),
    ({"nodeName": "a"}, None),
    (None, None),  # a reduced or partial object without a spec
])
def test_gang_gate_read_one_way_by_views_store_and_creates(spec, position):
    pod = {"metadata": {"name": "j-actor-0", "labels": {}}, "spec": spec}
    assert gang_gate_position(pod) == position
    assert gang_gated(pod) is (position is not None)
    view = PodView.from_object(pod)
    assert view.gate_position == position and view.gated is (position is not None)
