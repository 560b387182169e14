"""Compiling the decoder layers off the critical path (`training.backgroundCompile`).

Why: regional compilation (models.compile_layers) makes a step faster, but inline it makes the
first step wait for the compile: 32-52 s of a 1.5B model's 50-68 s from launch to the first
step on an H200 (docs/benchmarks.md), while the GPU sits idle.

How: the layers of each model handed over (`add`) stay uncompiled, and a forward pre-hook on the
model's first layer keeps a copy of that layer's inputs, once per grad mode, while the first step
runs eagerly (a training forward, a no-grad reference or scoring forward). After that step
(`start`) a thread compiles the first layer's call on those inputs: forward, and backward where
the step had gradients (inductor lowers it with the forward, so the thread does it, not the
autograd engine's device thread the training's backward also needs). The training goes on
uncompiled meanwhile. Between two steps (`poll`) the finished compile is put in place: every
layer gets `layer.compile(dynamic=True)`, the same call the thread compiled, and dynamo finds the
thread's graphs under the same code and guards, so the switch costs no second compile (a guard
the thread's inputs did not cover compiles then, as inline compilation would have).

What it costs: while the thread compiles, the two share the interpreter's lock, so uncompiled
steps launch their kernels more slowly, and a compile the training thread needs meanwhile (a new
shape elsewhere) waits for dynamo's compile lock. Numerics change at the switch from uncompiled to
compiled layers (float rounding, as `model.compile` itself does), at a step that depends on
timing. Off by default until measured on a GPU (CPU only so far: docs/benchmarks.md).

Only for a single-process run: the ranks of a multi-GPU job would have to switch at the same step.
Only DPO/KTO so far: in PPO/GRPO the first layer also runs inside the compiled decode call, which
would then trace the capture hook (and the capture would have to skip decode calls, whose inputs
hold the live KV cache); that interplay is neither built nor measured.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from rlkube.runtime.engine.models import decoder_layers

log = logging.getLogger("rlkube.runtime")

# How long closing waits for a compile in flight: the checkpoint has committed by then, and the
# operator gives a stopping pod 120 s (render.TERMINATION_GRACE_SECONDS) for all of its exit.
CLOSE_WAIT_S = 60.0


def _detached(value: Any) -> Any:
    """A copy of a layer's input with no tie to the caller's autograd graph (tensors cloned, grad
    flag kept; other values, such as a flex BlockMask, shared)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, tuple | list):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


class CompileAhead:
    """Decoder layers compiled on a thread while the training runs them uncompiled."""

    def __init__(self, device: torch.device):
        self.device = device
        self.models: list[torch.nn.Module] = []
        self.samples: dict[tuple[int, bool], tuple[torch.nn.Module, tuple, dict]] = {}
        self.hooks: list[torch.utils.hooks.RemovableHandle] = []
        self.thread: threading.Thread | None = None
        self.done = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.compile_seconds = 0.0  # the thread's, once done
        self.switched = False

    def add(self, model: torch.nn.Module) -> None:
        """Compile `model`'s decoder layers ahead (they stay uncompiled until `poll` switches)."""
        index = len(self.models)
        self.models.append(model)
        self.hooks.append(decoder_layers(model)[0].register_forward_pre_hook(
            lambda layer, args, kwargs: self._capture(index, layer, args, kwargs), with_kwargs=True))

    def _capture(self, index: int, layer: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        key = (index, torch.is_grad_enabled())
        if key not in self.samples:
            self.samples[key] = (layer, _detached(args), _detached(kwargs))

    @property
    def pending(self) -> bool:
        return bool(self.models) and not self.switched

    def start(self) -> None:
        """After the first step: compile on a thread what that step's layers were called with."""
        if not self.pending or self.thread is not None:
            return
        for hook in self.hooks:
            hook.remove()
        if not torch.cuda.is_available() and hasattr(torch._C, "_ensureCUDADeviceGuardSet"):
            # torch 2.11 without CUDA: tracing registers a no-op CUDA device guard the first time, and
            # one registered on a thread that has ended crashes the next compile on this thread
            # (a use-after-free, fixed upstream in pytorch/pytorch#178950). Registered here, it stays.
            torch._C._ensureCUDADeviceGuardSet()
        log.info("compile: %d models' decoder layers compiled on a background thread from the first step's "
                 "inputs (training.backgroundCompile); the steps until then run them uncompiled", len(self.models))
        self.thread = threading.Thread(target=self._work, name="rlkube-compile", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        t0 = time.perf_counter()
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # the current device is per thread
            # The backward lowered with the forward, here, rather than at the first backward on the
            # autograd engine's device thread, which the training's own backward waits for.
            import torch._functorch.config as aot_config  # not loaded by `import torch` alone

            with aot_config.patch(force_non_lazy_backward_lowering=True):
                for (_, grad), (layer, args, kwargs) in self.samples.items():
                    if self.stop.is_set():
                        return
                    call = torch.compile(layer._call_impl, dynamic=True)  # as Module.compile makes it
                    # The forward alone: it lowers the backward too (above). Running that backward
                    # would fail anyway once the training thread's optimizer has updated the
                    # weights the forward saved.
                    with torch.set_grad_enabled(grad):
                        call(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 (reported at the switch; the layers stay uncompiled)
            self.error = e
        finally:
            self.compile_seconds = time.perf_counter() - t0
            self.samples.clear()  # the inputs' memory
            self.done.set()

    def poll(self, step: int) -> bool:
        """Between steps: put the compiled layers in place if the thread has finished (True then)."""
        if not self.pending or not self.done.is_set():
            return False
        self.switched = True
        if self.error is not None:
            log.warning("compile: compiling the decoder layers in the background failed (%s: %s); they stay "
                        "uncompiled", type(self.error).__name__, str(self.error).splitlines()[0] if str(self.error) else "")
            return False
        for model in self.models:
            for layer in decoder_layers(model):
                layer.compile(dynamic=True)
        log.info("compile: decoder layers compiled from step %d on (%.1f s on a background thread; the steps "
                 "before ran uncompiled)", step, self.compile_seconds)
        return True

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Stop after the graph being compiled, if any (a compile cannot be interrupted), waiting at
        most `timeout` seconds for it: a pod stopped by SIGTERM has its grace period to exit in."""
        self.stop.set()
        if self.thread is not None and self.thread.is_alive():
            log.info("compile: waiting up to %.0f s for the background compile to finish before exit", timeout)
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("compile: exiting with the background compile unfinished")
