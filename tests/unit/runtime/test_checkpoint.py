"""Checkpoint atomicity: only directories with their metadata file count; keep K; round trip."""

import json

import pytest
import torch

from rlkube.runtime.infra.checkpoint import META, Checkpointer, committed, latest, step_dir
from rlkube.runtime.infra.distributed import DistContext


def fake(root, step, meta=True):
    d = step_dir(root, step)
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"x")
    if meta:
        (d / META).write_text(json.dumps({"step": step}))
    return d


def test_only_checkpoints_with_metadata_exist(tmp_path):
    fake(tmp_path, 10)
    fake(tmp_path, 20)
    fake(tmp_path, 30, meta=False)  # killed between rename and metadata
    (tmp_path / ".tmp-step-000000040-123").mkdir()  # killed while writing shards
    assert [s for s, _ in committed(tmp_path)] == [10, 20]
    assert latest(tmp_path)[0] == 20
    assert latest(tmp_path / "missing") is None


def model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def test_save_restore_round_trip_and_keep(tmp_path):
    ctx = DistContext()
    ck = Checkpointer(str(tmp_path), keep=2, ctx=ctx)
    model, opt = model_and_optimizer(0)
    for step in (1, 2, 3):
        ck.save(step, model, opt, {"batcher": {"budget": 100 * step}})
    assert [s for s, _ in committed(tmp_path)] == [2, 3]  # keep=2 pruned step 1
    other, other_opt = model_and_optimizer(1)
    meta = Checkpointer(str(tmp_path), keep=2, ctx=ctx).restore(other, other_opt)
    assert meta["step"] == 3 and meta["trainer"]["batcher"]["budget"] == 300
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    sa, sb = opt.state_dict()["state"], other_opt.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)


def test_a_save_killed_before_commit_leaves_the_previous_one_latest(tmp_path):
    ctx = DistContext()
    ck = Checkpointer(str(tmp_path), keep=3, ctx=ctx)
    model, opt = model_and_optimizer(0)
    ck.save(5, model, opt, {})

    class Killed(Exception):
        pass

    def die(step):
        raise Killed

    ck.before_commit = die
    try:
        ck.save(10, model, opt, {})
    except Killed:
        pass
    assert latest(tmp_path)[0] == 5
    assert any(p.name.startswith(".tmp-step-000000010") for p in tmp_path.iterdir())
    ck.before_commit = None
    ck.save(15, model, opt, {})  # the next commit removes the dead temp directory
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    assert [s for s, _ in committed(tmp_path)] == [5, 15]


@pytest.mark.parametrize("staging", ["host", "device"])
def test_background_save_returns_before_the_write_and_commits_a_snapshot(tmp_path, staging):
    import threading

    ctx = DistContext()
    ck = Checkpointer(str(tmp_path), keep=3, ctx=ctx, background=True, staging=staging)
    model, opt = model_and_optimizer(0)
    expected = [p.detach().clone() for p in model.parameters()]
    release, writing = threading.Event(), threading.Event()

    def pause(step):
        writing.set()
        assert release.wait(timeout=30)

    ck.before_write = pause
    ck.save(4, model, opt, {"batcher": {"budget": 4}})
    assert writing.wait(timeout=30)
    assert committed(tmp_path) == []  # the writer is held: nothing committed yet
    with torch.no_grad():  # training goes on while it writes: the checkpoint keeps step 4's state
        for p in model.parameters():
            p.add_(1.0)
    release.set()
    ck.close()
    assert [s for s, _ in committed(tmp_path)] == [4]
    assert len(ck.stalls) == 1 and ck.stalls[0] >= 0
    other, other_opt = model_and_optimizer(1)
    meta = Checkpointer(str(tmp_path), keep=3, ctx=ctx).restore(other, other_opt)
    assert meta["step"] == 4 and meta["trainer"]["batcher"]["budget"] == 4
    for a, b in zip(expected, other.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("staging", ["host", "device"])
def test_prepared_host_buffers_only_for_host_staging_and_the_first_save_fills_them(tmp_path, staging):
    """prepare() allocates the host stager's buffers ahead of the first save (pinned on CUDA, off
    the step loop), and that save fills them with the state of its own step, hyperparameters too.
    When saves snapshot on the device it allocates nothing: pinning would hold the CUDA driver
    while the step loop waits, and the writer moves the snapshot to host memory off the loop.
    Either way the checkpoint restores the saved state. (The stager caches buffers on CUDA only;
    the test turns that on.)"""
    ctx = DistContext()
    ck = Checkpointer(str(tmp_path), keep=3, ctx=ctx, background=True, staging=staging)
    ck._stager.cache_staged_state_dict = True
    model, opt = model_and_optimizer(0)
    ck.prepare(model, opt)
    if staging == "host":
        ck._preparing.join(timeout=30)
        prepared = ck._stager.state_dict_cache
        assert prepared is not None and prepared["model"]["0.weight"].shape == (3, 4)
        ck.prepare(model, opt)  # once only
        assert ck._stager.state_dict_cache is prepared
    else:
        assert ck._preparing is None and ck._stager.state_dict_cache is None
    model(torch.randn(5, 4)).sum().backward()  # the state moves on before the save
    opt.step()
    for group in opt.param_groups:
        group["lr"] = 0.05
    ck.save(2, model, opt, {})
    ck.close()
    if staging == "host":
        assert ck._stager.state_dict_cache is prepared
        assert torch.equal(prepared["model"]["0.weight"], model[0].weight.detach())
    other, other_opt = model_and_optimizer(1)
    Checkpointer(str(tmp_path), keep=3, ctx=ctx).restore(other, other_opt)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    assert other_opt.param_groups[0]["lr"] == 0.05
    sa, sb = opt.state_dict()["state"], other_opt.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)


def test_a_save_due_while_one_is_writing_waits_for_it(tmp_path):
    import threading

    ck = Checkpointer(str(tmp_path), keep=5, ctx=DistContext(), background=True)
    model, opt = model_and_optimizer(0)
    release = threading.Event()
    order = []

    def hold_first(step):
        order.append(("write", step))
        if step == 1:
            assert release.wait(timeout=30)

    ck.before_write = hold_first
    ck.save(1, model, opt, {})
    second = threading.Thread(target=ck.save, args=(2, model, opt, {}))
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive()  # blocked behind the write of step 1, not started beside it
    assert order == [("write", 1)]
    release.set()
    second.join(timeout=30)
    ck.close()
    assert order == [("write", 1), ("write", 2)]
    assert [s for s, _ in committed(tmp_path)] == [1, 2]


def test_a_failed_background_write_is_raised_by_wait_and_commits_nothing(tmp_path):
    ck = Checkpointer(str(tmp_path), keep=3, ctx=DistContext(), background=True)
    model, opt = model_and_optimizer(0)

    class Killed(Exception):
        pass

    def die(step):
        raise Killed

    ck.before_commit = die
    ck.save(7, model, opt, {})
    try:
        ck.wait()
        raise AssertionError("wait() must raise the writer's error")
    except Killed:
        pass
    assert latest(tmp_path) is None
    assert any(p.name.startswith(".tmp-step-000000007") for p in tmp_path.iterdir())
    ck.before_commit = None
    ck.save(8, model, opt, {})
    ck.close()
    assert [s for s, _ in committed(tmp_path)] == [8]
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


def test_a_device_snapshot_is_taken_only_when_it_fits_next_to_the_step_peak():
    from rlkube.runtime.infra.staging import HEADROOM_BYTES, MAX_SHARE, device_snapshot_fits, state_bytes

    state = {"model": {"w": torch.zeros(4, 8, dtype=torch.bfloat16)}, "optim": {"step": torch.tensor(3.0),
             "groups": [{"lr": 0.1}]}}
    assert state_bytes(state) == 4 * 8 * 2 + 4
    gib = 1 << 30
    total = 140 * gib
    limit = int(MAX_SHARE * total) - HEADROOM_BYTES
    assert device_snapshot_fits(18 * gib, 80 * gib, total)
    assert device_snapshot_fits(gib, limit - gib, total)
    assert not device_snapshot_fits(gib, limit - gib + 1, total)


def test_a_device_snapshot_ignores_host_buffers_of_another_layout():
    from rlkube.runtime.infra.staging import DeviceSnapshot, same_layout

    state = {"w": torch.randn(3, 4), "opt": {"lr": 0.1}}
    stale = {"w": torch.zeros(4, 3), "opt": {"lr": 0.1}}  # the state's shapes changed since
    assert same_layout(state, {"w": torch.zeros(3, 4), "opt": {"lr": 0.5}}) and not same_layout(state, stale)
    snap = DeviceSnapshot(torch.device("cpu"))
    host = snap.to_host(*snap.take(state), host=stale)
    assert host is not stale and torch.equal(host["w"], state["w"]) and stale["w"].eq(0).all()


@pytest.mark.parametrize("compiled", [False, True])
def test_each_save_record_says_what_collecting_the_compile_artifacts_cost(tmp_path, monkeypatch, compiled):
    from rlkube.runtime.infra import compile_artifacts
    from rlkube.runtime.infra.log import route_events

    if compiled:  # a process that compiled: its artifacts go into the checkpoint
        monkeypatch.setattr(compile_artifacts, "saved_artifacts", lambda rank: {compile_artifacts.artifact_name(rank): b"graphs"})
    records = []
    route_events(records.append)
    try:
        ck = Checkpointer(str(tmp_path), keep=2, ctx=DistContext())
        ck.attachments = lambda: compile_artifacts.checkpoint_attachments(0)
        model, opt = model_and_optimizer(0)
        ck.save(1, model, opt, {})
    finally:
        route_events(None)
    (saved,) = [r for r in records if r["event"] == "checkpointSave"]
    seconds = saved["compileArtifactsSeconds"]
    assert isinstance(seconds, float) and 0 <= seconds <= saved["stallSeconds"]  # part of the save's stall
    written = step_dir(tmp_path, 1) / compile_artifacts.artifact_name(0)
    assert (written.read_bytes() == b"graphs") if compiled else not written.exists()
