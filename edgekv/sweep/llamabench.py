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

import msgspec
from msgspec import UNSET

from edgekv.core.diagnose import diagnose
from edgekv.core.llamalog import parse_memory_log
from edgekv.core.predict import predict
from edgekv.errors import ResultsError
from edgekv.machine.memory import memory_watchdog
from edgekv.prediction.crosscheck import compare, engine_lines
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.records.schema import speed_test
from edgekv.runtime.engine import EngineResult
from edgekv.runtime.process import run_child
from edgekv.sweep.record import failure_block

LLAMA_BENCH_TYPES = {"f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}
_CTX_START = re.compile(r"llama_context: constructing llama_context")


def argv_for(path: str, model_path: str, s: S.Settings, test: str) -> list[str]:
    argv = [path, "-m", model_path, "-d", str(s.n_depth), "-ctk", s.type_k, "-ctv", s.type_v,
            "-fa", s.flash_attn, "-t", str(s.n_threads), "-r", str(s.repetitions), "-b", str(s.n_batch),
            "-ub", str(s.n_ubatch), "-o", "jsonl", "-v"]
    argv += ["-p", str(s.n_prompt), "-n", "0"] if test == "pp" else ["-p", "0", "-n", str(s.n_gen)]
    if s.n_gpu_layers != -1:
        argv += ["-ngl", str(s.n_gpu_layers)]
    if not s.warmup:
        argv.append("--no-warmup")
    if s.repack is False:          # llama-bench --repack 0 (use_extra_bufts off); 1 is its default, and
        argv += ["--repack", "0"]         # builds older than the flag refuse it, so it is passed only when off
    return argv


def _diagnose(child, test: str, s: S.Settings):
    """Where and why llama-bench died: its stderr carries llama.cpp's log (the AMX buffer line among it)."""
    lines = [x for x in (child.stderr or "").splitlines() if x.strip()]
    return diagnose(f"llama-bench {test}", child.signal_name, None if child.signal is not None else child.returncode,
                    child.timed_out, lines[-8:], s.n_prompt, child.oom_kills_rose, load_log=lines,
                    last_error=child.last_error(),
                    multi_token=(test == "pp" and s.n_prompt >= 2) or s.n_depth >= 2)


def split_contexts(stderr: str) -> list[str]:
    parts = _CTX_START.split(stderr)
    return parts[1:] if len(parts) > 1 else []


def _run_test(spec, s: S.Settings, test: str, gpu_probe, say):
    """One llama-bench process for ``test`` (pp or tg), memory sampled outside; the child and its wall time."""
    say.on_child({"event": "phase", "phase": f"llama-bench {test}"})
    argv = argv_for(spec.llama_bench, os.path.abspath(spec.model.ref.path), s, test)
    t = time.perf_counter()

    child = run_child(argv, stdin_data=b"", timeout=spec.timeout_s, sample_memory=True, gpu_probe=gpu_probe,
                      capture_output=True, watchdog=memory_watchdog)
    return child, time.perf_counter() - t


def _test_failure(child, test: str, s: S.Settings) -> tuple[str, S.Failure | None] | None:
    """(reason, failure block) that mark the record failed when the llama-bench ``test`` process stopped, died or
    timed out, else None."""
    if child.stopped_reason:
        return f"llama-bench {test}: {child.stopped_reason}", None
    if child.returncode != 0 or child.timed_out:
        d = _diagnose(child, test, s)
        return f"llama-bench {test}: {d.line()}", failure_block(d)
    return None


def _cache_lines(res: EngineResult) -> list[S.CacheLine]:
    return msgspec.convert(engine_lines(res), list[S.CacheLine], strict=True)


def _test_contexts(spec, case, test: str, stderr: str) -> list[S.LlamaBenchContext]:
    """Each llama.cpp context the ``test`` process constructed: its logged KV and compute buffers against the
    formula's prediction for that context."""
    contexts = []
    for chunk in split_contexts(stderr):
        log = parse_memory_log(chunk)
        n_ctx = int(log.context.get("n_ctx", 0) or 0)
        pred = predict(spec.model.shape, replace(case.params, n_ctx=n_ctx, swa_full=False, n_seq_max=1,
                                                 kv_unified=False))
        res = EngineResult(case.params, ok=True, log=log)
        diffs = compare(pred, res)
        contexts.append(S.LlamaBenchContext(
            test=test, n_ctx=n_ctx, kv=_cache_lines(res), kv_mib=round(log.kv_mib_total, 2),
            compute_mib=log.compute_buffers, formula_kv_bytes=pred.total_bytes, matches_formula=not diffs, diffs=diffs))
    return contexts


def _test_memory(child) -> S.TestMemory:
    """What was measured of the llama-bench process from outside."""
    return S.TestMemory(peak_rss_bytes=child.peak_rss_bytes, kernel_maxrss_bytes=child.kernel_maxrss_bytes,
                        peak_gpu_bytes=child.peak_gpu_bytes, peak_footprint_bytes=child.peak_footprint_bytes,
                        peak_anon_bytes=child.peak_anon_bytes, peak_file_bytes=child.peak_file_bytes)


def _fill_record(base: S.BenchRecord, spec, env: S.Environment, speed: S.Speed, mem: dict[str, S.TestMemory],
                 contexts: list[S.LlamaBenchContext], row: LlamaBenchRow, wall: float) -> S.BenchRecord:
    """The record's blocks (speed, memory, llama_bench, log, differences, timing, environment) from both tests;
    ``row``: llama-bench's JSON line of the last test."""
    peaks = [v.peak_rss_bytes for v in mem.values() if v.peak_rss_bytes]
    first = contexts[0] if contexts else None
    base.speed = speed
    base.memory = S.Memory(peak_rss_bytes=max(peaks) if peaks else None,
                           kernel_maxrss_bytes=max((v.kernel_maxrss_bytes or 0) for v in mem.values()) or None,
                           peak_gpu_bytes=max((v.peak_gpu_bytes or 0) for v in mem.values()) or None, per_test=mem)
    base.llama_bench = S.LlamaBench(
        path=spec.llama_bench, build_commit=row.build_commit, build_number=row.build_number, cpu_info=row.cpu_info,
        gpu_info=row.gpu_info, backends=row.backends, model_type=row.model_type, model_size=row.model_size,
        model_n_params=row.model_n_params, devices=row.devices, contexts=contexts)
    base.effective = S.Effective(n_ctx=first.n_ctx if first else None)
    base.llama_log = S.LlamaLog(kv=first.kv if first else [], kv_mib=first.kv_mib if first else None,
                                compute_mib=first.compute_mib if first else None)
    base.differences = S.Differences(llama_kv_matches_formula=all(c.matches_formula for c in contexts) if contexts
                                     else None)
    base.timing = S.Timing(wall_s=wall)
    base.environment = msgspec.structs.replace(env, llama_bench_build_commit=row.build_commit,
                                               llama_bench_build_number=row.build_number)
    return base


def accepts(s: S.Settings) -> bool:
    """Whether llama-bench takes the configuration's cache types (it refuses f32)."""
    return s.type_k in LLAMA_BENCH_TYPES and s.type_v in LLAMA_BENCH_TYPES


def run_llama_bench_case(spec, case, env: S.Environment, base: S.BenchRecord, gpu_probe, say) -> S.BenchRecord:
    """One configuration through llama-bench: one process per test (pp, tg), memory sampled outside.

    ``base`` is the sweep's record for this case (status "ok", no engine or child yet); it is filled in and returned.
    """
    s = case.settings
    if not accepts(s):
        base.status, base.reason = "skipped", f"llama-bench does not accept cache type {s.type_k}/{s.type_v}"
        return base
    speed: dict[str, S.SpeedTest] = {}
    mem: dict[str, S.TestMemory] = {}
    contexts: list[S.LlamaBenchContext] = []
    row = LlamaBenchRow()
    wall = 0.0
    for test in ("pp", "tg"):
        if (s.n_prompt if test == "pp" else s.n_gen) <= 0:
            continue
        child, took = _run_test(spec, s, test, gpu_probe, say)
        wall += took
        failed = _test_failure(child, test, s)
        if failed is not None:
            base.status, base.reason = "failed", failed[0]
            if failed[1] is not None:
                base.failure = failed[1]
            return base
        rows = [json.loads(x) for x in (child.stdout or "").splitlines() if x.strip().startswith("{")]
        if not rows:
            base.status, base.reason = "failed", f"llama-bench {test} printed no JSON result"
            return base
        row = llama_bench_row(rows[-1])
        speed[test] = speed_test(s.n_prompt if test == "pp" else s.n_gen, row.samples_ns, row.samples_ts,
                                  llama_bench_avg_ts=row.avg_ts)
        contexts += _test_contexts(spec, case, test, child.stderr or "")
        mem[test] = _test_memory(child)
    return _fill_record(base, spec, env, S.Speed(**speed), mem, contexts, row, wall)


# -- llama-bench output files -> records ---------------------------------------------------------------

FA_INT = {-1: "auto", 0: "off", 1: "on"}


class LlamaBenchRow(msgspec.Struct):
    """The keys edgekv reads of one llama-bench ``-o json``/``-o jsonl`` row (llama-bench's names; external input:
    a key it did not print is None, other keys are ignored).  Untyped here: the values are checked strictly where
    they enter a record (:func:`from_llama_bench_row`: one line naming the record key)."""

    build_commit: Any = None
    build_number: Any = None
    cpu_info: Any = None
    gpu_info: Any = None
    backends: Any = None
    devices: Any = None
    model_filename: Any = None
    model_type: Any = None
    model_size: Any = None
    model_n_params: Any = None
    test_time: Any = None
    n_batch: Any = None
    n_ubatch: Any = None
    n_threads: Any = None
    n_gpu_layers: Any = None
    type_k: Any = None
    type_v: Any = None
    flash_attn: Any = None
    repack: Any = None
    n_prompt: Any = None
    n_gen: Any = None
    n_depth: Any = 0
    samples_ns: Any = None
    samples_ts: Any = None
    avg_ts: Any = None


def llama_bench_row(row: dict[str, Any]) -> LlamaBenchRow:
    """One llama-bench JSON row (a dict) as :class:`LlamaBenchRow`: the one place its keys are read."""
    return msgspec.convert(row, LlamaBenchRow)


def load_llama_bench_file(path: str | os.PathLike) -> list[S.LlamaBenchRecord]:
    """Read llama-bench ``-o json`` or ``-o jsonl`` output as records of kind ``llama-bench`` (speed only).

    Each row is checked strictly (:func:`edgekv.records.schema.decode`): a value of the wrong type refuses
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


def _count(v: Any) -> int:
    return v if isinstance(v, int) else 0


def _flash_attn(fa: Any) -> Any:
    """llama-bench's flash_attn (-1/0/1, or true/false in older builds) as the schema's auto/off/on."""
    return FA_INT[fa] if isinstance(fa, int) and fa in FA_INT else fa


def _names(v: Any, split: bool) -> Any:
    """llama-bench's backends ("CUDA,BLAS": split at commas) or gpu_info (one string) as the environment's list of
    names; None when empty.  Anything else is kept for the strict check to refuse."""
    if isinstance(v, str):
        return (v.split(",") if split else [v]) if v else None
    return v


def from_llama_bench_row(row: dict[str, Any], source: str, where: str) -> S.LlamaBenchRecord:
    """One llama-bench JSON row as a record of kind ``llama-bench``, checked strictly (``where`` names the row
    in the one-line error)."""
    r = llama_bench_row(row)
    n_prompt, n_gen = _count(r.n_prompt), _count(r.n_gen)
    test = "pp" if n_prompt > 0 and n_gen == 0 else "tg" if n_gen > 0 and n_prompt == 0 else "pg"
    settings = S.Settings(
        engine="llama-bench", n_ctx=None, type_k=r.type_k, type_v=r.type_v, flash_attn=_flash_attn(r.flash_attn),
        swa_full=False, n_seq_max=1, kv_unified=False, n_batch=r.n_batch, n_ubatch=r.n_ubatch, n_threads=r.n_threads,
        n_gpu_layers=r.n_gpu_layers, n_prompt=r.n_prompt, n_gen=r.n_gen, n_depth=r.n_depth,
        repetitions=len(r.samples_ts or []), warmup=None, quality=None, test=test,
        repack=bool(r.repack) if isinstance(r.repack, (bool, int)) else UNSET)    # llama-bench's --repack
    rec = S.LlamaBenchRecord(
        schema_version=R.SCHEMA_VERSION, status="ok", reason=None, time_utc=r.test_time, source_file=source,
        model=S.Model(path=r.model_filename, name=r.model_type, sha256=None, size_bytes=r.model_size),
        settings=settings, speed=S.Speed(**{test: speed_test(n_prompt + n_gen, r.samples_ns, r.samples_ts)}),
        environment=S.Environment(cpu_model=r.cpu_info, devices=_names(r.gpu_info, split=False),
                                  backends=_names(r.backends, split=True), llama_cpp_commit=r.build_commit,
                                  llama_bench_build_number=r.build_number))
    checked = S.decode(S.encode(rec), where)     # the file's values, typed strictly: one line naming the record key
    assert isinstance(checked, S.LlamaBenchRecord)
    return checked
