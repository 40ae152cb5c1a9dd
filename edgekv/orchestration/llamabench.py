"""Run the user's own ``llama-bench`` (a Metal or CUDA build, say) and record it in edgekv's schema.

llama-bench measures speed but no memory; edgekv runs it as a child per configuration, samples its
process memory from outside, asks for ``-o jsonl`` (speed samples) and ``-v`` (llama.cpp's own
memory lines on stderr), and stores everything in the same record layout as a native run.

llama-bench sizes each test's context as depth + test tokens (pp: ``n_depth + n_prompt``, tg:
``n_depth + n_gen``; tools/llama-bench/llama-bench.cpp:1305-1320), so its KV figures are predicted
for those contexts, not for ``-c``.  It does not accept ``f32`` cache types.

Also converts llama-bench JSON/JSONL output files into typed records of kind ``llama-bench`` (for ``edgekv
compare``, ``report`` and ``merge``).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgekv.core.llamalog import parse_memory_log
from edgekv.core.predict import predict
from edgekv.edges.engine import EngineResult
from edgekv.errors import ResultsError
from edgekv.orchestration.crosscheck import compare, engine_lines
from edgekv.records import results as R
from edgekv.records.schema import Record, decode, speed_test

LLAMA_BENCH_TYPES = {"f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}
_CTX_START = re.compile(r"llama_context: constructing llama_context")


def argv_for(path: str, model_path: str, s: dict[str, Any], test: str) -> list[str]:
    argv = [path, "-m", model_path, "-d", str(s["n_depth"]), "-ctk", s["type_k"], "-ctv", s["type_v"],
            "-fa", s["flash_attn"], "-t", str(s["n_threads"]), "-r", str(s["repetitions"]), "-b", str(s["n_batch"]),
            "-ub", str(s["n_ubatch"]), "-o", "jsonl", "-v"]
    argv += ["-p", str(s["n_prompt"]), "-n", "0"] if test == "pp" else ["-p", "0", "-n", str(s["n_gen"])]
    if s["n_gpu_layers"] != -1:
        argv += ["-ngl", str(s["n_gpu_layers"])]
    if not s["warmup"]:
        argv.append("--no-warmup")
    if s.get("repack") is False:          # llama-bench --repack 0 (use_extra_bufts off); 1 is its default, and
        argv += ["--repack", "0"]         # builds older than the flag refuse it, so it is passed only when off
    return argv


def _diagnose(child, test: str, s: dict[str, Any]):
    """Where and why llama-bench died: its stderr carries llama.cpp's log (the AMX buffer line among it)."""
    from edgekv.core.diagnose import diagnose

    lines = [x for x in (child.stderr or "").splitlines() if x.strip()]
    return diagnose(f"llama-bench {test}", child.signal_name, None if child.signal is not None else child.returncode,
                    child.timed_out, lines[-8:], s["n_prompt"], child.oom_kills_rose, load_log=lines,
                    last_error=child.last_error(),
                    multi_token=(test == "pp" and s["n_prompt"] >= 2) or s["n_depth"] >= 2)


def split_contexts(stderr: str) -> list[str]:
    parts = _CTX_START.split(stderr)
    return parts[1:] if len(parts) > 1 else []


def _run_test(spec, s: dict[str, Any], test: str, gpu_probe, emit):
    """One llama-bench process for ``test`` (pp or tg), memory sampled outside; the child and its wall time."""
    from edgekv.edges.process import run_child

    emit("child", {"event": "phase", "phase": f"llama-bench {test}"})
    argv = argv_for(spec.llama_bench, os.path.abspath(spec.model.ref.path), s, test)
    t = time.perf_counter()
    from edgekv.edges.machine_memory import memory_watchdog

    child = run_child(argv, stdin_data=b"", timeout=spec.timeout_s, sample_memory=True, gpu_probe=gpu_probe,
                      capture_output=True, watchdog=memory_watchdog)
    return child, time.perf_counter() - t


def _test_failure(child, test: str, s: dict[str, Any]) -> dict[str, Any] | None:
    """The fields that mark the record failed when the llama-bench ``test`` process stopped, died or timed out,
    else None."""
    if child.stopped_reason:
        return {"status": "failed", "reason": f"llama-bench {test}: {child.stopped_reason}"}
    if child.returncode != 0 or child.timed_out:
        d = _diagnose(child, test, s)
        return {"status": "failed", "reason": f"llama-bench {test}: {d.line()}", "failure": d.to_dict()}
    return None


def _test_contexts(spec, case, test: str, stderr: str) -> list[dict[str, Any]]:
    """Each llama.cpp context the ``test`` process constructed: its logged KV and compute buffers against the
    formula's prediction for that context."""
    contexts = []
    for chunk in split_contexts(stderr):
        log = parse_memory_log(chunk)
        n_ctx = int(log.context.get("n_ctx", 0) or 0)
        pred = predict(spec.model.shape, replace(case.params, n_ctx=n_ctx, swa_full=False, n_seq_max=1,
                                                 kv_unified=False))
        diffs = compare(pred, EngineResult(case.params, True, None, log))
        contexts.append({"test": test, "n_ctx": n_ctx, "kv": engine_lines(EngineResult(case.params, True, None, log)),
                         "kv_mib": round(log.kv_mib_total, 2), "compute_mib": log.compute_buffers,
                         "formula_kv_bytes": pred.total_bytes, "matches_formula": not diffs, "diffs": diffs})
    return contexts


def _test_memory(child) -> dict[str, Any]:
    """What was measured of the llama-bench process from outside."""
    return {"peak_rss_bytes": child.peak_rss_bytes, "kernel_maxrss_bytes": child.kernel_maxrss_bytes,
            "peak_gpu_bytes": child.peak_gpu_bytes, "peak_footprint_bytes": child.peak_footprint_bytes,
            "peak_anon_bytes": child.peak_anon_bytes, "peak_file_bytes": child.peak_file_bytes}


def _fill_record(base: dict[str, Any], spec, env, speed: dict[str, Any], mem: dict[str, Any],
                 contexts: list[dict[str, Any]], info: dict[str, Any], wall: float) -> dict[str, Any]:
    """The record's blocks (speed, memory, llama_bench, log, differences, timing, environment) from both tests."""
    peaks = [v["peak_rss_bytes"] for v in mem.values() if v["peak_rss_bytes"]]
    base["speed"] = speed
    base["memory"] = {
        "peak_rss_bytes": max(peaks) if peaks else None,
        "kernel_maxrss_bytes": max((v["kernel_maxrss_bytes"] or 0) for v in mem.values()) or None,
        "peak_gpu_bytes": max((v["peak_gpu_bytes"] or 0) for v in mem.values()) or None,
        "per_test": mem,
    }
    base["llama_bench"] = {"path": spec.llama_bench, **info, "contexts": contexts}
    base["effective"] = {"n_ctx": contexts[0]["n_ctx"] if contexts else None}
    base["llama_log"] = {"kv": contexts[0]["kv"] if contexts else [], "kv_mib": contexts[0]["kv_mib"] if contexts else None,
                         "compute_mib": contexts[0]["compute_mib"] if contexts else None}
    base["differences"] = {"llama_kv_matches_formula": all(c["matches_formula"] for c in contexts) if contexts else None}
    base["timing"] = {"wall_s": wall}
    base["environment"] = {**env, "llama_bench_build_commit": info.get("build_commit"),
                           "llama_bench_build_number": info.get("build_number")}
    return base


def run_llama_bench_case(spec, case, env, base, gpu_probe, emit) -> dict[str, Any]:
    """One configuration through llama-bench: one process per test (pp, tg), memory sampled outside.

    ``base`` is the sweep's record for this case (status "ok", no engine or child yet); it is filled in and returned.
    """
    s = case.settings
    if s["type_k"] not in LLAMA_BENCH_TYPES or s["type_v"] not in LLAMA_BENCH_TYPES:
        base.update(status="skipped", reason=f"llama-bench does not accept cache type {s['type_k']}/{s['type_v']}")
        return base
    speed, mem, contexts, info = {}, {}, [], {}
    wall = 0.0
    for test in ("pp", "tg"):
        if (s["n_prompt"] if test == "pp" else s["n_gen"]) <= 0:
            continue
        child, took = _run_test(spec, s, test, gpu_probe, emit)
        wall += took
        failed = _test_failure(child, test, s)
        if failed is not None:
            base.update(**failed)
            return base
        rows = [json.loads(x) for x in (child.stdout or "").splitlines() if x.strip().startswith("{")]
        if not rows:
            base.update(status="failed", reason=f"llama-bench {test} printed no JSON result")
            return base
        row = rows[-1]
        info = {k: row.get(k) for k in ("build_commit", "build_number", "cpu_info", "gpu_info", "backends",
                                         "model_type", "model_size", "model_n_params", "devices")}
        speed[test] = speed_test(s["n_prompt"] if test == "pp" else s["n_gen"], row["samples_ns"], row["samples_ts"],
                                 llama_bench_avg_ts=row.get("avg_ts"))
        contexts += _test_contexts(spec, case, test, child.stderr or "")
        mem[test] = _test_memory(child)
    return _fill_record(base, spec, env, speed, mem, contexts, info, wall)


# -- llama-bench output files -> records ---------------------------------------------------------------

FA_INT = {-1: "auto", 0: "off", 1: "on"}


def load_llama_bench_file(path: str | os.PathLike) -> list[Record]:
    """Read llama-bench ``-o json`` or ``-o jsonl`` output as records of kind ``llama-bench`` (speed only).

    Each row is decoded strictly (:func:`edgekv.records.schema.decode`): a value of the wrong type refuses
    the file in one line naming ``file: entry N: key``."""
    p = Path(path)
    text = p.read_text()
    try:
        obj = json.loads(text)
        rows = obj if isinstance(obj, list) else [obj]
    except ValueError:
        try:
            rows = [json.loads(x) for x in text.splitlines() if x.strip()]
        except ValueError:
            raise ResultsError(f"{p}: neither edgekv results nor llama-bench JSON/JSONL") from None
    out = []
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict) or "samples_ts" not in row or "n_prompt" not in row:
            raise ResultsError(f"{p}: entry {i} is not a llama-bench result (no samples_ts / n_prompt)")
        out.append(from_llama_bench_row(row, str(p), f"{p}: entry {i}"))
    return out


def from_llama_bench_row(row: dict[str, Any], source: str, where: str) -> Record:
    """One llama-bench JSON row as a record of kind ``llama-bench``, decoded strictly (``where`` names the row
    in the one-line error)."""
    test = "pp" if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0 else \
        "tg" if row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0 else "pg"
    fa = row.get("flash_attn")
    settings = {
        "engine": "llama-bench", "n_ctx": None, "type_k": row.get("type_k"), "type_v": row.get("type_v"),
        "flash_attn": FA_INT.get(fa, fa) if isinstance(fa, int) else ({True: "on", False: "off"}.get(fa, fa)),
        "swa_full": False, "n_seq_max": 1, "kv_unified": False, "n_batch": row.get("n_batch"),
        "n_ubatch": row.get("n_ubatch"), "n_threads": row.get("n_threads"), "n_gpu_layers": row.get("n_gpu_layers"),
        "n_prompt": row.get("n_prompt"), "n_gen": row.get("n_gen"), "n_depth": row.get("n_depth", 0),
        "repetitions": len(row.get("samples_ts") or []), "warmup": None, "quality": None, "test": test,
    }
    if isinstance(row.get("repack"), (bool, int)):      # llama-bench prints its --repack as "repack"
        settings["repack"] = bool(row["repack"])
    n_tok = (row.get("n_prompt") or 0) + (row.get("n_gen") or 0)
    return decode({
        "schema_version": R.SCHEMA_VERSION, "kind": "llama-bench", "config_key": None, "status": "ok", "reason": None,
        "time_utc": row.get("test_time"), "source_file": source,
        "model": {"path": row.get("model_filename"), "name": row.get("model_type"), "sha256": None,
                  "size_bytes": row.get("model_size")},
        "settings": settings,
        "speed": {test: speed_test(n_tok, row.get("samples_ns"), row["samples_ts"])},
        "environment": {"cpu_model": row.get("cpu_info"), "devices": row.get("gpu_info") or None,
                        "backends": row.get("backends"), "llama_cpp_commit": row.get("build_commit"),
                        "llama_bench_build_number": row.get("build_number")},
    }, where)
