"""The CUDA runs of issue 30 in one call on a lent GPU machine: memory at full and partial offload, op placement, speed.

A lent GPU machine here has no network and takes at most 64 MiB of files, so the two real models travel as their
GGUF headers (tensor table included) and run as *stand-ins*: the header followed by zero bytes up to the file's size
(a sparse file, as `edgekv predict --engine` does for header-only files).  llama.cpp allocates exactly what it
allocates for the real file (every buffer is sized from the tensor table); the weights are zeros, so the speed
figures are those of the real shapes with zero data (docs/speed-experiments.md says what that changes).

    python -m tools.cuda_check --models-dir M prepare          # here: write M/*.head (+ sizes) from the installed models
    python -m tools.cuda_check --models-dir M run --out DIR --bin B   # there: stand-ins, edgekv bench sweeps,
                                                                       # llama-bench, sched logs

``--models-dir``: where the headers travel (written by ``prepare``, read by every call on the GPU machine);
``--work``: where the stand-ins and each step's EDGEKV_HOME go (default: a fresh temporary folder).  `run` expects
llama-cpp-python built with CUDA importable (PYTHONPATH, tools/cuda_build.sh) and llama.cpp's CUDA tools in --bin.
Every step has its own time limit and writes into --out as it goes, so a run cut short still returns what it
measured.  The records it writes become result rows with ``python -m bench.memory_model --table-only --out DIR`` and
``python -m bench.speed_model --table-only --out DIR``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]      # the checkout the steps run edgekv from
# set by main from --models-dir and --work
PATHS: dict[str, Path] = {}
# model -> (layers to offload at "half", contexts)
MODELS = {"smollm2-135m": 15, "gemma3-270m": 9}
CTX = "1024,4096"
TYPES = "f16,q8_0,q4_0"
COMMON = ["-p", "512", "-n", "16", "-r", "1"]


def prepare() -> None:
    """Cut each installed real model after its tensor-info table (header + alignment padding)."""
    from gguf import GGUFReader

    from edgekv.sources.resolve import resolve_model

    PATHS["models"].mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name in MODELS:
        p = resolve_model(name).path
        n = GGUFReader(p).data_offset
        with open(p, "rb") as f:
            head = f.read(n)
        (PATHS["models"] / f"{name}.head").write_bytes(head)
        sizes[name] = {"file_bytes": os.path.getsize(p), "head_bytes": len(head), "source": os.path.basename(p)}
        print(f"{name}: {len(head)} header bytes of {sizes[name]['file_bytes']}")
    (PATHS["models"] / "sizes.json").write_text(json.dumps(sizes, indent=1) + "\n")


def standins(dst: Path) -> dict[str, str]:
    sizes = json.loads((PATHS["models"] / "sizes.json").read_text())
    dst.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, s in sizes.items():
        p = dst / f"{name}-standin.gguf"
        with open(PATHS["models"] / f"{name}.head", "rb") as src, open(p, "wb") as f:
            shutil.copyfileobj(src, f)
            f.truncate(s["file_bytes"])
        out[name] = str(p)
    return out


RUNTIME_PROBE = """
import json, sys
from edgekv.runtime.process import run_child, worker_argv
res = run_child(worker_argv("device_runtime"), {"model_path": sys.argv[1], "n_ubatch": int(sys.argv[2]),
                                                "n_ctx": 1024}, timeout=50)
print(json.dumps({"ok": res.ok, "result": res.result, "reason": None if res.ok else res.failure_reason()}))
"""


SCHED_CAPTURE = """
import os, sys
os.environ["GGML_SCHED_DEBUG"] = "2"
import llama_cpp as L
from edgekv.core.predict import ContextParams
from edgekv.runtime.engine import LogCapture, context_params, model_params
cap = LogCapture()
cap.install()
L.llama_backend_init()
m = L.llama_model_load_from_file(sys.argv[1].encode(), model_params(int(sys.argv[3]), dry=True))
tk, tv = (sys.argv[2].split("/") * 2)[:2]
c = L.llama_init_from_model(m, context_params(ContextParams(n_ctx=1024, type_k=tk, type_v=tv, flash_attn=sys.argv[4])))
print("\\n".join(f"{lvl}\\t{t}" for lvl, t in cap.take()))
"""


def _probe_model() -> str:
    from edgekv.sources.tinymodel import write_probe_model

    p = PATHS["work"] / "standin" / "probe.gguf"
    p.parent.mkdir(parents=True, exist_ok=True)
    write_probe_model(p)
    return str(p)


def _start(out: Path, budget: float) -> tuple[Runner, dict[str, str], list[str]]:
    """The set-up every device call shares: the output folder, the step runner, the stand-ins and the edgekv command.
    No CPU speed calibration (a partial offload would otherwise measure one per sweep): speed is omitted there."""
    out.mkdir(parents=True, exist_ok=True)
    os.environ["EDGEKV_SPEED_CALIBRATE"] = "cached"
    return Runner(out, budget), standins(PATHS["work"] / "standin"), [sys.executable, "-m", "edgekv.cli"]


class Runner:
    def __init__(self, out: Path, budget: float):
        self.out, self.t0, self.budget = out, time.monotonic(), budget
        self.log_path = out / "steps.log"

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def sh(self, name: str, argv: list[str], timeout: float, env: dict | None = None, gz: bool = False) -> int:
        if self.left() < 10:
            self.note(f"SKIP {name}: budget spent")
            return -1
        timeout = min(timeout, self.left() - 5)
        t = time.monotonic()
        path = self.out / (name + (".log.gz" if gz else ".log"))
        opener = gzip.open if gz else open
        with opener(path, "wt") as f:
            f.write("+ " + " ".join(argv) + "\n")
            f.flush()
            try:
                p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)
                f.write(p.stdout)
                rc = p.returncode
            except OSError as e:
                f.write(f"cannot start: {e}\n")
                rc = 127
            except subprocess.TimeoutExpired as e:
                f.write((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
                rc = 124
        self.note(f"{name}: rc {rc} in {time.monotonic() - t:.1f} s")
        return rc

    def note(self, s: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {s}"
        print(line, flush=True)
        with open(self.log_path, "a") as f:
            f.write(line + "\n")


def run(out: Path, bindir: Path, budget: float, ctx: str = CTX, types: str = TYPES) -> None:
    r, models, ek = _start(out, budget)
    r.sh("env-nvidia-smi", ["nvidia-smi", "-q"], 20)
    r.sh("env-info", ek + ["info", "--json"], 60, env={"EDGEKV_HOME": str(PATHS["work"] / "ekh-info")})
    bench = str(bindir / "llama-bench")
    lbenv = {"LD_LIBRARY_PATH": f"{bindir}:" + os.environ.get("LD_LIBRARY_PATH", "")}

    # 1. memory: full and partial offload, f16/q8_0/q4_0, two contexts; one sweep at a time (the run's device-wide
    # readings, cudaMemGetInfo, would count another process's allocations)
    jobs = []
    for name, half in MODELS.items():
        for ngl in (-1, half):
            tag = f"{name}-ngl{'all' if ngl < 0 else ngl}"
            jobs.append((tag, ek + ["bench", models[name], "-c", ctx, "-ctk", types, "-ngl", str(ngl), *COMMON,
                                    "-o", str(out / f"{tag}.jsonl"), "--json"]))
    sm = models["smollm2-135m"]
    jobs.append(("smollm2-135m-fa-off", ek + ["bench", sm, "-c", ctx, "-ctk", "f16", "-fa", "off", *COMMON,
                                              "-o", str(out / "smollm2-135m-fa-off.jsonl"), "--json"]))
    jobs.append(("smollm2-135m-q5_0", ek + ["bench", sm, "-c", ctx.split(",")[-1], "-ctk", "q5_0", "-fa", "on,auto", *COMMON,
                                            "-o", str(out / "smollm2-135m-q5_0.jsonl"), "--json"]))
    if Path(bench).is_file():
        jobs.append(("smollm2-135m-llamabench", ek + ["bench", sm, "-c", ctx.split(",")[-1], "-ctk", "f16,q4_0", *COMMON,
                                                      "--llama-bench", bench, "-o",
                                                      str(out / "smollm2-135m-llamabench.jsonl"), "--json"]))
    for tag, argv in jobs[:4]:
        r.sh(tag, argv, 150, env={"EDGEKV_HOME": str(PATHS["work"] / f"ekh-{tag}")})

    # 2. the runtime's own device memory: one child per model (and the probe model), readings at every step
    for name, path in [("probe", _probe_model()), *models.items()]:
        for ub in (512, 256):
            r.sh(f"runtime-{name}-ub{ub}", [sys.executable, "-c", RUNTIME_PROBE, path, str(ub)], 60)

    # 3. where the ops run: the scheduler's placement of every node (GGML_SCHED_DEBUG=2) in llama.cpp's dry run
    for kv, fa, ngl in (("q5_0", "on", -1), ("f16", "on", -1), ("q4_0", "on", -1), ("q5_0", "auto", -1),
                        ("f16", "auto", 15)):
        r.sh(f"sched-smollm2-{kv}-fa{fa}-ngl{ngl}", [sys.executable, "-c", SCHED_CAPTURE, sm, kv, str(ngl), fa], 60,
             gz=True)
    r.sh("predict-engine-q5_0-fa-on", ek + ["predict", sm, "--engine", "-c", "4096", "-ctk", "q5_0", "-fa", "on",
                                            "--json"], 120, env={"EDGEKV_HOME": str(PATHS["work"] / "ekh-info")})

    for tag, argv in jobs[4:]:
        r.sh(tag, argv, 150, env={"EDGEKV_HOME": str(PATHS["work"] / f"ekh-{tag}")})

    # 4. speed with 3 repetitions of pp512 / tg128 at depth 3584, -fa on, so that q5_0 shows what a flash-attention
    # op on the CPU costs beside the pairs the CUDA build has kernels for
    for name, path in models.items():
        r.sh(f"speed-{name}", ek + ["bench", path, "-c", ctx.split(",")[-1], "-ctk", "f16,q8_0,q4_0,q5_0", "-fa", "on",
                                    "-p", "512", "-n", "128", "-r", "3", "-o", str(out / f"speed-{name}.jsonl"),
                                    "--json"], 150, env={"EDGEKV_HOME": str(PATHS["work"] / f"ekh-speed-{name}")})

    # 5. speed (alone on the machine): llama-bench, K = V, flash attention off and on, depth 0 and 4096
    for name, path in models.items() if Path(bench).is_file() else ():
        for kv in ("f16", "q8_0", "q4_0", "q5_0"):
            fa = "0,1" if kv == "f16" else "1"
            r.sh(f"llama-bench-{name}-{kv}", [bench, "-m", path, "-ngl", "99", "-ctk", kv, "-ctv", kv, "-fa", fa,
                                              "-d", "0,4096", "-p", "512", "-n", "64", "-r", "3", "-o", "jsonl"], 90,
                 env=lbenv)
    r.note("done")


PAIRS = ("f16", "q8_0", "q4_0", "q5_0", "q4_1", "q5_1", "iq4_nl", "bf16", "f32", "q8_0/f16", "f16/q8_0", "q8_0/q4_0",
         "q4_0/q8_0", "q5_0/f16")


def pairs(out: Path, budget: float) -> None:
    """Second call: which K/V pairs llama.cpp's CUDA build runs flash attention for on the device (the dry run's op
    placement), the runtime probe with single-token decodes (CUDA graphs), and bench on the pairs that moved."""
    r, models, ek = _start(out, budget)
    sm = models["smollm2-135m"]
    for kv in PAIRS:
        r.sh(f"sched-{kv.replace('/', '-')}", [sys.executable, "-c", SCHED_CAPTURE, sm, kv, "-1", "on"], 60, gz=True)
    for name, path in [("probe", _probe_model()), *models.items()]:
        r.sh(f"runtime-{name}-ub512", [sys.executable, "-c", RUNTIME_PROBE, path, "512"], 60)
    r.sh("bench-pairs", ek + ["bench", sm, "-c", "4096", "-ctk", "q8_0,q4_1,iq4_nl", "-ctv", "f16,q4_1,iq4_nl", "-fa", "on",
                              "-p", "512", "-n", "128", "-r", "3", "-o", str(out / "bench-pairs.jsonl"), "--json"], 150,
         env={"EDGEKV_HOME": str(PATHS["work"] / "ekh-pairs")})
    r.note("done")


def cublas(out: Path, budget: float) -> None:
    """Third call: the runtime probe with flash attention off (cuBLAS), and SmolLM2 -fa off / on measured again."""
    r, models, ek = _start(out, budget)
    for fa in ("off", "on"):
        tag = f"smollm2-135m-fa-{fa}"
        r.sh(tag, ek + ["bench", models["smollm2-135m"], "-c", CTX, "-ctk", "f16", "-fa", fa, *COMMON,
                        "-o", str(out / f"{tag}.jsonl"), "--json"], 120, env={"EDGEKV_HOME": str(PATHS["work"] / f"ekh-{tag}")})
    r.sh("gemma3-270m-fa-off", ek + ["bench", models["gemma3-270m"], "-c", CTX, "-ctk", "f16", "-fa", "off", *COMMON,
                                     "-o", str(out / "gemma3-270m-fa-off.jsonl"), "--json"], 120,
         env={"EDGEKV_HOME": str(PATHS["work"] / "ekh-gemma-fa-off")})
    r.note("done")


def memory(out: Path, budget: float) -> None:
    """Fourth call: the memory sweeps of ``run`` (full and partial offload) and -fa off again, with the runtime
    calibrated per K/V type and with CUDA graphs per node."""
    r, models, ek = _start(out, budget)
    for name, half in MODELS.items():
        for ngl in (-1, half):
            tag = f"{name}-ngl{'all' if ngl < 0 else ngl}"
            r.sh(tag, ek + ["bench", models[name], "-c", CTX, "-ctk", TYPES, "-ngl", str(ngl), *COMMON,
                            "-o", str(out / f"{tag}.jsonl"), "--json"], 120,
                 env={"EDGEKV_HOME": str(PATHS["work"] / "ekh-memory")})
        r.sh(f"{name}-fa-off", ek + ["bench", models[name], "-c", CTX, "-ctk", "f16", "-fa", "off", *COMMON,
                                     "-o", str(out / f"{name}-fa-off.jsonl"), "--json"], 120,
             env={"EDGEKV_HOME": str(PATHS["work"] / "ekh-memory")})
    r.note("done")


SPEED_DEPTHS = (512, 2048, 8192, 4096)      # 4096 last: the one to lose if the call runs short
SPEED_TYPES = "f16,q8_0,q5_0,q4_0"


def speed(out: Path, budget: float, lb: str | None = None) -> None:
    """Fifth call (issue 26 point 10): the speed model's GPU form.  The calibration with every layer offloaded
    (timed from an empty home), then both models' bench over f16/q8_0/q5_0/q4_0 at depths 512-8192 with the
    prediction made before each run, as bench/speed_model.py does on the CPU; the calibration (coefficients and its
    raw timings) is copied beside the records."""
    r, models, ek = _start(out, budget)
    os.environ["EDGEKV_SPEED_CALIBRATE"] = "auto"       # the GPU calibration is measured here, on demand
    home = {"EDGEKV_HOME": str(PATHS["work"] / "ekh-speed")}
    r.sh("env-gpu", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm",
                     "--format=csv"], 20)
    r.sh("calibrate-smollm2", ek + ["calibrate", models["smollm2-135m"], "-ngl", "-1", "-ctk", SPEED_TYPES,
                                    "--allow-busy"], 240, env=home)
    for d in SPEED_DEPTHS:
        for name, path in models.items():
            r.sh(f"speed-{name}-d{d}", ek + ["bench", path, "-c", str(d + 512), "-d", str(d), "-ctk", SPEED_TYPES,
                                             "-p", "512", "-n", "128", "-r", "5", "-o", str(out / f"speed-{name}.jsonl"),
                                             "--json"], 150, env=home)
    r.sh("predict-smollm2", ek + ["predict", models["smollm2-135m"], "-c", "4096,16384", "-ctk", "f16,q4_0", "--json"], 60,
         env=home)
    for f in (PATHS["work"] / "ekh-speed" / "calibration").glob("python-speed-*.json"):
        shutil.copy(f, out / f.name)
    # the same form through llama.cpp's own llama-bench of this build: calibrated through it, then measured by it
    if lb is not None and Path(lb).is_file():
        lbhome = {"EDGEKV_HOME": str(PATHS["work"] / "ekh-speed-lb")}
        r.sh("speed-llamabench", ek + ["bench", models["smollm2-135m"], "-c", "2560", "-d", "2048", "-ctk", "f16,q4_0",
                                       "-p", "512", "-n", "128", "-r", "5", "--llama-bench", lb,
                                       "-o", str(out / "speed-llamabench-smollm2-135m.jsonl"), "--json"], 240, env=lbhome)
        for f in (PATHS["work"] / "ekh-speed-lb" / "calibration").glob("*-speed-*.json"):
            shutil.copy(f, out / ("llamabench-" + f.name))
    r.note("done")


def _mark(d: float, lim: float) -> str:
    return "✓" if abs(d) <= lim else "✗"


def speed_table(res: Path) -> str:
    """Predicted vs measured tokens/s of the speed call's records (pp and tg per model, K/V and depth; "via
    llama-bench" where the calibration and the measurement both ran through llama-bench), against the mean of the
    repetitions (what llama-bench reports) and against their median (the steady state the model predicts: on a GPU
    the first two prompt repetitions after a depth fill run far slower, bench/README.md), and how many are within the
    targets (decode ±10 %, prefill ±15 %) each way."""
    import statistics

    out = ["| model | depth | K/V | test | measured t/s: mean | median | predicted t/s | mean − predicted | "
           "median − predicted |", "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    stats: dict[str, list[tuple[float, float, str]]] = {"tg": [], "pp": []}
    for f in sorted(res.glob("speed-*.jsonl")):
        via = " via llama-bench" if "llamabench" in f.stem else ""
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("status") != "ok":
                continue
            s, sp = r["settings"], (r.get("prediction") or {}).get("speed") or {}
            for t, lim in (("pp", 15.0), ("tg", 10.0)):
                x = (r.get("speed") or {}).get(t) or {}
                m, samples = x.get("mean_ts"), x.get("samples_ts") or []
                med = statistics.median(samples) if samples else None
                p = (sp.get(t) or {}).get("tokens_per_s")
                if not (m and med and p):
                    out.append(f"| {r['model']['name']}{via} | {s.get('n_depth')} | {s['type_k']} | {t} | - | - | - | "
                               f"{sp.get('error') or '-'} | |")
                    continue
                d, dm = 100 * (m - p) / p, 100 * (med - p) / p
                stats[t].append((d, dm, f"{r['model']['name']}{via} d{s.get('n_depth')} {s['type_k']}"))
                out.append(f"| {r['model']['name']}{via} | {s.get('n_depth')} | {s['type_k']} | {t} | {m:.1f} | {med:.1f} | "
                           f"{p:.1f} | {d:+.1f} % {_mark(d, lim)} | {dm:+.1f} % {_mark(dm, lim)} |")
    for t, lim in (("tg", 10), ("pp", 15)):
        for i, what in ((0, "mean"), (1, "median")):
            if stats[t]:
                worst = max(stats[t], key=lambda z: abs(z[i]))
                out.append(f"\n{t} ({what}): {sum(1 for z in stats[t] if abs(z[i]) <= lim)} of {len(stats[t])} within "
                           f"±{lim} %; worst {worst[i]:+.1f} % ({worst[2]}).")
    return "\n".join(out)


def table(res: Path) -> str:
    """Predicted vs measured device memory (NVML, this process) and host peak RSS of every bench record in ``res``."""
    rows = []
    for f in sorted(res.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("status") != "ok":
                continue
            s, mem = r["settings"], r.get("memory") or {}
            proc = (r.get("prediction") or {}).get("process") or {}
            dev_pred = sum((proc.get("device_bytes") or {}).values()) or None
            rows.append((r["model"]["name"], f.stem, s["n_ctx"], s["type_k"], s.get("n_gpu_layers"),
                         (r.get("effective") or {}).get("flash_attn") or s.get("flash_attn"),
                         mem.get("peak_gpu_bytes"), dev_pred, mem.get("peak_rss_bytes"), proc.get("peak_rss_bytes")))
    out = ["| run | n_ctx | K/V | -ngl | FA | GPU MiB measured (NVML peak) | predicted | diff | host peak RSS MiB "
           "measured | predicted | diff |", "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|"]

    def d(a, b):
        return f"{(a - b) / MIB:+.1f} MiB ({100 * (a - b) / b:+.2f} %)" if a and b else "-"

    for _name, run, n_ctx, kv, ngl, fa, gm, gp, hm, hp in rows:
        out.append(f"| {run} | {n_ctx} | {kv} | {ngl} | {fa} | {gm / MIB if gm else 0:.1f} | "
                   f"{gp / MIB if gp else 0:.1f} | {d(gm, gp)} | {hm / MIB if hm else 0:.1f} | {hp / MIB if hp else 0:.1f} | "
                   f"{d(hm, hp)} |")
    return "\n".join(out)


MIB = 1024 * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", type=Path, help="the models' headers and sizes.json (prepare writes them; every "
                    "call on the GPU machine reads them)")
    ap.add_argument("--work", type=Path, help="stand-ins and each step's EDGEKV_HOME (default: a fresh temporary folder)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare")
    q = sub.add_parser("pairs")
    q.add_argument("--out", type=Path, required=True)
    q.add_argument("--budget", type=float, default=240.0)
    c = sub.add_parser("cublas")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--budget", type=float, default=240.0)
    mm = sub.add_parser("memory")
    mm.add_argument("--out", type=Path, required=True)
    mm.add_argument("--budget", type=float, default=300.0)
    t = sub.add_parser("table")
    t.add_argument("results", type=Path)
    sp = sub.add_parser("speed")
    sp.add_argument("--out", type=Path, required=True)
    sp.add_argument("--budget", type=float, default=420.0)
    sp.add_argument("--llama-bench", dest="lb", default=None, help="also calibrate and measure through this llama-bench")
    st = sub.add_parser("speed-table")
    st.add_argument("results", type=Path)
    p = sub.add_parser("run")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--bin", type=Path, required=True, help="llama.cpp's CUDA tools (llama-bench) of this build")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    p.add_argument("--ctx", default=CTX)
    p.add_argument("--types", default=TYPES)
    a = ap.parse_args()
    if a.cmd not in ("table", "speed-table"):
        if a.models_dir is None:
            ap.error(f"{a.cmd} needs --models-dir DIR (where the models' headers are written and read)")
        PATHS["models"] = a.models_dir
        PATHS["work"] = a.work or Path(tempfile.mkdtemp(prefix="edgekv-cuda-"))
    if a.cmd == "prepare":
        prepare()
    elif a.cmd == "pairs":
        pairs(a.out, a.budget)
    elif a.cmd == "cublas":
        cublas(a.out, a.budget)
    elif a.cmd == "memory":
        memory(a.out, a.budget)
    elif a.cmd == "table":
        print(table(a.results))
    elif a.cmd == "speed":
        speed(a.out, a.budget, a.lb)
    elif a.cmd == "speed-table":
        print(speed_table(a.results))
    else:
        run(a.out, a.bin, a.budget, a.ctx, a.types)
    return 0


if __name__ == "__main__":
    sys.exit(main())
