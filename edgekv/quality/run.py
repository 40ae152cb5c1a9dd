"""Quality cost of KV-cache quantization: perplexity and KL divergence against the f16 KV cache.

:func:`measure` is the one entry point (the CLI's ``edgekv quality`` and ``edgekv bench --quality``
both call it).  It resolves the model and the corpus, refuses configurations llama.cpp would refuse
(through :mod:`edgekv.core.predict`, without running them), and runs the pass in a child process
(:mod:`edgekv.child.quality_child` via :mod:`edgekv.runtime.process`), so that an abort inside llama.cpp becomes a
clean error.  The child loads the model once and evaluates every chunk in the baseline context and
in each candidate context side by side; no logits file is written and no logits are kept.

The child's reply is decoded once, where it arrives (edgekv.core.qualitywire); each returned
row is the results schema's typed block :class:`edgekv.records.schema.Quality`, one (context size, cache
configuration)::

    Quality(
      n_ctx=4096, type_k="q8_0", type_v="q8_0", flash_attn="auto",   # the join key
      status="ok" | "error" | "invalid", error=None | "one line",
      quality=QualityStats(             # None unless status == "ok"
        corpus=Corpus(name, path, n_bytes, sha256, source, detail, n_tokens),
        baseline=CacheTypes(type_k="f16", type_v="f16"),
        method="llama-perplexity",      # chunking, scored positions, statistics
        n_threads, attn_rot_k, attn_rot_v, flash_attn_resolved,
        n_tokens_scored, ppl, ppl_err, base_ppl, base_ppl_err,
        ln_ppl_ratio, ln_ppl_ratio_err, ppl_ratio, ppl_ratio_err, cor_ln_ppl,
        kld_mean, kld_mean_err, kld_median, kld_p90, kld_p95, kld_p99, kld_p999, kld_max, kld_min,
        same_top_rate, same_top_rate_err,            # fractions (0..1), not percent
        delta_p_mean, delta_p_mean_err, delta_p_rms, delta_p_rms_err, delta_p_max_abs,
        eval_s, eval_tokens_per_s,      # this configuration's own llama_decode time
        n_chunks, n_seq, n_batch, n_ubatch,
      ),
      pass_=QualityPass(wall_s, stats_s, n_contexts, tokens_per_s, peak_rss_bytes, model, ...),  # JSON key "pass"
    )

``schema.encode_block(row)`` is its JSON (the ``quality`` block of a bench or quality record).

This module does not import ``llama_cpp``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from edgekv.calibration.preflight import repack_choice
from edgekv.core.cachetypes import DEFAULT_SWEEP_TYPES, cache_type
from edgekv.core.corpus import CorpusFile
from edgekv.core.klstats import PassSizes, plan
from edgekv.core.predict import STATUS_INVALID, ContextParams, predict
from edgekv.core.qualitywire import QualityCase, QualityOptions, QualityReply, QualityRequest, QualityRow, reply_from, to_wire
from edgekv.errors import CorpusError, EngineError, RunFailed, UsageError
from edgekv.machine.environment import collect, default_threads
from edgekv.prediction.api import load_model
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.runtime.process import run_child, worker_argv
from edgekv.sources.corpus import resolve_corpus
from edgekv.sources.resolve import verified_sha256
from edgekv.sweep.spec import SWEEP_CHUNKS
from edgekv.version import __version__

BASE_TYPE = "f16"
METHOD = "llama-perplexity"


@dataclass(frozen=True)
class QualityConfig:
    """One cache configuration to compare with the baseline."""

    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "type_k", cache_type(self.type_k).name)
        object.__setattr__(self, "type_v", cache_type(self.type_v).name)
        if self.flash_attn not in ("auto", "on", "off"):
            raise UsageError(f"flash_attn must be on, off or auto (got '{self.flash_attn}')")


# -- the child's result, typed where it arrives ------------------------------------------------------------

# The statistics a row carries into its quality block as they are (the others: corpus, baseline, method, threads).
_STAT_FIELDS = tuple(f for f in S.QualityStats.__struct_fields__ if f not in ("corpus", "baseline", "method", "n_threads"))
assert set(_STAT_FIELDS) <= set(QualityRow.__struct_fields__)


class EmulatedQualityStats(S.QualityStats, kw_only=True):
    """The statistics of :func:`measure` with ``emulate_llama``: also those llama-perplexity's 16-bit base file
    would give (``llama_uint16``, for the agreement check in ``bench/``).  Not a block of the results schema: a
    record holding one does not read back, so no record is written from an emulated pass."""

    llama_uint16: dict[str, Any]


def _as_config(c: QualityConfig | tuple[str, str] | str | dict[str, Any], flash_attn: str) -> QualityConfig:
    if isinstance(c, QualityConfig):
        return c
    if isinstance(c, str):
        return QualityConfig(c, c, flash_attn)
    if isinstance(c, dict):
        return QualityConfig(c.get("type_k", "f16"), c.get("type_v", c.get("type_k", "f16")), c.get("flash_attn", flash_attn))
    k, v = c
    return QualityConfig(k, v, flash_attn)


def _invalid_reason(shape, c: QualityConfig, n_ctx: int, p: PassSizes, n_ubatch: int) -> str | None:
    """What llama.cpp would say (refusal or abort) for this context, from the predictor."""
    pred = predict(shape, ContextParams(n_ctx=p.n_ctx_total, type_k=c.type_k, type_v=c.type_v, flash_attn=c.flash_attn,
                                        swa_full=False, n_seq_max=p.n_seq, kv_unified=False, n_batch=p.n_batch,
                                        n_ubatch=min(n_ubatch, p.n_batch)))
    return pred.reason if pred.status == STATUS_INVALID else None


def resolve_repack(repack: bool | None) -> tuple[bool, str | None]:
    """The --repack the quality child runs with (edgekv.calibration.preflight.repack_choice: as asked, else the
    preflight's) and the note that says it fell back (said once the run is known to have read its inputs: a refused
    corpus stays one line)."""
    choice = repack_choice(None if repack is None else [repack], probe=repack is None)
    return choice.values[0], (choice.measure_note() if choice.fell_back else None)


def _checked_inputs(n_ctx: int | Sequence[int], chunks: int | None, n_batch: int, n_ubatch: int,
                    configs: Sequence[QualityConfig | tuple[str, str] | str | dict[str, Any]],
                    flash_attn: str) -> tuple[list[int], list[QualityConfig]]:
    """Validate phase: the context sizes and the cache configurations, refusing what cannot be run."""
    ctxs = [int(n_ctx)] if isinstance(n_ctx, int) else [int(n) for n in n_ctx]
    if not ctxs or min(ctxs) < 2:
        raise UsageError("-c/--ctx-size: each context size must be at least 2 tokens")
    if chunks is not None and chunks < 1:
        raise UsageError("--chunks must be at least 1")
    if n_batch < 1 or n_ubatch < 1:
        raise UsageError("-b and -ub must be at least 1")
    cfgs = [_as_config(c, flash_attn) for c in configs]
    if not cfgs:
        raise UsageError("-ctk: needs at least one cache type")
    return ctxs, cfgs


def _load_inputs(model: str | os.PathLike | None, corpus: str | os.PathLike | CorpusFile | None) -> tuple[Any, CorpusFile]:
    """The whole model file (a header alone is refused) and the resolved corpus."""
    m = load_model(None if model is None else str(model))
    if not m.ref.complete:
        raise UsageError(f"{m.ref.spec}: the quality pass needs the whole model file, not only its header")
    m.require_whole("edgekv quality")
    corp = corpus if isinstance(corpus, CorpusFile) else resolve_corpus(corpus)
    return m, corp


def _invalid_cases(shape, ctxs: list[int], cfgs: list[QualityConfig], n_batch: int, n_ubatch: int, base_k: str,
                   base_v: str) -> dict[tuple[int, int], str]:
    """Plan phase: why each (n_ctx, config index) would be refused; a baseline that would be is a UsageError."""
    # Refusals llama.cpp would make (or aborts it would die of), known before running anything.
    invalid: dict[tuple[int, int], str] = {}
    for n in ctxs:
        p = plan(1 << 30, n, n_batch, None)
        for i, c in enumerate(cfgs):
            reason = _invalid_reason(shape, c, n, p, n_ubatch)
            if reason:
                invalid[(n, i)] = reason
        for fa in {c.flash_attn for c in cfgs}:
            reason = _invalid_reason(shape, QualityConfig(base_k, base_v, fa), n, p, n_ubatch)
            if reason:
                raise UsageError(f"the baseline {base_k}/{base_v} with -fa {fa} at -c {n} is not possible: {reason}")
    return invalid


def _raise_child_failure(res, m, corp: CorpusFile) -> None:
    """The quality child's last error event (or its death) as CorpusError, EngineError or RunFailed."""
    errors = [e for e in res.events if e.get("event") == "error"]
    if errors:
        e = errors[-1]
        kind, msg = e.get("kind"), e.get("error", "quality pass failed")
        if kind == "corpus_too_short":
            raise CorpusError(f"corpus '{corp.name}' ({corp.path}): {msg}")
        if kind in ("model", "context"):
            raise EngineError(f"{m.ref.path}: {msg}")
        raise RunFailed(f"quality pass on {m.ref.path}: {msg}")
    if not res.ok:
        raise RunFailed(f"quality pass on {m.ref.path}: {res.failure_reason()}")


def _run_pass(m, corp: CorpusFile, ctxs: list[int], cfgs: list[QualityConfig], run_cfgs: list[int], n_gpu_layers: int,
              repack: bool | None, options: QualityOptions, timeout: float | None,
              on_event: Callable[[dict[str, Any]], None] | None
              ) -> tuple[dict[tuple[int, int], QualityRow], QualityReply, int | None]:
    """Run phase: the configurations in ``run_cfgs`` (indexes into ``cfgs``) in one quality child, when there are
    any.  Returns the child's rows by (n_ctx, config index), its result (decoded here, once) and the peak RSS."""
    if not run_cfgs:
        return {}, QualityReply(), None
    use_repack, fallback = resolve_repack(repack)
    req = QualityRequest(model_path=m.ref.path, corpus_path=corp.path, n_ctx=ctxs, n_gpu_layers=n_gpu_layers,
                         configs=[QualityCase(type_k=cfgs[i].type_k, type_v=cfgs[i].type_v, flash_attn=cfgs[i].flash_attn)
                                  for i in run_cfgs],
                         options=options, repack=use_repack)
    res = run_child(worker_argv("quality"), to_wire(req), timeout=timeout, sample_memory=True, on_event=on_event)
    _raise_child_failure(res, m, corp)
    if fallback and on_event is not None:
        on_event({"event": "note", "message": fallback})
    try:
        info = reply_from(res.result or {})
    except msgspec.ValidationError as e:
        raise RunFailed(f"quality pass on {m.ref.path}: its result does not read ({e})") from None
    peak_rss = res.peak_rss_bytes or res.kernel_maxrss_bytes
    per_ctx = len(run_cfgs)
    rows = {(ctxs[k // per_ctx], run_cfgs[k % per_ctx]): r for k, r in enumerate(info.rows)}
    return rows, info, peak_rss


def _quality_block(r: QualityRow, corpus: S.Corpus, base_k: str, base_v: str, threads: int) -> S.QualityStats:
    """An ok row's ``quality`` block: the corpus, baseline and method, then the child's statistics."""
    common = {"corpus": corpus, "baseline": S.CacheTypes(type_k=base_k, type_v=base_v), "method": METHOD,
              "n_threads": threads, **{f: getattr(r, f) for f in _STAT_FIELDS}}
    if r.llama_uint16 is None:
        return S.QualityStats(**common)
    return EmulatedQualityStats(**common, llama_uint16=r.llama_uint16)


def _pass_block(r: QualityRow, peak_rss: int | None, m, info: QualityReply) -> S.QualityPass:
    """An ok row's ``pass`` block: the shared pass's timings, memory, model and llama.cpp build."""
    return S.QualityPass(
        wall_s=r.pass_wall_s, stats_s=r.pass_stats_s, n_contexts=r.pass_contexts, tokens_per_s=r.pass_tokens_per_s,
        n_ctx_total=r.n_ctx_total, eval_tokens=r.eval_tokens, base_eval_s=r.base_eval_s,
        base_flash_attn_resolved=r.base_flash_attn_resolved, peak_rss_bytes=peak_rss, model=m.ref.path,
        model_name=m.shape.name or m.ref.name, n_vocab=info.n_vocab, add_bos=info.add_bos,
        llama_cpp_python=info.llama_cpp_python, system_info=info.system_info)


def _not_measured(n_ctx: int, c: QualityConfig, status: str, error: str) -> S.Quality:
    """The row of a configuration without figures (``invalid``: refused before running; ``error``)."""
    return S.Quality(n_ctx=n_ctx, type_k=c.type_k, type_v=c.type_v, flash_attn=c.flash_attn, status=status, error=error,
                     quality=None, pass_=None)


def _shape_rows(ctxs: list[int], cfgs: list[QualityConfig], invalid: dict[tuple[int, int], str],
                rows: dict[tuple[int, int], QualityRow], info: QualityReply, peak_rss: int | None,
                corp: CorpusFile, m, base_k: str, base_v: str, threads: int) -> list[S.Quality]:
    """Shape phase: one row per (n_ctx, config), n_ctx-major, invalid, error or ok (see the module docstring)."""
    # the text as scored: the file and its tokens (a reply without them scored nothing: its rows are not evaluated)
    corpus = (S.Corpus(name=corp.name, path=corp.path, n_bytes=corp.n_bytes, sha256=corp.sha256, source=corp.source,
                       detail=corp.detail, n_tokens=info.n_tokens) if info.n_tokens is not None else None)
    out: list[S.Quality] = []
    for n in ctxs:
        for i, c in enumerate(cfgs):
            r = rows.get((n, i))
            if (n, i) in invalid:
                out.append(_not_measured(n, c, "invalid", invalid[(n, i)]))
            elif r is None or r.status != "ok" or corpus is None:
                out.append(_not_measured(n, c, "error", "not evaluated" if r is None or r.error is None else r.error))
            else:
                out.append(S.Quality(n_ctx=n, type_k=c.type_k, type_v=c.type_v, flash_attn=c.flash_attn, status="ok",
                                     error=None, quality=_quality_block(r, corpus, base_k, base_v, threads),
                                     pass_=_pass_block(r, peak_rss, m, info)))
    return out


def measure(
    model: str | os.PathLike | None,
    configs: Sequence[QualityConfig | tuple[str, str] | str | dict[str, Any]] = DEFAULT_SWEEP_TYPES,
    corpus: str | os.PathLike | CorpusFile | None = None,
    n_ctx: int | Sequence[int] = 512,
    chunks: int | None = None,
    *,
    flash_attn: str = "auto",
    n_batch: int = 2048,
    n_ubatch: int = 512,
    n_threads: int | None = None,
    n_gpu_layers: int = -1,
    base_type_k: str = BASE_TYPE,
    base_type_v: str = BASE_TYPE,
    emulate_llama: bool = False,
    timeout: float | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    repack: bool | None = None,
) -> list[S.Quality]:
    """Perplexity and KL divergence of each cache configuration against the f16/f16 baseline.

    ``configs``: cache types (``"q8_0"``), (type_k, type_v) pairs, dicts or :class:`QualityConfig`.
    ``corpus``: ``None``/``"pydoc"`` (built in), ``"wikitext-2"``, a text file, or a :class:`CorpusFile`.
    ``chunks``: at most this many chunks per context size (llama-perplexity's ``--chunks``).
    ``emulate_llama``: also report the statistics llama-perplexity's 16-bit base file would give
    (``row.quality.llama_uint16``, :class:`EmulatedQualityStats`), for the agreement check in ``bench/``.
    ``on_event``: receives the child's events (``tokens``, ``progress``) as they arrive.
    ``repack``: llama-bench's --repack (the CPU backend's AMX / CPU_REPACK weight copies); None: llama.cpp's
    default unless the extra-buffer preflight saw those kernels crash here (edgekv.calibration.preflight).

    Returns one typed :class:`edgekv.records.schema.Quality` per (n_ctx, config), n_ctx-major, in the order given
    (see the module docstring).  Raises :class:`CorpusError` (empty, binary, too short), :class:`EngineError`
    (llama.cpp refused the model or the baseline) or :class:`RunFailed` (the child died, or its result does not read).
    """
    ctxs, cfgs = _checked_inputs(n_ctx, chunks, n_batch, n_ubatch, configs, flash_attn)
    base_k, base_v = cache_type(base_type_k).name, cache_type(base_type_v).name
    threads = int(n_threads) if n_threads else default_threads()
    m, corp = _load_inputs(model, corpus)
    invalid = _invalid_cases(m.shape, ctxs, cfgs, n_batch, n_ubatch, base_k, base_v)
    run_cfgs = sorted({i for i in range(len(cfgs)) if any((n, i) not in invalid for n in ctxs)})
    options = QualityOptions(n_batch=n_batch, n_ubatch=n_ubatch, n_threads=threads, chunks=chunks,
                             base_type_k=base_k, base_type_v=base_v, emulate_llama=bool(emulate_llama))
    rows, info, peak_rss = _run_pass(m, corp, ctxs, cfgs, run_cfgs, n_gpu_layers, repack, options, timeout, on_event)
    return _shape_rows(ctxs, cfgs, invalid, rows, info, peak_rss, corp, m, base_k, base_v, threads)


def quality_records(rows: list[S.Quality], model: str | os.PathLike | None, *, corpus: str | None,
                    chunks: int | None, n_batch: int, n_ubatch: int, n_gpu_layers: int,
                    env: dict[str, Any] | None = None, repack: bool = True) -> list[S.QualityRecord]:
    """``edgekv quality --json``: each :func:`measure` row as a typed record of kind ``quality`` (model, settings,
    environment; the row itself is the ``quality`` block, as in a bench record), so report, compare, merge and
    :func:`edgekv.results_frame` load it like bench records.  ``schema.encode(rec)`` is the JSON printed."""
    m = load_model(None if model is None else str(model))
    sha = verified_sha256(m.ref.path)
    environment = S.environment(env if env is not None else collect())
    model_block = S.model_block(m, sha)
    out = []
    for r in rows:
        q = r.quality
        settings = S.Settings(
            engine="llama-cpp-python", n_ctx=r.n_ctx, type_k=r.type_k, type_v=r.type_v, flash_attn=r.flash_attn,
            swa_full=False, n_seq_max=1, kv_unified=False, n_batch=n_batch, n_ubatch=n_ubatch,
            n_threads=None if q is None else q.n_threads, n_gpu_layers=n_gpu_layers, n_prompt=None, n_gen=None,
            n_depth=None, repetitions=None, warmup=None,
            quality=S.QualitySettings(corpus=corpus or (q.corpus.name if q is not None else None) or "pydoc",
                                      chunks=chunks),
            repack=repack)
        out.append(S.QualityRecord(
            schema_version=S.SCHEMA_VERSION, config_key=R.config_key(sha, S.encode_block(settings)), status=r.status,
            reason=r.error, time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), edgekv=__version__,
            model=model_block, settings=settings, environment=environment, quality=r))
    return out


# -- edgekv bench --quality -------------------------------------------------------------------------------

class SweepQuality:
    """The quality block of each sweep record, measured once per (context, -fa) group.

    The first configuration of a group that needs its figures runs one pass for every cache pair of
    that group still to do (the baseline is evaluated once, not once per pair); the others reuse the
    rows.  A pass that fails puts its one-line reason into each record of the group (``status``
    ``error``) instead of stopping the sweep.  ``spec.settings.quality`` names the corpus and the chunks.
    A case is read through its context parameters (``case.params``: n_ctx, type_k, type_v, flash_attn).
    """

    def __init__(self, spec, cases) -> None:
        self.spec = spec
        q = spec.settings.quality
        self.corpus = q.corpus if q is not None else None
        self.chunks = (q.chunks if q is not None else None) or SWEEP_CHUNKS
        self.groups: dict[tuple[int, str], list[QualityConfig]] = {}
        for c in cases:
            p = c.params
            g = self.groups.setdefault((p.n_ctx, p.flash_attn), [])
            cfg = QualityConfig(p.type_k, p.type_v, p.flash_attn)
            if cfg not in g:
                g.append(cfg)
        self.rows: dict[tuple[int, str, str, str], S.Quality] = {}

    def __call__(self, case, say: Any) -> S.Quality:
        """The quality row of ``case`` (its group's pass run on the first case that needs it); ``say``: the sweep's
        listener (edgekv.sweep.listener), which hears the pass's child events."""
        p = case.params
        key = (p.n_ctx, p.flash_attn, p.type_k, p.type_v)
        if key not in self.rows:
            self._run(p.n_ctx, p.flash_attn, say)
        return self.rows[key]

    def _run(self, n_ctx: int, fa: str, say: Any) -> None:
        cfgs = self.groups.get((n_ctx, fa), [])
        say.on_child({"event": "phase", "phase": "quality"})
        sp, st = self.spec, self.spec.settings
        try:
            rows = measure(sp.model.ref.path, cfgs, self.corpus, n_ctx, self.chunks, flash_attn=fa, n_batch=st.n_batch,
                           n_ubatch=st.n_ubatch, n_threads=st.n_threads or None, n_gpu_layers=st.n_gpu_layers,
                           repack=(sp.repack or [True])[0] if len(sp.repack or [True]) == 1 else None,
                           timeout=sp.timeout_s, on_event=lambda ev: say.on_child({**ev, "phase": "quality"}))
        except (CorpusError, EngineError, RunFailed, UsageError) as e:
            for c in cfgs:           # each c.flash_attn is fa: the group's
                self.rows[(n_ctx, fa, c.type_k, c.type_v)] = _not_measured(n_ctx, c, "error", str(e))
            return
        for r in rows:
            self.rows[(n_ctx, fa, r.type_k, r.type_v)] = r


def for_sweep(spec, cases) -> SweepQuality:
    """What :func:`edgekv.sweep.run.run_sweep` calls with ``spec.settings.quality`` set: a per-record quality provider,
    ``quality(case, listener)`` -> the typed :class:`edgekv.records.schema.Quality` to set as the record's ``quality``."""
    return SweepQuality(spec, cases)
