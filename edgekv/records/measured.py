"""The blocks of a results record that say what llama.cpp did and reported and what was measured: ``effective``,
``llama_log``, ``speed``, ``serving``, ``memory``, ``timing``, ``differences``, the residuals, ``load``, ``plan``,
``quality``, ``llama_bench`` and ``failure`` (each block's provenance is in its docstring and in
:data:`edgekv.records.schema.PROVENANCE`).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
from msgspec import UNSET, UnsetType

from edgekv.core.corpus import Corpus
from edgekv.records.blocks import Block, BufMiB, CacheLine, OptFloat, OptInt, OptStr, doc

# -- what llama.cpp did and reported -------------------------------------------------------------------

class Effective(Block, kw_only=True):
    """Context parameters llama.cpp actually used (provenance: llama.cpp)."""

    n_ctx: doc(Union[int, None, UnsetType], "context size (absent: the context was never created)") = UNSET
    n_batch: doc(Union[int, UnsetType], "logical batch") = UNSET
    n_ubatch: doc(Union[int, UnsetType], "physical batch") = UNSET
    n_seq_max: doc(Union[int, UnsetType], "parallel sequences") = UNSET
    n_ctx_seq: doc(Union[int, UnsetType], "cells per sequence") = UNSET
    flash_attn: doc(Union[str, None, UnsetType], "enabled | disabled as resolved") = UNSET
    flash_attn_forced_for_quantized_v: doc(Union[bool, UnsetType], "llama.cpp turned FA on for a quantized V") = UNSET


class LlamaLog(Block, kw_only=True):
    """Buffers llama.cpp printed in the measured run (provenance: llama.cpp)."""

    kv: doc(list[CacheLine], "cache lines")
    kv_mib: doc(Union[float, int, None], "KV MiB (sum of the cache lines)")
    recurrent_mib: doc(Union[int, float, UnsetType], "recurrent state MiB") = UNSET
    kv_buffers_mib: doc(Union[BufMiB, None, UnsetType], "KV buffers, MiB per buffer type") = UNSET
    rs_buffers_mib: doc(Union[BufMiB, None, UnsetType], "recurrent buffers, MiB per buffer type") = UNSET
    compute_mib: doc(Union[BufMiB, None], "compute buffers, MiB per buffer type")
    output_mib: doc(Union[BufMiB, None, UnsetType], "output buffers, MiB per buffer type") = UNSET
    model_buffers_mib: doc(Union[BufMiB, None, UnsetType], "model weight buffers, MiB per buffer type") = UNSET
    gpu_layers: doc(Union[list[int], None, UnsetType], "offloaded/total layers as printed") = UNSET
    device_notes: doc(Union[list[str], UnsetType], "device lines worth keeping") = UNSET


# -- measured -----------------------------------------------------------------------------------------

class SpeedTest(Block, kw_only=True):
    """One test (pp or tg): every timed sample and its summary (provenance: measured)."""

    n_tokens: doc(int, "tokens per sample")
    samples_ns: doc(Union[list[int], None], "duration of each timed repetition, ns (None: the llama-bench file had none)")
    samples_ts: doc(list[float], "tokens per second of each repetition")
    mean_ts: doc(OptFloat, "mean tokens per second")
    stdev_ts: doc(OptFloat, "sample standard deviation, tokens per second")
    ci95_ts: doc(Union[list[float], None], "95% confidence interval of the mean, tokens per second")
    cv: doc(OptFloat, "coefficient of variation (stdev / mean)")
    unstable: doc(bool, "cv >= 10%: rerun on a quieter machine")
    llama_bench_avg_ts: doc(Union[float, None, UnsetType], "llama-bench's own avg_ts (llama.cpp)") = UNSET


class Speed(Block, kw_only=True):
    """Speed per llama-bench test (provenance: measured; ``llama_bench_avg_ts``: llama.cpp)."""

    pp: doc(Union[SpeedTest, UnsetType], "prompt processing (-p tokens)") = UNSET
    tg: doc(Union[SpeedTest, UnsetType], "text generation (-n tokens)") = UNSET
    pg: doc(Union[SpeedTest, UnsetType], "prompt + generation in one test (imported llama-bench -pg)") = UNSET
    tg_seq: doc(Union[SpeedTest, UnsetType], "-npl: decode tokens/s of each sequence while all n_parallel decode "
                                            "(tg / n_parallel); absent for one sequence") = UNSET


class Serving(Block, kw_only=True):
    """The user's llama-server driven over HTTP (``edgekv bench --llama-server``; provenance: measured by edgekv's
    client, except ``server_timings``: llama.cpp's own figures as the server sent them)."""

    path: doc(str, "the llama-server binary")
    concurrency: doc(int, "requests in flight at once (= the server's -np slots)")
    n_requests: doc(int, "requests sent (concurrency x repetitions)")
    n_failed: doc(int, "requests that failed (reasons in failures)")
    ttft_s: doc(list[float], "time to first token of each request that succeeded, seconds (client: send -> first "
                            "streamed token)")
    ttft_p50_s: doc(OptFloat, "median time to first token")
    ttft_p95_s: doc(OptFloat, "95th percentile of the time to first token")
    throughput_ts: doc(OptFloat, "generated tokens of all requests / the rounds' wall time (prefill included)")
    ready_s: doc(OptFloat, "seconds from start until /health answered 200 (model load, warm-up)")
    failures: doc(list[str], "distinct reasons of failed requests (at most 5)")
    server_timings: doc(list[dict[str, Any]], "the server's 'timings' of each request (prompt_n, prompt_ms, "
                                             "predicted_n, predicted_ms, ...)")


class TestMemory(Block, kw_only=True):
    """Peaks of one llama-bench process (provenance: measured)."""

    peak_rss_bytes: doc(OptInt, "peak RSS")
    kernel_maxrss_bytes: doc(OptInt, "ru_maxrss from wait4")
    peak_gpu_bytes: doc(OptInt, "peak GPU memory")
    peak_footprint_bytes: doc(OptInt, "peak footprint (macOS)")
    peak_anon_bytes: doc(OptInt, "peak anonymous RSS")
    peak_file_bytes: doc(OptInt, "peak file-backed RSS")


class Memory(Block, kw_only=True):
    """Memory of the measured process, sampled by the parent and read by the child (provenance: measured)."""

    peak_rss_bytes: doc(OptInt, "peak RSS over the model's phases (harness snapshot/restore left out)")
    peak_rss_all_phases_bytes: doc(Union[int, None, UnsetType], "peak RSS over every phase") = UNSET
    kernel_maxrss_bytes: doc(OptInt, "ru_maxrss from wait4")
    peak_footprint_bytes: doc(Union[int, None, UnsetType], "peak footprint (macOS)") = UNSET
    peak_gpu_bytes: doc(OptInt, "peak GPU memory in use")
    phase_peaks_bytes: doc(Union[dict[str, int], UnsetType], "peak RSS per phase") = UNSET
    gpu_phase_peaks_bytes: doc(Union[dict[str, int], None, UnsetType], "peak GPU memory per phase") = UNSET
    n_samples: doc(Union[int, UnsetType], "parent's RSS samples") = UNSET
    sample_interval_mean_s: doc(Union[float, None, UnsetType], "mean interval between samples") = UNSET
    sample_interval_max_s: doc(Union[float, None, UnsetType], "longest interval between samples") = UNSET
    timed_unsampled_s: doc(Union[float, None, UnsetType], "time in timed tests the parent did not sample") = UNSET
    n_child_samples: doc(Union[int, None, UnsetType], "RSS readings by the child after each repetition") = UNSET
    rss_start_bytes: doc(Union[int, None, UnsetType], "RSS at child start") = UNSET
    anon_start_bytes: doc(Union[int, None, UnsetType], "anonymous RSS at child start") = UNSET
    gpu_used_start_bytes: doc(Union[int, UnsetType], "device memory in use at start") = UNSET
    rss_after_load_bytes: doc(Union[int, None, UnsetType], "RSS after the model load") = UNSET
    anon_after_load_bytes: doc(Union[int, None, UnsetType], "anonymous RSS after the load") = UNSET
    gpu_used_after_load_bytes: doc(Union[int, UnsetType], "device memory in use after the load") = UNSET
    rss_after_context_bytes: doc(Union[int, None, UnsetType], "RSS after context creation") = UNSET
    anon_after_context_bytes: doc(Union[int, None, UnsetType], "anonymous RSS after context creation") = UNSET
    gpu_used_after_context_bytes: doc(Union[int, UnsetType], "device memory after context creation") = UNSET
    rss_after_fill_bytes: doc(Union[int, None, UnsetType], "RSS after filling to depth") = UNSET
    anon_after_fill_bytes: doc(Union[int, None, UnsetType], "anonymous RSS after the fill") = UNSET
    gpu_used_after_fill_bytes: doc(Union[int, UnsetType], "device memory after the fill") = UNSET
    rss_end_bytes: doc(Union[int, None, UnsetType], "RSS at the end") = UNSET
    anon_end_bytes: doc(Union[int, None, UnsetType], "anonymous RSS at the end") = UNSET
    gpu_used_end_bytes: doc(Union[int, UnsetType], "device memory at the end") = UNSET
    file_after_fill_bytes: doc(Union[int, UnsetType], "file-backed RSS after the fill (rss - anon)") = UNSET
    per_test: doc(Union[dict[str, TestMemory], UnsetType], "llama-bench: peaks per test process") = UNSET


class Timing(Block, kw_only=True):
    """Wall-clock phases of the run, seconds (provenance: measured)."""

    import_s: doc(Union[float, UnsetType], "child: importing llama_cpp") = UNSET
    load_s: doc(Union[float, UnsetType], "model load") = UNSET
    context_s: doc(Union[float, UnsetType], "context creation") = UNSET
    warmup_s: doc(Union[float, UnsetType], "warm-up run") = UNSET
    fill_s: doc(Union[float, UnsetType], "fill to depth") = UNSET
    fill_from: doc(Union[int, UnsetType], "the fill's first tokens, restored from an earlier configuration's fill of "
                   "the same cache (fill_s is the rest's)") = UNSET
    pp_s: doc(Union[float, UnsetType], "timed prompt processing") = UNSET
    tg_s: doc(Union[float, UnsetType], "timed generation") = UNSET
    snapshot_s: doc(Union[float, UnsetType], "harness: saving the depth state") = UNSET
    restore_s: doc(Union[float, UnsetType], "harness: restoring the depth state") = UNSET
    child_total_s: doc(Union[float, UnsetType], "child's whole life") = UNSET
    timed_s: doc(Union[float, UnsetType], "timed tests") = UNSET
    wall_s: doc(float, "parent's wall time for the configuration")
    llama_s: doc(Union[float, UnsetType], "sum of llama.cpp phases (load .. tg)") = UNSET
    harness_s: doc(Union[float, UnsetType], "wall_s - llama_s") = UNSET


class Differences(Block, kw_only=True):
    """Measured (or llama.cpp-reported) minus predicted; each key names both sides (provenance: derived)."""

    llama_kv_matches_formula: doc(Union[bool, None, UnsetType],
                                 "llama.cpp's cache lines in the run equal the formula's (absent: no valid formula)") = UNSET
    llama_kv_diffs: doc(Union[list[str], UnsetType], "how they differ") = UNSET
    kv_buffer_mib: doc(Union[float, UnsetType], "KV buffer MiB llama.cpp allocated") = UNSET
    kv_buffer_minus_formula_mib: doc(Union[float, UnsetType], "llama.cpp KV buffer - formula, MiB") = UNSET
    context_anon_growth_bytes: doc(Union[int, UnsetType], "measured anonymous RSS growth at context creation") = UNSET
    context_anon_growth_minus_formula_bytes: doc(Union[int, UnsetType], "that growth - formula KV bytes") = UNSET
    context_gpu_growth_bytes: doc(Union[int, UnsetType], "measured device memory growth at context creation") = UNSET
    gpu_compute_buffer_bytes: doc(Union[int, UnsetType], "llama.cpp's device compute buffers, bytes") = UNSET
    context_gpu_growth_minus_compute_minus_formula_bytes: doc(
        Union[int, UnsetType], "device growth - compute buffers - formula KV bytes") = UNSET
    fill_anon_growth_bytes: doc(Union[int, UnsetType], "measured anonymous growth during the fill") = UNSET
    compute_buffer_bytes: doc(Union[int, UnsetType], "llama.cpp's compute buffers, bytes (reserved, not compared)") = UNSET


class MemoryResidual(Block, kw_only=True):
    """Measured peak RSS minus the whole-process prediction (provenance: derived)."""

    peak_rss_bytes: doc(int, "measured - predicted, bytes")
    peak_rss_pct: doc(float, "that, % of predicted")
    workload: doc(str, "the workload predicted")


class SpeedResidual(Block, kw_only=True):
    """Measured minus predicted tokens/s, % of predicted (provenance: derived)."""

    pp_pct: doc(Union[float, None], "prompt processing: (measured - predicted) / predicted, %")
    tg_pct: doc(Union[float, None], "generation: (measured - predicted) / predicted, %")


class LoadWindow(Block, kw_only=True):
    """Other processes' CPU over a time window (provenance: measured; :mod:`edgekv.machine.load`)."""

    wall_s: doc(Union[float, UnsetType], "window length") = UNSET
    others_cpu_s: doc(Union[float, UnsetType], "CPU seconds used by other processes") = UNSET
    others_cores: doc(Union[float, UnsetType], "cores other processes used on average") = UNSET
    others_share: doc(Union[float, UnsetType], "their share of the machine's cores") = UNSET
    loadavg_1m: doc(Union[float, None, UnsetType], "1-minute load average at the start") = UNSET
    loadavg_1m_max: doc(Union[float, None, UnsetType], "highest 1-minute load average during the window") = UNSET


class Load(Block, kw_only=True):
    """Was the machine busy before/while this configuration ran (pyperf's habit; provenance: measured)."""

    cpus: doc(int, "logical CPUs")
    before: doc(LoadWindow, "the half second before")
    during: doc(LoadWindow, "the configuration itself")
    threshold_share: doc(float, "others' share at or above which the record is marked busy")
    busy: doc(bool, "others used at least threshold_share of the cores")
    others_share_max: doc(float, "the larger of the two shares")


class Plan(Block, kw_only=True):
    """The time estimate beside the measured wall time (``edgekv bench``'s planner; estimate: model, wall: measured)."""

    estimate_s: doc(OptFloat, "predicted seconds for this configuration")
    wall_s: doc(float, "measured seconds")
    sweep_elapsed_s: doc(float, "seconds since the sweep started")
    remaining_eta_s: doc(float, "predicted seconds left")
    remaining_configs: doc(int, "configurations left")
    sweep_estimate_s: doc(float, "the first estimate of the whole sweep")
    basis: doc(str, "what the estimate was calibrated on")


# -- quality ------------------------------------------------------------------------------------------

class CacheTypes(Block, kw_only=True):
    type_k: doc(str, "K cache type")
    type_v: doc(str, "V cache type")


class QualityStats(Block, kw_only=True):
    """Perplexity and KL divergence vs the f16-KV baseline, llama-perplexity's statistics (provenance: measured)."""

    corpus: doc(Corpus, "the text scored")
    baseline: doc(CacheTypes, "the reference cache types")
    method: doc(str, "how logits were compared")
    n_threads: doc(int, "CPU threads")
    attn_rot_k: doc(bool, "llama.cpp rotated K (attn_rot)")
    attn_rot_v: doc(bool, "llama.cpp rotated V")
    flash_attn_resolved: doc(OptStr, "flash attention as llama.cpp resolved it")
    n_tokens_scored: doc(OptInt, "tokens scored")
    ppl: doc(OptFloat, "perplexity")
    ppl_err: doc(OptFloat, "its standard error")
    base_ppl: doc(OptFloat, "baseline perplexity")
    base_ppl_err: doc(OptFloat, "its standard error")
    ln_ppl_ratio: doc(OptFloat, "mean ln(ppl / base ppl)")
    ln_ppl_ratio_err: doc(OptFloat, "its standard error")
    ppl_ratio: doc(OptFloat, "ppl / base ppl")
    ppl_ratio_err: doc(OptFloat, "its standard error")
    cor_ln_ppl: doc(OptFloat, "correlation of the per-token ln p")
    kld_mean: doc(OptFloat, "mean KL divergence")
    kld_mean_err: doc(OptFloat, "its standard error")
    kld_median: doc(OptFloat, "median KL divergence")
    kld_p90: doc(OptFloat, "90th percentile")
    kld_p95: doc(OptFloat, "95th percentile")
    kld_p99: doc(OptFloat, "99th percentile")
    kld_p999: doc(OptFloat, "99.9th percentile")
    kld_max: doc(OptFloat, "maximum")
    kld_min: doc(OptFloat, "minimum")
    same_top_rate: doc(OptFloat, "fraction of tokens with the same top-1")
    same_top_rate_err: doc(OptFloat, "its standard error")
    delta_p_mean: doc(OptFloat, "mean change of the correct token's probability")
    delta_p_mean_err: doc(OptFloat, "its standard error")
    delta_p_rms: doc(OptFloat, "RMS of that change")
    delta_p_rms_err: doc(OptFloat, "its standard error")
    delta_p_max_abs: doc(OptFloat, "largest absolute change")
    eval_s: doc(OptFloat, "evaluation time, s")
    eval_tokens_per_s: doc(OptFloat, "evaluation speed, tokens per second")
    n_chunks: doc(OptInt, "chunks scored")
    n_seq: doc(OptInt, "sequences per batch")
    n_batch: doc(OptInt, "logical batch")
    n_ubatch: doc(OptInt, "physical batch")


class QualityPass(Block, kw_only=True):
    """The child process that computed a quality pass (provenance: measured)."""

    wall_s: doc(OptFloat, "wall time")
    stats_s: doc(OptFloat, "time computing statistics")
    n_contexts: doc(OptInt, "contexts created")
    tokens_per_s: doc(OptFloat, "evaluation speed")
    n_ctx_total: doc(OptInt, "sum of the contexts' sizes")
    eval_tokens: doc(OptInt, "tokens evaluated")
    base_eval_s: doc(OptFloat, "baseline evaluation time")
    base_flash_attn_resolved: doc(OptStr, "flash attention of the baseline")
    peak_rss_bytes: doc(OptInt, "peak RSS of the pass")
    model: doc(OptStr, "model path")
    model_name: doc(OptStr, "model name")
    n_vocab: doc(OptInt, "vocabulary size")
    add_bos: doc(Union[bool, None], "BOS added")
    llama_cpp_python: doc(OptStr, "llama-cpp-python version")
    system_info: doc(OptStr, "llama.cpp system info")


class Quality(Block, kw_only=True):
    """KV-quantization quality of one (n_ctx, type_k, type_v) (provenance: measured)."""

    n_ctx: doc(int, "context size")
    type_k: doc(str, "K cache type")
    type_v: doc(str, "V cache type")
    flash_attn: doc(str, "flash attention asked")
    status: doc(str, "ok | invalid | failed | ...")
    error: doc(OptStr, "why not ok")
    quality: doc(Union[QualityStats, None], "the statistics, None when not ok")
    pass_: doc(Union[QualityPass, None, UnsetType], "the pass that computed it") = msgspec.field(default=UNSET, name="pass")


# -- llama-bench import -------------------------------------------------------------------------------

class LlamaBenchContext(Block, kw_only=True):
    """What llama-bench's log printed for one test's context (provenance: llama.cpp)."""

    test: doc(str, "pp | tg")
    n_ctx: doc(int, "context size")
    kv: doc(list[CacheLine], "cache lines")
    kv_mib: doc(float, "KV MiB")
    compute_mib: doc(BufMiB, "compute buffers, MiB per buffer type")
    formula_kv_bytes: doc(int, "formula KV bytes for this context (formula)")
    matches_formula: doc(bool, "llama.cpp's lines equal the formula's")
    diffs: doc(list[str], "how they differ")


class LlamaBench(Block, kw_only=True):
    """llama-bench's own JSON fields for an imported run (provenance: llama.cpp)."""

    # llama-bench's JSON keys differ between builds (devices, for one, is recent): a key the user's build did not
    # print is None, so a record written with an older llama-bench reads back
    path: doc(str, "llama-bench binary")
    build_commit: doc(OptStr, "llama.cpp commit")
    build_number: doc(OptInt, "llama.cpp build number")
    cpu_info: doc(OptStr, "CPU as llama-bench reports it")
    gpu_info: doc(OptStr, "GPU as llama-bench reports it")
    backends: doc(OptStr, "backends")
    model_type: doc(OptStr, "model type string")
    model_size: doc(OptInt, "model bytes (llama-bench's count)")
    model_n_params: doc(OptInt, "parameters")
    devices: doc(OptStr, "devices")
    contexts: doc(list[LlamaBenchContext], "the contexts it created")


class Failure(Block, kw_only=True):
    """Where and why a measuring process died (edgekv.core.diagnose): the parent's view of the dead child."""

    phase: doc(OptStr, "the run's phase when it died: load, context, warm-up, prompt at depth, prompt, generate, ...")
    signal: doc(OptStr, "the signal that ended it (SIGSEGV, SIGKILL, ...), None when it exited")
    exit_code: doc(OptInt, "its exit code when no signal ended it")
    timed_out: doc(bool, "stopped at the --timeout deadline")
    cause: doc(OptStr, "a recognised cause: amx-crash (llama.cpp #20824) | oom-kill (the kernel counted it) | "
                      "timeout | memory-watchdog (edgekv stopped it: the machine's memory nearly exhausted) | None")
    cause_text: doc(OptStr, "the cause in words, with what to do")
    log_tail: doc(list[str], "the last llama.cpp log lines (INFO and above) it forwarded before it died")
    last_error: doc(Union[str, None, UnsetType], "its last error line on stderr (an assert, an exception)") = UNSET

