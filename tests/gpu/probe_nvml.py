"""What NVML's GPU utilization (DCGM_FI_DEV_GPU_UTIL, `nvidia-smi utilization.gpu`) counts as busy.

Why: the busy goal (docs/benchmarks.md) is measured with NVML, and for PPO it reads ~11% idle where
torch.profiler finds ~1.4% of idle gaps inside the same steps. Whether NVML misses part of the
busy time for some kinds of work (graphs of small kernels, copies) or the profiler misses real
gaps decides what is worth fixing. This script runs workloads whose busy fraction is known from
CUDA events (each unit of work timed on the GPU; busy = the units' time over the span), while
NVML is read three ways: `nvidia-smi -lms 200` in its own process (as bench_utilization does), the
runtime's 10 Hz sampler (infra/gpu_busy.py), and NVML's own sample buffer (nvmlDeviceGetSamples,
the driver's readings at its native period). It prints one row per workload.

Workloads (each `--seconds` long, work kept queued so the GPU never runs dry unless the workload
means it to):
  matmul      large bf16 matmuls (busy ~1)
  tiny-graph  a CUDA graph of 400 small element-wise kernels, replayed back to back (busy ~1)
  decode-64   a CUDA graph shaped like one decode step of a 1.5B model at 64 rows: 28 x (4
              matmuls of [64, 1536] by the layer's weights, a few element-wise kernels) (busy ~1)
  gapped      a ~2 ms matmul, then the host waits for it and sleeps 0.2 ms (busy ~0.9)
  copy        device-to-host copies into pinned memory only (copy engine, no kernel)
  idle        nothing (busy 0)

    PYTHONPATH=runtime python3 tests/gpu/probe_nvml.py --json-out OUT.json
    PYTHONPATH=runtime python3 tests/gpu/probe_nvml.py --cpu --seconds 0.2     # the CPU dry run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

WORKLOADS = ("matmul", "tiny-graph", "decode-64", "gapped", "copy", "idle")


class Units:
    """Runs `unit()` back to back, each bracketed by CUDA events, with at most `depth` units in
    flight (waiting for the oldest keeps the queue fed); `busy()` is the units' GPU time over the
    span from the first start to the last end."""

    def __init__(self, cuda: bool, depth: int = 8) -> None:
        self.cuda, self.depth = cuda, depth
        self.timed: list[tuple] = []
        self.flight: deque = deque()

    def run(self, unit, seconds: float, after=None) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if not self.cuda:
                unit()
                continue
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            unit()
            stop.record()
            self.timed.append((start, stop))
            if after is not None:
                after(stop)
            self.flight.append(stop)
            if len(self.flight) > self.depth:
                self.flight.popleft().synchronize()
        if self.cuda:
            torch.cuda.synchronize()

    def busy(self) -> float | None:
        if not self.timed:
            return None
        span = self.timed[0][0].elapsed_time(self.timed[-1][1])
        work = sum(a.elapsed_time(b) for a, b in self.timed)
        return round(min(work / span, 1.0), 4) if span > 0 else None


def graph_of(fn, cuda: bool):
    """`fn` captured as a CUDA graph (its replay), or `fn` itself on CPU."""
    if not cuda:
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def workload(name: str, device: torch.device, cpu: bool):
    """(unit, after) of workload `name`: `unit()` queues one unit of work; `after(event)`, if not
    None, runs on the host after each unit (the gapped workload's wait and sleep)."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    if name == "matmul":
        n = 256 if cpu else 8192
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        return (lambda: torch.mm(a, b)), None
    if name == "tiny-graph":
        x = torch.zeros(4096, device=device)
        return graph_of(lambda: [x.add_(1.0) for _ in range(400)], cuda), None
    if name == "decode-64":
        rows, hidden, inter, layers = (4, 32, 64, 2) if cpu else (64, 1536, 8960, 28)
        x = torch.randn(rows, hidden, device=device, dtype=dtype)
        w = [(torch.randn(hidden, 2048 if not cpu else hidden, device=device, dtype=dtype),
              torch.randn(2048 if not cpu else hidden, hidden, device=device, dtype=dtype),
              torch.randn(hidden, 2 * inter, device=device, dtype=dtype),
              torch.randn(inter, hidden, device=device, dtype=dtype)) for _ in range(layers)]

        def step():
            h = x
            for qkv, out, gate_up, down in w:
                a = torch.nn.functional.rms_norm(h, (hidden,))
                h = h + (a @ qkv) @ out
                g, u = (torch.nn.functional.rms_norm(h, (hidden,)) @ gate_up).chunk(2, dim=-1)
                h = h + (torch.nn.functional.silu(g) * u) @ down
            return h

        return graph_of(step, cuda), None
    if name == "gapped":
        n = 128 if cpu else 4096
        a = torch.randn(n, n, device=device, dtype=dtype)

        def wait_and_sleep(event):
            event.synchronize()
            time.sleep(0.0002)

        return (lambda: [torch.mm(a, a) for _ in range(1 if cpu else 8)]), (wait_and_sleep if cuda else None)
    if name == "copy":
        n = 1 << (16 if cpu else 26)
        src = torch.randn(n, device=device)
        dst = torch.empty(n, pin_memory=cuda)
        return (lambda: dst.copy_(src, non_blocking=True)), None
    if name == "idle":
        return None, None
    raise ValueError(f"unknown workload {name!r}: one of {WORKLOADS}")


def nvml_buffer(index: int):
    """A reader of NVML's utilization sample buffer: read(t0, t1) -> mean of the driver's samples
    stamped in [t0, t1] (wall-clock seconds), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None

    def read(t0: float, t1: float) -> tuple[float | None, int]:
        try:
            _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, int(t0 * 1e6))
        except Exception:
            return None, 0
        values = [s.sampleValue.uiVal / 100.0 for s in samples if t0 * 1e6 <= s.timeStamp <= t1 * 1e6]
        return (round(sum(values) / len(values), 4) if values else None), len(values)

    return read


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--cpu", action="store_true", help="the dry run: the workloads' host side on CPU, no NVML")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if cuda else "cpu")
    smi = buffer = None
    runtime_sampler = None
    if cuda:
        from bench_utilization import Sampler

        from rlkube.runtime.infra.gpu_busy import BusySampler, nvml_source, physical_index

        index = physical_index(torch.cuda.current_device())
        smi = Sampler(str(index))
        runtime_sampler = BusySampler(nvml_source(index)).start()
        buffer = nvml_buffer(index)
    rows = []
    for name in args.workloads.split(","):
        unit, after = workload(name, device, args.cpu)
        if unit is not None:
            unit()  # first call: allocation, kernel selection
            if cuda:
                torch.cuda.synchronize()
        time.sleep(1.0 if cuda else 0.0)  # the previous workload's samples end here
        if runtime_sampler is not None:
            runtime_sampler.window()
        units = Units(cuda)
        t0 = time.time()
        if unit is None:
            time.sleep(args.seconds)
        else:
            units.run(unit, args.seconds, after)
        t1 = time.time()
        edge = min(0.5, args.seconds / 4)  # a sample straddling the start or the end is left out
        row = {"workload": name, "seconds": round(t1 - t0, 2), "truth": 0.0 if unit is None else units.busy(),
               "nvidiaSmi": smi.mean(t0 + edge, t1) if smi else None,
               "runtime10Hz": runtime_sampler.window().mean if runtime_sampler else None}
        row["nvmlBuffer"], row["nvmlBufferSamples"] = buffer(t0 + edge, t1) if buffer else (None, 0)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if smi:
        smi.stop()
    if runtime_sampler:
        runtime_sampler.close()
    print("| workload | busy (CUDA events) | nvidia-smi | runtime 10 Hz | NVML buffer (samples) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['workload']} | {r['truth']} | {r['nvidiaSmi']} | {r['runtime10Hz']} | "
              f"{r['nvmlBuffer']} ({r['nvmlBufferSamples']}) |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"device": torch.cuda.get_device_name() if cuda else "cpu",
                                                   "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
