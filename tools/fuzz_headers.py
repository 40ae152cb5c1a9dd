"""Fuzz the GGUF header reader and the predictor with mutated and truncated headers (issue 18).

Seeds are real headers: every tiny family in tests/tiny/specs.json (written with tools/gguf_writer.py)
and SmolLM2-135M's whole header (1.7 MB: its tokenizer's long string arrays).  Each
input is a seed after one to four mutations (mostly one) -- bit flips, random bytes, a u32/u64 overwritten with a
hostile value (0, 1, 2^31, 2^32-1, 2^32, 2^63, 2^64-1 ...) at a random or a length/count offset,
a chunk deleted or duplicated, a truncation -- and goes through exactly what ``edgekv predict`` does
with a header: ``read_header`` (with the input's size as ``size_hint``), ``shape_from_metadata``,
``validate_shape``, ``predict`` at 4096 tokens.  An outcome is the edgekv error class raised, or the
prediction's status; a crash is any exception that is not an :class:`edgekv.errors.EdgekvError`.
RSS (from /proc/self/statm) is sampled every 500 inputs; the slowest single input is kept.

    python -m tools.fuzz_headers [--inputs 30000] [--seconds 300] [--seed 18] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import platform
import random
import resource
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from edgekv.core.arch import shape_from_metadata
from edgekv.core.predict import ContextParams, predict
from edgekv.core.shapecheck import validate_shape
from edgekv.errors import EdgekvError
from edgekv.sources.gguf_header import read_header, read_header_file
from tools.gguf_writer import write_spec

ROOT = Path(__file__).resolve().parents[1]

HOSTILE = [0, 1, 2, 3, 7, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 62, 1 << 63,
           (1 << 64) - 1]
PARAMS = ContextParams(n_ctx=4096)


def seeds() -> list[bytes]:
    out = []
    specs = json.loads((ROOT / "tests" / "tiny" / "specs.json").read_text())["families"]
    with tempfile.TemporaryDirectory() as d:
        for name, spec in sorted(specs.items()):
            p = Path(d) / f"{name}.gguf"
            write_spec(p, spec)
            end = read_header_file(p).data_offset
            with open(p, "rb") as f:
                out.append(f.read(end))
    try:
        from edgekv.sources.resolve import resolve_model

        path = resolve_model("smollm2-135m").path
        with open(path, "rb") as f:
            out.append(f.read(read_header_file(path).data_offset))
    except EdgekvError:
        pass
    return out


def _offsets_of_lengths(data: bytes, rng: random.Random) -> int:
    """An offset that is likely a length or count field: 8 bytes before a printable run."""
    if len(data) < 48:
        return 0
    for _ in range(8):
        i = rng.randrange(24, len(data) - 8)
        if 0 < struct.unpack_from("<Q", data, i)[0] < 4096:
            return i
    return rng.randrange(0, max(1, len(data) - 8))


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        op = rng.choice((0, 0, 1, 2, 2, 3, 4, 5, 6, 7))
        n = len(b)
        if n < 48:
            break
        if op == 0:        # bit flips
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(n)
                b[i] ^= 1 << rng.randrange(8)
        elif op == 1:      # random bytes
            i = rng.randrange(n)
            k = rng.randint(1, 16)
            b[i:i + k] = rng.randbytes(min(k, n - i))
        elif op in (2, 3):  # a hostile u64 / u32 where a length or count likely is
            i = _offsets_of_lengths(bytes(b), rng) if op == 2 else rng.randrange(0, n - 8)
            v = rng.choice(HOSTILE)
            if rng.random() < 0.5:
                struct.pack_into("<Q", b, i, v & ((1 << 64) - 1))
            else:
                struct.pack_into("<I", b, i, v & 0xFFFFFFFF)
        elif op == 4:      # the header counts themselves
            struct.pack_into("<Q", b, rng.choice((8, 16)), rng.choice(HOSTILE))
        elif op == 5:      # delete a chunk
            i = rng.randrange(n)
            del b[i:i + rng.randint(1, 256)]
        elif op == 6:      # duplicate a chunk
            i = rng.randrange(n)
            b[i:i] = b[i:i + rng.randint(1, 256)]
        else:              # truncate
            del b[rng.randrange(8, n):]
    return bytes(b)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


def one(data: bytes) -> str:
    h = read_header(io.BytesIO(data), name="fuzz", size_hint=len(data))
    shape = shape_from_metadata(h.metadata, "fuzz", h.value_types)
    why = validate_shape(shape, {t.name: t.shape for t in h.tensors})      # as edgekv's load_model checks a shape
    shape = dataclasses.replace(shape, invalid_reason=why) if why else shape
    return f"predict:{predict(shape, PARAMS).status}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=int, default=30000)
    ap.add_argument("--seconds", type=float, default=300.0, help="stop earlier when this much time has passed")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--out", default=str(ROOT / "tools" / "results" / "fuzz_headers.json"))
    a = ap.parse_args()

    rng = random.Random(a.seed)
    pool = seeds()
    outcomes: Counter[str] = Counter()
    crashes: list[dict[str, str]] = []
    rss = [rss_mib()]
    slowest = (0.0, "")
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    done = 0
    for done in range(1, a.inputs + 1):
        data = mutate(rng.choice(pool), rng)
        t = time.perf_counter()
        try:
            outcome = one(data)
        except EdgekvError as e:
            outcome = type(e).__name__
        except Exception as e:  # noqa: BLE001 - a crash: what the fuzzer looks for
            outcome = "CRASH"
            if len(crashes) < 20:
                crashes.append({"error": f"{type(e).__name__}: {e}"[:300], "input_hex": data[:512].hex()})
        dt = time.perf_counter() - t
        if dt > slowest[0]:
            slowest = (dt, outcome)
        outcomes[outcome] += 1
        if done % 500 == 0:
            rss.append(rss_mib())
        if time.perf_counter() - t0 > a.seconds:
            break
    wall = time.perf_counter() - t0
    rss.append(rss_mib())
    res = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "inputs": done, "seconds": round(wall, 1), "inputs_per_s": round(done / wall, 1),
        "outcomes": dict(outcomes.most_common()), "crashes": outcomes.get("CRASH", 0), "crash_samples": crashes,
        "rss_mib": {"min": round(min(rss), 1), "max": round(max(rss), 1),
                    "maxrss": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)},
        "slowest_input_s": round(slowest[0], 3), "slowest_outcome": slowest[1],
        "seeds": len(pool), "seed": a.seed,
        "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "loadavg_start": [round(x, 2) for x in load0],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "crash_samples"}, indent=1))
    sys.exit(1 if res["crashes"] else 0)


if __name__ == "__main__":
    main()
