"""The machine's read bandwidth, measured (not looked up): ``n_threads`` threads each sum their slice of a buffer
larger than the last-level cache, best of a few passes.  NumPy releases the GIL inside its reductions, so the
threads read memory in parallel like llama.cpp's own threads.  (NumPy is already installed with gguf; a
hand-written loop in Python could not come near the bandwidth.)"""

from __future__ import annotations

import threading
import time

import numpy as np

SIZE_BYTES = 256 * 1024 * 1024
PASSES = 4


def read_bandwidth(n_threads: int, size_bytes: int = SIZE_BYTES, passes: int = PASSES) -> float | None:
    """Bytes per second read by ``n_threads`` threads; None when it cannot be measured."""
    n = max(1, int(n_threads))
    a = np.ones(size_bytes // 8, dtype=np.int64)      # written once: every page is resident before timing
    parts = np.array_split(a, n)
    best = None
    for _ in range(passes):
        barrier = threading.Barrier(n + 1)

        def work(x, gate: threading.Barrier) -> None:
            gate.wait()
            x.sum()

        threads = [threading.Thread(target=work, args=(p, barrier)) for p in parts]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    n_bytes = a.nbytes
    del a, parts
    return n_bytes / best if best else None
