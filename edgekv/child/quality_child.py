"""The quality pass itself; runs inside a child process (``python -m edgekv.child.worker quality``).

One model, loaded once.  For each context size, one llama.cpp context per cache configuration is
created next to the baseline's (f16/f16), and every chunk of the corpus is decoded in all of them
with exactly the batches ``llama-perplexity`` builds (tools/perplexity/perplexity.cpp,
``perplexity()`` / ``kl_divergence()``):

* the whole text is tokenized with BOS (``add_special``), without parsing special tokens;
* ``n_seq = max(1, n_batch / n_ctx)`` chunks are evaluated at once in a context of
  ``n_seq * n_ctx`` cells with ``n_seq`` non-unified sequences, ``n_batch = min(n_batch, n_seq*n_ctx)``;
* chunk ``i`` is tokens ``[i*n_ctx, (i+1)*n_ctx)``; its first token is replaced by BOS in the
  first batch when the vocabulary adds BOS; the cache is cleared per group of chunks;
* logits are requested for positions ``>= n_ctx/2``, and positions ``n_ctx/2 .. n_ctx-2`` are
  scored against the next token.

After each ``llama_decode`` of one batch in every context, the logits still sit in each context's
output buffer; :class:`edgekv.core.klstats.Accumulator` reads them in place (zero-copy views) and keeps
per-token scalars only.  Peak memory is therefore the model, the caches, and one batch's logits per
context: ``(1 + n_configs) * outputs_per_batch * n_vocab * 4`` bytes, independent of corpus length
(``-b`` lowers it).  This module and :mod:`edgekv.runtime.engine`/:mod:`edgekv.child.worker` import ``llama_cpp``.
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from edgekv import heavy
from edgekv.core.klstats import Accumulator, plan
from edgekv.core.llamalog import RE_FA_RESOLVED, context_param
from edgekv.core.predict import ContextParams
from edgekv.core.qualitywire import (
    QualityCase,
    QualityOptions,
    QualityReply,
    QualityRequest,
    QualityRow,
    request_from,
    to_wire,
)
from edgekv.runtime.childside import EventWriter
from edgekv.runtime.engine import LOG_LEVEL_ERROR, LogCapture, context_params, model_params
from edgekv.sources.corpus import text_for_tokenizer

RE_ROT = re.compile(r"attn_rot_([kv]) = (\d)")


class PassError(Exception):
    """Reported to the parent as an ``error`` event with a ``kind``."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def tokenize(lc, vocab, data: bytes) -> np.ndarray:
    """common_tokenize(ctx, text, add_special=true, parse_special=false)."""
    n_max = len(data) + 2
    buf = (lc.llama_token * n_max)()
    n = lc.llama_tokenize(vocab, data, len(data), buf, n_max, True, False)
    if n < 0:
        n_max = -n
        buf = (lc.llama_token * n_max)()
        n = lc.llama_tokenize(vocab, data, len(data), buf, n_max, True, False)
    if n < 0:
        raise PassError("tokenize", "llama.cpp could not tokenize the corpus")
    return np.ctypeslib.as_array(buf)[:n].astype(np.int32).copy()


class _Batch:
    """A llama_batch with numpy views on its arrays (one sequence id per token)."""

    def __init__(self, lc, capacity: int):
        self.lc = lc
        self.capacity = capacity
        self.b = lc.llama_batch_init(capacity, 0, 1)
        self.token = np.ctypeslib.as_array(self.b.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(self.b.pos, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(self.b.n_seq_id, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(ctypes.cast(self.b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(capacity,))
        self._seq_ptrs = [self.b.seq_id[i] for i in range(capacity)]
        self._seq_cache = np.full(capacity, -1, dtype=np.int64)

    def fill(self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray, want: np.ndarray) -> None:
        n = tokens.size
        self.token[:n] = tokens
        self.pos[:n] = pos
        self.n_seq_id[:n] = 1
        self.logits[:n] = want
        for i in np.nonzero(self._seq_cache[:n] != seq)[0]:
            self._seq_ptrs[i][0] = int(seq[i])
            self._seq_cache[i] = seq[i]
        self.b.n_tokens = n

    def free(self) -> None:
        self.lc.llama_batch_free(self.b)


@dataclass
class _ContextInfo:
    """What llama.cpp's log said of a context it created: the flash attention it resolved, the attention rotations,
    and its last error where it created none."""

    flash_attn_resolved: str | None = None
    attn_rot_k: bool | None = None
    attn_rot_v: bool | None = None
    error: str | None = None

    def into(self, row: QualityRow) -> None:
        """This context's facts in a row of the reply (its error only where there is one)."""
        row.flash_attn_resolved = self.flash_attn_resolved
        row.attn_rot_k, row.attn_rot_v = self.attn_rot_k, self.attn_rot_v
        if self.error is not None:
            row.error = self.error


def _flash_attn(line: str) -> str | None:
    """'on' or 'off' from a context's log line: its ``flash_attn = enabled|disabled``, or the line that resolves
    ``auto`` (edgekv.core.llamalog's readings of both)."""
    param = context_param(line)
    if param in (("flash_attn", "enabled"), ("flash_attn", "disabled")):
        return "on" if param == ("flash_attn", "enabled") else "off"
    m = RE_FA_RESOLVED.search(line)
    return None if m is None else "on" if m["state"] == "enabled" else "off"


def _context(lc, model, cap: LogCapture, p: ContextParams, n_threads: int) -> tuple[Any, _ContextInfo]:
    cap.take()
    ctx = lc.llama_init_from_model(model, context_params(p, n_threads))
    lines = cap.take()
    info = _ContextInfo()
    for _, text in lines:
        fa = _flash_attn(text)
        if fa is not None:
            info.flash_attn_resolved = fa
        m = RE_ROT.search(text)
        if m and m[1] == "k":
            info.attn_rot_k = bool(int(m[2]))
        elif m:
            info.attn_rot_v = bool(int(m[2]))
    if not ctx:
        errs = [t.strip() for lvl, t in lines if lvl == LOG_LEVEL_ERROR and t.strip()]
        info.error = errs[-1] if errs else "llama_init_from_model returned NULL"
    return ctx, info


@dataclass
class _Member:
    """A configuration's context in a group: its index among the pass's configs, its context, its decode seconds."""

    i: int
    ctx: Any
    eval_s: float = 0.0


@dataclass
class _Group:
    """A baseline context (one per flash-attention mode) and the configurations' contexts measured against it."""

    ctx: Any
    info: _ContextInfo
    members: list[_Member] = field(default_factory=list)
    eval_s: float = 0.0

    def contexts(self) -> list[Any]:
        return [self.ctx] + [m.ctx for m in self.members]


@dataclass
class _Pass:
    """One context length's pass: llama-perplexity's sizes (:func:`edgekv.core.klstats.plan`), the corpus's tokens,
    the threads and the vocabulary's facts, shared by its phases."""

    lc: Any
    tokens: np.ndarray
    n_ctx: int
    n_seq: int
    n_batch: int
    first: int
    n_chunk: int
    num_batches: int
    n_ctx_total: int
    n_threads: int
    add_bos: bool
    bos: int
    n_vocab: int


def _open_contexts(model, cap: LogCapture, ps: _Pass, configs: list[QualityCase], opts: QualityOptions,
                   rows: list[QualityRow], contexts: list[Any]) -> list[_Group]:
    """The pass's contexts: a baseline per flash-attention mode among the configs and, beside it, one per config of
    that mode.  Each context goes into ``contexts`` as soon as it exists (the caller frees them); a config whose
    context fails gets ``status: error`` in its row.  The groups (baseline and members) that have members."""

    def cparams(type_k: str, type_v: str, fa: str) -> ContextParams:
        return ContextParams(n_ctx=ps.n_ctx_total, type_k=type_k, type_v=type_v, flash_attn=fa, swa_full=False,
                             n_seq_max=ps.n_seq, kv_unified=False, n_batch=ps.n_batch, n_ubatch=opts.n_ubatch)

    # One baseline per flash-attention mode among the configs.
    lc, n_threads = ps.lc, ps.n_threads
    base_type_k, base_type_v = opts.base_type_k, opts.base_type_v
    groups: dict[str, _Group] = {}
    for i, c in enumerate(configs):
        fa = c.flash_attn
        g = groups.get(fa)
        if g is None:
            ctx, info = _context(lc, model, cap, cparams(base_type_k, base_type_v, fa), n_threads)
            if not ctx:
                raise PassError("context", f"baseline {base_type_k}/{base_type_v} (-fa {fa}) at -c {ps.n_ctx}: {info.error}")
            contexts.append(ctx)
            g = groups[fa] = _Group(ctx, info)
        ctx, info = _context(lc, model, cap, cparams(c.type_k, c.type_v, fa), n_threads)
        info.into(rows[i])
        if not ctx:
            rows[i].status = "error"
            continue
        contexts.append(ctx)
        g.members.append(_Member(i, ctx))
    return [g for g in groups.values() if g.members]


def _fill_batch(ps: _Pass, batch: _Batch, i0: int, n_seq_batch: int, j: int) -> tuple[list[tuple[int, int, np.ndarray]], int]:
    """Batch ``j`` of the chunks from chunk ``i0`` (``n_seq_batch`` of them, one sequence each), as llama-perplexity
    builds it: BOS first in a chunk's first batch where the vocabulary adds it, logits from position ``first`` on.
    Per sequence (first output row, number of scored rows, their target tokens), and the batch's number of outputs."""
    tokens, n_ctx, first = ps.tokens, ps.n_ctx, ps.first
    start = i0 * n_ctx
    p0 = j * ps.n_batch
    batch_size = min(n_ctx - p0, ps.n_batch)
    pos1 = np.arange(p0, p0 + batch_size, dtype=np.int32)
    toks, pos, seq, want = [], [], [], []
    spans = []        # per sequence: (first output row, number of scored rows, targets)
    row = 0
    for s in range(n_seq_batch):
        cs = start + s * n_ctx
        t = tokens[cs + p0: cs + p0 + batch_size].copy()
        if ps.add_bos and j == 0:
            t[0] = ps.bos
        toks.append(t)
        pos.append(pos1)
        seq.append(np.full(batch_size, s, dtype=np.int64))
        w = pos1 >= first
        want.append(w)
        n_out = int(w.sum())
        scored = pos1[w & (pos1 <= n_ctx - 2)]
        spans.append((row, scored.size, tokens[cs + scored + 1]))
        row += n_out
    batch.fill(np.concatenate(toks), np.concatenate(pos), np.concatenate(seq), np.concatenate(want))
    return spans, row


def _decode_group(ps: _Pass, g: _Group, acc: Accumulator, batch: _Batch, spans: list[tuple[int, int, np.ndarray]],
                  n_outputs: int, i0: int) -> float:
    """The batch decoded in a group's baseline context and in each member's (each decode timed into its ``eval_s``),
    then every sequence's scored rows read in place by the group's accumulator.  The seconds the statistics took."""
    lc, n_ctx, n_vocab = ps.lc, ps.n_ctx, ps.n_vocab
    views = []
    for k, ctx in enumerate(g.contexts()):
        t0 = time.perf_counter()
        rc = lc.llama_decode(ctx, batch.b)
        if rc != 0:
            raise PassError("decode", f"llama_decode failed with {rc} at -c {n_ctx}, chunk {i0 + 1}")
        ptr = lc.llama_get_logits(ctx) if n_outputs else None
        dt = time.perf_counter() - t0
        if k == 0:
            g.eval_s += dt
        else:
            g.members[k - 1].eval_s += dt
        if n_outputs:
            views.append(np.ctypeslib.as_array(ptr, shape=(n_outputs, n_vocab)))
    if not n_outputs:
        return 0.0
    t0 = time.perf_counter()
    for r0, n_sc, targets in spans:
        if n_sc:
            acc.add(views[0][r0:r0 + n_sc], [v[r0:r0 + n_sc] for v in views[1:]], targets)
    return time.perf_counter() - t0


def _decode_chunks(ps: _Pass, active: list[_Group], accs: dict[int, Accumulator], ev: EventWriter) -> tuple[float, float]:
    """Every chunk through every context, ``n_seq`` chunks at a time from an empty cache, batch by batch; progress
    after each group of chunks.  The pass's wall seconds and the seconds spent in the statistics."""
    lc, n_ctx, n_seq, n_chunk = ps.lc, ps.n_ctx, ps.n_seq, ps.n_chunk
    batch = _Batch(lc, ps.n_batch)
    stats_s = 0.0
    t_start = time.perf_counter()
    for i0 in range(0, n_chunk, n_seq):
        n_seq_batch = min(n_seq, n_chunk - i0)
        for g in active:
            for ctx in g.contexts():
                lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        for j in range(ps.num_batches):
            spans, n_outputs = _fill_batch(ps, batch, i0, n_seq_batch, j)
            for g in active:
                stats_s += _decode_group(ps, g, accs[id(g)], batch, spans, n_outputs, i0)
        done = i0 + n_seq_batch
        ev.emit("progress", n_ctx=n_ctx, chunks_done=done, n_chunks=n_chunk,
                tokens_done=done * n_ctx, elapsed_s=time.perf_counter() - t_start)
    wall = time.perf_counter() - t_start
    batch.free()
    return wall, stats_s


def _member_results(active: list[_Group], accs: dict[int, Accumulator], rows: list[QualityRow], n_eval: int) -> None:
    """Each member's statistics against its baseline and its decode times into its row; the accumulators closed."""
    for g in active:
        acc = accs[id(g)]
        for k, m in enumerate(g.members):
            # the statistics' names are the row's (a name the row does not declare is a TypeError here)
            r = rows[m.i] = msgspec.structs.replace(rows[m.i], **acc.summary(k))
            r.status = "ok"
            r.eval_s = m.eval_s
            r.eval_tokens_per_s = n_eval / m.eval_s if m.eval_s > 0 else None
            r.base_eval_s = g.eval_s
            r.base_flash_attn_resolved = g.info.flash_attn_resolved
        acc.close()


def evaluate(lc, model, vocab, cap: LogCapture, tokens: np.ndarray, n_ctx: int, configs: list[QualityCase],
             opts: QualityOptions, ev: EventWriter) -> list[QualityRow]:
    """Baseline plus candidates at one context length; one row per candidate config.  llama-perplexity's pass in its
    order: the contexts, every chunk through all of them, the statistics."""
    sz = plan(tokens.size, n_ctx, opts.n_batch, opts.chunks)
    ps = _Pass(lc=lc, tokens=tokens, n_ctx=n_ctx, n_seq=sz.n_seq, n_batch=sz.n_batch, first=sz.first,
               n_chunk=sz.n_chunk, num_batches=sz.num_batches, n_ctx_total=sz.n_ctx_total,
               n_threads=opts.n_threads, add_bos=bool(lc.llama_vocab_get_add_bos(vocab)),
               bos=int(lc.llama_vocab_bos(vocab)), n_vocab=int(lc.llama_vocab_n_tokens(vocab)))
    rows = [QualityRow(n_ctx=n_ctx, type_k=c.type_k, type_v=c.type_v, flash_attn=c.flash_attn) for c in configs]
    contexts: list[Any] = []
    try:
        active = _open_contexts(model, cap, ps, configs, opts, rows, contexts)
        accs = {id(g): Accumulator(len(g.members), opts.emulate_llama, ps.n_threads) for g in active}
        wall, stats_s = _decode_chunks(ps, active, accs, ev)
        n_eval = ps.n_chunk * n_ctx
        _member_results(active, accs, rows, n_eval)
        n_contexts = sum(1 + len(g.members) for g in active)
        for r in rows:
            r.n_chunks, r.n_seq, r.n_batch, r.n_ctx_total = ps.n_chunk, ps.n_seq, ps.n_batch, ps.n_ctx_total
            r.n_ubatch = min(opts.n_ubatch, ps.n_batch)
            r.eval_tokens, r.pass_wall_s, r.pass_stats_s, r.pass_contexts = n_eval, wall, stats_s, n_contexts
            r.pass_tokens_per_s = n_eval * n_contexts / wall if wall > 0 else None
        return rows
    finally:
        for ctx in contexts:
            lc.llama_free(ctx)
        cap.take()


def run(payload: Any, ev: EventWriter) -> None:
    """The quality pass of a :class:`~edgekv.core.qualitywire.QualityRequest` (msgspec.ValidationError when the
    payload is not one); its :class:`~edgekv.core.qualitywire.QualityReply`, or an ``error`` event with a kind."""
    lc = heavy.llama_cpp()

    req: QualityRequest = request_from(payload)
    cap = LogCapture(tee=lambda line: ev.emit("log", line=line))     # survives a crash: the parent keeps the tail
    cap.install()
    lc.llama_backend_init()
    t0 = time.perf_counter()
    mparams = model_params(req.n_gpu_layers, dry=False, use_extra_bufts=req.repack)
    model = lc.llama_model_load_from_file(req.model_path.encode(), mparams)
    lines = cap.take()
    if not model:
        errs = [t.strip() for lvl, t in lines if lvl == LOG_LEVEL_ERROR and t.strip()]
        ev.emit("error", kind="model", error=errs[-1] if errs else "llama.cpp could not load the model")
        return
    try:
        vocab = lc.llama_model_get_vocab(model)
        with open(req.corpus_path, "rb") as f:
            data = text_for_tokenizer(f.read())
        tokens = tokenize(lc, vocab, data)
        ev.emit("tokens", n_tokens=int(tokens.size), add_bos=bool(lc.llama_vocab_get_add_bos(vocab)),
                load_s=time.perf_counter() - t0, pid=os.getpid())
        for n in req.n_ctx:
            if tokens.size < 2 * n:
                raise PassError("corpus_too_short",
                                f"the corpus tokenizes to {tokens.size} tokens; -c {n} needs at least {2 * n} "
                                "(two chunks, as llama-perplexity requires): use a smaller -c or a longer corpus")
        rows: list[QualityRow] = []
        for n in req.n_ctx:
            rows.extend(evaluate(lc, model, vocab, cap, tokens, n, req.configs, req.options, ev))
        sysinfo = lc.llama_print_system_info()
        ev.result(to_wire(QualityReply(
            rows=rows, n_tokens=int(tokens.size), add_bos=bool(lc.llama_vocab_get_add_bos(vocab)),
            n_vocab=int(lc.llama_vocab_n_tokens(vocab)), llama_cpp_python=getattr(lc, "__version__", None),
            system_info=sysinfo.decode() if isinstance(sysinfo, bytes) else str(sysinfo), pid=os.getpid())))
    except PassError as e:
        ev.emit("error", kind=e.kind, error=str(e))
    finally:
        lc.llama_model_free(model)
