"""Add the whole-process and speed predictions to the committed measured reports and render them again.

The sweeps behind reports/smollm2-135m/ and reports/gemma3-270m/ were measured before edgekv predicted
the whole process (schema 1).  They hold everything the process model needs -- the model (sha256), the
settings of every run (context, cache types, -b/-ub, threads, prompt, generated tokens, depth) -- so the
prediction can be made for exactly those runs without measuring them again.  It is made *now*, after
the measurement, and every record says so (``prediction.process.predicted_after_measurement``: when and
by which edgekv); the report's explained-memory section says so too.  The speed prediction (issue 26,
``prediction.speed``) is made the same way, from this machine's speed calibration of today (measured first
if it is not cached): a measurement of another day on the same machine class, so its residuals carry that
day's difference too, and the note says so.  A fresh sweep (``tools/publish/publish_reports.py``) predicts before it
measures.

    python -m tools.publish.explain_reports            # both reports
    python -m tools.publish.explain_reports --models smollm2-135m
    python -m tools.publish.explain_reports --roofline-only   # only the decode bound, counted again

``--roofline-only`` keeps every prediction as it was made and counts again only the bytes a decoded token reads
(the roofline's denominator; tools/publish/recount.py), so nothing is re-measured or re-predicted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from edgekv import __version__
from edgekv.calibration.baseline import runtime_baseline
from edgekv.core.memmodel import WORKLOAD_BENCH
from edgekv.core.predict import ContextParams
from edgekv.core.shape import MEMORY_KV
from edgekv.prediction.api import load_model
from edgekv.prediction.speed import (
    SpeedInputs,
    calibration_for,
    model_speed_shape,
    speed_block,
    with_graph,
)
from edgekv.prediction.wholeprocess import ProcessSettings, predict_processes
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.runtime.engine import EngineSession
from edgekv.sources.home import verified_sha256
from edgekv.sweep.record import attach_process, attach_speed
from tools.publish.recount import recount

ROOT = Path(__file__).resolve().parents[2]

MODELS = ("smollm2-135m", "gemma3-270m")
AFTER_NOTE = ("The whole-process prediction in the explained-memory section was made after these runs were measured "
              "(`tools/publish/explain_reports.py`, from the same settings, model and llama.cpp build), not before them.")


def explain(name: str) -> int:
    d = ROOT / "reports" / name
    sweep = d / "sweep.jsonl"
    recs = R.load_records(sweep)
    m = load_model(recs[0].model.spec or name)
    sha = verified_sha256(m.ref.path)
    if sha != recs[0].model.sha256:
        raise SystemExit(f"{name}: the local model ({sha[:12]}) is not the measured one "
                         f"({recs[0].model.sha256[:12]})")
    baseline = runtime_baseline()
    stamp = S.PredictedAfter(edgekv=__version__, time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    n = 0
    speed: list = []
    with EngineSession(m.ref.path, header=m.header) as eng:
        for r in recs:
            if r.status != "ok":
                continue
            s = S.encode_block(r.settings)
            params = ContextParams(n_ctx=s["n_ctx"], type_k=s["type_k"], type_v=s["type_v"], flash_attn=s["flash_attn"],
                                   swa_full=s["swa_full"], n_seq_max=s["n_seq_max"], kv_unified=s["kv_unified"],
                                   n_batch=s["n_batch"], n_ubatch=s["n_ubatch"])
            st = ProcessSettings(workload=WORKLOAD_BENCH, n_threads=s["n_threads"], use_mmap=not s.get("no_mmap"),
                                 n_gpu_layers=s["n_gpu_layers"], n_prompt=s["n_prompt"], n_gen=s["n_gen"],
                                 n_depth=s["n_depth"],
                                 restores_state_file=m.shape.memory != MEMORY_KV and s["n_depth"] > 0)
            proc = predict_processes(m, [params], st, baseline, eng)[0]
            if proc is None:
                continue
            speed.append((r, SpeedInputs.from_settings(r.settings)))
            proc.notes.append("predicted after the measurement (tools/publish/explain_reports.py)")
            r.prediction.process = None
            attach_process(r, proc)
            r.prediction.process.predicted_after_measurement = stamp
            n += 1
        graph = eng.graph
    n_speed, cal_id = attach_speeds(m, speed, baseline.cpu_features, graph, stamp)
    R.write_all(sweep, recs)
    md = (d / "README.md").read_text().split("\n")
    title, note = md[0].removeprefix("# "), md[2]
    if AFTER_NOTE not in note:
        note = f"{note} {AFTER_NOTE}"
    note = note.split(" " + SPEED_NOTE_HEAD)[0]
    if n_speed:
        note += f" {SPEED_NOTE_HEAD} {stamp.time_utc[:10]} (calibration `{cal_id}`), after these runs, which were " \
                f"measured on {_measured_on(recs)}: the residuals include the difference between those days on this " \
                "shared VM, not only the model's error."
    subprocess.run([sys.executable, "-m", "edgekv.cli", "report", str(sweep), "-o", str(d), "--title", title,
                    "--note", note, "--json"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    print(f"{name}: {n} records predicted ({n_speed} with speed), report rendered in {d}")
    return n


SPEED_NOTE_HEAD = "The speed prediction in the explained-speed section was made with this machine's speed calibration of"


def _measured_on(recs: list[S.Record]) -> str:
    days = sorted({(r.environment.time_utc or "")[:10] for r in recs} - {""})
    return " and ".join(days) or "an earlier day"


def attach_speeds(m, cases: list, cpu_features: list[str], graph, stamp: S.PredictedAfter) -> tuple[int, str | None]:
    """``prediction.speed`` for each (record, SpeedInputs), marked as predicted after the measurement."""
    n, cal_id = 0, None
    for repack in sorted({x.repack for _r, x in cases}):
        group = [(r, x) for r, x in cases if x.repack == repack]
        sh = model_speed_shape(m, cpu_features, repack, graph)
        cal, why = calibration_for(sh, [x for _r, x in group], cpu_features,
                                   progress=lambda step: print(f"  calibrating: {step}", flush=True))
        if cal is None:
            print(f"  no speed prediction: {why}")
            continue
        cal_id = cal.id
        for r, x in group:
            # the record's own dry-run graph size where it has one (a quantized cache adds nodes)
            eng = r.prediction.engine if r.prediction else None
            own = getattr(eng, "graph", None) if eng not in (None, S.UNSET) else None
            block = speed_block(with_graph(sh, own if isinstance(own, dict) else None), cal, x)
            attach_speed(r, block)
            r.prediction.speed.predicted_after_measurement = stamp
            n += not block.error
    return n, cal_id


def fix_rooflines(name: str) -> int:
    """--roofline-only: each recorded decode bound counted again (module docstring); the report rendered again."""
    d = ROOT / "reports" / name
    sweep = d / "sweep.jsonl"
    recs = R.load_records(sweep)
    m = load_model(recs[0].model.spec or name)
    sh = model_speed_shape(m, runtime_baseline().cpu_features, True, None)      # its attention layers
    n = 0
    for r in recs:
        sp = r.prediction.speed if r.prediction else None
        tg = getattr(sp, "tg", None) if sp not in (None, S.UNSET) else None
        if tg in (None, S.UNSET) or not tg.roofline_tokens_per_s or not tg.bytes_per_token:
            continue
        s = S.encode_block(r.settings)
        if max(1, int(s.get("n_parallel") or 0)) != 1:
            raise SystemExit(f"{name}: a record of -npl {s['n_parallel']}: not counted again here")
        tg.bytes_per_token, tg.roofline_tokens_per_s, sp.explain = recount(
            m.shape, sh, s["type_k"], s["type_v"], tg.depth, tg.n_tokens, tg.bytes_per_token, tg.roofline_tokens_per_s,
            tg.tokens_per_s, sp.explain if isinstance(sp.explain, str) else None)
        n += 1
    R.write_all(sweep, recs)
    md = (d / "README.md").read_text().split("\n")
    subprocess.run([sys.executable, "-m", "edgekv.cli", "report", str(sweep), "-o", str(d), "--title",
                    md[0].removeprefix("# "), "--note", md[2], "--json"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    print(f"{name}: {n} decode bounds counted again, report rendered in {d}")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--roofline-only", action="store_true", help="count each recorded decode bound again, nothing else")
    a = ap.parse_args(argv)
    for name in a.models.split(","):
        (fix_rooflines if a.roofline_only else explain)(name.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
