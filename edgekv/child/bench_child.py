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

from edgekv import heavy
from edgekv.child.tokens import SeqBatch, TokenRunner
from edgekv.child.workload import SEED, DeviceMemory, process_memory, self_memory
from edgekv.core.benchwire import (
    REPLY_FAILED,
    REPLY_OK,
    BenchReply,
    BenchRequest,
    BenchSamples,
    BenchWorkload,
    Checkpoint,
    Checkpoints,
    ChildTiming,
    DepthSeed,
    Effective,
    ModelFacts,
    Samples,
    enough,
    request_from,
    to_wire,
)
from edgekv.core.llamalog import LlamaMemoryLog, parse_memory_log
from edgekv.runtime.childside import EventWriter
from edgekv.runtime.engine import LogCapture, context_params, model_params


def finish_ok(run: _BenchRun, ctx, model, samples: BenchSamples, restore: str, snapshot_bytes: int | None,
              runner: TokenRunner) -> None:
    """A measured run's end: the last memory checkpoint, its total and timed seconds, the reply, then llama.cpp's
    context and model freed."""
    run.checkpoints.end = run.reading()
    run.timing.child_total_s = time.perf_counter() - run.t_begin
    run.timing.timed_s = samples.timed_ns() / 1e9
    run.reply(REPLY_OK, None, samples=samples, restore=restore, snapshot_bytes=snapshot_bytes,
              n_vocab=runner.n_vocab, add_bos=runner.add_bos)
    run.L.llama_free(ctx)
    run.L.llama_model_free(model)


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
    """What the phases of one measured run share: llama.cpp's module, the event writer, the workload, the log
    capture, the run's start, its timings and memory checkpoints so far; then the accelerators' memory reader (set
    by the load), llama.cpp's logs, the model's size and the device notes, and the context's sizes (set by the
    context)."""

    L: Any
    ev: EventWriter
    w: BenchWorkload
    cap: Any
    t_begin: float
    timing: ChildTiming = field(default_factory=ChildTiming)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    devmem: DeviceMemory | None = None
    load_log: LlamaMemoryLog | None = None
    ctx_log: LlamaMemoryLog | None = None
    model: ModelFacts | None = None
    device_notes: list[str] = field(default_factory=list)
    effective: Effective | None = None

    def reading(self) -> Checkpoint:
        """This process's memory now, with the accelerators' (once the load created the reader)."""
        cp = process_memory()
        cp.gpu_used = self.devmem.used() if self.devmem is not None else None
        return cp

    def reply(self, status: str, reason: str | None, **measured: Any) -> None:
        """The reply to the parent: the status, why, and everything measured so far."""
        self.ev.result(to_wire(BenchReply(
            status=status, reason=reason, effective=self.effective, checkpoints=self.checkpoints, timing=self.timing,
            load_log=self.load_log, ctx_log=self.ctx_log, model=self.model, device_notes=self.device_notes,
            **measured)))


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
    L, ev, w, timing = run.L, run.ev, run.w, run.timing
    n_seq, p, n, reps = int(w.n_parallel or 1), w.n_prompt, w.n_gen, w.repetitions
    mem = L.llama_get_memory(ctx)
    rng, n_vocab, n_batch = runner.rng, runner.n_vocab, run.effective.n_batch
    step = SeqBatch(L, ctx, n_seq, n_seq)
    ns_pp: list[int] = []
    ns_tg: list[int] = []
    try:
        for r in range(reps + (1 if w.warmup else 0)):
            warm = w.warmup and r == 0
            rep = r if w.warmup else r + 1
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
                timing.warmup_s = (t_pp + t_tg) / 1e9
                continue
            ev.emit("mem", **self_memory())
            ns_pp.append(t_pp)
            ns_tg.append(t_tg)
    except RuntimeError as e:
        run.reply(REPLY_FAILED, str(e))
        return
    finally:
        step.free()
        runner.close()
    _batched_finish(run, ctx, model, runner, ns_pp, ns_tg)


def _batched_finish(run: _BenchRun, ctx, model, runner: TokenRunner, ns_pp: list[int], ns_tg: list[int]) -> None:
    """The batched run's statistics and result: each test's aggregate rate over all sequences (timed), and what each
    sequence sees of the decode (the same samples, not counted again)."""
    w, timing = run.w, run.timing
    n_seq, p, n = int(w.n_parallel or 1), w.n_prompt, w.n_gen
    samples = BenchSamples()
    if p > 0:
        timing.pp_s = sum(ns_pp) / 1e9
        samples.pp = Samples.of(n_seq * p, ns_pp)
    if n > 0:
        timing.tg_s = sum(ns_tg) / 1e9
        samples.tg = Samples.of(n_seq * n, ns_tg)
        # what each sequence sees: its own decode rate while the others decode beside it (not timed again)
        samples.tg_seq = Samples.of(n, ns_tg)
    timing.fill_s = 0.0
    finish_ok(run, ctx, model, samples, "clear", None, runner)


def _bench_load(run: _BenchRun, model_path: str) -> tuple[Any, list[tuple[int, str]]] | None:
    """The load phase: the model loaded as the settings say (timed), llama.cpp's log of the load parsed, the memory
    checkpoint after it.  The model and the log lines; None after a failed result."""
    L, w, ev, cap = run.L, run.w, run.ev, run.cap
    ev.emit("phase", phase="load")
    t = time.perf_counter()
    mparams = model_params(w.n_gpu_layers, dry=False, use_extra_bufts=w.repack)
    if w.no_mmap:
        mparams.load_mode = 0     # LLAMA_LOAD_MODE_NONE: llama.cpp's `-lm none` (older builds: --no-mmap)
    model = L.llama_model_load_from_file(model_path.encode(), mparams)
    run.timing.load_s = time.perf_counter() - t
    load_lines = cap.take()
    load_log = parse_memory_log([x for _, x in load_lines])
    if not model:
        errs = [x.strip() for lvl, x in load_lines if lvl == 4 and x.strip()]
        # only the status and why: a reply of a failed load carries nothing measured
        ev.result(to_wire(BenchReply(status=REPLY_FAILED,
                                     reason=f"llama.cpp could not load the model: {errs[-1] if errs else '?'}")))
        return None
    run.load_log = load_log
    run.devmem = DeviceMemory()          # after the load: reading a CUDA device's memory creates its context
    run.checkpoints.after_load = run.reading()
    return model, load_lines


def _bench_context(run: _BenchRun, model, load_lines: list[tuple[int, str]], params) -> Any:
    """The context phase: the context created with the request's sizes and cache types (timed), the context's log
    parsed, the model's size and the device notes, the memory checkpoint and ``run.effective`` (the sizes llama.cpp
    chose).  The context; None after a failed result, the model freed."""
    L, ev, cap = run.L, run.ev, run.cap
    ev.emit("phase", phase="context")
    t = time.perf_counter()
    ctx = L.llama_init_from_model(model, context_params(params, n_threads=run.w.n_threads))
    run.timing.context_s = time.perf_counter() - t
    ctx_lines = cap.take()
    run.ctx_log = parse_memory_log([x for _, x in ctx_lines])
    run.device_notes = [x.strip() for _, x in load_lines + ctx_lines if "recommendedMaxWorkingSetSize" in x]
    run.model = ModelFacts(size_bytes=int(L.llama_model_size(model)), n_params=int(L.llama_model_n_params(model)))
    if not ctx:
        errs = [x.strip() for lvl, x in ctx_lines if lvl == 4 and x.strip()]
        run.reply(REPLY_FAILED, errs[-1] if errs else "llama_init_from_model returned NULL")
        L.llama_model_free(model)
        return None
    run.checkpoints.after_context = run.reading()
    run.effective = Effective(n_ctx=int(L.llama_n_ctx(ctx)), n_batch=int(L.llama_n_batch(ctx)),
                              n_ubatch=int(L.llama_n_ubatch(ctx)), n_seq_max=int(L.llama_n_seq_max(ctx)),
                              n_ctx_seq=int(L.llama_n_ctx_seq(ctx)) if hasattr(L, "llama_n_ctx_seq") else None)
    return ctx


def _bench_runner(run: _BenchRun, model, ctx) -> TokenRunner:
    """The run's token source: random tokens from the fixed seed in ``n_batch`` chunks, BOS first where the
    vocabulary adds it (llama-bench)."""
    L = run.L
    vocab = L.llama_model_get_vocab(model)
    n_vocab = int(L.llama_vocab_n_tokens(vocab))
    add_bos = bool(L.llama_vocab_get_add_bos(vocab))
    bos = int(L.llama_vocab_bos(vocab))
    return TokenRunner(L, ctx, run.effective.n_batch, n_vocab, add_bos, bos, random.Random(SEED))


def _bench_warmup(run: _BenchRun, runner: TokenRunner, mem) -> None:
    """llama-bench's warm-up, timed: a prompt of ``n_prompt`` tokens and one generated token."""
    L, p, n, timing = run.L, run.w.n_prompt, run.w.n_gen, run.timing
    run.ev.emit("phase", phase="warmup")
    t = time.perf_counter()
    if p > 0:
        runner.run_prompt(runner.prompt_chunks(p))
    if n > 0:
        runner.run_gen(runner.gen_tokens(1), int(L.llama_memory_seq_pos_max(mem, 0)) + 1)
    timing.warmup_s = time.perf_counter() - t


def _seed_depth(run: _BenchRun, ctx, mem, seed: DepthSeed | None) -> int:
    """The first tokens of the depth restored from an earlier configuration's state (``seed.load``): how many, or 0
    when there is none or it does not restore exactly (the fill then does the whole depth)."""
    if seed is None or not seed.load or not 0 < seed.tokens < run.w.n_depth:
        return 0
    L = run.L
    run.ev.emit("phase", phase="restore")        # the harness's own phase: the peak leaves it out
    if _load_depth_state(L, ctx, seed.load) and int(L.llama_memory_seq_pos_max(mem, 0)) + 1 == seed.tokens:
        return seed.tokens
    L.llama_memory_clear(mem, True)
    return 0


def _bench_fill(run: _BenchRun, runner: TokenRunner, mem, d: int, start: int = 0) -> None:
    """The depth fill, timed: from ``start`` tokens (restored) to ``d`` in ``n_batch`` chunks with progress after
    each; then the memory checkpoint after it."""
    ev, timing = run.ev, run.timing
    t = time.perf_counter()
    if d > start:
        chunks = runner.prompt_chunks(d - start)
        done = start
        ev.emit("phase", phase="fill", done=done, total=d)
        for arr, k in chunks:
            runner.run_prompt([(arr, k)])
            done += k
            ev.emit("progress", phase="fill", done=done, total=d)
    timing.fill_s = time.perf_counter() - t
    timing.fill_from = start or None
    held = int(run.L.llama_memory_seq_pos_max(mem, 0)) + 1
    if d > 0 and held != d:
        raise RuntimeError(f"the cache holds {held} tokens after the fill, not the depth {d}")
    run.checkpoints.after_fill = run.reading()


def _save_depth_state(L, ctx, state_path: str) -> int:
    """Sequence 0's state (the cache at depth) saved to ``state_path``; the file's size in bytes."""
    if L.llama_state_seq_save_file(ctx, state_path.encode(), 0, (L.llama_token * 1)(), 0) == 0:
        raise RuntimeError(f"llama.cpp could not save the depth state to {state_path}: "
                           "free disk space there or point TMPDIR elsewhere")
    return os.path.getsize(state_path)


def _load_depth_state(L, ctx, state_path: str) -> bool:
    """Sequence 0's state restored from ``state_path`` (a file _save_depth_state wrote); whether llama.cpp read it."""
    n_tok = ctypes.c_size_t(0)
    return L.llama_state_seq_load_file(ctx, state_path.encode(), 0, (L.llama_token * 1)(), 1, ctypes.byref(n_tok)) != 0


def _back_to_depth(L, ctx, mem, d: int, state_path: str | None) -> None:
    """The cache back to exactly ``d`` tokens: cleared at depth 0, else the snapshot restored where there is one,
    else the tokens after the depth removed."""
    if d == 0:
        L.llama_memory_clear(mem, True)
    elif state_path is not None:
        L.llama_memory_clear(mem, False)
        if not _load_depth_state(L, ctx, state_path):
            raise RuntimeError(f"llama.cpp could not restore the depth state from {state_path}")
    elif not L.llama_memory_seq_rm(mem, 0, d, -1):
        raise RuntimeError("llama.cpp could not remove the tokens added after the depth fill")


def _bench_timed_test(run: _BenchRun, runner: TokenRunner, ctx, mem, test: str, count: int,
                      state_path: str | None) -> Samples:
    """One test's repetitions ("pp": a prompt of ``count`` tokens, "tg": ``count`` generated tokens), each from the
    cache back at depth and timed alone, this process's memory read after each; the test's samples."""
    L, ev, d, reps = run.L, run.ev, run.w.n_depth, run.w.repetitions
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
        if enough(ns, run.w.min_repetitions, run.w.rep_budget_s, time.perf_counter() - t_test):
            break
    if test == "pp":
        run.timing.pp_s = time.perf_counter() - t_test
    else:
        run.timing.tg_s = time.perf_counter() - t_test
    return Samples.of(count, ns)


def _bench_repetitions(run: _BenchRun, restore: str, model, ctx, runner: TokenRunner, mem,
                       seed: DepthSeed | None = None) -> None:
    """llama-bench's workload from a cache of ``n_depth`` tokens: the warm-up, the depth fill (from the ``seed``'s
    state where there is one, which then receives this depth's), the state snapshot where the depth comes back from
    one, then each test's timed repetitions; the result, failed or ok."""
    L, ev, w = run.L, run.ev, run.w
    p, n, d = w.n_prompt, w.n_gen, w.n_depth
    samples = BenchSamples()
    snapshot_bytes = None
    state_path: str | None = None
    kept: str | None = None
    try:
        if w.warmup:
            _bench_warmup(run, runner, mem)
        L.llama_memory_clear(mem, True)
        _bench_fill(run, runner, mem, d, _seed_depth(run, ctx, mem, seed))
        if d > 0 and seed is not None and seed.save:
            ev.emit("phase", phase="snapshot")
            try:
                _save_depth_state(L, ctx, seed.save)
                kept = seed.save
            except RuntimeError:        # a later configuration then fills its whole depth
                kept = None
        if d > 0 and restore == "snapshot":
            # The depth state goes to a file, not to memory: an in-memory copy is as large as the cache and
            # would sit in the measured RSS for the rest of the run.  Saving and restoring pass through one
            # layer's rows at a time; those two phases are the only ones the peak leaves out.
            ev.emit("phase", phase="snapshot")
            state_path = kept or os.path.join(tempfile.mkdtemp(prefix="edgekv-state-"), "depth.state")
            snapshot_bytes = os.path.getsize(kept) if kept else _save_depth_state(L, ctx, state_path)
        if p > 0:
            samples.pp = _bench_timed_test(run, runner, ctx, mem, "pp", p, state_path)
        if n > 0:
            samples.tg = _bench_timed_test(run, runner, ctx, mem, "tg", n, state_path)
    except RuntimeError as e:
        run.reply(REPLY_FAILED, str(e))
        return
    finally:
        runner.close()
        if state_path is not None and state_path != kept:
            shutil.rmtree(os.path.dirname(state_path), ignore_errors=True)
    finish_ok(run, ctx, model, samples, restore if d > 0 else "clear", snapshot_bytes, runner)


def bench(payload: Any, ev: EventWriter) -> None:
    """One measured run, phase by phase: import, load, context, then llama-bench's repetitions (or, with
    ``n_parallel``, llama-batched-bench's loop); each phase announced to the parent before it starts.  The payload is
    a :class:`~edgekv.core.benchwire.BenchRequest` (msgspec.ValidationError when it is not one)."""
    t_begin = time.perf_counter()
    req: BenchRequest = request_from(payload)
    ev.emit("phase", phase="import")
    L = heavy.llama_cpp()

    cap = LogCapture(tee=lambda line: ev.emit("log", line=line))     # survives a crash: the parent keeps the tail
    cap.install()
    L.llama_backend_init()
    run = _BenchRun(L, ev, req.workload, cap, t_begin)
    run.timing.import_s = time.perf_counter() - t_begin
    run.checkpoints.start = process_memory()
    loaded = _bench_load(run, req.model_path)
    if loaded is None:
        return
    model, load_lines = loaded
    ctx = _bench_context(run, model, load_lines, req.params)
    if ctx is None:
        return
    runner = _bench_runner(run, model, ctx)
    mem = L.llama_get_memory(ctx)
    if req.workload.n_parallel:
        return _batched_run(run, ctx, model, runner)
    _bench_repetitions(run, req.restore, model, ctx, runner, mem, req.seed)
