"""The typed results record: one type per kind (``bench``, ``llama-bench``, ``predict``, ``quality``; the union
:data:`AnyRecord` tagged by ``kind``, each a :class:`Record`), decoded strictly and encoded back to the same JSON.

Why ``msgspec.Struct`` (not dataclasses): strict typed decoding with a path to the bad key
(``$.settings.n_ctx``), ``forbid_unknown_fields``, absent-vs-null kept apart (``UNSET`` fields are left
out when encoding, so a record written today reads back byte for byte), and the JSON Schema generated
from the same types (:func:`json_schema`).  It is small, typed and has no dependencies.

Provenance.  Every block that carries numbers says where they come from, in its docstring and in
:data:`PROVENANCE` (block -> source), so readers never guess:

* ``formula``    -- predicted by edgekv from the GGUF header (``prediction.formula``; pure Python)
* ``llama.cpp``  -- reported by llama.cpp: its dry run (``prediction.engine``), its log in the measured
  run (``llama_log``, ``effective``), llama-bench's own figures (``llama_bench``)
* ``measured``   -- measured by the OS / timers around a real run (``memory``, ``speed``, ``timing``,
  ``quality``: perplexity and KL divergence computed from real logits)
* ``model``      -- ``prediction.process`` mixes sources: each of its ``parts`` names its own ``source``
  (formula, llama.cpp dry run, measured calibration; :mod:`edgekv.core.memmodel`)
* ``derived``    -- ``differences`` and ``memory_residual``: measured minus predicted, each key naming
  both sides; ``plan``: the bench planner's time estimate beside the measured wall time
* ``load`` is measured (other processes' CPU share around the run: the "busy machine" marker)

Mappings (``dict[str, ...]``) are used where the content is free-form by nature: the environment's ``extra``
and llama.cpp's ``device_details`` (their keys grow with what the platform exposes), ggml buffer
sizes keyed by buffer-type name (``CPU``, ``CPU_Mapped``, ``CUDA0``: llama.cpp's names, open-ended),
per-phase peaks keyed by phase name, per-device byte counts, and the per-layer breakdown of
``predict --layers`` (``prediction.formula.layers``, one dict per layer as :mod:`edgekv.core.predict` has it).

Kinds: :class:`BenchRecord` requires every identifying block (config key, time, edgekv version, prediction,
model.arch, settings.n_ctx and engine); :class:`PredictRecord` (``edgekv predict --json``, built by
:func:`predict_record`), :class:`QualityRecord` (``edgekv quality --json``) and :class:`LlamaBenchRecord` (an
imported llama-bench row) leave out what they do not have (``UNSET``: absent in the JSON, never invented).
The environment is typed too (:class:`Environment`: the keys edgekv collects, and ``extra`` for the rest).

Units are in the field names (``_bytes``, ``_mib``, ``_s``, ``_ns``, ``_ts`` = tokens per second).
The keys of committed schema-2 files are kept as they are (``mean_ts`` etc.).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

SCHEMA_VERSION = 3

KINDS = ("bench", "llama-bench", "predict", "quality")

# Which source each block's numbers come from (documented above; the DataFrame suffixes use it).
PROVENANCE: dict[str, str] = {
    "prediction.formula": "formula",
    "prediction.engine": "llama.cpp",
    "prediction.process": "model",
    "llama_log": "llama.cpp",
    "effective": "llama.cpp",
    "llama_bench": "llama.cpp",
    "memory": "measured",
    "speed": "measured",
    "timing": "measured",
    "quality": "measured",
    "differences": "derived",
    "memory_residual": "derived",
    "prediction.speed": "model",
    "speed_residual": "derived",
    "load": "measured",
    "plan": "derived",
}


def _d(t: Any, desc: str) -> Any:
    return Annotated[t, Meta(description=desc)]


class _Block(Struct, kw_only=True, forbid_unknown_fields=True):
    pass


OptInt = Union[int, None]
OptFloat = Union[float, None]
OptStr = Union[str, None]
BufMiB = dict[str, float]          # ggml buffer type name -> MiB, as llama.cpp prints it


# -- settings and model -------------------------------------------------------------------------------

class QualitySettings(_Block, kw_only=True):
    """What quality measurement was asked for alongside a bench (``--quality``)."""

    corpus: _d(str, "corpus name or path the perplexity/KL pass read")
    chunks: _d(OptInt, "number of corpus chunks scored (None: all)")


class Settings(_Block, kw_only=True):
    """What was asked: llama.cpp's context parameters and the workload (llama-bench's names).

    Every key is present; None where the producer did not set it (a predict row has no workload)."""

    engine: _d(OptStr, "'llama-cpp-python' (edgekv's child) or 'llama-bench'")
    n_ctx: _d(OptInt, "context size in tokens (-c); None in an imported llama-bench file (llama-bench's own default)")
    type_k: _d(OptStr, "K cache type as llama.cpp spells it (-ctk)")
    type_v: _d(OptStr, "V cache type (-ctv)")
    flash_attn: _d(OptStr, "flash attention asked: on | off | auto (-fa)")
    swa_full: _d(Union[bool, None], "full-size SWA cache (--swa-full)")
    n_seq_max: _d(OptInt, "parallel sequences (-np)")
    kv_unified: _d(Union[bool, None], "one KV buffer shared by all sequences (--kv-unified)")
    n_batch: _d(OptInt, "logical batch size in tokens (-b)")
    n_ubatch: _d(OptInt, "physical batch size in tokens (-ub)")
    n_threads: _d(OptInt, "CPU threads (-t)")
    n_gpu_layers: _d(OptInt, "layers offloaded to the GPU (-ngl)")
    n_prompt: _d(OptInt, "prompt-processing test length in tokens (-p)")
    n_gen: _d(OptInt, "generation test length in tokens (-n)")
    n_depth: _d(OptInt, "tokens already in the context before each test (-d)")
    repetitions: _d(OptInt, "timed repetitions per test (-r)")
    warmup: _d(Union[bool, None], "one untimed warm-up run before the timed ones (None: unknown, imported llama-bench)")
    quality: _d(Union[QualitySettings, None], "quality pass asked with the bench, or None")
    no_mmap: _d(Union[bool, UnsetType], "weights read into anonymous memory (--no-mmap); only present when set") = UNSET
    repack: _d(Union[bool, UnsetType], "the CPU backend's extra buffer types (AMX, CPU_REPACK) on: llama-bench --repack, "
                                       "llama_model_params.use_extra_bufts; absent in records written before it "
                                       "(llama.cpp's default, on)") = UNSET
    test: _d(Union[str, UnsetType], "imported llama-bench row: its test (pp, tg, pg)") = UNSET
    n_parallel: _d(Union[int, UnsetType], "sequences decoded at once (-npl, llama-batched-bench's pl): each with -p prompt "
                                          "and -n generated tokens from an empty cache; speed.pp/tg are then aggregate "
                                          "tokens/s of all of them; absent: one sequence at depth -d") = UNSET


class Model(_Block, kw_only=True):
    """The GGUF file: where it came from and its KV-relevant shape (read from the header).

    An imported llama-bench file names only ``path``, ``name``, ``sha256`` (None) and ``size_bytes``."""

    path: _d(OptStr, "absolute path of the GGUF file")
    name: _d(OptStr, "model name (general.name, else the registry/file name; llama-bench: its model_type)")
    spec: _d(Union[str, UnsetType], "what the user passed to -m") = UNSET
    source: _d(Union[str, UnsetType], "local | hf | url | pypi") = UNSET
    sha256: _d(OptStr, "sha256 of the whole file (None: only the header was read)")
    arch: _d(Union[str, UnsetType], "general.architecture") = UNSET
    memory: _d(Union[str, UnsetType], "cache family: kv | swa | hybrid | recurrent | ...") = UNSET
    size_bytes: _d(Union[int, None, UnsetType], "bytes of weight tensors") = UNSET
    file_bytes: _d(Union[int, UnsetType], "bytes of the GGUF file") = UNSET
    n_layer: _d(Union[int, UnsetType], "layers (block_count)") = UNSET
    n_ctx_train: _d(Union[OptInt, UnsetType], "training context length") = UNSET
    n_head_kv: _d(Union[list[int], None, UnsetType], "distinct KV head counts over attention layers") = UNSET
    head_dim_k: _d(Union[list[int], None, UnsetType], "distinct K head dimensions over attention layers") = UNSET
    n_swa: _d(Union[OptInt, UnsetType], "sliding-window size in tokens, None when the model has no SWA") = UNSET
    swa_layers: _d(Union[int, UnsetType], "layers using the sliding window") = UNSET
    shared_kv_layers: _d(Union[int, UnsetType], "layers reusing another layer's KV (no cache of their own)") = UNSET
    recurrent_layers: _d(Union[int, UnsetType], "layers with recurrent state") = UNSET
    mla: _d(Union[bool, UnsetType], "multi-head latent attention") = UNSET
    incomplete: _d(Union[str, UnsetType], "a local file shorter than its tensor table needs: bytes present and "
                                          "expected (the prediction used the header only)") = UNSET


# -- prediction ---------------------------------------------------------------------------------------

class FormulaCache(_Block, kw_only=True):
    """One KV cache of the formula (provenance: formula; :meth:`edgekv.core.predict.CachePrediction.to_dict`)."""

    kind: _d(Union[str, UnsetType], "cache kind: kv | swa | recurrent | dsv4_state | ...") = UNSET
    cells: _d(Union[int, UnsetType], "cells (tokens) per stream (absent for state caches: see state_rows)") = UNSET
    n_stream: _d(Union[int, UnsetType], "streams (sequences with their own cells)") = UNSET
    layers: _d(Union[int, UnsetType], "layers in this cache") = UNSET
    layer_ids: _d(Union[list[int], UnsetType], "layer indices") = UNSET
    type_k: _d(Union[str, UnsetType], "K cache type") = UNSET
    type_v: _d(Union[str, UnsetType], "V cache type") = UNSET
    k_bytes: _d(Union[int, UnsetType], "K bytes") = UNSET
    v_bytes: _d(Union[int, UnsetType], "V bytes") = UNSET
    bytes: _d(Union[int, UnsetType], "all bytes of this cache") = UNSET
    r_bytes: _d(Union[int, UnsetType], "recurrent R state bytes") = UNSET
    s_bytes: _d(Union[int, UnsetType], "recurrent S state bytes") = UNSET
    name: _d(Union[str, UnsetType], "state cache name") = UNSET
    state_rows: _d(Union[int, UnsetType], "state rows") = UNSET
    width: _d(Union[int, UnsetType], "state row width") = UNSET
    rs_seq: _d(Union[int, UnsetType], "state sequences") = UNSET
    state_bytes: _d(Union[int, UnsetType], "state bytes") = UNSET


class Formula(_Block, kw_only=True):
    """The KV prediction from the GGUF header (provenance: formula; :mod:`edgekv.core.predict`)."""

    n_ctx: _d(int, "context size asked")
    n_ctx_padded: _d(int, "context size after llama.cpp's padding")
    n_ctx_seq: _d(int, "cells per sequence")
    type_k: _d(str, "K cache type")
    type_v: _d(str, "V cache type")
    flash_attn: _d(str, "flash attention asked")
    flash_attn_effective: _d(str, "flash attention llama.cpp would use (on/off/auto)")
    swa_full: _d(bool, "full-size SWA cache")
    n_seq_max: _d(int, "parallel sequences")
    kv_unified: _d(bool, "unified KV buffer")
    n_batch: _d(int, "logical batch")
    n_ubatch: _d(int, "physical batch")
    status: _d(str, "ok | invalid | unsupported")
    reason: _d(OptStr, "why not ok")
    aborts: _d(bool, "llama.cpp would abort at context creation")
    memory: _d(str, "cache family")
    kv_bytes: _d(OptInt, "attention KV bytes (None unless status is ok)")
    k_bytes: _d(OptInt, "K bytes")
    v_bytes: _d(OptInt, "V bytes")
    recurrent_bytes: _d(OptInt, "recurrent state bytes")
    state_bytes: _d(Union[int, None, UnsetType], "other state bytes (DeepSeek-V4 style caches)") = UNSET
    total_bytes: _d(OptInt, "KV + recurrent + state bytes: what llama.cpp allocates for the caches")
    caches: _d(list[FormulaCache], "one entry per cache (empty unless status is ok)")
    notes: _d(Union[list[str], UnsetType], "caveats of the prediction") = UNSET
    layers: _d(Union[list[dict[str, Any]], UnsetType], "per-layer breakdown (predict --layers)") = UNSET
    saving_vs_f16: _d(Union[float, None, UnsetType], "f16 cache bytes / these cache bytes (predict)") = UNSET


class CacheLine(_Block, kw_only=True):
    """One cache as llama.cpp's log prints it (provenance: llama.cpp; :func:`edgekv.orchestration.crosscheck.engine_lines`)."""

    kind: _d(str, "kv | recurrent | state")
    role: _d(Union[str, None, UnsetType], "role in a hybrid/iSWA cache (full, swa) or None") = UNSET
    mib: _d(str, "total MiB, as printed (a string: keeps llama.cpp's digits)")
    cells: _d(int, "cells")
    layers: _d(Union[int, UnsetType], "layers") = UNSET
    streams: _d(Union[int, None, UnsetType], "streams (seqs)") = UNSET
    type_k: _d(Union[str, None, UnsetType], "K type") = UNSET
    type_v: _d(Union[str, None, UnsetType], "V type") = UNSET
    k_mib: _d(Union[str, None, UnsetType], "K MiB as printed") = UNSET
    v_mib: _d(Union[str, None, UnsetType], "V MiB as printed") = UNSET
    r_mib: _d(Union[str, None, UnsetType], "recurrent R MiB as printed") = UNSET
    s_mib: _d(Union[str, None, UnsetType], "recurrent S MiB as printed") = UNSET
    width: _d(Union[int, None, UnsetType], "state row width") = UNSET
    rs_seq: _d(Union[int, None, UnsetType], "state sequences") = UNSET


class Engine(_Block, kw_only=True):
    """llama.cpp's own dry run for the configuration (provenance: llama.cpp; ``no_alloc``, parsed log)."""

    ok: _d(bool, "the dry run succeeded")
    error: _d(OptStr, "why it failed")
    match: _d(Union[bool, None], "its caches equal the formula's (None: edgekv does not model this cache)")
    diffs: _d(list[str], "formula vs llama.cpp differences, readable")
    caches: _d(Union[list[CacheLine], UnsetType], "its cache lines (absent when the dry run failed)") = UNSET
    kv_mib: _d(Union[float, None, UnsetType], "KV MiB it printed (sum)") = UNSET
    recurrent_mib: _d(Union[float, int, None, UnsetType], "recurrent state MiB (predict --engine)") = UNSET
    state_mib: _d(Union[float, int, None, UnsetType], "other state MiB (predict --engine)") = UNSET
    other_buffers_mib: _d(Union[BufMiB, None, UnsetType], "buffers of kinds the log parser does not know") = UNSET
    compute_mib: _d(Union[BufMiB, None, UnsetType], "compute buffers, MiB per ggml buffer type") = UNSET
    output_mib: _d(Union[BufMiB, None, UnsetType], "output buffers, MiB per buffer type") = UNSET
    flash_attn_resolved: _d(Union[str, None, UnsetType], "flash attention as llama.cpp resolved it") = UNSET
    n_ctx: _d(Union[int, None, UnsetType], "context size llama.cpp created") = UNSET
    total_bytes: _d(Union[int, None, UnsetType], "weights + caches + compute + output buffers (predict --engine)") = UNSET
    total_caches_from: _d(Union[str, UnsetType], "formula | llama.cpp: whose cache bytes total_bytes uses") = UNSET
    graph: _d(Union[dict[str, int], None, UnsetType], "llama.cpp's graph nodes and splits (prompt and one-token graphs)") = UNSET
    off_device: _d(Union[list[dict[str, Any]], None, UnsetType],
                   "ops the scheduler put on another backend than their offloaded layer's device (op, backend, device, "
                   "layers; from GGML_SCHED_DEBUG=2): on a GPU, the ops that silently run on the CPU") = UNSET
    weights_bytes: _d(Union[int, None, UnsetType], "llama_model_size(): llama.cpp's own weights figure") = UNSET


class ProcessPart(_Block, kw_only=True):
    """One part of the whole-process prediction; ``source`` is its provenance."""

    name: _d(str, "what it is")
    bytes: _d(int, "bytes")
    source: _d(str, "formula | llama.cpp dry run | measured (runtime calibration) | ...")
    where: _d(str, "host or a ggml device name")
    kind: _d(str, "anonymous | file | device")
    note: _d(str, "how it was obtained")


class PredictedAfter(_Block, kw_only=True):
    """Set when the prediction was added to a record after its measurement."""

    edgekv: _d(str, "edgekv version that predicted")
    time_utc: _d(str, "when")


class Process(_Block, kw_only=True):
    """Whole-process memory prediction (issue 15; :mod:`edgekv.core.memmodel`); provenance per part."""

    workload: _d(Union[str, UnsetType], "the workload predicted (bench, llama-bench, ...)") = UNSET
    peak_rss_bytes: _d(OptInt, "predicted peak RSS (None: not predicted)")
    device_bytes: _d(Union[dict[str, int], UnsetType], "predicted bytes per device") = UNSET
    parts: _d(Union[list[ProcessPart], UnsetType], "the parts summed") = UNSET
    notes: _d(Union[list[str], UnsetType], "caveats") = UNSET
    predicted_after_measurement: _d(Union[PredictedAfter, UnsetType], "added later by edgekv") = UNSET
    error: _d(Union[str, None, UnsetType], "why the dry run behind it failed") = UNSET
    fits: _d(Union[bool, None, UnsetType], "edgekv predict: the peak plus the margin (edgekv.core.fit) within the "
                                           "memory available when it predicted") = UNSET
    available_bytes: _d(Union[int, None, UnsetType], "edgekv predict: the memory available then") = UNSET
    available_source: _d(Union[str, None, UnsetType], "which figure: MemAvailable | cgroup limit | ...") = UNSET


class SpeedPartBlock(_Block, kw_only=True):
    """One part of a predicted token's time (edgekv.core.speed)."""

    name: _d(str, "fixed | weights | output head | attention")
    s_per_token: _d(float, "seconds per token")
    source: _d(str, "how it was obtained (the calibrated coefficient and the model's figure)")


class SpeedTestPrediction(_Block, kw_only=True):
    """Predicted speed of one test (pp or tg) at a depth."""

    test: _d(str, "pp | tg")
    tokens_per_s: _d(float, "predicted tokens/s")
    depth: _d(int, "cells in the cache when the test starts")
    n_tokens: _d(int, "prompt or generated tokens")
    s_per_token: _d(float, "sum of the parts")
    parts: _d(list[SpeedPartBlock], "the parts, seconds per token")
    roofline_tokens_per_s: _d(Union[float, None], "decode bound: measured read bandwidth / bytes read per token")
    bytes_per_token: _d(Union[float, None], "bytes a decoded token reads (weights + KV at the mean depth)")
    calibration_id: _d(str, "the calibration the coefficients come from")


class SpeedPrediction(_Block, kw_only=True):
    """The speed model's prediction (issue 26; edgekv.core.speed, edgekv.orchestration.speedcal)."""

    pp: _d(Union[SpeedTestPrediction, None, UnsetType], "prompt processing") = UNSET
    tg: _d(Union[SpeedTestPrediction, None, UnsetType], "generation") = UNSET
    calibration_id: _d(OptStr, "the calibration used")
    machine: _d(Union[str, None, UnsetType], "the CPU and thread count the calibration was measured on") = UNSET
    calibrated_with: _d(Union[str, UnsetType], "the llama.cpp the calibration was measured through: "
                                               "llama-cpp-python, or the user's llama-bench (its path)") = UNSET
    calibration_busy: _d(Union[bool, UnsetType], "the calibration was taken while other work used the CPUs "
                                                 "(its figures are not this machine's own)") = UNSET
    error: _d(Union[str, None, UnsetType], "why no speed was predicted (a type the calibration lacks, ...)") = UNSET
    explain: _d(Union[str, None, UnsetType], "the part that dominates, and the roofline share") = UNSET
    predicted_after_measurement: _d(Union[PredictedAfter, UnsetType], "added later by edgekv") = UNSET


class Prediction(_Block, kw_only=True):
    """What edgekv predicts: the formula, llama.cpp's dry run, the whole process, the speed."""

    formula: _d(Formula, "KV from the header (formula)")
    engine: _d(Union[Engine, None, UnsetType], "llama.cpp dry run (llama.cpp)") = UNSET
    process: _d(Union[Process, None, UnsetType], "whole-process prediction; None: never predicted") = UNSET
    speed: _d(Union[SpeedPrediction, None, UnsetType], "predicted tokens/s (schema 3); None: not predicted") = UNSET


# -- what llama.cpp did and reported -------------------------------------------------------------------

class Effective(_Block, kw_only=True):
    """Context parameters llama.cpp actually used (provenance: llama.cpp)."""

    n_ctx: _d(Union[int, None, UnsetType], "context size (absent: the context was never created)") = UNSET
    n_batch: _d(Union[int, UnsetType], "logical batch") = UNSET
    n_ubatch: _d(Union[int, UnsetType], "physical batch") = UNSET
    n_seq_max: _d(Union[int, UnsetType], "parallel sequences") = UNSET
    n_ctx_seq: _d(Union[int, UnsetType], "cells per sequence") = UNSET
    flash_attn: _d(Union[str, None, UnsetType], "enabled | disabled as resolved") = UNSET
    flash_attn_forced_for_quantized_v: _d(Union[bool, UnsetType], "llama.cpp turned FA on for a quantized V") = UNSET


class LlamaLog(_Block, kw_only=True):
    """Buffers llama.cpp printed in the measured run (provenance: llama.cpp)."""

    kv: _d(list[CacheLine], "cache lines")
    kv_mib: _d(Union[float, int, None], "KV MiB (sum of the cache lines)")
    recurrent_mib: _d(Union[int, float, UnsetType], "recurrent state MiB") = UNSET
    kv_buffers_mib: _d(Union[BufMiB, None, UnsetType], "KV buffers, MiB per buffer type") = UNSET
    rs_buffers_mib: _d(Union[BufMiB, None, UnsetType], "recurrent buffers, MiB per buffer type") = UNSET
    compute_mib: _d(Union[BufMiB, None], "compute buffers, MiB per buffer type")
    output_mib: _d(Union[BufMiB, None, UnsetType], "output buffers, MiB per buffer type") = UNSET
    model_buffers_mib: _d(Union[BufMiB, None, UnsetType], "model weight buffers, MiB per buffer type") = UNSET
    gpu_layers: _d(Union[list[int], None, UnsetType], "offloaded/total layers as printed") = UNSET
    device_notes: _d(Union[list[str], UnsetType], "device lines worth keeping") = UNSET


# -- measured -----------------------------------------------------------------------------------------

class SpeedTest(_Block, kw_only=True):
    """One test (pp or tg): every timed sample and its summary (provenance: measured)."""

    n_tokens: _d(int, "tokens per sample")
    samples_ns: _d(Union[list[int], None], "duration of each timed repetition, ns (None: the llama-bench file had none)")
    samples_ts: _d(list[float], "tokens per second of each repetition")
    mean_ts: _d(OptFloat, "mean tokens per second")
    stdev_ts: _d(OptFloat, "sample standard deviation, tokens per second")
    ci95_ts: _d(Union[list[float], None], "95% confidence interval of the mean, tokens per second")
    cv: _d(OptFloat, "coefficient of variation (stdev / mean)")
    unstable: _d(bool, "cv >= 10%: rerun on a quieter machine")
    llama_bench_avg_ts: _d(Union[float, None, UnsetType], "llama-bench's own avg_ts (llama.cpp)") = UNSET


class Speed(_Block, kw_only=True):
    """Speed per llama-bench test (provenance: measured; ``llama_bench_avg_ts``: llama.cpp)."""

    pp: _d(Union[SpeedTest, UnsetType], "prompt processing (-p tokens)") = UNSET
    tg: _d(Union[SpeedTest, UnsetType], "text generation (-n tokens)") = UNSET
    pg: _d(Union[SpeedTest, UnsetType], "prompt + generation in one test (imported llama-bench -pg)") = UNSET
    tg_seq: _d(Union[SpeedTest, UnsetType], "-npl: decode tokens/s of each sequence while all n_parallel decode "
                                            "(tg / n_parallel); absent for one sequence") = UNSET


class Serving(_Block, kw_only=True):
    """The user's llama-server driven over HTTP (``edgekv bench --llama-server``; provenance: measured by edgekv's
    client, except ``server_timings``: llama.cpp's own figures as the server sent them)."""

    path: _d(str, "the llama-server binary")
    concurrency: _d(int, "requests in flight at once (= the server's -np slots)")
    n_requests: _d(int, "requests sent (concurrency x repetitions)")
    n_failed: _d(int, "requests that failed (reasons in failures)")
    ttft_s: _d(list[float], "time to first token of each request that succeeded, seconds (client: send -> first "
                            "streamed token)")
    ttft_p50_s: _d(OptFloat, "median time to first token")
    ttft_p95_s: _d(OptFloat, "95th percentile of the time to first token")
    throughput_ts: _d(OptFloat, "generated tokens of all requests / the rounds' wall time (prefill included)")
    ready_s: _d(OptFloat, "seconds from start until /health answered 200 (model load, warm-up)")
    failures: _d(list[str], "distinct reasons of failed requests (at most 5)")
    server_timings: _d(list[dict[str, Any]], "the server's 'timings' of each request (prompt_n, prompt_ms, "
                                             "predicted_n, predicted_ms, ...)")


class TestMemory(_Block, kw_only=True):
    """Peaks of one llama-bench process (provenance: measured)."""

    peak_rss_bytes: _d(OptInt, "peak RSS")
    kernel_maxrss_bytes: _d(OptInt, "ru_maxrss from wait4")
    peak_gpu_bytes: _d(OptInt, "peak GPU memory")
    peak_footprint_bytes: _d(OptInt, "peak footprint (macOS)")
    peak_anon_bytes: _d(OptInt, "peak anonymous RSS")
    peak_file_bytes: _d(OptInt, "peak file-backed RSS")


class Memory(_Block, kw_only=True):
    """Memory of the measured process, sampled by the parent and read by the child (provenance: measured)."""

    peak_rss_bytes: _d(OptInt, "peak RSS over the model's phases (harness snapshot/restore left out)")
    peak_rss_all_phases_bytes: _d(Union[int, None, UnsetType], "peak RSS over every phase") = UNSET
    kernel_maxrss_bytes: _d(OptInt, "ru_maxrss from wait4")
    peak_footprint_bytes: _d(Union[int, None, UnsetType], "peak footprint (macOS)") = UNSET
    peak_gpu_bytes: _d(OptInt, "peak GPU memory in use")
    phase_peaks_bytes: _d(Union[dict[str, int], UnsetType], "peak RSS per phase") = UNSET
    gpu_phase_peaks_bytes: _d(Union[dict[str, int], None, UnsetType], "peak GPU memory per phase") = UNSET
    n_samples: _d(Union[int, UnsetType], "parent's RSS samples") = UNSET
    sample_interval_mean_s: _d(Union[float, None, UnsetType], "mean interval between samples") = UNSET
    sample_interval_max_s: _d(Union[float, None, UnsetType], "longest interval between samples") = UNSET
    timed_unsampled_s: _d(Union[float, None, UnsetType], "time in timed tests the parent did not sample") = UNSET
    n_child_samples: _d(Union[int, None, UnsetType], "RSS readings by the child after each repetition") = UNSET
    rss_start_bytes: _d(Union[int, None, UnsetType], "RSS at child start") = UNSET
    anon_start_bytes: _d(Union[int, None, UnsetType], "anonymous RSS at child start") = UNSET
    gpu_used_start_bytes: _d(Union[int, UnsetType], "device memory in use at start") = UNSET
    rss_after_load_bytes: _d(Union[int, None, UnsetType], "RSS after the model load") = UNSET
    anon_after_load_bytes: _d(Union[int, None, UnsetType], "anonymous RSS after the load") = UNSET
    gpu_used_after_load_bytes: _d(Union[int, UnsetType], "device memory in use after the load") = UNSET
    rss_after_context_bytes: _d(Union[int, None, UnsetType], "RSS after context creation") = UNSET
    anon_after_context_bytes: _d(Union[int, None, UnsetType], "anonymous RSS after context creation") = UNSET
    gpu_used_after_context_bytes: _d(Union[int, UnsetType], "device memory after context creation") = UNSET
    rss_after_fill_bytes: _d(Union[int, None, UnsetType], "RSS after filling to depth") = UNSET
    anon_after_fill_bytes: _d(Union[int, None, UnsetType], "anonymous RSS after the fill") = UNSET
    gpu_used_after_fill_bytes: _d(Union[int, UnsetType], "device memory after the fill") = UNSET
    rss_end_bytes: _d(Union[int, None, UnsetType], "RSS at the end") = UNSET
    anon_end_bytes: _d(Union[int, None, UnsetType], "anonymous RSS at the end") = UNSET
    gpu_used_end_bytes: _d(Union[int, UnsetType], "device memory at the end") = UNSET
    file_after_fill_bytes: _d(Union[int, UnsetType], "file-backed RSS after the fill (rss - anon)") = UNSET
    per_test: _d(Union[dict[str, TestMemory], UnsetType], "llama-bench: peaks per test process") = UNSET


class Timing(_Block, kw_only=True):
    """Wall-clock phases of the run, seconds (provenance: measured)."""

    import_s: _d(Union[float, UnsetType], "child: importing llama_cpp") = UNSET
    load_s: _d(Union[float, UnsetType], "model load") = UNSET
    context_s: _d(Union[float, UnsetType], "context creation") = UNSET
    warmup_s: _d(Union[float, UnsetType], "warm-up run") = UNSET
    fill_s: _d(Union[float, UnsetType], "fill to depth") = UNSET
    pp_s: _d(Union[float, UnsetType], "timed prompt processing") = UNSET
    tg_s: _d(Union[float, UnsetType], "timed generation") = UNSET
    snapshot_s: _d(Union[float, UnsetType], "harness: saving the depth state") = UNSET
    restore_s: _d(Union[float, UnsetType], "harness: restoring the depth state") = UNSET
    child_total_s: _d(Union[float, UnsetType], "child's whole life") = UNSET
    timed_s: _d(Union[float, UnsetType], "timed tests") = UNSET
    wall_s: _d(float, "parent's wall time for the configuration")
    llama_s: _d(Union[float, UnsetType], "sum of llama.cpp phases (load .. tg)") = UNSET
    harness_s: _d(Union[float, UnsetType], "wall_s - llama_s") = UNSET


class Differences(_Block, kw_only=True):
    """Measured (or llama.cpp-reported) minus predicted; each key names both sides (provenance: derived)."""

    llama_kv_matches_formula: _d(Union[bool, None, UnsetType],
                                 "llama.cpp's cache lines in the run equal the formula's (absent: no valid formula)") = UNSET
    llama_kv_diffs: _d(Union[list[str], UnsetType], "how they differ") = UNSET
    kv_buffer_mib: _d(Union[float, UnsetType], "KV buffer MiB llama.cpp allocated") = UNSET
    kv_buffer_minus_formula_mib: _d(Union[float, UnsetType], "llama.cpp KV buffer - formula, MiB") = UNSET
    context_anon_growth_bytes: _d(Union[int, UnsetType], "measured anonymous RSS growth at context creation") = UNSET
    context_anon_growth_minus_formula_bytes: _d(Union[int, UnsetType], "that growth - formula KV bytes") = UNSET
    context_gpu_growth_bytes: _d(Union[int, UnsetType], "measured device memory growth at context creation") = UNSET
    gpu_compute_buffer_bytes: _d(Union[int, UnsetType], "llama.cpp's device compute buffers, bytes") = UNSET
    context_gpu_growth_minus_compute_minus_formula_bytes: _d(
        Union[int, UnsetType], "device growth - compute buffers - formula KV bytes") = UNSET
    fill_anon_growth_bytes: _d(Union[int, UnsetType], "measured anonymous growth during the fill") = UNSET
    compute_buffer_bytes: _d(Union[int, UnsetType], "llama.cpp's compute buffers, bytes (reserved, not compared)") = UNSET


class MemoryResidual(_Block, kw_only=True):
    """Measured peak RSS minus the whole-process prediction (provenance: derived)."""

    peak_rss_bytes: _d(int, "measured - predicted, bytes")
    peak_rss_pct: _d(float, "that, % of predicted")
    workload: _d(str, "the workload predicted")


class SpeedResidual(_Block, kw_only=True):
    """Measured minus predicted tokens/s, % of predicted (provenance: derived)."""

    pp_pct: _d(Union[float, None], "prompt processing: (measured - predicted) / predicted, %")
    tg_pct: _d(Union[float, None], "generation: (measured - predicted) / predicted, %")


class LoadWindow(_Block, kw_only=True):
    """Other processes' CPU over a time window (provenance: measured; :mod:`edgekv.edges.load`)."""

    wall_s: _d(Union[float, UnsetType], "window length") = UNSET
    others_cpu_s: _d(Union[float, UnsetType], "CPU seconds used by other processes") = UNSET
    others_cores: _d(Union[float, UnsetType], "cores other processes used on average") = UNSET
    others_share: _d(Union[float, UnsetType], "their share of the machine's cores") = UNSET
    loadavg_1m: _d(Union[float, None, UnsetType], "1-minute load average at the start") = UNSET
    loadavg_1m_max: _d(Union[float, None, UnsetType], "highest 1-minute load average during the window") = UNSET


class Load(_Block, kw_only=True):
    """Was the machine busy before/while this configuration ran (pyperf's habit; provenance: measured)."""

    cpus: _d(int, "logical CPUs")
    before: _d(LoadWindow, "the half second before")
    during: _d(LoadWindow, "the configuration itself")
    threshold_share: _d(float, "others' share at or above which the record is marked busy")
    busy: _d(bool, "others used at least threshold_share of the cores")
    others_share_max: _d(float, "the larger of the two shares")


class Plan(_Block, kw_only=True):
    """The time estimate beside the measured wall time (``edgekv bench``'s planner; estimate: model, wall: measured)."""

    estimate_s: _d(OptFloat, "predicted seconds for this configuration")
    wall_s: _d(float, "measured seconds")
    sweep_elapsed_s: _d(float, "seconds since the sweep started")
    remaining_eta_s: _d(float, "predicted seconds left")
    remaining_configs: _d(int, "configurations left")
    sweep_estimate_s: _d(float, "the first estimate of the whole sweep")
    basis: _d(str, "what the estimate was calibrated on")


# -- quality ------------------------------------------------------------------------------------------

class Corpus(_Block, kw_only=True):
    """The text scored."""

    name: _d(str, "corpus name")
    path: _d(str, "file read")
    n_bytes: _d(int, "bytes")
    sha256: _d(str, "sha256 of the file")
    source: _d(str, "where it came from")
    detail: _d(str, "how it was obtained")
    n_tokens: _d(int, "tokens after tokenisation")


class CacheTypes(_Block, kw_only=True):
    type_k: _d(str, "K cache type")
    type_v: _d(str, "V cache type")


class QualityStats(_Block, kw_only=True):
    """Perplexity and KL divergence vs the f16-KV baseline, llama-perplexity's statistics (provenance: measured)."""

    corpus: _d(Corpus, "the text scored")
    baseline: _d(CacheTypes, "the reference cache types")
    method: _d(str, "how logits were compared")
    n_threads: _d(int, "CPU threads")
    attn_rot_k: _d(bool, "llama.cpp rotated K (attn_rot)")
    attn_rot_v: _d(bool, "llama.cpp rotated V")
    flash_attn_resolved: _d(OptStr, "flash attention as llama.cpp resolved it")
    n_tokens_scored: _d(OptInt, "tokens scored")
    ppl: _d(OptFloat, "perplexity")
    ppl_err: _d(OptFloat, "its standard error")
    base_ppl: _d(OptFloat, "baseline perplexity")
    base_ppl_err: _d(OptFloat, "its standard error")
    ln_ppl_ratio: _d(OptFloat, "mean ln(ppl / base ppl)")
    ln_ppl_ratio_err: _d(OptFloat, "its standard error")
    ppl_ratio: _d(OptFloat, "ppl / base ppl")
    ppl_ratio_err: _d(OptFloat, "its standard error")
    cor_ln_ppl: _d(OptFloat, "correlation of the per-token ln p")
    kld_mean: _d(OptFloat, "mean KL divergence")
    kld_mean_err: _d(OptFloat, "its standard error")
    kld_median: _d(OptFloat, "median KL divergence")
    kld_p90: _d(OptFloat, "90th percentile")
    kld_p95: _d(OptFloat, "95th percentile")
    kld_p99: _d(OptFloat, "99th percentile")
    kld_p999: _d(OptFloat, "99.9th percentile")
    kld_max: _d(OptFloat, "maximum")
    kld_min: _d(OptFloat, "minimum")
    same_top_rate: _d(OptFloat, "fraction of tokens with the same top-1")
    same_top_rate_err: _d(OptFloat, "its standard error")
    delta_p_mean: _d(OptFloat, "mean change of the correct token's probability")
    delta_p_mean_err: _d(OptFloat, "its standard error")
    delta_p_rms: _d(OptFloat, "RMS of that change")
    delta_p_rms_err: _d(OptFloat, "its standard error")
    delta_p_max_abs: _d(OptFloat, "largest absolute change")
    eval_s: _d(OptFloat, "evaluation time, s")
    eval_tokens_per_s: _d(OptFloat, "evaluation speed, tokens per second")
    n_chunks: _d(OptInt, "chunks scored")
    n_seq: _d(OptInt, "sequences per batch")
    n_batch: _d(OptInt, "logical batch")
    n_ubatch: _d(OptInt, "physical batch")


class QualityPass(_Block, kw_only=True):
    """The child process that computed a quality pass (provenance: measured)."""

    wall_s: _d(OptFloat, "wall time")
    stats_s: _d(OptFloat, "time computing statistics")
    n_contexts: _d(OptInt, "contexts created")
    tokens_per_s: _d(OptFloat, "evaluation speed")
    n_ctx_total: _d(OptInt, "sum of the contexts' sizes")
    eval_tokens: _d(OptInt, "tokens evaluated")
    base_eval_s: _d(OptFloat, "baseline evaluation time")
    base_flash_attn_resolved: _d(OptStr, "flash attention of the baseline")
    peak_rss_bytes: _d(OptInt, "peak RSS of the pass")
    model: _d(OptStr, "model path")
    model_name: _d(OptStr, "model name")
    n_vocab: _d(OptInt, "vocabulary size")
    add_bos: _d(Union[bool, None], "BOS added")
    llama_cpp_python: _d(OptStr, "llama-cpp-python version")
    system_info: _d(OptStr, "llama.cpp system info")


class Quality(_Block, kw_only=True):
    """KV-quantization quality of one (n_ctx, type_k, type_v) (provenance: measured)."""

    n_ctx: _d(int, "context size")
    type_k: _d(str, "K cache type")
    type_v: _d(str, "V cache type")
    flash_attn: _d(str, "flash attention asked")
    status: _d(str, "ok | invalid | failed | ...")
    error: _d(OptStr, "why not ok")
    quality: _d(Union[QualityStats, None], "the statistics, None when not ok")
    pass_: _d(Union[QualityPass, None, UnsetType], "the pass that computed it") = msgspec.field(default=UNSET, name="pass")


# -- llama-bench import -------------------------------------------------------------------------------

class LlamaBenchContext(_Block, kw_only=True):
    """What llama-bench's log printed for one test's context (provenance: llama.cpp)."""

    test: _d(str, "pp | tg")
    n_ctx: _d(int, "context size")
    kv: _d(list[CacheLine], "cache lines")
    kv_mib: _d(float, "KV MiB")
    compute_mib: _d(BufMiB, "compute buffers, MiB per buffer type")
    formula_kv_bytes: _d(int, "formula KV bytes for this context (formula)")
    matches_formula: _d(bool, "llama.cpp's lines equal the formula's")
    diffs: _d(list[str], "how they differ")


class LlamaBench(_Block, kw_only=True):
    """llama-bench's own JSON fields for an imported run (provenance: llama.cpp)."""

    # llama-bench's JSON keys differ between builds (devices, for one, is recent): a key the user's build did not
    # print is None, so a record written with an older llama-bench reads back
    path: _d(str, "llama-bench binary")
    build_commit: _d(OptStr, "llama.cpp commit")
    build_number: _d(OptInt, "llama.cpp build number")
    cpu_info: _d(OptStr, "CPU as llama-bench reports it")
    gpu_info: _d(OptStr, "GPU as llama-bench reports it")
    backends: _d(OptStr, "backends")
    model_type: _d(OptStr, "model type string")
    model_size: _d(OptInt, "model bytes (llama-bench's count)")
    model_n_params: _d(OptInt, "parameters")
    devices: _d(OptStr, "devices")
    contexts: _d(list[LlamaBenchContext], "the contexts it created")


class Failure(_Block, kw_only=True):
    """Where and why a measuring process died (edgekv.core.diagnose): the parent's view of the dead child."""

    phase: _d(OptStr, "the run's phase when it died: load, context, warm-up, prompt at depth, prompt, generate, ...")
    signal: _d(OptStr, "the signal that ended it (SIGSEGV, SIGKILL, ...), None when it exited")
    exit_code: _d(OptInt, "its exit code when no signal ended it")
    timed_out: _d(bool, "stopped at the --timeout deadline")
    cause: _d(OptStr, "a recognised cause: amx-crash (llama.cpp #20824) | oom-kill (the kernel counted it) | "
                      "timeout | memory-watchdog (edgekv stopped it: the machine's memory nearly exhausted) | None")
    cause_text: _d(OptStr, "the cause in words, with what to do")
    log_tail: _d(list[str], "the last llama.cpp log lines (INFO and above) it forwarded before it died")
    last_error: _d(Union[str, None, UnsetType], "its last error line on stderr (an assert, an exception)") = UNSET


# -- environment --------------------------------------------------------------------------------------

class NvidiaDevice(_Block, kw_only=True):
    """One GPU as NVML names it (nvidia-ml-py)."""

    index: _d(int, "NVML device index")
    name: _d(str, "the card's name")
    memory_total: _d(int, "its memory, bytes")


class Nvidia(_Block, kw_only=True):
    """NVML's view of the machine (``edgekv[cuda]``): the driver and the GPUs, or why NVML could not tell."""

    driver: _d(Union[str, UnsetType], "driver version") = UNSET
    devices: _d(Union[list[NvidiaDevice], UnsetType], "the GPUs") = UNSET
    error: _d(Union[str, UnsetType], "NVML's error (an environment fact, not an edgekv failure)") = UNSET


class ExtraBuffersPreflight(_Block, kw_only=True):
    """Whether llama.cpp's extra CPU buffer kernels (AMX, CPU_REPACK) run on this machine
    (:mod:`edgekv.orchestration.preflight`; measured by a probe process)."""

    runs: _d(Union[bool, None], "the probe decoded with them (False: it died; None: it could not tell)")
    detail: _d(str, "what the probe did")
    extra_buffers_mib: _d(BufMiB, "the extra buffers it allocated, MiB per buffer type")


class Environment(_Block, kw_only=True):
    """The reproducibility fingerprint of the machine and the llama.cpp build (:mod:`edgekv.edges.environment`).

    Every key edgekv writes is typed here; what a platform exposes beyond them goes into ``extra`` (named by the
    producer, never guessed).  Absent keys were not collected: a ``predict`` record has none, an imported
    llama-bench row only what llama-bench printed."""

    edgekv: _d(Union[str, UnsetType], "edgekv version") = UNSET
    llama_cpp_python: _d(Union[str, None, UnsetType], "llama-cpp-python version") = UNSET
    llama_cpp_commit: _d(Union[str, None, UnsetType], "llama.cpp commit (vendored by llama-cpp-python, or "
                                                      "llama-bench's build_commit)") = UNSET
    python: _d(Union[str, UnsetType], "Python version") = UNSET
    machine_id: _d(Union[str, UnsetType], "EDGEKV_MACHINE_ID, else the host name") = UNSET
    cpu_model: _d(Union[str, None, UnsetType], "CPU model") = UNSET
    cpu_count_logical: _d(Union[int, None, UnsetType], "logical CPUs") = UNSET
    cpu_count_physical: _d(Union[int, None, UnsetType], "physical cores") = UNSET
    ram_bytes: _d(Union[int, UnsetType], "total RAM") = UNSET
    os: _d(Union[str, UnsetType], "system and release") = UNSET
    platform: _d(Union[str, UnsetType], "platform.platform()") = UNSET
    arch: _d(Union[str, UnsetType], "machine architecture") = UNSET
    governor: _d(Union[str, None, UnsetType], "CPU frequency governor (Linux)") = UNSET
    power: _d(Union[str, None, UnsetType], "ac | battery (n%) | None") = UNSET
    argv: _d(Union[list[str], UnsetType], "the command line") = UNSET
    time_utc: _d(Union[str, UnsetType], "when the environment was collected") = UNSET
    hw_memsize: _d(Union[int, str, None, UnsetType], "macOS: sysctl hw.memsize") = UNSET
    iogpu_wired_limit_mb: _d(Union[int, str, None, UnsetType], "macOS: the GPU wired-memory limit (0: the OS "
                                                                "default)") = UNSET
    ci: _d(Union[bool, UnsetType], "run under CI (the CI variable was set)") = UNSET
    backends: _d(Union[list[str], None, UnsetType], "llama.cpp's backends") = UNSET
    devices: _d(Union[list[str], None, UnsetType], "llama.cpp's devices, by description") = UNSET
    device_details: _d(Union[list[dict[str, Any]], None, UnsetType], "llama.cpp's devices as it lists them "
                                                                      "(free-form: its fields per backend)") = UNSET
    system_info: _d(Union[str, None, UnsetType], "llama_print_system_info()") = UNSET
    gpu_offload: _d(Union[bool, None, UnsetType], "llama_supports_gpu_offload()") = UNSET
    llama_error: _d(Union[str, UnsetType], "why llama.cpp's side could not be read") = UNSET
    nvidia: _d(Union[Nvidia, None, UnsetType], "NVML's driver and GPUs (None: no NVML)") = UNSET
    memory_available_bytes: _d(Union[int, None, UnsetType], "memory available at the start") = UNSET
    memory_available_source: _d(Union[str, None, UnsetType], "which figure: MemAvailable | cgroup limit | ...") = UNSET
    extra_buffers_preflight: _d(Union[ExtraBuffersPreflight, UnsetType], "the AMX/CPU_REPACK probe") = UNSET
    llama_bench_build_commit: _d(Union[str, None, UnsetType], "the user's llama-bench: its build_commit") = UNSET
    llama_bench_build_number: _d(Union[int, None, UnsetType], "the user's llama-bench: its build_number") = UNSET
    extra: _d(Union[dict[str, Any], UnsetType], "what the platform exposed beyond the keys above") = UNSET


ENVIRONMENT_KEYS = frozenset(Environment.__struct_fields__) - {"extra"}


def environment(d: dict[str, Any] | None) -> Environment:
    """A collected environment (a plain dict, :func:`edgekv.edges.environment.collect`) as the typed block: the
    known keys typed, anything else under ``extra``."""
    d = dict(d or {})
    extra = {k: d.pop(k) for k in list(d) if k not in ENVIRONMENT_KEYS}
    if extra:
        d["extra"] = {**d.get("extra", {}), **extra} if isinstance(d.get("extra"), dict) else extra
    return msgspec.convert(d, Environment, strict=True)



# -- the record ---------------------------------------------------------------------------------------

class Record(Struct, kw_only=True, forbid_unknown_fields=True, tag_field="kind"):
    """One configuration: what was asked, predicted, reported by llama.cpp, and measured.

    The blocks every kind may carry; each kind is its own type (:data:`AnyRecord`, a union tagged by ``kind``)
    and declares the blocks it requires.  Use a kind's type, never this base.
    """

    schema_version: _d(int, "schema version (see edgekv.records.results)")
    config_key: _d(OptStr, "hash of the model sha256 and the key settings (edgekv.records.results.KEY_SETTINGS); "
                           "None for an imported llama-bench row")
    status: _d(str, "ok | failed | skipped | invalid | ...")
    reason: _d(OptStr, "why not ok")
    time_utc: _d(Union[str, None, UnsetType], "when (ISO 8601, UTC)") = UNSET
    edgekv: _d(Union[str, UnsetType], "edgekv version that wrote it (absent: an imported llama-bench row)") = UNSET
    source_file: _d(Union[str, UnsetType], "the llama-bench file an imported row came from") = UNSET
    model: _d(Model, "the model")
    settings: _d(Settings, "what was asked")
    prediction: _d(Union[Prediction, UnsetType], "predicted: formula, llama.cpp dry run, whole process "
                                                 "(absent only in an imported llama-bench row)") = UNSET
    environment: _d(Environment, "reproducibility fingerprint (typed; what else a platform exposes: extra)")
    effective: _d(Union[Effective, None, UnsetType], "what llama.cpp used") = UNSET
    llama_log: _d(Union[LlamaLog, None, UnsetType], "what llama.cpp printed in the run") = UNSET
    speed: _d(Union[Speed, None, UnsetType], "speed per test (pp, tg)") = UNSET
    serving: _d(Union[Serving, UnsetType], "llama-server under a real client: latency and throughput "
                                           "(settings.engine llama-server)") = UNSET
    timing: _d(Union[Timing, None, UnsetType], "wall-clock phases") = UNSET
    restore: _d(Union[str, None, UnsetType], "how depth state was restored between repetitions") = UNSET
    snapshot_bytes: _d(Union[int, UnsetType], "bytes of the saved depth state") = UNSET
    memory: _d(Union[Memory, None, UnsetType], "measured memory") = UNSET
    llama_bench: _d(Union[LlamaBench, None, UnsetType], "llama-bench's own fields (kind llama-bench)") = UNSET
    differences: _d(Union[Differences, None, UnsetType], "measured - predicted") = UNSET
    quality: _d(Union[Quality, None, UnsetType], "perplexity / KL divergence") = UNSET
    memory_residual: _d(Union[MemoryResidual, None, UnsetType], "measured - predicted peak RSS") = UNSET
    speed_residual: _d(Union[SpeedResidual, None, UnsetType], "measured - predicted tokens/s (schema 3)") = UNSET
    load: _d(Union[Load, None, UnsetType], "other work on the machine during the run (edgekv bench)") = UNSET
    plan: _d(Union[Plan, None, UnsetType], "time estimate vs wall time (edgekv bench)") = UNSET
    machine: _d(Union[str, UnsetType], "machine label added by `edgekv merge` (device and host)") = UNSET
    failure: _d(Union[Failure, UnsetType], "where and why the measuring process died (status failed)") = UNSET
    llama_cpp_args: _d(Union[list[str], UnsetType], "the llama-cli / llama-server arguments of this configuration "
                                                     "(edgekv.core.llamacmd): reproduce it with llama.cpp alone") = UNSET

    @property
    def kind(self) -> str:
        """What produced the record: ``bench``, ``llama-bench``, ``predict`` or ``quality`` (the type's tag)."""
        return self.__struct_config__.tag


class BenchRecord(Record, kw_only=True, tag="bench"):
    """``edgekv bench`` (edgekv's child process, the user's llama-bench or llama-server): every identifying block
    is required, and the measured ones are present unless the configuration was skipped or failed."""

    config_key: _d(str, "hash of the model sha256 and the key settings (edgekv.records.results.KEY_SETTINGS)")
    time_utc: _d(str, "when (ISO 8601, UTC)")
    edgekv: _d(str, "edgekv version that wrote it")
    prediction: _d(Prediction, "predicted: formula, llama.cpp dry run, whole process, speed")

    def __post_init__(self) -> None:
        for key, value in (("model.arch", self.model.arch), ("settings.n_ctx", self.settings.n_ctx),
                           ("settings.engine", self.settings.engine)):
            if value is UNSET or value is None:
                raise ValueError(f"{key}: missing in a bench record")


class LlamaBenchRecord(Record, kw_only=True, tag="llama-bench"):
    """One row of a llama-bench JSON file, imported (``edgekv report FILE.json``): no prediction, no config key;
    its environment is what llama-bench printed."""

    config_key: _d(None, "an imported row identifies no edgekv configuration") = None


class PredictRecord(Record, kw_only=True, tag="predict"):
    """``edgekv predict --json``: the formula, and llama.cpp's dry run and the whole-process prediction when they
    were asked; nothing measured (built by :func:`predict_record`)."""

    config_key: _d(None, "a prediction is not a measured configuration") = None
    prediction: _d(Prediction, "predicted: formula, llama.cpp dry run, whole process")


class QualityRecord(Record, kw_only=True, tag="quality"):
    """``edgekv quality --json``: perplexity and KL divergence of one configuration against the f16-KV baseline."""

    quality: _d(Union[Quality, None], "perplexity / KL divergence (None: the pass computed none)")


AnyRecord = Union[BenchRecord, LlamaBenchRecord, PredictRecord, QualityRecord]
KIND_TYPES: dict[str, type[Record]] = {"bench": BenchRecord, "llama-bench": LlamaBenchRecord,
                                       "predict": PredictRecord, "quality": QualityRecord}
assert tuple(KIND_TYPES) == KINDS

# The order of a written record's keys (the base's fields, ``kind`` second): lines read the same whatever kind.
RECORD_KEYS = ("schema_version", "kind", *(k for k in Record.__struct_fields__ if k != "schema_version"))


# -- decode / encode ----------------------------------------------------------------------------------

def decode(obj: dict[str, Any], where: str) -> Record:
    """A plain (upgraded) dict -> the record type of its ``kind``, strictly; else one-line ResultsError naming
    ``where: key``."""
    from edgekv.errors import ResultsError

    try:
        return msgspec.convert(obj, AnyRecord, strict=True)
    except msgspec.ValidationError as e:
        raise ResultsError(f"{where}: {_explain(str(e), obj)}") from None


def _explain(msg: str, obj: Any = None) -> str:
    """msgspec's 'Expected `int`, got `str` - at `$.settings.n_ctx`' -> 'settings.n_ctx: expected int, got str; ...'."""
    text, _, path = msg.partition(" - at `")
    path = path.rstrip("`")
    key = path[2:] if path.startswith("$.") else (path or "record")
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if " missing in a bench record" in text:          # BenchRecord.__post_init__: a nested required key
        return f"{text.split(': ')[0]}: missing in a bench record; not a complete edgekv record (re-run the bench, " \
               "or remove the line)"
    if key == "kind" and text.startswith("Invalid value"):      # the tag of the union: the words a Literal had
        return f"kind: invalid enum value {kind!r}; the results file is damaged or hand-edited (fix or remove the line)"
    if text.startswith("Object missing required field") and not path and kind == "bench":
        return f"{text.split('`')[1]}: missing in a bench record; not a complete edgekv record (re-run the bench, " \
               "or remove the line)"
    if text.startswith("Object missing required field"):
        field = text.split("`")[1]
        key = f"{key}.{field}" if path and path != "$" else field
        return f"{key}: missing; not a complete edgekv record (re-run the bench, or remove the line)"
    if text.startswith("Object contains unknown field"):
        field = text.split("`")[1]
        key = f"{key}.{field}" if path and path != "$" else field
        return (f"{key}: unknown key; written by another tool or a newer edgekv "
                "(upgrade edgekv, or remove the key)")
    text = text.replace("`", "")
    return f"{key}: {text[0].lower() + text[1:]}; the results file is damaged or hand-edited (fix or remove the line)"


def encode(rec: Record) -> dict[str, Any]:
    """:class:`Record` -> plain dict (absent fields left out, ``None`` kept), its keys in :data:`RECORD_KEYS`'s
    order: the line written."""
    d = msgspec.to_builtins(rec)
    return {k: d[k] for k in RECORD_KEYS if k in d}


def encode_block(block: Struct | None) -> Any:
    """One block -> plain dict (the single serialiser for every block type)."""
    return None if block is None else msgspec.to_builtins(block)



def speed_test(n_tokens: int, samples_ns: list[int] | None, samples_ts: list[float],
               llama_bench_avg_ts: Any = UNSET) -> SpeedTest:
    """The one builder of a speed test block (sweep, llama-bench runs, imported llama-bench files): every sample
    kept, summarised by :func:`edgekv.core.stats.summarize`.  ``llama_bench_avg_ts``: llama-bench's own average."""
    from edgekv.core.stats import summarize

    summ = summarize(samples_ts)
    return SpeedTest(
        n_tokens=n_tokens, samples_ns=samples_ns, samples_ts=samples_ts, mean_ts=summ["mean"], stdev_ts=summ["stdev"],
        ci95_ts=summ["ci95"], cv=summ["cv"], unstable=summ["unstable"], llama_bench_avg_ts=llama_bench_avg_ts)


def predict_record(*, model_path: str, arch: str | None, weights_bytes: int | None, formula: dict[str, Any],
                   engine: Any = UNSET, process: Any = UNSET, saving_vs_f16: Any = UNSET,
                   settings: dict[str, Any] | None = None, source_file: str | None = None,
                   key_settings: tuple[str, ...] = ()) -> PredictRecord:
    """A record of kind ``predict`` (``edgekv predict --json``): the formula, and llama.cpp's dry run and the
    whole-process prediction when they were made; nothing measured.

    ``formula`` is :meth:`KVPrediction.to_dict`; ``saving_vs_f16`` goes into it (None: no saving to give);
    ``engine`` and ``process`` are left out when ``UNSET`` (not asked) and kept as None when asked but not
    predicted.  ``settings`` are the asked values (every key setting present, None where a prediction has none:
    pass ``key_settings`` to name them all).  The model is named after its file (the reports' model column).
    Decoded strictly: a block of the wrong shape is an error here, not a dash later.  Encode with :func:`encode`."""
    st: dict[str, Any] = {k: None for k in key_settings}
    st.update(settings or {k: formula.get(k) for k in ("n_ctx", "type_k", "type_v", "flash_attn", "swa_full",
                                                       "n_seq_max", "kv_unified", "n_batch", "n_ubatch")})
    prediction: dict[str, Any] = {"formula": formula if saving_vs_f16 is UNSET else
                                  {**formula, "saving_vs_f16": saving_vs_f16}}
    if engine is not UNSET:
        prediction["engine"] = engine
    if process is not UNSET:
        prediction["process"] = process
    obj: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "kind": "predict", "config_key": None,
        "status": "ok" if formula.get("status") == "ok" else "skipped", "reason": formula.get("reason"),
        "model": {"path": model_path, "name": Path(model_path).stem if model_path else None, "arch": arch,
                  "sha256": None, "size_bytes": weights_bytes},
        "settings": st, "prediction": prediction, "environment": {},
    }
    if source_file is not None:
        obj["source_file"] = source_file
    return msgspec.convert(obj, PredictRecord, strict=True)


def model_block(m: Any, sha: str | None) -> dict[str, Any]:
    """The one serialiser of the ``model`` block, from a loaded model (:class:`edgekv.orchestration.api.LoadedModel`)."""
    import os

    sh = m.shape
    attn = [lay for lay in sh.layers if lay.attn_cache]
    return encode_block(Model(
        path=os.path.abspath(m.ref.path), name=sh.name or m.ref.name, spec=m.ref.spec, source=m.ref.source,
        sha256=sha, arch=sh.arch, memory=sh.memory, size_bytes=m.header.weights_bytes, file_bytes=m.header.file_size,
        n_layer=sh.n_layer_all, n_ctx_train=sh.n_ctx_train,
        n_head_kv=sorted({lay.n_head_kv for lay in attn}) or None, head_dim_k=sorted({lay.head_k for lay in attn}) or None,
        n_swa=sh.n_swa or None, swa_layers=len([lay for lay in sh.layers if lay.is_swa and lay.attn_cache]),
        shared_kv_layers=len([lay for lay in sh.layers if not lay.has_kv]),
        recurrent_layers=len([lay for lay in sh.layers if lay.recr_state]), mla=sh.is_mla))


def growth_minus_formula_bytes(growth_bytes: int | None, formula_bytes: int | None) -> int | None:
    """The one measured-minus-formula difference: memory a context added (measured) minus the formula's cache bytes."""
    if growth_bytes is None or formula_bytes is None:
        return None
    return growth_bytes - formula_bytes

def json_schema() -> dict[str, Any]:
    """The JSON Schema of a record, generated from the types (committed as results.schema.json).  Every description
    is the type's docstring as :func:`inspect.cleandoc` cleans it: msgspec 0.23 cleans them itself, 0.22 and before
    kept their indentation, and the committed file must not depend on which one pip chose."""
    import inspect

    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: inspect.cleandoc(v) if k == "description" and isinstance(v, str) else clean(v)
                    for k, v in node.items()}
        if isinstance(node, list):
            return [clean(v) for v in node]
        return node

    return clean(msgspec.json.schema(AnyRecord))


SCHEMA_FILE = Path(__file__).with_name("results.schema.json")


def schema_text() -> str:
    """The committed ``results.schema.json`` text (sorted keys, 2-space indent, final newline)."""
    import json

    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def write_schema_file() -> Path:
    """Regenerate the committed JSON Schema:
    ``python -c "from edgekv.records.schema import write_schema_file as w; print(w())"``."""
    SCHEMA_FILE.write_text(schema_text())
    return SCHEMA_FILE
