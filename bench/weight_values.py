"""Does a decode's speed depend on the weights' values, and on how the model's pages sit in memory?  (issue 26)

For each real model (SmolLM2-135M, Gemma 3 270M) this writes two stand-ins with the model's own header and tensor
table -- one of zeros (a sparse file: what the speed calibration decoded until CAL_VERSION 8) and one of values
like a trained model's (``edgekv.edges.tinymodel.fill_values``: what it decodes now) -- and decodes the real file
and both stand-ins with this build's llama-bench (``-p 0 -n 32 -r 5 -t 2``), in turn, ``--rounds`` times.  Before
each run every file's pages are dropped from the page cache (``posix_fadvise(DONTNEED)``), so llama.cpp's mmap reads
each afresh: the comparison is of values alone.  ``--aged`` also decodes the real file as the page cache holds it
already (not dropped) beside a fresh copy of the same bytes: how much the state of the model's cached pages moves
a decode (the kernel's large folios; ``/proc/kpageflags`` counts, as root, how many of the mapped pages are in
huge folios).

    .venv/bin/python bench/weight_values.py --out bench/results/weight_values.csv
    .venv/bin/python bench/weight_values.py --aged --rounds 3

Run it on a quiet machine; it prints each run and the medians, and writes the runs as CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import mmap
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MODELS = ("smollm2-135m", "gemma3-270m")


def standins(src: Path, folder: Path, name: str) -> dict[str, Path]:
    """The model's header over a hole (zeros) and over values like a trained model's."""
    from gguf import GGUFReader

    from edgekv.edges.tinymodel import fill_values

    r = GGUFReader(src)
    size = src.stat().st_size
    with src.open("rb") as fh:
        head = fh.read(r.data_offset)
    out = {}
    for kind in ("zeros", "values"):
        p = folder / f"{name}-{kind}.gguf"
        with p.open("wb") as f:
            f.write(head)
            f.truncate(size)
            if kind == "values":
                for t in r.tensors:
                    fill_values(f, int(t.data_offset), int(t.n_bytes), t.tensor_type, t.name)
        out[kind] = p
    return out


def drop(path: Path) -> None:
    fd = os.open(os.path.realpath(path), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def huge_share(path: Path) -> float | None:
    """The share of the file's pages that the page cache holds in huge folios (KPF_THP), or None where
    /proc/kpageflags cannot be read (it needs root).  Maps the file and touches every page first."""
    if not os.access("/proc/kpageflags", os.R_OK):
        return None
    real = os.path.realpath(path)
    with open("/proc/kpageflags", "rb") as kf, open(real, "rb") as fh, open("/proc/self/pagemap", "rb") as pm:
        size = os.fstat(fh.fileno()).st_size
        m = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ)
        try:
            n = size // 4096
            sum(m[i * 4096] for i in range(n))                 # fault every page in
            maps = Path("/proc/self/maps").read_text().splitlines()
            base = next((int(line.split("-")[0], 16) for line in maps if line.rstrip().endswith(real)), None)
            if base is None:
                return None
            huge = present = 0
            for i in range(n):
                pm.seek((base // 4096 + i) * 8)
                e = struct.unpack("Q", pm.read(8))[0]
                if not e >> 63 & 1:
                    continue
                present += 1
                kf.seek((e & ((1 << 55) - 1)) * 8)
                huge += bool(struct.unpack("Q", kf.read(8))[0] & (1 << 22))
            return huge / present if present else None
        finally:
            m.close()


def decode_ts(exe: Path, env: dict, path: Path, threads: int) -> float:
    r = subprocess.run([str(exe), "-m", str(path), "-p", "0", "-n", "32", "-r", "5", "-t", str(threads), "-fa", "1",
                        "-o", "jsonl"], capture_output=True, text=True, env=env, check=True)
    return next(json.loads(x) for x in r.stdout.splitlines() if x.startswith("{"))["avg_ts"]


def main() -> None:
    from llama_tools import tool, tool_env

    from edgekv.edges.sources import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--aged", action="store_true", help="the real file as cached now, beside a fresh copy")
    ap.add_argument("--out", type=Path, help="CSV of every run")
    a = ap.parse_args()
    exe = tool("llama-bench")
    env = tool_env(exe)
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgekv-values-", dir=os.environ.get("TMPDIR")) as tmp:
        for name in a.models.split(","):
            real = Path(resolve_model(name).path)
            files = {"real": real}
            if a.aged:
                files["real, as cached"] = real
                files["fresh copy"] = Path(tmp) / f"{name}-copy.gguf"
                shutil.copyfile(real, files["fresh copy"])
                files = {k: files[k] for k in ("real, as cached", "fresh copy")}
            else:
                files.update(standins(real, Path(tmp), name))
            for rnd in range(a.rounds):
                for kind, p in files.items():
                    if kind != "real, as cached":
                        drop(p)
                    ts = decode_ts(exe, env, p, a.threads)
                    share = huge_share(p)
                    rows.append({"model": name, "file": kind, "round": rnd + 1, "threads": a.threads, "tg_ts": round(ts, 2),
                                 "huge_folio_share": None if share is None else round(share, 3)})
                    print(f"{name} {kind}: {ts:.1f} t/s" + ("" if share is None else f" ({100 * share:.0f} % of its "
                                                                                   "pages in huge folios)"), flush=True)
            base = statistics.median(r["tg_ts"] for r in rows if r["model"] == name and r["file"] == next(iter(files)))
            for kind in files:
                med = statistics.median(r["tg_ts"] for r in rows if r["model"] == name and r["file"] == kind)
                print(f"  {name} {kind}: median {med:.1f} t/s ({100 * (med / base - 1):+.1f} % against "
                      f"{next(iter(files))})")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with a.out.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
