"""Does a background device -> host copy hold up the step loop? (Why staging.PinnedPool exists.)

On a CUDA machine: `python3 tests/gpu/probe_host_copies.py`. The main thread runs matmul loops
with a sync each iteration (as the step loop does) while a background thread, on a stream of its
own, does one of: copy 6 GiB of device tensors into pageable host memory; page-lock (pin) 6 GiB
of host memory; copy the same 6 GiB into that pinned memory. Printed per case: the background
work's seconds, and the main loop's median and longest iteration.

Measured on an H200 (2026-12-04): a loop iteration of 7 ms; the pageable copy took 4.53 s and
blocked the main loop for all of it (longest iteration 4,533 ms); pinning took 2.72 s and
blocked it as long; the pinned copy took 0.12 s (longest iteration 117 ms).
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import torch

GIB = 6


def main() -> None:
    dev = "cuda"
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    src = [torch.randn(256 * 1024 * 1024, device=dev, dtype=torch.bfloat16) for _ in range(2 * GIB)]
    side = torch.cuda.Stream()

    def loop(stop: threading.Event) -> list[float]:
        times: list[float] = []
        while (not stop.is_set() or len(times) < 5) and len(times) <= 400:
            t0 = time.perf_counter()
            for _ in range(40):
                a @ a
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return times

    def run(name: str, work) -> None:
        stop, out = threading.Event(), {}

        def background() -> None:
            t0 = time.perf_counter()
            work()
            out["s"] = time.perf_counter() - t0
            stop.set()

        thread = threading.Thread(target=background)
        thread.start()
        times = loop(stop)
        thread.join()
        print(json.dumps({"case": name, "backgroundSeconds": round(out["s"], 2), "loopIterations": len(times),
                          "medianMs": round(1e3 * statistics.median(times), 1),
                          "longestMs": round(1e3 * max(times), 1)}), flush=True)

    def copy_into(hosts: list[torch.Tensor]):
        def work() -> None:
            with torch.cuda.stream(side):
                for h, s in zip(hosts, src, strict=True):
                    h.copy_(s, non_blocking=True)
            side.synchronize()
        return work

    done = threading.Event()
    done.set()
    print(json.dumps({"case": "alone", "medianMs": round(1e3 * statistics.median(loop(done)), 1)}), flush=True)
    run(f"pageable copy {GIB} GiB", copy_into([torch.empty(s.shape, dtype=s.dtype) for s in src]))
    pinned: list[torch.Tensor] = []
    run(f"pin {GIB} GiB", lambda: pinned.extend(torch.empty(s.shape, dtype=s.dtype, pin_memory=True) for s in src))
    run(f"pinned copy {GIB} GiB", copy_into(pinned))


if __name__ == "__main__":
    main()
