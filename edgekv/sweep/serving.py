"""``edgekv bench --llama-server PATH``: the user's own llama-server, measured under a real HTTP client.

One configuration is one server process (a fresh one each time, like every measured run): started on a free port of
127.0.0.1 with the configuration's ``-c -np -ctk -ctv -fa -t -b -ub -ngl`` (``-np`` = the ``-npl`` value N), ready
when ``/health`` says so, then ``-r`` rounds of N concurrent streamed ``/completion`` requests of ``-p`` random prompt
token ids and ``-n`` generated tokens (EOS ignored, no prompt cache) through :mod:`edgekv.runtime.server`; its memory
is sampled from outside all along.  The record holds, per round, the aggregate prefill (N·p tokens over the longest
``prompt_ms`` the server reported: llama.cpp's own timing) and decode (all requests' tokens per second over the time all of them
decode at once, measured by the client), each request's decode rate, time to first token, the server's timings as it sent them,
the server's peak RSS beside the whole-process prediction for ``-np N`` over this binary's own runtime baseline,
and llama.cpp's KV lines from the server's log beside the formula.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec

from edgekv.core.llamalog import parse_memory_log
from edgekv.errors import EngineError, RunFailed
from edgekv.prediction.crosscheck import compare, engine_lines
from edgekv.records import schema as S
from edgekv.records.schema import speed_test
from edgekv.runtime.engine import EngineResult
from edgekv.runtime.server import ServerProcess, drive, fetch_props, log_reason

SEED = 1234


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, int(round(q * (len(ys) - 1)))))]


def _rounds(srv, s: S.Settings, n_vocab: int, timeout_s: float, say) -> list[Any]:
    k, reps = int(s.n_parallel), int(s.repetitions)
    levels = []
    for r in range(reps):
        say.on_child({"event": "phase", "phase": "tg", "rep": r + 1, "reps": reps})
        levels.append(drive(srv.base_url, k, k, int(s.n_prompt), int(s.n_gen), n_vocab, seed=SEED + r,
                            request_timeout_s=timeout_s, warmup=bool(s.warmup) and r == 0))
    return levels


def _count_at(arrivals: list[tuple[float, int]], t: float) -> int:
    """Tokens a request had received by time ``t`` (its arrivals are in order)."""
    n = 0
    for when, count in arrivals:
        if when > t:
            break
        n = count
    return n


def all_decoding_rate(requests: list[Any]) -> float | None:
    """Tokens/s of all requests together while every one of them decodes: from the last request's first token to the
    first request's last token (the server prefills late arrivals between decode steps, so a request's own rate
    also holds other prompts; over this window all of them decode at once, like -npl in-process).  None when the
    requests never decoded all at once."""
    starts = [r.arrivals[0][0] for r in requests if r.arrivals]
    ends = [r.arrivals[-1][0] for r in requests if r.arrivals]
    if len(starts) != len(requests) or not starts:
        return None
    a, b = max(starts), min(ends)
    if b <= a:
        return None
    return sum(_count_at(r.arrivals, b) - _count_at(r.arrivals, a) for r in requests) / (b - a)


def speed_and_serving(levels: list[Any], s: S.Settings, exe: str, ready_s: float | None) -> tuple[S.Speed, S.Serving]:
    """(``speed``, ``serving``) blocks of a record from the rounds' request results."""
    k, p, n = int(s.n_parallel), int(s.n_prompt), int(s.n_gen)
    pp_ns, tg_ts, seq_ts, ttft, timings, failures = [], [], [], [], [], []
    for lv in levels:
        ok = [r for r in lv.requests if r.ok]
        failures += [r.reason for r in lv.requests if not r.ok and r.reason]
        timings += [r.timings for r in ok if r.timings]
        ttft += [r.ttft_s for r in ok if r.ttft_s is not None]
        rates = [r.decode_tps for r in ok if r.decode_tps]
        seq_ts += rates
        together = all_decoding_rate(ok) if len(ok) == k else None
        if together:
            tg_ts.append(together)
        prompt_ms = [float(r.timings["prompt_ms"]) for r in ok if r.timings and r.timings.get("prompt_ms")]
        if len(prompt_ms) == k:
            pp_ns.append(int(max(prompt_ms) * 1e6))
    speed = S.Speed()
    if pp_ns:
        speed.pp = speed_test(k * p, pp_ns, [k * p * 1e9 / x for x in pp_ns])
    if tg_ts:
        speed.tg = speed_test(k * n, None, tg_ts)
    if seq_ts:
        speed.tg_seq = speed_test(n, None, seq_ts)
    gen = sum(lv.generated_tokens for lv in levels)
    wall = sum(lv.wall_s for lv in levels)
    serving = S.Serving(path=exe, concurrency=k, n_requests=sum(len(lv.requests) for lv in levels),
                        n_failed=sum(lv.n_failed for lv in levels), ttft_s=ttft, ttft_p50_s=_percentile(ttft, 0.5),
                        ttft_p95_s=_percentile(ttft, 0.95), throughput_ts=gen / wall if wall > 0 else None,
                        ready_s=ready_s, failures=sorted(set(failures))[:5], server_timings=timings)
    return speed, serving


def _log_blocks(case, text: str) -> tuple[S.LlamaLog, S.Effective, S.Differences]:
    """(``llama_log``, ``effective``, ``differences``) from the server's log: its KV lines beside the formula."""
    log = parse_memory_log(text.splitlines())
    eng = EngineResult(case.params, ok=True, log=log)
    diffs = compare(case.prediction, eng) if log.caches else ["no llama_kv_cache line in the server's log"]
    llama_log = S.LlamaLog(kv=msgspec.convert(engine_lines(eng), list[S.CacheLine], strict=True),
                           kv_mib=round(log.kv_mib_total, 2), recurrent_mib=round(log.recurrent_mib_total, 2),
                           kv_buffers_mib=log.kv_buffers, rs_buffers_mib=log.rs_buffers, compute_mib=log.compute_buffers,
                           output_mib=log.output_buffers, model_buffers_mib=log.model_buffers)
    ctx = log.context or {}
    effective = S.Effective(**{k: int(ctx[k]) for k in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_ctx_seq")
                               if ctx.get(k)})
    differences = S.Differences(llama_kv_matches_formula=not diffs)
    if diffs:
        differences.llama_kv_diffs = diffs
    return llama_log, effective, differences


def run_server_case(spec, case, base: S.BenchRecord, gpu_probe, say) -> S.BenchRecord:
    """One configuration through the user's llama-server; ``base`` (the sweep's record, status ok, nothing measured)
    is filled in and returned: ``failed`` with one line when the server would not start, died, or answered no
    request."""
    s = case.settings
    t0 = time.perf_counter()
    srv = ServerProcess(spec.llama_server, os.path.abspath(spec.model.ref.path), S.encode_block(s), gpu_probe=gpu_probe)
    levels: list[Any] = []
    try:
        say.on_child({"event": "phase", "phase": "load"})
        with srv:
            try:
                n_vocab = fetch_props(srv.base_url).n_vocab or spec.model.shape.n_vocab
                levels = _rounds(srv, s, n_vocab, spec.timeout_s, say)
            except (EngineError, RunFailed):
                if srv.alive():
                    raise
            if not srv.alive():         # it died under the requests: its exit status and last log lines say why
                how = f"status {srv.returncode}" if (srv.returncode or 0) >= 0 else f"signal {-(srv.returncode or 0)}"
                raise RunFailed(f"{os.path.basename(str(spec.llama_server))} ended during the run ({how}): "
                                f"{log_reason(srv.log_text()) or 'its log says nothing'}")
    except (EngineError, RunFailed) as e:
        base.status, base.reason = "failed", str(e).splitlines()[0]
    wall = time.perf_counter() - t0
    base.llama_log, base.effective, base.differences = _log_blocks(case, srv.log_text())
    base.timing = S.Timing(wall_s=wall)
    base.memory = S.Memory(peak_rss_bytes=srv.peak_rss_bytes, kernel_maxrss_bytes=srv.kernel_maxrss_bytes,
                           peak_gpu_bytes=srv.peak_gpu_bytes, n_samples=srv.n_samples)
    if levels:
        base.speed, serving = speed_and_serving(levels, s, str(spec.llama_server), srv.ready_s)
        base.serving = serving
        if base.status == "ok" and serving.n_failed:
            base.reason = f"{serving.n_failed} requests failed: {serving.failures[0]}"
    return base
