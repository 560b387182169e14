"""The chaos soak's verdicts (tests/soak/verdict.py, faults.schedule): pure, no cluster."""

from tests.soak import faults, verdict
from tests.soak.verdict import AttemptLog, Fault


def pod(uid, name="j-actor-0", job="j", index="0", node="n0", phase="Running", deleting=False):
    meta = {"uid": uid, "name": name, "namespace": "ns", "labels": {"rlkube.io/job": job, "rlkube.io/pod-index": index}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T05:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_api_census_flags_two_live_pods_of_one_index_but_not_a_terminating_one():
    census = verdict.ApiCensus()
    census.observe("ADDED", pod("a"), 1.0)
    census.observe("MODIFIED", pod("a", deleting=True), 2.0)
    census.observe("ADDED", pod("b", name="j-actor-0x"), 3.0)  # beside a terminating one: allowed
    assert census.violations == [] and census.most == 1
    census.observe("ADDED", pod("c", name="j-actor-0y"), 4.0)  # two live ones
    assert census.most == 2 and census.violations[0]["index"] == "0"
    census.observe("ADDED", pod("d", name="j-actor-1", index="1"), 5.0)
    assert len(census.violations) == 1  # another index is not a duplicate


def test_api_census_forgets_pods_deleted_while_the_watch_was_down():
    census = verdict.ApiCensus()
    census.observe("ADDED", pod("a"), 1.0)
    census.forget_missing(set(), 2.0)
    census.observe("ADDED", pod("b"), 3.0)
    assert census.violations == [] and census.present == {"b"}


def test_pod_of_cgroup_reads_node_and_uid():
    uid = "0f3c2a1b-1111-2222-3333-444455556666"
    text = f"4:memory:/rlkube-abc123-rlk-node-1/pod{uid}/0123abcd\n0::/\n"
    assert verdict.pod_of_cgroup(text) == ("rlk-node-1", uid)
    assert verdict.pod_of_cgroup(f"0::/rlkube-abc123-rlk-node-0/kubepods/pod{uid.replace('-', '_')}/x") == ("rlk-node-0", uid)
    assert verdict.pod_of_cgroup("0::/user.slice\n") is None


def test_two_processes_of_one_pod_name_are_a_duplicate_unless_the_old_is_stale_on_a_stopped_node():
    names = {"old": "j-actor-0", "new": "j-actor-0"}
    sample = [("n0", "old"), ("n1", "new")]
    # the old pod was force-deleted (not in the API) and its node's kubelet is stopped: allowed
    assert verdict.process_duplicates(sample, names, {"new"}, {"n0": 10.0}, {}, 20.0) is None
    # ... or resumed a moment ago (its kubelet has not killed the container yet)
    assert verdict.process_duplicates(sample, names, {"new"}, {}, {"n0": 15.0}, 20.0) is None
    # resumed long ago: a duplicate
    assert verdict.process_duplicates(sample, names, {"new"}, {}, {"n0": 15.0}, 15.0 + verdict.STALE_KILL_GRACE + 1)
    # both pods in the API, or no stopped node: a duplicate
    assert verdict.process_duplicates(sample, names, {"old", "new"}, {"n0": 10.0}, {}, 20.0)
    assert verdict.process_duplicates(sample, names, {"new"}, {}, {}, 20.0)["pod"] == "j-actor-0"
    # two processes of one pod (a launcher and its worker) are one pod
    assert verdict.process_duplicates([("n0", "new"), ("n0", "new")], names, {"new"}, {}, {}, 20.0) is None


def test_parse_cri_line_and_attempt_log():
    line = '2026-12-04T05:00:01.500000000Z stdout F {"time":1796360401.5,"event":"step","step":7,"loss":0.6}'
    when, message = verdict.parse_cri_line(line)
    assert abs(when - 1796360401.5) < 1e-3 and message.startswith("{")
    attempt = AttemptLog("u", "j", "n0")
    attempt.feed(when, message)
    attempt.feed(when + 1, "INFO resumed from /ckpt at step 5 (written by 1 ranks, now 1)")
    assert attempt.steps == [(1796360401.5, 7)] and attempt.resumed == 5
    assert verdict.parse_cri_line("garbage") is None


def log(uid, steps, resumed=None, job="j"):
    a = AttemptLog(uid, job, "n0", steps=[(float(t), s) for t, s in steps], resumed=resumed)
    a.first_seen = a.steps[0][0]
    return a


def test_restarts_count_steps_lost_from_the_last_step_before_the_fault():
    first = log("a", [(10, 1), (20, 7), (30, 9), (40, 12)])  # step 12 logged after the fault at 35
    second = log("b", [(60, 6), (70, 8)], resumed=5)
    kill = Fault("kill-trainer", 35.0, 35.5, "ns/j-actor-0")
    (row,) = verdict.restarts_of("j", [second, first], [kill], every=5)
    assert (row["last_step_before"], row["resumed"], row["steps_lost"], row["ok"]) == (9, 5, 4, True)
    assert row["fault"] == "kill-trainer" and row["recovery_s"] == 25.0
    (row,) = verdict.restarts_of("j", [first, log("b", [(60, 1)], resumed=None)], [kill], every=5)
    assert row["steps_lost"] == 9 and row["ok"] is False  # restarted from scratch: 9 > 5


def test_restarts_are_attributed_to_the_fault_that_touched_the_job():
    first, second = log("a", [(10, 1), (30, 9)]), log("b", [(60, 6)], resumed=5)
    faults_ = [Fault("restart-apiserver", 32.0, 34.0, "kube-apiserver"), Fault("kill-trainer", 35.0, 35.5, "ns/j-actor-0"),
               Fault("kill-trainer", 45.0, 45.5, "ns/other-actor-0"), Fault("stop-kubelet", 50.0, 59.0, "n0")]
    (row,) = verdict.restarts_of("j", [first, second], faults_, every=5)
    assert row["fault"] == "kill-trainer" and row["fault_time"] == 35.0
    (row,) = verdict.restarts_of("j", [first, second], faults_[:1], every=5)
    assert row["fault"] == "restart-apiserver"  # nothing else happened: named, for the check to flag


def test_schedule_is_seeded_bounded_and_covers_every_kind():
    plan = faults.schedule(7, 8, 600)
    assert plan == faults.schedule(7, 8, 600) and plan != faults.schedule(8, 8, 600)
    assert len(plan) == 8 and all(0 <= p.at <= 600 for p in plan)
    assert [p.at for p in plan] == sorted(p.at for p in plan)
    assert {p.kind for p in plan} == set(faults.KINDS)
    stops = [p for p in plan if p.kind == "stop-kubelet"]
    assert all(faults.SHORT_STOP[0] <= p.seconds <= faults.LONG_STOP[1] for p in stops)


def live_pod(job, index, node):
    return ((job, str(index)), f"{job}-actor-{index}", node)


def test_training_pods_are_the_live_pods_of_jobs_whose_rank_0_logged_a_step_lately_short_of_the_end():
    live = {"a0": live_pod("a", 0, "n0"), "a1": live_pod("a", 1, "n1"), "b0": live_pod("b", 0, "n1"),
            "c0": live_pod("c", 0, "n0"), "e0": live_pod("e", 0, "n0")}
    attempts = [log("a0", [(90, 12)], job="a"),  # training: both pods of the gang count
                log("b0", [(10, 3)], job="b"),  # last step 90 s ago: stuck or loading, not training
                log("c0", [(95, 400)], job="c"),  # at its last step: done
                log("old", [(99, 7)], job="e")]  # a stale attempt (its pod is not live); e's live pod has not trained
    found = verdict.training_pods(attempts, live, {"a": 400, "b": 400, "c": 400, "e": 400}, now=100.0)
    assert [(t.pod, t.node, t.step) for t in found] == [("a-actor-0", "n0", 12), ("a-actor-1", "n1", 12)]
    assert found[0].describe() == "a-actor-0 on n0 at step 12/400"


def test_landing_wants_every_fault_to_strike_a_training_job_and_every_kind_to_happen():
    on = ("j-actor-0 on n0 at step 12/400",)
    good = [Fault("kill-trainer", 1, 2, "ns/j-actor-0", training=on), Fault("stop-kubelet", 3, 4, "n0", training=on),
            Fault("kill-operator", 5, 6, "op", training=on), Fault("restart-apiserver", 7, 8, "kube-apiserver", training=on)]
    assert verdict.landing(good, [], faults.KINDS)["ok"]
    assert not verdict.landing(good[:3], [], faults.KINDS)["ok"]  # a kind never happened
    assert verdict.landing(good[:3], [], faults.KINDS)["kinds_missing"] == ["restart-apiserver"]
    assert not verdict.landing(good, ["12:00:00 kill-trainer: no job training"], faults.KINDS)["ok"]
    idle = Fault("kill-operator", 5, 6, "op")  # struck while nothing trained
    assert not verdict.landing([*good, idle], [], faults.KINDS)["ok"]
    other_node = Fault("stop-kubelet", 3, 4, "n1", training=on)  # stopped a node where nothing trained
    assert not verdict.landing([*good, other_node], [], faults.KINDS)["ok"]
    wrong_pod = Fault("kill-trainer", 1, 2, "ns/k-actor-0", training=on)
    assert [r["ok"] for r in verdict.landing([wrong_pod], [], ("kill-trainer",))["faults"]] == [False]
