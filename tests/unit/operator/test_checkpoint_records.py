"""A job's checkpoint record (cleanup.py) outlives the job, so the sweep (checkpoint_sweep.py) can
clean the hostPath folders of a job deleted while no operator ran."""

from __future__ import annotations

from operator_builders import UID, job

from rlkube.operator.api.observed import JobRef, JobView
from rlkube.operator.controller.checkpoint_sweep import sweep
from rlkube.operator.render import checkpoint_host_path, cleanup

STATUS = {"checkpointNodes": ["a"], "placement": {"pods": [{"index": 0, "node": "b"}]}}


def test_the_record_names_the_job_its_image_and_every_node_and_is_not_owned_by_it():
    view = JobView.from_object(job(algorithm="dpo"))
    rec = cleanup.record(view, STATUS)
    meta = rec["metadata"]
    assert rec["kind"] == "ConfigMap" and "ownerReferences" not in meta  # it must outlive the job
    assert meta["name"] == f"tiny-ckpt-{UID[:8]}" and meta["namespace"] == "team"
    assert meta["labels"][cleanup.LABEL_RECORD] == "tiny"
    assert rec["data"]["nodes"] == "a\nb" and rec["data"]["uid"] == UID and rec["data"]["image"] == view.spec.image


def test_no_record_for_a_volume_claim_or_before_any_node_is_planned():
    assert cleanup.record(JobView.from_object(job(algorithm="dpo", checkpoint={"volumeClaim": "shared"})), STATUS) is None
    assert cleanup.record(JobView.from_object(job(algorithm="dpo")), {}) is None


def test_cleanup_pods_from_a_record_equal_those_from_the_deleted_jobs_last_state():
    body = job(algorithm="dpo", status=STATUS)
    rec = cleanup.record(JobView.from_object(body), STATUS)
    from_record = cleanup.cleanup_pods(cleanup.job_of_record(rec))
    assert from_record == cleanup.cleanup_pods(body)
    folder = checkpoint_host_path(JobRef("tiny", "team", UID))
    assert [p["spec"]["containers"][0]["command"][-1] for p in from_record] == \
        [cleanup.MOUNT + folder.removeprefix(cleanup.HOST_CHECKPOINT_ROOT)] * 2


def test_only_records_whose_job_uid_is_gone_are_orphans():
    records = [{"metadata": {"name": f"j{i}-ckpt", "namespace": "team"}, "data": {"uid": f"u{i}"}} for i in range(3)]
    assert [r["data"]["uid"] for r in cleanup.orphaned(records, {"u0", "u2"})] == ["u1"]
    assert cleanup.orphaned(records, {"u0", "u1", "u2"}) == []


class RecordingApi:
    """Answers the two listings the sweep makes and records their order."""

    def __init__(self, records: list[dict], jobs: list[dict]) -> None:
        self.records, self.jobs, self.calls = records, jobs, []

    def request(self, method, path, query=None):
        assert method == "GET" and path.endswith("/configmaps")
        namespace = path.split("/")[4] if "/namespaces/" in path else None
        self.calls.append(("records", namespace, query["labelSelector"]))
        return {"items": [r for r in self.records if namespace in (None, r["metadata"]["namespace"])]}

    def list_jobs(self, namespace):
        self.calls.append(("jobs", namespace))
        return [j for j in self.jobs if namespace in (None, j["metadata"]["namespace"])]


class RecordingReconciler:
    def __init__(self) -> None:
        self.cleaned: list[dict] = []

    def clean_checkpoints(self, body: dict) -> list[str]:
        self.cleaned.append(body)
        return []


def test_the_sweep_lists_records_before_jobs_and_cleans_only_for_deleted_jobs():
    kept, gone = job("kept", status=STATUS, algorithm="dpo"), job("gone", status=STATUS, algorithm="dpo")
    kept["metadata"]["uid"], gone["metadata"]["uid"] = "uid-kept", "uid-gone"
    records = [cleanup.record(JobView.from_object(j), STATUS) for j in (kept, gone)]
    api, reconciler = RecordingApi(records, [kept]), RecordingReconciler()
    assert sweep(api, reconciler, []) == ["team/gone"]
    assert [c[0] for c in api.calls] == ["records", "jobs"]  # the order that makes it safe (cleanup.orphaned)
    (body,) = reconciler.cleaned
    assert body["metadata"] == {"name": "gone", "namespace": "team", "uid": "uid-gone"}
    assert body["status"]["checkpointNodes"] == ["a", "b"]


def test_a_namespaced_operator_sweeps_only_its_namespaces_and_lists_no_jobs_without_records():
    api = RecordingApi([], [])
    assert sweep(api, RecordingReconciler(), ["team", "other"]) == []
    assert api.calls == [("records", "team", cleanup.LABEL_RECORD), ("records", "other", cleanup.LABEL_RECORD)]
