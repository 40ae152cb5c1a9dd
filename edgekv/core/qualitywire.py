"""The quality pass's protocol: what edgekv asks the quality child (edgekv.child.quality_child) to evaluate and
what it replies, shared by the child and the parent (edgekv.quality.run), as edgekv.core.benchwire is for
a measured run.  The request crosses as JSON on the child's stdin and the reply comes back on its event pipe; both
are decoded strictly where they arrive (msgspec.ValidationError when a payload is not one)."""

from __future__ import annotations

from typing import Any

import msgspec

from edgekv.core.wire import decoder
from edgekv.core.wire import to_wire as to_wire


class QualityCase(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One cache configuration to compare with the baseline."""

    type_k: str
    type_v: str
    flash_attn: str = "auto"


class QualityOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """llama-perplexity's options of the pass: batch sizes, threads, chunks (None: all), the baseline's cache types
    and ``emulate_llama`` (also the statistics llama-perplexity's 16-bit base file would give)."""

    n_batch: int
    n_ubatch: int
    n_threads: int
    base_type_k: str
    base_type_v: str
    chunks: int | None = None
    emulate_llama: bool = False


class QualityRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One quality pass: the model, the corpus, the context sizes, the configurations and the options."""

    model_path: str
    corpus_path: str
    n_ctx: list[int]
    configs: list[QualityCase]
    options: QualityOptions
    n_gpu_layers: int = -1
    repack: bool = True


class QualityRow(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One row of the quality child's reply (edgekv.child.quality_child: a config joined with what ``evaluate``
    found for it): what its context reported, llama-perplexity's statistics (absent where the context
    failed) and the shared pass's figures.  Every key the child sends is declared: a new one is an error here, not
    a key that lands nowhere."""

    n_ctx: int
    type_k: str
    type_v: str
    flash_attn: str
    status: str | None = None                # ok | error (its context failed)
    error: str | None = None
    flash_attn_resolved: str | None = None   # from llama.cpp's log
    attn_rot_k: bool | None = None
    attn_rot_v: bool | None = None
    n_tokens_scored: int | None = None       # edgekv.core.klstats.summarize: the rest absent when nothing was scored
    ppl: float | None = None
    ppl_err: float | None = None
    base_ppl: float | None = None
    base_ppl_err: float | None = None
    ln_ppl_ratio: float | None = None
    ln_ppl_ratio_err: float | None = None
    ppl_ratio: float | None = None
    ppl_ratio_err: float | None = None
    cor_ln_ppl: float | None = None
    kld_mean: float | None = None
    kld_mean_err: float | None = None
    kld_median: float | None = None
    kld_p90: float | None = None
    kld_p95: float | None = None
    kld_p99: float | None = None
    kld_p999: float | None = None
    kld_max: float | None = None
    kld_min: float | None = None
    same_top_rate: float | None = None
    same_top_rate_err: float | None = None
    delta_p_mean: float | None = None
    delta_p_mean_err: float | None = None
    delta_p_rms: float | None = None
    delta_p_rms_err: float | None = None
    delta_p_max_abs: float | None = None
    llama_uint16: dict[str, Any] | None = None   # emulate_llama only
    eval_s: float | None = None
    eval_tokens_per_s: float | None = None
    base_eval_s: float | None = None
    base_flash_attn_resolved: str | None = None
    n_chunks: int | None = None
    n_seq: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_ctx_total: int | None = None
    eval_tokens: int | None = None
    pass_wall_s: float | None = None
    pass_stats_s: float | None = None
    pass_contexts: int | None = None
    pass_tokens_per_s: float | None = None


class QualityReply(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The quality child's reply (edgekv.child.quality_child.run): its rows, n_ctx-major, and the facts of the model
    and the build it ran."""

    rows: list[QualityRow] = []
    n_tokens: int | None = None
    add_bos: bool | None = None
    n_vocab: int | None = None
    llama_cpp_python: str | None = None
    system_info: str | None = None
    pid: int | None = None


request_from = decoder(QualityRequest)
reply_from = decoder(QualityReply)
