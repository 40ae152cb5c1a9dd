"""Quality cost of KV-cache quantization: perplexity and KL divergence against the f16 KV cache.

:func:`measure` is the one entry point (the CLI's ``edgekv quality`` and ``edgekv bench --quality``
both call it).  It resolves the model and the corpus, refuses configurations llama.cpp would refuse
(through :mod:`edgekv.core.predict`, without running them), and runs the pass in a child process
(:mod:`edgekv.child.quality_child` via :mod:`edgekv.edges.process`), so that an abort inside llama.cpp becomes a
clean error.  The child loads the model once and evaluates every chunk in the baseline context and
in each candidate context side by side; no logits file is written and no logits are kept.

Each returned row is one (context size, cache configuration)::

    {
      "n_ctx": 4096, "type_k": "q8_0", "type_v": "q8_0", "flash_attn": "auto",   # the join key
      "status": "ok" | "error" | "invalid", "error": None | "one line",
      "quality": {                      # None unless status == "ok"
        "corpus": {"name", "n_bytes", "n_tokens", "sha256", "source", "detail"},
        "baseline": {"type_k": "f16", "type_v": "f16"},
        "method": "llama-perplexity",   # chunking, scored positions, statistics
        "n_chunks", "n_tokens_scored", "n_batch", "n_ubatch", "n_seq", "n_threads",
        "ppl", "ppl_err", "base_ppl", "base_ppl_err",
        "ln_ppl_ratio", "ln_ppl_ratio_err", "ppl_ratio", "ppl_ratio_err", "cor_ln_ppl",
        "kld_mean", "kld_mean_err", "kld_median", "kld_p90", "kld_p95", "kld_p99", "kld_p999",
        "kld_max", "kld_min",
        "same_top_rate", "same_top_rate_err",            # fractions (0..1), not percent
        "delta_p_mean", "delta_p_mean_err", "delta_p_rms", "delta_p_rms_err", "delta_p_max_abs",
        "flash_attn_resolved", "attn_rot_k", "attn_rot_v",
        "eval_s", "eval_tokens_per_s",  # this configuration's own llama_decode time
      },
      "pass": {"wall_s", "stats_s", "n_contexts", "tokens_per_s", "peak_rss_bytes", "model", ...},
    }

This module does not import ``llama_cpp``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from edgekv.core.cachetypes import DEFAULT_SWEEP_TYPES, cache_type
from edgekv.core.klstats import plan
from edgekv.core.predict import STATUS_INVALID, ContextParams
from edgekv.edges.corpus import Corpus, resolve_corpus
from edgekv.edges.environment import default_threads
from edgekv.errors import CorpusError, EngineError, RunFailed, UsageError

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


def _as_config(c: QualityConfig | tuple[str, str] | str | dict[str, Any], flash_attn: str) -> QualityConfig:
    if isinstance(c, QualityConfig):
        return c
    if isinstance(c, str):
        return QualityConfig(c, c, flash_attn)
    if isinstance(c, dict):
        return QualityConfig(c.get("type_k", "f16"), c.get("type_v", c.get("type_k", "f16")), c.get("flash_attn", flash_attn))
    k, v = c
    return QualityConfig(k, v, flash_attn)


def _invalid_reason(shape, c: QualityConfig, n_ctx: int, p: dict[str, int], n_ubatch: int) -> str | None:
    """What llama.cpp would say (refusal or abort) for this context, from the predictor."""
    from edgekv.core.predict import predict

    pred = predict(shape, ContextParams(n_ctx=p["n_ctx_total"], type_k=c.type_k, type_v=c.type_v, flash_attn=c.flash_attn,
                                        swa_full=False, n_seq_max=p["n_seq"], kv_unified=False, n_batch=p["n_batch"],
                                        n_ubatch=min(n_ubatch, p["n_batch"])))
    return pred.reason if pred.status == STATUS_INVALID else None


def resolve_repack(repack: bool | None, on_event: Callable[[dict[str, Any]], None] | None) -> bool:
    """The --repack the quality child runs with: as asked, else the preflight's (said through ``on_event``)."""
    if repack is not None:
        return repack
    from edgekv.orchestration.preflight import preflight

    pf = preflight()
    if not pf.repack and on_event is not None:
        on_event({"event": "note", "message": pf.fallback_line})
    return pf.repack


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


def _load_inputs(model: str | os.PathLike | None, corpus: str | os.PathLike | Corpus | None) -> tuple[Any, Corpus]:
    """The whole model file (a header alone is refused) and the resolved corpus."""
    from edgekv.orchestration.api import load_model

    m = load_model(None if model is None else str(model))
    if not m.ref.complete:
        raise UsageError(f"{m.ref.spec}: the quality pass needs the whole model file, not only its header")
    m.require_whole("edgekv quality")
    corp = corpus if isinstance(corpus, Corpus) else resolve_corpus(corpus)
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


def _raise_child_failure(res, m, corp: Corpus) -> None:
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


def _run_pass(m, corp: Corpus, ctxs: list[int], cfgs: list[QualityConfig], run_cfgs: list[int], n_gpu_layers: int,
              repack: bool | None, options: dict[str, Any], timeout: float | None,
              on_event: Callable[[dict[str, Any]], None] | None
              ) -> tuple[dict[tuple[int, int], dict[str, Any]], dict[str, Any], int | None]:
    """Run phase: the configurations in ``run_cfgs`` (indexes into ``cfgs``) in one quality child, when there are
    any.  Returns the child's rows by (n_ctx, config index), its result and the peak RSS."""
    from edgekv.edges.process import run_child, worker_argv

    rows: dict[tuple[int, int], dict[str, Any]] = {}
    if not run_cfgs:
        return rows, {}, None
    payload = {
        "model_path": m.ref.path,
        "corpus_path": corp.path,
        "n_ctx": ctxs,
        "configs": [asdict(cfgs[i]) for i in run_cfgs],
        "n_gpu_layers": n_gpu_layers,
        "repack": resolve_repack(repack, on_event),
        "options": options,
    }
    res = run_child(worker_argv("quality"), payload, timeout=timeout, sample_memory=True, on_event=on_event)
    _raise_child_failure(res, m, corp)
    child_info = res.result or {}
    peak_rss = res.peak_rss_bytes or res.kernel_maxrss_bytes
    per_ctx = len(run_cfgs)
    for k, r in enumerate(child_info.get("rows", [])):
        n = ctxs[k // per_ctx]
        rows[(n, run_cfgs[k % per_ctx])] = r
    return rows, child_info, peak_rss


def _quality_block(r: dict[str, Any], corpus_dict: dict[str, Any], base_k: str, base_v: str,
                   threads: int) -> dict[str, Any]:
    """An ok row's ``quality`` block: the corpus, baseline and method, then the child's statistics."""
    q = {
        "corpus": corpus_dict,
        "baseline": {"type_k": base_k, "type_v": base_v},
        "method": METHOD,
        "n_threads": threads,
    }
    pass_keys = ("pass_wall_s", "pass_stats_s", "pass_contexts", "pass_tokens_per_s", "n_ctx_total", "eval_tokens",
                 "base_eval_s", "base_flash_attn_resolved")
    for key, value in r.items():
        if key in ("type_k", "type_v", "flash_attn", "n_ctx", "status") or key in pass_keys:
            continue
        q[key] = value
    return q


def _pass_block(r: dict[str, Any], peak_rss: int | None, m, child_info: dict[str, Any]) -> dict[str, Any]:
    """An ok row's ``pass`` block: the shared pass's timings, memory, model and llama.cpp build."""
    return {
        "wall_s": r.get("pass_wall_s"), "stats_s": r.get("pass_stats_s"), "n_contexts": r.get("pass_contexts"),
        "tokens_per_s": r.get("pass_tokens_per_s"), "n_ctx_total": r.get("n_ctx_total"),
        "eval_tokens": r.get("eval_tokens"), "base_eval_s": r.get("base_eval_s"),
        "base_flash_attn_resolved": r.get("base_flash_attn_resolved"),
        "peak_rss_bytes": peak_rss, "model": m.ref.path, "model_name": m.shape.name or m.ref.name,
        "n_vocab": child_info.get("n_vocab"), "add_bos": child_info.get("add_bos"),
        "llama_cpp_python": child_info.get("llama_cpp_python"), "system_info": child_info.get("system_info"),
    }


def _shape_rows(ctxs: list[int], cfgs: list[QualityConfig], invalid: dict[tuple[int, int], str],
                rows: dict[tuple[int, int], dict[str, Any]], child_info: dict[str, Any], peak_rss: int | None,
                corp: Corpus, m, base_k: str, base_v: str, threads: int) -> list[dict[str, Any]]:
    """Shape phase: one row per (n_ctx, config), n_ctx-major, invalid, error or ok (see the module docstring)."""
    corpus_dict = {**corp.to_dict(), "n_tokens": child_info.get("n_tokens")}
    out: list[dict[str, Any]] = []
    for n in ctxs:
        for i, c in enumerate(cfgs):
            row: dict[str, Any] = {"n_ctx": n, "type_k": c.type_k, "type_v": c.type_v, "flash_attn": c.flash_attn}
            if (n, i) in invalid:
                out.append({**row, "status": "invalid", "error": invalid[(n, i)], "quality": None, "pass": None})
                continue
            r = dict(rows.get((n, i), {}))
            if r.get("status") != "ok":
                out.append({**row, "status": "error", "error": r.get("error", "not evaluated"), "quality": None,
                            "pass": None})
                continue
            out.append({**row, "status": "ok", "error": None, "quality": _quality_block(r, corpus_dict, base_k, base_v, threads),
                        "pass": _pass_block(r, peak_rss, m, child_info)})
    return out


def measure(
    model: str | os.PathLike | None,
    configs: Sequence[QualityConfig | tuple[str, str] | str | dict[str, Any]] = DEFAULT_SWEEP_TYPES,
    corpus: str | os.PathLike | Corpus | None = None,
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
) -> list[dict[str, Any]]:
    """Perplexity and KL divergence of each cache configuration against the f16/f16 baseline.

    ``configs``: cache types (``"q8_0"``), (type_k, type_v) pairs, dicts or :class:`QualityConfig`.
    ``corpus``: ``None``/``"pydoc"`` (built in), ``"wikitext-2"``, a text file, or a :class:`Corpus`.
    ``chunks``: at most this many chunks per context size (llama-perplexity's ``--chunks``).
    ``emulate_llama``: also report the statistics llama-perplexity's 16-bit base file would give
    (``quality["llama_uint16"]``), for the agreement check in ``bench/``.
    ``on_event``: receives the child's events (``tokens``, ``progress``) as they arrive.
    ``repack``: llama-bench's --repack (the CPU backend's AMX / CPU_REPACK weight copies); None: llama.cpp's
    default unless the extra-buffer preflight saw those kernels crash here (edgekv.orchestration.preflight).

    Returns one row per (n_ctx, config), n_ctx-major, in the order given (see the module docstring).
    Raises :class:`CorpusError` (empty, binary, too short), :class:`EngineError` (llama.cpp refused
    the model or the baseline) or :class:`RunFailed` (the child died).
    """
    ctxs, cfgs = _checked_inputs(n_ctx, chunks, n_batch, n_ubatch, configs, flash_attn)
    base_k, base_v = cache_type(base_type_k).name, cache_type(base_type_v).name
    threads = int(n_threads) if n_threads else default_threads()
    m, corp = _load_inputs(model, corpus)
    invalid = _invalid_cases(m.shape, ctxs, cfgs, n_batch, n_ubatch, base_k, base_v)
    run_cfgs = sorted({i for i in range(len(cfgs)) if any((n, i) not in invalid for n in ctxs)})
    options = {"n_batch": n_batch, "n_ubatch": n_ubatch, "n_threads": threads, "chunks": chunks,
               "base_type_k": base_k, "base_type_v": base_v, "emulate_llama": emulate_llama}
    rows, child_info, peak_rss = _run_pass(m, corp, ctxs, cfgs, run_cfgs, n_gpu_layers, repack, options, timeout, on_event)
    return _shape_rows(ctxs, cfgs, invalid, rows, child_info, peak_rss, corp, m, base_k, base_v, threads)


def quality_records(rows: list[dict[str, Any]], model: str | os.PathLike | None, *, corpus: str | None,
                    chunks: int | None, n_batch: int, n_ubatch: int, n_gpu_layers: int,
                    env: dict[str, Any] | None = None, repack: bool = True) -> list[dict[str, Any]]:
    """``edgekv quality --json``: each :func:`measure` row as a record of kind ``quality`` (``schema_version``,
    model, settings, environment; the row itself is the ``quality`` block, as in a bench record), so report,
    compare, merge and :func:`edgekv.results_frame` load it like bench records.  Checked against the schema."""
    import time

    from edgekv.edges.environment import collect
    from edgekv.edges.sources import verified_sha256
    from edgekv.orchestration.api import load_model
    from edgekv.records import results as R
    from edgekv.records.schema import SCHEMA_VERSION, decode, encode, model_block
    from edgekv.version import __version__

    m = load_model(None if model is None else str(model))
    sha = verified_sha256(m.ref.path)
    env = env if env is not None else collect()
    out = []
    for r in rows:
        q = r.get("quality") or {}
        settings = {
            "engine": "llama-cpp-python", "n_ctx": r["n_ctx"], "type_k": r["type_k"], "type_v": r["type_v"],
            "flash_attn": r["flash_attn"], "swa_full": False, "n_seq_max": 1, "kv_unified": False, "n_batch": n_batch,
            "n_ubatch": n_ubatch, "n_threads": q.get("n_threads"), "n_gpu_layers": n_gpu_layers, "n_prompt": None,
            "n_gen": None, "n_depth": None, "repetitions": None, "warmup": None,
            "quality": {"corpus": corpus or (q.get("corpus") or {}).get("name") or "pydoc", "chunks": chunks},
            "repack": repack,
        }
        rec = {
            "schema_version": SCHEMA_VERSION, "kind": "quality", "config_key": R.config_key(sha, settings),
            "status": r["status"], "reason": r.get("error"), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "edgekv": __version__, "model": model_block(m, sha), "settings": settings, "environment": env, "quality": r,
        }
        out.append(encode(decode(rec, f"quality row {r['n_ctx']}/{r['type_k']}/{r['type_v']}")))
    return out


# -- edgekv bench --quality -------------------------------------------------------------------------------

SWEEP_CHUNKS = 2   # default chunks per context in a sweep: enough scored tokens for the KLD, minutes not hours


class SweepQuality:
    """The quality block of each sweep record, measured once per (context, -fa) group.

    The first configuration of a group that needs its figures runs one pass for every cache pair of
    that group still to do (the baseline is evaluated once, not once per pair); the others reuse the
    rows.  A pass that fails puts its one-line reason into each record of the group (``status``
    ``error``) instead of stopping the sweep.  ``spec.quality`` may carry ``corpus`` and ``chunks``.
    """

    def __init__(self, spec, cases) -> None:
        self.spec = spec
        q = spec.quality or {}
        self.corpus = q.get("corpus")
        self.chunks = int(q["chunks"]) if q.get("chunks") else SWEEP_CHUNKS
        self.groups: dict[tuple[int, str], list[QualityConfig]] = {}
        for c in cases:
            s = c.settings
            g = self.groups.setdefault((s["n_ctx"], s["flash_attn"]), [])
            cfg = QualityConfig(s["type_k"], s["type_v"], s["flash_attn"])
            if cfg not in g:
                g.append(cfg)
        self.rows: dict[tuple[int, str, str, str], dict[str, Any]] = {}

    def __call__(self, case, emit: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
        s = case.settings
        key = (s["n_ctx"], s["flash_attn"], s["type_k"], s["type_v"])
        if key not in self.rows:
            self._run(s["n_ctx"], s["flash_attn"], emit)
        return self.rows[key]

    def _run(self, n_ctx: int, fa: str, emit) -> None:
        cfgs = self.groups.get((n_ctx, fa), [])
        emit("child", {"event": "phase", "phase": "quality"})
        sp = self.spec
        try:
            rows = measure(sp.model.ref.path, cfgs, self.corpus, n_ctx, self.chunks, flash_attn=fa, n_batch=sp.n_batch,
                           n_ubatch=sp.n_ubatch, n_threads=sp.n_threads or None, n_gpu_layers=sp.n_gpu_layers,
                           repack=(sp.repack or [True])[0] if len(sp.repack or [True]) == 1 else None,
                           timeout=sp.timeout_s, on_event=lambda ev: emit("child", {**ev, "phase": "quality"}))
        except (CorpusError, EngineError, RunFailed, UsageError) as e:
            for c in cfgs:
                self.rows[(n_ctx, fa, c.type_k, c.type_v)] = {
                    "n_ctx": n_ctx, "type_k": c.type_k, "type_v": c.type_v, "flash_attn": fa,
                    "status": "error", "error": str(e), "quality": None, "pass": None}
            return
        for r in rows:
            self.rows[(n_ctx, fa, r["type_k"], r["type_v"])] = r


def for_sweep(spec, cases) -> SweepQuality:
    """What :func:`edgekv.orchestration.sweep.run_sweep` calls with ``spec.quality`` set: a per-record quality provider."""
    return SweepQuality(spec, cases)
