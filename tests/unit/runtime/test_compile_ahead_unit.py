"""CompileAhead's bookkeeping without a compile: it captures the first layer's inputs once per grad
mode, a failed background compile leaves the layers uncompiled (warned), and nothing is switched
before the thread has finished. tests/training/test_compile_ahead.py runs the real compile."""

import logging
import threading

import pytest
import torch

from rlkube.runtime.engine import compile_ahead
from rlkube.runtime.engine.compile_ahead import CompileAhead


def tiny_model() -> torch.nn.Module:
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    return model


def run_layers(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    for layer in model.model.layers:
        x = layer(x)
    return x


def test_inputs_are_captured_once_per_grad_mode_and_detached():
    model, ahead = tiny_model(), CompileAhead(torch.device("cpu"))
    ahead.add(model)
    x = torch.randn(2, 4, requires_grad=True)
    run_layers(model, x * 2)
    run_layers(model, x * 3)
    with torch.no_grad():
        run_layers(model, x)
    assert sorted(grad for _, grad in ahead.samples) == [False, True]
    layer, args, _ = ahead.samples[(0, True)]
    assert layer is model.model.layers[0]  # the first layer only
    assert args[0].requires_grad and args[0].grad_fn is None  # a leaf: no tie to the step's graph
    assert torch.equal(args[0], (x * 2).detach())  # the first call's inputs


def started_on_a_held_compile(monkeypatch, outcome) -> tuple[torch.nn.Module, CompileAhead, threading.Event]:
    """A CompileAhead started after one step, its thread's torch.compile held until the returned
    event is set, then doing `outcome(fn)`."""
    model, ahead = tiny_model(), CompileAhead(torch.device("cpu"))
    ahead.add(model)
    run_layers(model, torch.randn(2, 4))
    release = threading.Event()

    def held_compile(fn, **kwargs):
        release.wait(timeout=60)
        return outcome(fn)

    monkeypatch.setattr(compile_ahead.torch, "compile", held_compile)
    ahead.start()
    return model, ahead, release


def fail(fn):
    raise RuntimeError("inductor says no")


def test_a_failed_background_compile_leaves_the_layers_uncompiled(monkeypatch, caplog):
    model, ahead, release = started_on_a_held_compile(monkeypatch, fail)
    assert not ahead.poll(step=1)  # the thread has not finished: nothing switched
    assert ahead.pending
    release.set()
    assert ahead.done.wait(timeout=60)
    with caplog.at_level(logging.WARNING, logger="rlkube.runtime"):
        assert not ahead.poll(step=2)
    assert "inductor says no" in caplog.text
    assert not ahead.pending
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)
    ahead.close()


def test_nothing_added_nothing_pending():
    ahead = CompileAhead(torch.device("cpu"))
    ahead.start()
    assert ahead.thread is None and not ahead.pending and not ahead.poll(step=1)
    ahead.close()


@pytest.mark.parametrize("value", [None, 3, "x"])
def test_non_tensor_inputs_are_shared(value):
    assert compile_ahead._detached(value) is value


def test_close_waits_a_bounded_time_for_a_compile_in_flight(monkeypatch):
    _, ahead, release = started_on_a_held_compile(monkeypatch, lambda fn: fn)
    ahead.close(timeout=0.2)  # returns although the compile has not finished
    assert ahead.thread.is_alive()
    release.set()
    assert ahead.done.wait(timeout=60)
