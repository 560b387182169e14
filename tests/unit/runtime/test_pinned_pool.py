"""staging.PinnedPool: the writer's host buffers for device snapshots, reserved up front.

On CPU the pool is plain memory (pin=False); what is checked is the carving: every tensor of a
state gets a view of its own shape and dtype, 64-byte aligned, no two overlapping; a state that
does not fit, or a pool not yet ready, gives None (the writer then uses pageable memory); and a
checkpoint written from the views holds each tensor's own bytes, not the whole chunk it sits in.
"""

from __future__ import annotations

import json

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from rlkube.runtime.infra.staging import PinnedPool, checkpoint_bytes_estimate, same_layout


def state() -> dict:
    torch.manual_seed(0)
    return {"model": {"w": torch.randn(33, 7, dtype=torch.bfloat16), "b": torch.randn(5)},
            "optim": {"state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.randn(33, 7)}},
                      "param_groups": [{"lr": 0.1, "params": ["w"]}]}}


def ready_pool(nbytes: int, chunk: int = PinnedPool.CHUNK) -> PinnedPool:
    pool = PinnedPool(nbytes, pin=False, chunk=chunk)
    assert pool.ready.wait(10)
    return pool


def test_carved_views_match_the_layout_and_do_not_overlap():
    s = state()
    pool = ready_pool(1 << 16, chunk=1 << 12)
    host = pool.carve(s)
    assert host is not None and same_layout(s, host)
    assert host["optim"]["param_groups"] == s["optim"]["param_groups"]  # non-tensors pass through
    views = [host["model"]["w"], host["model"]["b"], host["optim"]["state"]["w"]["step"],
             host["optim"]["state"]["w"]["exp_avg"]]
    spans = sorted((v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()) for v in views)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert all(v.data_ptr() % 64 == 0 for v in views)


def test_a_state_that_does_not_fit_or_a_pool_not_ready_gives_none():
    s = state()
    assert ready_pool(256).carve(s) is None
    pool = PinnedPool(1 << 16, pin=False)
    pool.ready.wait(10)
    pool.ready.clear()  # as while the reserving thread still runs
    assert pool.carve(s) is None


def test_a_checkpoint_written_from_views_holds_the_tensors(tmp_path):
    s = state()
    host = ready_pool(1 << 20).carve(s)
    for src, dst in ((s["model"]["w"], host["model"]["w"]), (s["model"]["b"], host["model"]["b"]),
                     (s["optim"]["state"]["w"]["exp_avg"], host["optim"]["state"]["w"]["exp_avg"])):
        dst.copy_(src)
    host["optim"]["state"]["w"]["step"].copy_(s["optim"]["state"]["w"]["step"])
    dcp.save(host, storage_writer=FileSystemWriter(str(tmp_path), thread_count=2))
    written = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert written < (1 << 20) // 4  # each view's bytes, not the 1 MiB chunk they sit in
    back = {"model": {"w": torch.zeros(33, 7, dtype=torch.bfloat16), "b": torch.zeros(5)},
            "optim": {"state": {"w": {"step": torch.tensor(0.0), "exp_avg": torch.zeros(33, 7)}},
                      "param_groups": [{"lr": 0.0, "params": ["w"]}]}}
    dcp.load(back, checkpoint_id=str(tmp_path))
    assert torch.equal(back["model"]["w"], s["model"]["w"]) and torch.equal(back["model"]["b"], s["model"]["b"])
    assert torch.equal(back["optim"]["state"]["w"]["exp_avg"], s["optim"]["state"]["w"]["exp_avg"])


def test_estimate_covers_a_model_and_its_adamw_state():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    model[1].requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from rlkube.runtime.infra.staging import state_bytes

    msd, osd = get_state_dict(model, opt)
    need = state_bytes({"model": msd, "optim": osd})
    estimate = checkpoint_bytes_estimate(model)
    assert need <= estimate <= 2 * need + 4096
    assert ready_pool(estimate).carve({"model": msd, "optim": osd}) is not None


def test_estimate_counts_a_tied_embedding_as_the_checkpoint_does():
    # the state a checkpoint holds names a tied embedding twice; an estimate from parameters alone
    # came out ~0.5 GB short for a 1.5B model on the H200 and the pool went unused
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlkube.runtime.infra.staging import state_bytes

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    estimate = checkpoint_bytes_estimate(model)
    assert state_bytes(state) <= estimate
    assert ready_pool(estimate, chunk=1 << 16).carve(state) is not None


def test_device_snapshots_are_written_from_the_pool_and_restore(tmp_path, capsys):
    """The writer carves the snapshot's host copy from the reserved pool (on CUDA the pool is
    page-locked; here plain memory, the pool set directly since reserve() is CUDA-only), says so
    in its checkpointStaged event, reuses the carved copy on the next save, and what it wrote
    restores the saved state."""
    from rlkube.runtime.infra.checkpoint import Checkpointer, committed
    from rlkube.runtime.infra.distributed import DistContext

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    ctx = DistContext()
    ck = Checkpointer(str(tmp_path), keep=3, ctx=ctx, background=True, staging="device")
    ck._pool = ready_pool(checkpoint_bytes_estimate(model))
    ck.save(1, model, opt, {})
    ck.wait()
    carved = ck._stager.state_dict_cache
    assert carved is not None
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    ck.save(2, model, opt, {})
    ck.close()
    assert ck._stager.state_dict_cache is carved  # same layout: carved once
    staged = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "checkpointStaged" in line]
    assert [e["pinned"] for e in staged] == [True, True] and staged[0]["stateBytes"] <= staged[0]["poolBytes"]
    assert [s for s, _ in committed(tmp_path)] == [1, 2]
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    Checkpointer(str(tmp_path), keep=3, ctx=ctx).restore(other, other_opt)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    sa, sb = opt.state_dict()["state"], other_opt.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)


def test_host_staging_buffers_come_from_the_pool_when_it_holds_the_state(tmp_path):
    """With no room for a device snapshot, prepare() gives the host stager its buffers: from the
    reserved pool when the state fits there (no second page-locked copy), and the save restores."""
    from rlkube.runtime.infra.checkpoint import Checkpointer
    from rlkube.runtime.infra.distributed import DistContext

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    ck = Checkpointer(str(tmp_path), keep=3, ctx=DistContext(), background=True, staging="host")
    ck._stager.cache_staged_state_dict = True  # as on CUDA
    pool = ck._pool = ready_pool(checkpoint_bytes_estimate(model))
    ck.prepare(model, opt)
    ck._preparing.join(timeout=30)
    cache = ck._stager.state_dict_cache
    chunk = pool.chunks[0]
    start, end = chunk.data_ptr(), chunk.data_ptr() + chunk.numel()
    assert start <= cache["model"]["0.weight"].data_ptr() < end
    ck.save(1, model, opt, {})
    ck.close()
    other = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    Checkpointer(str(tmp_path), keep=3, ctx=DistContext()).restore(other, other_opt)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
