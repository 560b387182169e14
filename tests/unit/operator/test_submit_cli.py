"""`rlkube submit` and `rlkube logs` without a cluster: argument parsing, what following prints and
how it ends for each status, which pod a role's rank is in, and a bad manifest refused before the
API client is even made. The API server is stood in for by a small fake of commands/kube.Kube,
driven by statuses written here (the e2e test tests/e2e/test_submit.py runs the real one)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from rlkube.operator import cli
from rlkube.operator.commands import follow, logs, submit
from rlkube.operator.commands.kube import KubeError
from rlkube.operator.commands.pod_logs import NoSuchPod, choose_pod

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "dpo-tiny-cpu.yaml"


# -- builders --------------------------------------------------------------------------------------


def status(phase: str | None = None, step: int | None = None, total: int = 30, **extra) -> dict:
    out: dict = {"conditions": []}
    if phase:
        out["phase"] = phase
    if step is not None:
        out["progress"] = {"step": step, "totalSteps": total, "percent": round(100 * step / total, 1),
                           "etaSeconds": (total - step) * 2, "tokensPerSecond": 1500.0, "loss": 0.5}
    out.update(extra)
    return out


def with_condition(st: dict, type_: str, reason: str, message: str) -> dict:
    st["conditions"].append({"type": type_, "status": "True", "reason": reason, "message": message})
    return st


def job(name: str = "dpo", st: dict | None = None, device_map: dict | None = None) -> dict:
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    out = {"metadata": {"name": name, "namespace": "ns", "uid": "u1"}, "spec": spec, "status": dict(st or {})}
    if device_map is not None:
        out["status"]["placement"] = {"deviceMap": device_map}
    return out


def pod(name: str, ranks: str, uid: str = "p1", started: bool = True) -> dict:
    state = {"running": {}} if started else {"waiting": {"reason": "ContainerCreating"}}
    return {"metadata": {"name": name, "uid": uid, "annotations": {"rlkube.io/ranks": ranks}},
            "status": {"phase": "Running" if started else "Pending", "containerStatuses": [{"state": state}]}}


class FakeKube:
    """Answers get_job with the given jobs in turn (the last one repeats); records what it was asked."""

    default_namespace = "team"

    def __init__(self, jobs: list[dict | None] = (), pods: list[dict] = (), log: list[str] = ()) -> None:
        self.jobs, self.pods, self.log = list(jobs), list(pods), list(log)
        self.created: list[tuple[str, dict]] = []
        self.calls: list[str] = []

    def create_job(self, namespace: str, body: dict) -> dict:
        self.created.append((namespace, body))
        return body

    def get_job(self, namespace: str, name: str) -> dict | None:
        self.calls.append(f"get {namespace}/{name}")
        return self.jobs.pop(0) if len(self.jobs) > 1 else (self.jobs[0] if self.jobs else None)

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        self.calls.append(f"pods {selector}")
        return self.pods

    def pod_log(self, namespace: str, pod: str, follow: bool):
        self.calls.append(f"log {pod} follow={follow}")
        yield from self.log


# -- parsing ---------------------------------------------------------------------------------------


def test_submit_and_logs_arguments_parse_with_their_defaults():
    ns = cli._parser().parse_args(["submit", "job.yaml"])
    assert (ns.file, ns.follow, ns.timeout, ns.logs, ns.namespace, ns.kubeconfig) == \
        ("job.yaml", False, 86400.0, True, None, None)
    ns = cli._parser().parse_args(["submit", "-", "-f", "--timeout", "30m", "-n", "t", "--kubeconfig", "k",
                                   "--no-logs"])
    assert (ns.file, ns.follow, ns.timeout, ns.logs, ns.namespace, ns.kubeconfig) == ("-", True, 1800.0, False, "t", "k")
    ns = cli._parser().parse_args(["logs", "dpo"])
    assert (ns.job, ns.role, ns.rank, ns.follow) == ("dpo", "actor", 0, False)
    ns = cli._parser().parse_args(["logs", "dpo", "--role", "critic", "--rank", "1", "-f"])
    assert (ns.role, ns.rank, ns.follow) == ("critic", 1, True)


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5h", 5400),
                                          ("1d", 86400)])
def test_durations(text, seconds):
    assert submit.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "5x", "m"])
def test_bad_durations_are_refused_by_the_parser(text, capsys):
    with pytest.raises(SystemExit) as caught:
        cli._parser().parse_args(["submit", "job.yaml", "--timeout", text])
    assert caught.value.code == 2 and "not a duration" in capsys.readouterr().err


# -- what following prints and how it ends -------------------------------------------------------


@pytest.mark.parametrize("phase,code", [("Succeeded", 0), ("Failed", 1), ("Running", None), ("Pending", None),
                                        ("Scheduling", None), ("Restarting", None), ("Suspended", None), (None, None)])
def test_phase_decides_the_exit_code(phase, code):
    assert follow.exit_code(phase) == code


@pytest.mark.parametrize("progress,line", [
    ({"step": 12, "totalSteps": 30, "percent": 40.0, "etaSeconds": 65, "tokensPerSecond": 12345.6, "loss": 0.693147},
     "step 12/30 (40.0%)  ETA 1m05s  12,346 tokens/s  loss 0.6931"),
    ({"step": 30, "totalSteps": 30, "percent": 100.0, "etaSeconds": 0}, "step 30/30 (100.0%)"),
    ({"step": 3, "totalSteps": 1000, "etaSeconds": 7500, "rewardMean": 0.25}, "step 3/1000  ETA 2h05m  reward 0.25"),
    ({"step": 1}, "step 1"),
    ({"totalSteps": 30}, None),
    (None, None),
])
def test_progress_line_from_status_progress(progress, line):
    assert follow.progress_line(progress) == line


def test_a_followed_job_prints_each_phase_and_step_once_and_ends_succeeded():
    f = follow.Follower("dpo")
    seen = [f.observe(None),  # just created, not visible yet: not an end
            f.observe(job(st=status())),
            f.observe(job(st=with_condition(status("Scheduling"), "Progressing", "Placed", "2 pods on 1 node"))),
            f.observe(job(st=status("Running", step=3))),
            f.observe(job(st=status("Running", step=3))),
            f.observe(job(st=status("Succeeded", step=30, outputs={"model": {"path": "/c/export", "step": 30}})))]
    assert seen == [
        ([], None), ([], None),
        (["phase Scheduling (Placed: 2 pods on 1 node)"], None),
        (["phase Running", "step 3/30 (10.0%)  ETA 54s  1,500 tokens/s  loss 0.5"], None),
        ([], None),
        (["step 30/30 (100.0%)  1,500 tokens/s  loss 0.5", "job dpo succeeded; exported model /c/export (step 30)"], 0),
    ]


def test_a_failed_job_ends_with_exit_1_and_its_reason():
    f = follow.Follower("dpo")
    f.observe(job(st=status("Running")))
    failed = with_condition(status("Failed"), "Failed", "ExitCode",
                            "config error: data.source: '/data/missing.jsonl' does not exist")
    assert f.observe(job(st=failed)) == (
        ["job dpo failed: ExitCode: config error: data.source: '/data/missing.jsonl' does not exist"], 1)


def test_a_deleted_job_ends_following_and_a_suspended_one_does_not():
    f = follow.Follower("dpo")
    lines, code = f.observe(job(st=with_condition(status("Suspended"), "Suspended", "Suspended", "spec.suspend")))
    assert code is None and lines[0] == "phase Suspended (Suspended: spec.suspend)" and "resumes" in lines[1]
    assert f.observe(None) == (["job dpo was deleted"], 1)


def follow_with(kube: FakeKube, timeout: float = 60.0, logs: bool = True) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    clock = iter(range(0, 10_000, 2))
    code = submit.follow_job(kube, "ns", "dpo", timeout, logs, submit.Printer(out, "dpo"), err,
                             clock=lambda: float(next(clock)), sleep=lambda s: None)
    return code, out.getvalue() + err.getvalue()


def test_follow_streams_rank_0s_log_and_returns_the_jobs_exit_code():
    done = with_condition(status("Failed"), "Failed", "ExitCode", "config error: data.source: missing")
    kube = FakeKube([job(st=status("Running")), job(st=done)], pods=[pod("dpo-actor-0", "0")],
                    log=["loading data", "config error: data.source: missing"])
    code, text = follow_with(kube)
    assert code == 1
    assert text.splitlines() == ["[dpo] phase Running", "dpo-actor-0 | loading data",
                                 "dpo-actor-0 | config error: data.source: missing",
                                 "[dpo] job dpo failed: ExitCode: config error: data.source: missing"]
    assert kube.calls.count("log dpo-actor-0 follow=True") == 1  # one stream per pod, not per poll
    assert "pods rlkube.io/job=dpo,rlkube.io/pod-index=0" in kube.calls


def test_pods_forbidden_to_the_user_leave_the_job_followed_without_its_log():
    class NoPods(FakeKube):
        def list_pods(self, namespace, selector):
            raise KubeError(403, 'list pods -l x: pods is forbidden: User "me" cannot list resource "pods"')

    code, text = follow_with(NoPods([job(st=status("Running")), job(st=status("Succeeded"))]))
    assert code == 0
    assert text.splitlines() == ["[dpo] phase Running",
                                 "[dpo] rank 0's log: list pods -l x: pods is forbidden: User \"me\" cannot list "
                                 "resource \"pods\"; following without it",
                                 "[dpo] job dpo succeeded"]


def test_follow_stops_at_the_timeout_without_deleting_the_job():
    kube = FakeKube([job(st=status("Running", step=1))])
    code, text = follow_with(kube, timeout=10, logs=False)
    assert code == follow.EXIT_TIMEOUT and not kube.created
    assert "stopped following after --timeout 10s" in text and "kubectl delete rltj dpo -n ns" in text
    assert not any(call.startswith("pods") for call in kube.calls)  # --no-logs


def test_ctrl_c_stops_following_and_says_the_job_keeps_running():
    class Interrupted(FakeKube):
        def get_job(self, namespace, name):
            raise KeyboardInterrupt

    code, text = follow_with(Interrupted())
    assert code == follow.EXIT_INTERRUPTED
    assert "stopped following (Ctrl-C); nothing was deleted, the job keeps running" in text


# -- submit: validation before any API call ------------------------------------------------------


def run_submit(tmp_path, doc: dict | str, *flags, connect=None) -> tuple[int, str, str]:
    path = tmp_path / "job.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    out, err = io.StringIO(), io.StringIO()
    options = {"follow": False, "namespace": None, "kubeconfig": None, "timeout": 60.0, "logs": True, **dict(flags)}
    code = submit.run(str(path), out=out, err=err, connect=connect, **options)
    return code, out.getvalue(), err.getvalue()


def refuse_to_connect(kubeconfig):
    raise AssertionError("the API client was made for a manifest that should have been refused")


@pytest.mark.parametrize("edit,problem", [
    (lambda d: d["spec"]["roles"]["actor"].update(gpus=0), "spec.roles.actor.gpus: must be >= 1"),
    (lambda d: d["spec"].update(algorithm="sft"), "spec.algorithm"),
    (lambda d: d["metadata"].update(name="Bad_Name"), "metadata.name"),
])
def test_a_bad_manifest_is_refused_with_its_field_before_any_api_call(tmp_path, edit, problem):
    doc = yaml.safe_load(EXAMPLE.read_text())
    edit(doc)
    code, out, err = run_submit(tmp_path, doc, connect=refuse_to_connect)
    assert code == follow.EXIT_INVALID and problem in err and "nothing was submitted" in err, err
    assert out == ""


def test_duplicate_keys_and_several_jobs_are_refused_too(tmp_path):
    text = EXAMPLE.read_text()
    code, _, err = run_submit(tmp_path, text.replace("  algorithm: dpo\n", "  algorithm: dpo\n  algorithm: ppo\n"),
                              connect=refuse_to_connect)
    assert code == 3 and "spec.algorithm: duplicate key" in err
    code, _, err = run_submit(tmp_path, text + "---\n" + text, connect=refuse_to_connect)
    assert code == 3 and "holds 2 RLTrainingJobs" in err


def test_a_good_manifest_is_created_in_the_namespace_asked_for(tmp_path):
    kube = FakeKube()
    code, out, _ = run_submit(tmp_path, yaml.safe_load(EXAMPLE.read_text()), connect=lambda _: kube)
    assert code == 0 and out == "rltrainingjob.rlkube.io/dpo-tiny created in namespace team\n"
    (namespace, body), = kube.created
    assert namespace == "team" and body["metadata"]["namespace"] == "team" and body["kind"] == "RLTrainingJob"
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = "written"
    assert submit.target_namespace(doc, None, "team") == "written"
    assert submit.target_namespace(doc, "written", "team") == "written"
    with pytest.raises(ValueError, match="does not match --namespace"):
        submit.target_namespace(doc, "other", "team")


def test_an_existing_job_is_left_alone_with_a_hint(tmp_path):
    class Exists(FakeKube):
        def create_job(self, namespace, body):
            raise KubeError(409, "create rltrainingjobs/dpo-tiny: already exists")

    code, _, err = run_submit(tmp_path, yaml.safe_load(EXAMPLE.read_text()), connect=lambda _: Exists())
    assert code == 1 and "already exists" in err and "kubectl delete rltj dpo-tiny -n team" in err


# -- logs: which pod holds a role's rank ---------------------------------------------------------

PODS = [pod("ppo-actor-0", "0,1"), pod("ppo-critic-1", "2", uid="p2")]
DEVICE_MAP = {"actor": [0, 1], "reference": [0, 1], "critic": [2]}


@pytest.mark.parametrize("role,rank,name", [("actor", 0, "ppo-actor-0"), ("actor", 1, "ppo-actor-0"),
                                            ("reference", 1, "ppo-actor-0"), ("critic", 0, "ppo-critic-1")])
def test_a_roles_rank_is_found_in_the_pod_holding_its_global_rank(role, rank, name):
    assert choose_pod(job("ppo", device_map=DEVICE_MAP), PODS, role, rank)["metadata"]["name"] == name


@pytest.mark.parametrize("role,rank,message", [
    ("reward", 0, "job ppo has no role 'reward'; its roles: actor (ranks 0-1), reference (ranks 0-1), critic (rank 0)"),
    ("critic", 1, "role critic has no rank 1; its roles: actor (ranks 0-1)"),
])
def test_a_missing_role_or_rank_names_the_valid_ones(role, rank, message):
    with pytest.raises(NoSuchPod, match=message.replace("(", r"\(").replace(")", r"\)")):
        choose_pod(job("ppo", device_map=DEVICE_MAP), PODS, role, rank)


def test_a_rank_whose_pod_is_gone_names_the_pods_and_the_phase():
    with pytest.raises(NoSuchPod, match="no pod holds critic rank 0 .global rank 2. now; job phase Restarting, "
                                        "its pods: ppo-actor-0"):
        choose_pod(job("ppo", st={"phase": "Restarting"}, device_map=DEVICE_MAP), PODS[:1], "critic", 0)


def test_without_a_placement_the_specs_device_map_is_used():
    assert choose_pod(job("dpo"), [pod("dpo-actor-0", "0"), pod("dpo-actor-1", "1")], "actor", 1)["metadata"]["name"] \
        == "dpo-actor-1"


def test_logs_prints_the_chosen_pods_log_or_says_why_not():
    def run(kube, *args) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        role, rank = (args + ("actor", 0))[:2] if args else ("actor", 0)
        return logs.run("ppo", role, rank, False, None, None, out=out, err=err, connect=lambda _: kube), \
            out.getvalue(), err.getvalue()

    kube = FakeKube([job("ppo", device_map=DEVICE_MAP)], pods=PODS, log=["step 1", "step 2"])
    assert run(kube) == (0, "step 1\nstep 2\n", "")
    assert "log ppo-actor-0 follow=False" in kube.calls and "get team/ppo" in kube.calls
    code, _, err = run(kube, "reward", 0)
    assert code == logs.EXIT_NO_POD and "its roles: actor (ranks 0-1)" in err
    code, _, err = run(FakeKube([None]))
    assert code == logs.EXIT_NO_POD and "no RLTrainingJob 'ppo' in namespace team" in err
    waiting = FakeKube([job("ppo", device_map=DEVICE_MAP)], pods=[pod("ppo-actor-0", "0,1", started=False)])
    code, _, err = run(waiting)
    assert code == logs.EXIT_NO_POD and "has not started its trainer yet (pod phase Pending)" in err
