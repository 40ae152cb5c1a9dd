"""Child side of a measured run: load, create the context, warm up, fill to depth, time pp and tg.

Runs inside ``python -m edgekv.child.worker bench`` (one fresh process per configuration).  The workload
mirrors llama-bench (tools/llama-bench/llama-bench.cpp, test_prompt/test_gen and the repetition
loop): random tokens with BOS first, prompt processing in ``n_batch`` chunks followed by
``llama_synchronize``, generation one token at a time with a synchronize after each, a warm-up prompt
run and one warm-up token, and every repetition timed from a cache holding exactly ``n_depth``
tokens.  Between repetitions the cache goes back to that depth by removing the tokens the test added
(plain caches) or, where that cannot be exact (sliding-window and recurrent caches), by restoring a
state snapshot taken after the fill, as llama-bench always does (kept in a file under ``TMPDIR`` so
that it never counts in the measured memory).  The parent samples memory; phase
events tell it which part of the run each peak belongs to.  With ``n_parallel`` it runs llama-batched-bench's
loop instead.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from edgekv.child.tokens import SeqBatch, TokenRunner
from edgekv.child.workload import SEED, DeviceMemory, process_memory, self_memory
from edgekv.edges.childside import EventWriter


def finish_ok(L, ctx, model, ev: EventWriter, devmem: DeviceMemory, t_begin: float, samples: dict[str, Any],
               untimed: dict[str, Any], out: dict[str, Any]) -> None:
    """A measured run's end: the last memory checkpoint, its total and timed seconds (``samples``; ``untimed``: views
    of the same samples, not counted again), the result, then llama.cpp's context and model freed."""
    cps, timing = out["checkpoints"], out["timing"]
    cps["end"] = process_memory()
    cps["end"]["gpu_used"] = devmem.used()
    timing["child_total_s"] = time.perf_counter() - t_begin
    timing["timed_s"] = sum(sum(v["samples_ns"]) for v in samples.values()) / 1e9
    ev.result({**out, "status": "ok", "samples": {**samples, **untimed}})
    L.llama_free(ctx)
    L.llama_model_free(model)


def _batched_prompt(L, ctx, rng: random.Random, n_vocab: int, n_seq: int, n_prompt: int, n_batch: int) -> list[SeqBatch]:
    """llama-batched-bench's prompt: ``n_seq`` sequences of ``n_prompt`` random tokens (positions 0..p-1, logits for
    each sequence's last token), cut into batches of at most ``n_batch`` tokens."""
    out: list[SeqBatch] = []
    left = n_seq * n_prompt
    for j in range(n_seq):
        for i in range(n_prompt):
            if not out or out[-1].b.n_tokens == n_batch:
                out.append(SeqBatch(L, ctx, min(n_batch, left), n_seq))
            out[-1].add(rng.randrange(n_vocab), i, j, i == n_prompt - 1)
            left -= 1
    return out


@dataclass
class _BenchRun:
    """What the phases of one measured run share: llama.cpp's module, the event writer, the settings, the log
    capture, the run's start, its timings and memory checkpoints so far; then the accelerators' memory reader (set
    by the load), llama.cpp's logs and the model's size (``base``) and the context's sizes (set by the context)."""

    L: Any
    ev: EventWriter
    s: dict[str, Any]
    cap: Any
    t_begin: float
    timing: dict[str, float]
    checkpoints: dict[str, Any]
    devmem: DeviceMemory | None = None
    base: dict[str, Any] = field(default_factory=dict)
    effective: dict[str, int] = field(default_factory=dict)


def _batched_prompts_timed(L, ctx, prompt: list[SeqBatch]) -> int:
    """The prompts' batches decoded and synchronised, in nanoseconds; the batches freed after the clock stops."""
    t0 = time.perf_counter_ns()
    for b in prompt:
        b.decode("processing the prompts")
    L.llama_synchronize(ctx)
    t_pp = time.perf_counter_ns() - t0
    for b in prompt:
        b.free()
    return t_pp


def _batched_steps_timed(L, ctx, step: SeqBatch, toks: list[list[int]], p: int) -> int:
    """Generation in nanoseconds: per row of ``toks``, one token of every sequence (positions from ``p``) in one
    batch, synchronised after each."""
    t0 = time.perf_counter_ns()
    for i, row in enumerate(toks):
        step.clear()
        for j, tok in enumerate(row):
            step.add(tok, p + i, j, True)
        step.decode("generating")
        L.llama_synchronize(ctx)
    return time.perf_counter_ns() - t0


# llama-batched-bench's loop (tools/batched-bench/batched-bench.cpp) with edgekv's phases and memory events
def _batched_run(run: _BenchRun, ctx, model, runner: TokenRunner) -> None:
    """``-npl N``: each repetition clears the cache, decodes N prompts of ``-p`` tokens in one go (timed: aggregate
    prefill = N·p / t) and then ``-n`` steps of one token for each sequence (timed: aggregate decode = N·n / t), as
    llama-batched-bench does with its default ``is_pp_shared = 0, is_tg_separate = 0``."""
    L, ev, s, timing = run.L, run.ev, run.s, run.timing
    n_seq, p, n, reps = int(s["n_parallel"]), s["n_prompt"], s["n_gen"], s["repetitions"]
    mem = L.llama_get_memory(ctx)
    rng, n_vocab, n_batch = runner.rng, runner.n_vocab, run.effective["n_batch"]
    step = SeqBatch(L, ctx, n_seq, n_seq)
    ns: dict[str, list[int]] = {"pp": [], "tg": []}
    try:
        for r in range(reps + (1 if s["warmup"] else 0)):
            warm = s["warmup"] and r == 0
            rep = r if s["warmup"] else r + 1
            if warm:
                ev.emit("phase", phase="warmup")
            L.llama_memory_clear(mem, False)
            prompt = _batched_prompt(L, ctx, rng, n_vocab, n_seq, p, n_batch) if p > 0 else []
            toks = [[rng.randrange(n_vocab) for _ in range(n_seq)] for _ in range(1 if warm else n)]
            if not warm:
                ev.emit("phase", phase="pp", rep=rep, reps=reps, timed=True)
            t_pp = _batched_prompts_timed(L, ctx, prompt)
            if not warm:
                ev.emit("mem", **self_memory())
                ev.emit("phase", phase="tg", rep=rep, reps=reps, timed=True)
            t_tg = _batched_steps_timed(L, ctx, step, toks, p)
            if warm:
                timing["warmup_s"] = (t_pp + t_tg) / 1e9
                continue
            ev.emit("mem", **self_memory())
            ns["pp"].append(t_pp)
            ns["tg"].append(t_tg)
    except RuntimeError as e:
        ev.result({**run.base, "status": "failed", "reason": str(e), "checkpoints": run.checkpoints, "timing": timing,
                   "effective": run.effective})
        return
    finally:
        step.free()
        runner.close()
    _batched_finish(run, ctx, model, runner, ns)


def _batched_finish(run: _BenchRun, ctx, model, runner: TokenRunner, ns: dict[str, list[int]]) -> None:
    """The batched run's statistics and result: each test's aggregate rate over all sequences (timed), and what each
    sequence sees of the decode (the same samples, not counted again)."""
    s, timing = run.s, run.timing
    n_seq, p, n = int(s["n_parallel"]), s["n_prompt"], s["n_gen"]
    samples = {}
    for test, per_seq in (("pp", p), ("tg", n)):
        if per_seq > 0:
            total = n_seq * per_seq
            timing[f"{test}_s"] = sum(ns[test]) / 1e9
            samples[test] = {"n_tokens": total, "samples_ns": ns[test], "samples_ts": [total * 1e9 / x for x in ns[test]]}
    timing["fill_s"] = 0.0
    # what each sequence sees: its own decode rate while the others decode beside it (not timed again)
    per_seq = {"tg_seq": {"n_tokens": n, "samples_ns": ns["tg"], "samples_ts": [n * 1e9 / x for x in ns["tg"]]}} \
        if n > 0 else {}
    finish_ok(run.L, ctx, model, run.ev, run.devmem, run.t_begin, samples, per_seq,
               {**run.base, "effective": run.effective, "checkpoints": run.checkpoints, "timing": timing,
                "restore": "clear", "snapshot_bytes": None, "n_vocab": runner.n_vocab, "add_bos": runner.add_bos})


def _bench_load(run: _BenchRun, payload: dict) -> tuple[Any, list[tuple[int, str]], Any] | None:
    """The load phase: the model loaded as the settings say (timed), llama.cpp's log of the load parsed, the memory
    checkpoint after it.  The model, the log lines and the parsed log; None after a failed result."""
    from edgekv.core.llamalog import parse_memory_log
    from edgekv.edges.engine import model_params

    L, s, ev, timing, cap = run.L, run.s, run.ev, run.timing, run.cap
    ev.emit("phase", phase="load")
    t = time.perf_counter()
    mparams = model_params(s["n_gpu_layers"], dry=False, use_extra_bufts=s.get("repack", True) is not False)
    if s.get("no_mmap"):
        mparams.load_mode = 0     # LLAMA_LOAD_MODE_NONE: llama.cpp's `-lm none` (older builds: --no-mmap)
    model = L.llama_model_load_from_file(payload["model_path"].encode(), mparams)
    timing["load_s"] = time.perf_counter() - t
    load_lines = cap.take()
    load_log = parse_memory_log([x for _, x in load_lines])
    if not model:
        errs = [x.strip() for lvl, x in load_lines if lvl == 4 and x.strip()]
        ev.result({"status": "failed", "reason": f"llama.cpp could not load the model: {errs[-1] if errs else '?'}"})
        return None
    run.checkpoints["after_load"] = process_memory()
    run.devmem = DeviceMemory()          # after the load: reading a CUDA device's memory creates its context
    run.checkpoints["after_load"]["gpu_used"] = run.devmem.used()
    return model, load_lines, load_log


def _bench_context(run: _BenchRun, model, load_lines: list[tuple[int, str]], load_log) -> Any:
    """The context phase: the context created with the settings' sizes and cache types (timed), ``run.base`` (both
    logs parsed, the model's size, the device notes), the memory checkpoint and ``run.effective`` (the sizes
    llama.cpp chose).  The context; None after a failed result, the model freed."""
    from edgekv.core.llamalog import parse_memory_log
    from edgekv.core.predict import ContextParams
    from edgekv.edges.engine import context_params

    L, s, ev, timing, cap, checkpoints = run.L, run.s, run.ev, run.timing, run.cap, run.checkpoints
    ev.emit("phase", phase="context")
    cp = ContextParams(n_ctx=s["n_ctx"], type_k=s["type_k"], type_v=s["type_v"], flash_attn=s["flash_attn"],
                       swa_full=s["swa_full"], n_seq_max=s["n_seq_max"], kv_unified=s["kv_unified"],
                       n_batch=s["n_batch"], n_ubatch=s["n_ubatch"])
    t = time.perf_counter()
    ctx = L.llama_init_from_model(model, context_params(cp, n_threads=s["n_threads"]))
    timing["context_s"] = time.perf_counter() - t
    ctx_lines = cap.take()
    ctx_log = parse_memory_log([x for _, x in ctx_lines])
    extra_lines = [x.strip() for _, x in load_lines + ctx_lines if "recommendedMaxWorkingSetSize" in x]
    run.base = {
        "load_log": load_log.to_dict(), "ctx_log": ctx_log.to_dict(),
        "model": {"size_bytes": int(L.llama_model_size(model)), "n_params": int(L.llama_model_n_params(model))},
        "device_notes": extra_lines,
    }
    if not ctx:
        errs = [x.strip() for lvl, x in ctx_lines if lvl == 4 and x.strip()]
        ev.result({**run.base, "status": "failed", "reason": errs[-1] if errs else "llama_init_from_model returned NULL",
                   "checkpoints": checkpoints, "timing": timing})
        L.llama_model_free(model)
        return None
    checkpoints["after_context"] = process_memory()
    checkpoints["after_context"]["gpu_used"] = run.devmem.used()
    run.effective = {"n_ctx": int(L.llama_n_ctx(ctx)), "n_batch": int(L.llama_n_batch(ctx)),
                     "n_ubatch": int(L.llama_n_ubatch(ctx)), "n_seq_max": int(L.llama_n_seq_max(ctx))}
    if hasattr(L, "llama_n_ctx_seq"):
        run.effective["n_ctx_seq"] = int(L.llama_n_ctx_seq(ctx))
    return ctx


def _bench_runner(run: _BenchRun, model, ctx) -> TokenRunner:
    """The run's token source: random tokens from the fixed seed in ``n_batch`` chunks, BOS first where the
    vocabulary adds it (llama-bench)."""
    L = run.L
    vocab = L.llama_model_get_vocab(model)
    n_vocab = int(L.llama_vocab_n_tokens(vocab))
    add_bos = bool(L.llama_vocab_get_add_bos(vocab))
    bos = int(L.llama_vocab_bos(vocab))
    return TokenRunner(L, ctx, run.effective["n_batch"], n_vocab, add_bos, bos, random.Random(SEED))


def _bench_warmup(run: _BenchRun, runner: TokenRunner, mem) -> None:
    """llama-bench's warm-up, timed: a prompt of ``n_prompt`` tokens and one generated token."""
    L, p, n, timing = run.L, run.s["n_prompt"], run.s["n_gen"], run.timing
    run.ev.emit("phase", phase="warmup")
    t = time.perf_counter()
    if p > 0:
        runner.run_prompt(runner.prompt_chunks(p))
    if n > 0:
        runner.run_gen(runner.gen_tokens(1), int(L.llama_memory_seq_pos_max(mem, 0)) + 1)
    timing["warmup_s"] = time.perf_counter() - t


def _bench_fill(run: _BenchRun, runner: TokenRunner, d: int) -> None:
    """The depth fill, timed: ``d`` tokens in ``n_batch`` chunks with progress after each; then the memory
    checkpoint after it."""
    ev, timing, checkpoints = run.ev, run.timing, run.checkpoints
    t = time.perf_counter()
    if d > 0:
        chunks = runner.prompt_chunks(d)
        done = 0
        ev.emit("phase", phase="fill", done=0, total=d)
        for arr, k in chunks:
            runner.run_prompt([(arr, k)])
            done += k
            ev.emit("progress", phase="fill", done=done, total=d)
    timing["fill_s"] = time.perf_counter() - t
    checkpoints["after_fill"] = process_memory()
    checkpoints["after_fill"]["gpu_used"] = run.devmem.used()


def _save_depth_state(L, ctx, state_path: str) -> int:
    """Sequence 0's state (the cache at depth) saved to ``state_path``; the file's size in bytes."""
    if L.llama_state_seq_save_file(ctx, state_path.encode(), 0, (L.llama_token * 1)(), 0) == 0:
        raise RuntimeError(f"llama.cpp could not save the depth state to {state_path}: "
                           "free disk space there or point TMPDIR elsewhere")
    return os.path.getsize(state_path)


def _back_to_depth(L, ctx, mem, d: int, state_path: str | None) -> None:
    """The cache back to exactly ``d`` tokens: cleared at depth 0, else the snapshot restored where there is one,
    else the tokens after the depth removed."""
    if d == 0:
        L.llama_memory_clear(mem, True)
    elif state_path is not None:
        L.llama_memory_clear(mem, False)
        n_tok = ctypes.c_size_t(0)
        if L.llama_state_seq_load_file(ctx, state_path.encode(), 0, (L.llama_token * 1)(), 1,
                                       ctypes.byref(n_tok)) == 0:
            raise RuntimeError(f"llama.cpp could not restore the depth state from {state_path}")
    elif not L.llama_memory_seq_rm(mem, 0, d, -1):
        raise RuntimeError("llama.cpp could not remove the tokens added after the depth fill")


def _bench_timed_test(run: _BenchRun, runner: TokenRunner, ctx, mem, test: str, count: int,
                      state_path: str | None) -> dict[str, Any]:
    """One test's repetitions ("pp": a prompt of ``count`` tokens, "tg": ``count`` generated tokens), each from the
    cache back at depth and timed alone, this process's memory read after each; the test's samples."""
    L, ev, timing, d, reps = run.L, run.ev, run.timing, run.s["n_depth"], run.s["repetitions"]
    ns: list[int] = []
    t_test = time.perf_counter()
    for r in range(reps):
        if state_path is not None:
            ev.emit("phase", phase="restore")
        _back_to_depth(L, ctx, mem, d, state_path)
        # timed: the parent stops sampling until the next phase (its wake-ups would take CPU from
        # llama.cpp's threads); this process reads its own memory after the repetition instead
        ev.emit("phase", phase=test, rep=r + 1, reps=reps, timed=True)
        if test == "pp":
            work = runner.prompt_chunks(count)
            t0 = time.perf_counter_ns()
            runner.run_prompt(work)
        else:
            toks = runner.gen_tokens(count)
            pos0 = int(L.llama_memory_seq_pos_max(mem, 0)) + 1
            t0 = time.perf_counter_ns()
            runner.run_gen(toks, pos0)
        ns.append(time.perf_counter_ns() - t0)
        ev.emit("mem", **self_memory())
    timing[f"{test}_s"] = time.perf_counter() - t_test
    return {"n_tokens": count, "samples_ns": ns, "samples_ts": [count * 1e9 / x for x in ns]}


def _bench_repetitions(run: _BenchRun, restore: str, model, ctx, runner: TokenRunner, mem) -> None:
    """llama-bench's workload from a cache of ``n_depth`` tokens: the warm-up, the depth fill, the state snapshot
    where the depth comes back from one, then each test's timed repetitions; the result, failed or ok."""
    L, ev, s = run.L, run.ev, run.s
    p, n, d = s["n_prompt"], s["n_gen"], s["n_depth"]
    samples: dict[str, Any] = {}
    snapshot_bytes = None
    state_path: str | None = None
    try:
        if s["warmup"]:
            _bench_warmup(run, runner, mem)
        L.llama_memory_clear(mem, True)
        _bench_fill(run, runner, d)
        if d > 0 and restore == "snapshot":
            # The depth state goes to a file, not to memory: an in-memory copy is as large as the cache and
            # would sit in the measured RSS for the rest of the run.  Saving and restoring pass through one
            # layer's rows at a time; those two phases are the only ones the peak leaves out.
            ev.emit("phase", phase="snapshot")
            state_path = os.path.join(tempfile.mkdtemp(prefix="edgekv-state-"), "depth.state")
            snapshot_bytes = _save_depth_state(L, ctx, state_path)
        for test, count in (("pp", p), ("tg", n)):
            if count > 0:
                samples[test] = _bench_timed_test(run, runner, ctx, mem, test, count, state_path)
    except RuntimeError as e:
        ev.result({**run.base, "status": "failed", "reason": str(e), "checkpoints": run.checkpoints,
                   "timing": run.timing, "effective": run.effective})
        return
    finally:
        runner.close()
        if state_path is not None:
            shutil.rmtree(os.path.dirname(state_path), ignore_errors=True)
    finish_ok(L, ctx, model, ev, run.devmem, run.t_begin, samples, {},
               {**run.base, "effective": run.effective, "checkpoints": run.checkpoints, "timing": run.timing,
                "restore": restore if d > 0 else "clear", "snapshot_bytes": snapshot_bytes, "n_vocab": runner.n_vocab,
                "add_bos": runner.add_bos})


def bench(payload: dict, ev: EventWriter) -> None:
    """One measured run, phase by phase: import, load, context, then llama-bench's repetitions (or, with
    ``n_parallel``, llama-batched-bench's loop); each phase announced to the parent before it starts."""
    t_begin = time.perf_counter()
    s = payload["settings"]
    timing: dict[str, float] = {}
    checkpoints: dict[str, Any] = {}
    ev.emit("phase", phase="import")
    import llama_cpp as L

    # edgekv.edges.engine brings llama.cpp's log parser and ContextParams (edgekv.core) in with it: the load and
    # context phases find them imported
    from edgekv.edges.engine import LogCapture

    cap = LogCapture(tee=lambda line: ev.emit("log", line=line))     # survives a crash: the parent keeps the tail
    cap.install()
    L.llama_backend_init()
    timing["import_s"] = time.perf_counter() - t_begin
    checkpoints["start"] = process_memory()
    run = _BenchRun(L, ev, s, cap, t_begin, timing, checkpoints)
    loaded = _bench_load(run, payload)
    if loaded is None:
        return
    model, load_lines, load_log = loaded
    ctx = _bench_context(run, model, load_lines, load_log)
    if ctx is None:
        return
    runner = _bench_runner(run, model, ctx)
    mem = L.llama_get_memory(ctx)
    if s.get("n_parallel"):
        return _batched_run(run, ctx, model, runner)
    _bench_repetitions(run, payload.get("restore", "snapshot"), model, ctx, runner, mem)
