"""The blocks of a results record that say what was asked and predicted, and where: ``settings``, ``model``,
``prediction`` (formula, llama.cpp's dry run, the whole process, the speed) and ``environment``.

Each block is a strict ``msgspec.Struct`` (:class:`Block`: unknown keys refused) whose fields carry their description
(:func:`doc`), from which the committed JSON Schema is generated.  What the core's models return is embedded as it
is, never restated: the formula (:class:`~edgekv.core.formula.Formula`), the process's parts
(:class:`~edgekv.core.mempart.ProcessPart`) and each predicted speed test
(:class:`~edgekv.core.speed.SpeedTestPrediction`), strict frozen Structs of the core.  The measured blocks are in
:mod:`edgekv.records.measured`; the record that holds them all, and the public namespace of every block, is
:mod:`edgekv.records.schema`.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
from msgspec import UNSET, Struct, UnsetType

from edgekv.core.benchwire import BenchWorkload
from edgekv.core.formula import Formula as Formula
from edgekv.core.formula import FormulaCache as FormulaCache
from edgekv.core.mempart import ProcessPart
from edgekv.core.predict import ContextParams
from edgekv.core.speed import SpeedPart as SpeedPart
from edgekv.core.speed import SpeedTestPrediction
from edgekv.core.wire import doc


class Block(Struct, kw_only=True, forbid_unknown_fields=True):
    """The base of every block: keyword-only, unknown keys refused."""


OptInt = Union[int, None]
OptFloat = Union[float, None]
OptStr = Union[str, None]
BufMiB = dict[str, float]          # ggml buffer type name -> MiB, as llama.cpp prints it


# -- settings and model -------------------------------------------------------------------------------

class QualitySettings(Block, kw_only=True):
    """What quality measurement was asked for alongside a bench (``--quality``)."""

    corpus: doc(str, "corpus name or path the perplexity/KL pass read")
    chunks: doc(OptInt, "number of corpus chunks scored (None: all)")


class Settings(Block, kw_only=True):
    """What was asked: llama.cpp's context parameters and the workload (llama-bench's names).

    Every key is present; None where the producer did not set it (a predict row has no workload)."""

    engine: doc(OptStr, "'llama-cpp-python' (edgekv's child) or 'llama-bench'")
    n_ctx: doc(OptInt, "context size in tokens (-c); None in an imported llama-bench file (llama-bench's own default)")
    type_k: doc(OptStr, "K cache type as llama.cpp spells it (-ctk)")
    type_v: doc(OptStr, "V cache type (-ctv)")
    flash_attn: doc(OptStr, "flash attention asked: on | off | auto (-fa)")
    swa_full: doc(Union[bool, None], "full-size SWA cache (--swa-full)")
    n_seq_max: doc(OptInt, "parallel sequences (-np)")
    kv_unified: doc(Union[bool, None], "one KV buffer shared by all sequences (--kv-unified)")
    n_batch: doc(OptInt, "logical batch size in tokens (-b)")
    n_ubatch: doc(OptInt, "physical batch size in tokens (-ub)")
    n_threads: doc(OptInt, "CPU threads (-t)")
    n_gpu_layers: doc(OptInt, "layers offloaded to the GPU (-ngl)")
    n_prompt: doc(OptInt, "prompt-processing test length in tokens (-p)")
    n_gen: doc(OptInt, "generation test length in tokens (-n)")
    n_depth: doc(OptInt, "tokens already in the context before each test (-d)")
    repetitions: doc(OptInt, "timed repetitions per test (-r)")
    warmup: doc(Union[bool, None], "one untimed warm-up run before the timed ones (None: unknown, imported llama-bench)")
    quality: doc(Union[QualitySettings, None], "quality pass asked with the bench, or None")
    no_mmap: doc(Union[bool, UnsetType], "weights read into anonymous memory (--no-mmap); only present when set") = UNSET
    repack: doc(Union[bool, UnsetType], "the CPU backend's extra buffer types (AMX, CPU_REPACK) on: llama-bench --repack, "
                                       "llama_model_params.use_extra_bufts; absent in records written before it "
                                       "(llama.cpp's default, on)") = UNSET
    test: doc(Union[str, UnsetType], "imported llama-bench row: its test (pp, tg, pg)") = UNSET
    n_parallel: doc(Union[int, UnsetType], "sequences decoded at once (-npl, llama-batched-bench's pl): each with -p prompt "
                                          "and -n generated tokens from an empty cache; speed.pp/tg are then aggregate "
                                          "tokens/s of all of them; absent: one sequence at depth -d") = UNSET

    def context_params(self) -> ContextParams:
        """llama.cpp's context parameters these settings ask for (the formula's and the child's input); a field the
        settings leave None takes llama.cpp's default."""
        d = ContextParams()
        return ContextParams(n_ctx=_or(self.n_ctx, d.n_ctx), type_k=_or(self.type_k, d.type_k),
                             type_v=_or(self.type_v, d.type_v), flash_attn=_or(self.flash_attn, d.flash_attn),
                             swa_full=_or(self.swa_full, d.swa_full), n_seq_max=_or(self.n_seq_max, d.n_seq_max),
                             kv_unified=_or(self.kv_unified, d.kv_unified), n_batch=_or(self.n_batch, d.n_batch),
                             n_ubatch=_or(self.n_ubatch, d.n_ubatch))

    def workload(self) -> BenchWorkload:
        """The bench child's workload these settings ask for (a measured case's settings set every field)."""
        return BenchWorkload(n_threads=self.n_threads or 0, n_gpu_layers=_or(self.n_gpu_layers, -1),
                             n_prompt=self.n_prompt or 0, n_gen=self.n_gen or 0, n_depth=self.n_depth or 0,
                             repetitions=self.repetitions or 0, warmup=bool(self.warmup),
                             repack=self.repack is not False, no_mmap=self.no_mmap is True,
                             n_parallel=None if self.n_parallel is UNSET else self.n_parallel)


def _or(x: Any, default: Any) -> Any:
    return default if x is None else x


class Model(Block, kw_only=True):
    """The GGUF file: where it came from and its KV-relevant shape (read from the header).

    An imported llama-bench file names only ``path``, ``name``, ``sha256`` (None) and ``size_bytes``."""

    path: doc(OptStr, "absolute path of the GGUF file")
    name: doc(OptStr, "model name (general.name, else the registry/file name; llama-bench: its model_type)")
    spec: doc(Union[str, UnsetType], "what the user passed to -m") = UNSET
    source: doc(Union[str, UnsetType], "local | hf | url | pypi") = UNSET
    sha256: doc(OptStr, "sha256 of the whole file (None: only the header was read)")
    arch: doc(Union[str, UnsetType], "general.architecture") = UNSET
    memory: doc(Union[str, UnsetType], "cache family: kv | swa | hybrid | recurrent | ...") = UNSET
    size_bytes: doc(Union[int, None, UnsetType], "bytes of weight tensors") = UNSET
    file_bytes: doc(Union[int, UnsetType], "bytes of the GGUF file") = UNSET
    n_layer: doc(Union[int, UnsetType], "layers (block_count)") = UNSET
    n_ctx_train: doc(Union[OptInt, UnsetType], "training context length") = UNSET
    n_head_kv: doc(Union[list[int], None, UnsetType], "distinct KV head counts over attention layers") = UNSET
    head_dim_k: doc(Union[list[int], None, UnsetType], "distinct K head dimensions over attention layers") = UNSET
    n_swa: doc(Union[OptInt, UnsetType], "sliding-window size in tokens, None when the model has no SWA") = UNSET
    swa_layers: doc(Union[int, UnsetType], "layers using the sliding window") = UNSET
    shared_kv_layers: doc(Union[int, UnsetType], "layers reusing another layer's KV (no cache of their own)") = UNSET
    recurrent_layers: doc(Union[int, UnsetType], "layers with recurrent state") = UNSET
    mla: doc(Union[bool, UnsetType], "multi-head latent attention") = UNSET
    incomplete: doc(Union[str, UnsetType], "a local file shorter than its tensor table needs: bytes present and "
                                          "expected (the prediction used the header only)") = UNSET


# -- prediction ---------------------------------------------------------------------------------------

class CacheLine(Block, kw_only=True):
    """One cache as llama.cpp's log prints it (provenance: llama.cpp; :func:`edgekv.prediction.crosscheck.engine_lines`)."""

    kind: doc(str, "kv | recurrent | state")
    role: doc(Union[str, None, UnsetType], "role in a hybrid/iSWA cache (full, swa) or None") = UNSET
    mib: doc(str, "total MiB, as printed (a string: keeps llama.cpp's digits)")
    cells: doc(int, "cells")
    layers: doc(Union[int, UnsetType], "layers") = UNSET
    streams: doc(Union[int, None, UnsetType], "streams (seqs)") = UNSET
    type_k: doc(Union[str, None, UnsetType], "K type") = UNSET
    type_v: doc(Union[str, None, UnsetType], "V type") = UNSET
    k_mib: doc(Union[str, None, UnsetType], "K MiB as printed") = UNSET
    v_mib: doc(Union[str, None, UnsetType], "V MiB as printed") = UNSET
    r_mib: doc(Union[str, None, UnsetType], "recurrent R MiB as printed") = UNSET
    s_mib: doc(Union[str, None, UnsetType], "recurrent S MiB as printed") = UNSET
    width: doc(Union[int, None, UnsetType], "state row width") = UNSET
    rs_seq: doc(Union[int, None, UnsetType], "state sequences") = UNSET


class Engine(Block, kw_only=True):
    """llama.cpp's own dry run for the configuration (provenance: llama.cpp; ``no_alloc``, parsed log)."""

    ok: doc(bool, "the dry run succeeded")
    error: doc(OptStr, "why it failed")
    match: doc(Union[bool, None], "its caches equal the formula's (None: edgekv does not model this cache)")
    diffs: doc(list[str], "formula vs llama.cpp differences, readable")
    caches: doc(Union[list[CacheLine], UnsetType], "its cache lines (absent when the dry run failed)") = UNSET
    kv_mib: doc(Union[float, None, UnsetType], "KV MiB it printed (sum)") = UNSET
    recurrent_mib: doc(Union[float, int, None, UnsetType], "recurrent state MiB (predict --engine)") = UNSET
    state_mib: doc(Union[float, int, None, UnsetType], "other state MiB (predict --engine)") = UNSET
    other_buffers_mib: doc(Union[BufMiB, None, UnsetType], "buffers of kinds the log parser does not know") = UNSET
    compute_mib: doc(Union[BufMiB, None, UnsetType], "compute buffers, MiB per ggml buffer type") = UNSET
    output_mib: doc(Union[BufMiB, None, UnsetType], "output buffers, MiB per buffer type") = UNSET
    flash_attn_resolved: doc(Union[str, None, UnsetType], "flash attention as llama.cpp resolved it") = UNSET
    n_ctx: doc(Union[int, None, UnsetType], "context size llama.cpp created") = UNSET
    total_bytes: doc(Union[int, None, UnsetType], "weights + caches + compute + output buffers (predict --engine)") = UNSET
    total_caches_from: doc(Union[str, UnsetType], "formula | llama.cpp: whose cache bytes total_bytes uses") = UNSET
    graph: doc(Union[dict[str, int], None, UnsetType], "llama.cpp's graph nodes and splits (prompt and one-token graphs)") = UNSET
    off_device: doc(Union[list[dict[str, Any]], None, UnsetType],
                   "ops the scheduler put on another backend than their offloaded layer's device (op, backend, device, "
                   "layers; from GGML_SCHED_DEBUG=2): on a GPU, the ops that silently run on the CPU") = UNSET
    weights_bytes: doc(Union[int, None, UnsetType], "llama_model_size(): llama.cpp's own weights figure") = UNSET


class PredictedAfter(Block, kw_only=True):
    """Set when the prediction was added to a record after its measurement."""

    edgekv: doc(str, "edgekv version that predicted")
    time_utc: doc(str, "when")


class Process(Block, kw_only=True):
    """Whole-process memory prediction (issue 15; :mod:`edgekv.core.memmodel`); provenance per part."""

    workload: doc(Union[str, UnsetType], "the workload predicted (bench, llama-bench, ...)") = UNSET
    peak_rss_bytes: doc(OptInt, "predicted peak RSS (None: not predicted)")
    device_bytes: doc(Union[dict[str, int], UnsetType], "predicted bytes per device") = UNSET
    parts: doc(Union[list[ProcessPart], UnsetType], "the parts summed") = UNSET
    notes: doc(Union[list[str], UnsetType], "caveats") = UNSET
    predicted_after_measurement: doc(Union[PredictedAfter, UnsetType], "added later by edgekv") = UNSET
    far_miss: doc(Union[SpeedAdjustment, UnsetType], "this configuration measured far (2x) from its prediction on a "
                                                     "quiet machine: what bench did about the rest of the plan") = UNSET
    adjusted: doc(Union[list[SpeedAdjustment], UnsetType], "the scalings applied to this prediction after an earlier "
                                                           "configuration's far miss (its tokens/s are scaled)") = UNSET
    error: doc(Union[str, None, UnsetType], "why the dry run behind it failed") = UNSET
    fits: doc(Union[bool, None, UnsetType], "edgekv predict: the peak plus the margin (edgekv.core.fit) within the "
                                           "memory available when it predicted") = UNSET
    available_bytes: doc(Union[int, None, UnsetType], "edgekv predict: the memory available then") = UNSET
    available_source: doc(Union[str, None, UnsetType], "which figure: MemAvailable | cgroup limit | ...") = UNSET


class SpeedAdjustment(Block, kw_only=True):
    """What bench did after a configuration measured far from its prediction on a quiet machine (issue 68)."""

    action: doc(str, "scaled: the rest of the plan's predictions of that test scaled by what was measured")
    test: doc(str, "pp | tg")
    factor: doc(float, "measured / predicted tokens/s of the configuration that missed")
    config_key: doc(OptStr, "that configuration's key")
    note: doc(str, "in words")


class SpeedPrediction(Block, kw_only=True):
    """The speed model's prediction (issue 26; edgekv.core.speed, edgekv.calibration.speedcal)."""

    pp: doc(Union[SpeedTestPrediction, None, UnsetType], "prompt processing") = UNSET
    tg: doc(Union[SpeedTestPrediction, None, UnsetType], "generation") = UNSET
    calibration_id: doc(OptStr, "the calibration used")
    machine: doc(Union[str, None, UnsetType], "the CPU and thread count the calibration was measured on") = UNSET
    calibrated_with: doc(Union[str, UnsetType], "the llama.cpp the calibration was measured through: "
                                               "llama-cpp-python, or the user's llama-bench (its path)") = UNSET
    calibration_busy: doc(Union[bool, UnsetType], "the calibration was taken while other work used the CPUs "
                                                 "(its figures are not this machine's own)") = UNSET
    error: doc(Union[str, None, UnsetType], "why no speed was predicted (a type the calibration lacks, ...)") = UNSET
    explain: doc(Union[str, None, UnsetType], "the part that dominates, and the roofline share") = UNSET
    predicted_after_measurement: doc(Union[PredictedAfter, UnsetType], "added later by edgekv") = UNSET
    far_miss: doc(Union[SpeedAdjustment, UnsetType], "this configuration measured far (2x) from its prediction on a "
                                                     "quiet machine: what bench did about the rest of the plan") = UNSET
    adjusted: doc(Union[list[SpeedAdjustment], UnsetType], "the scalings applied to this prediction after an earlier "
                                                           "configuration's far miss (its tokens/s are scaled)") = UNSET


class Prediction(Block, kw_only=True):
    """What edgekv predicts: the formula, llama.cpp's dry run, the whole process, the speed."""

    formula: doc(Formula, "KV from the header (formula)")
    engine: doc(Union[Engine, None, UnsetType], "llama.cpp dry run (llama.cpp)") = UNSET
    process: doc(Union[Process, None, UnsetType], "whole-process prediction; None: never predicted") = UNSET
    speed: doc(Union[SpeedPrediction, None, UnsetType], "predicted tokens/s (schema 3); None: not predicted") = UNSET


# -- environment --------------------------------------------------------------------------------------

class NvidiaDevice(Block, kw_only=True):
    """One GPU as NVML names it (nvidia-ml-py)."""

    index: doc(int, "NVML device index")
    name: doc(str, "the card's name")
    memory_total: doc(int, "its memory, bytes")


class Nvidia(Block, kw_only=True):
    """NVML's view of the machine (``edgekv[cuda]``): the driver and the GPUs, or why NVML could not tell."""

    driver: doc(Union[str, UnsetType], "driver version") = UNSET
    devices: doc(Union[list[NvidiaDevice], UnsetType], "the GPUs") = UNSET
    error: doc(Union[str, UnsetType], "NVML's error (an environment fact, not an edgekv failure)") = UNSET


class ExtraBuffersPreflight(Block, kw_only=True):
    """Whether llama.cpp's extra CPU buffer kernels (AMX, CPU_REPACK) run on this machine
    (:mod:`edgekv.calibration.preflight`; measured by a probe process)."""

    runs: doc(Union[bool, None], "the probe decoded with them (False: it died; None: it could not tell)")
    detail: doc(str, "what the probe did")
    extra_buffers_mib: doc(BufMiB, "the extra buffers it allocated, MiB per buffer type")


class Environment(Block, kw_only=True):
    """The reproducibility fingerprint of the machine and the llama.cpp build (:mod:`edgekv.machine.environment`).

    Every key edgekv writes is typed here; what a platform exposes beyond them goes into ``extra`` (named by the
    producer, never guessed).  Absent keys were not collected: a ``predict`` record has none, an imported
    llama-bench row only what llama-bench printed."""

    edgekv: doc(Union[str, UnsetType], "edgekv version") = UNSET
    edgekv_commit: doc(Union[str, None, UnsetType], "the edgekv commit that wrote it (git HEAD of its checkout, or "
                                                    "EDGEKV_COMMIT); None: edgekv could not tell; absent: written "
                                                    "before records carried it (schema 4)") = UNSET
    edgekv_dirty: doc(Union[bool, None, UnsetType], "edgekv's files differed from that commit (local changes); None: "
                                                    "unknown") = UNSET
    llama_cpp_python: doc(Union[str, None, UnsetType], "llama-cpp-python version") = UNSET
    llama_cpp_commit: doc(Union[str, None, UnsetType], "llama.cpp commit (vendored by llama-cpp-python, or "
                                                      "llama-bench's build_commit)") = UNSET
    python: doc(Union[str, UnsetType], "Python version") = UNSET
    machine_id: doc(Union[str, UnsetType], "EDGEKV_MACHINE_ID, else the host name") = UNSET
    cpu_model: doc(Union[str, None, UnsetType], "CPU model") = UNSET
    cpu_count_logical: doc(Union[int, None, UnsetType], "logical CPUs") = UNSET
    cpu_count_physical: doc(Union[int, None, UnsetType], "physical cores") = UNSET
    ram_bytes: doc(Union[int, UnsetType], "total RAM") = UNSET
    os: doc(Union[str, UnsetType], "system and release") = UNSET
    platform: doc(Union[str, UnsetType], "platform.platform()") = UNSET
    arch: doc(Union[str, UnsetType], "machine architecture") = UNSET
    governor: doc(Union[str, None, UnsetType], "CPU frequency governor (Linux)") = UNSET
    power: doc(Union[str, None, UnsetType], "ac | battery (n%) | None") = UNSET
    argv: doc(Union[list[str], UnsetType], "the command line") = UNSET
    time_utc: doc(Union[str, UnsetType], "when the environment was collected") = UNSET
    hw_memsize: doc(Union[int, str, None, UnsetType], "macOS: sysctl hw.memsize") = UNSET
    iogpu_wired_limit_mb: doc(Union[int, str, None, UnsetType], "macOS: the GPU wired-memory limit (0: the OS "
                                                                "default)") = UNSET
    ci: doc(Union[bool, UnsetType], "run under CI (the CI variable was set)") = UNSET
    backends: doc(Union[list[str], None, UnsetType], "llama.cpp's backends") = UNSET
    devices: doc(Union[list[str], None, UnsetType], "llama.cpp's devices, by description") = UNSET
    device_details: doc(Union[list[dict[str, Any]], None, UnsetType], "llama.cpp's devices as it lists them "
                                                                      "(free-form: its fields per backend)") = UNSET
    system_info: doc(Union[str, None, UnsetType], "llama_print_system_info()") = UNSET
    gpu_offload: doc(Union[bool, None, UnsetType], "llama_supports_gpu_offload()") = UNSET
    llama_error: doc(Union[str, UnsetType], "why llama.cpp's side could not be read") = UNSET
    nvidia: doc(Union[Nvidia, None, UnsetType], "NVML's driver and GPUs (None: no NVML)") = UNSET
    memory_available_bytes: doc(Union[int, None, UnsetType], "memory available at the start") = UNSET
    memory_available_source: doc(Union[str, None, UnsetType], "which figure: MemAvailable | cgroup limit | ...") = UNSET
    extra_buffers_preflight: doc(Union[ExtraBuffersPreflight, UnsetType], "the AMX/CPU_REPACK probe") = UNSET
    llama_bench_build_commit: doc(Union[str, None, UnsetType], "the user's llama-bench: its build_commit") = UNSET
    llama_bench_build_number: doc(Union[int, None, UnsetType], "the user's llama-bench: its build_number") = UNSET
    extra: doc(Union[dict[str, Any], UnsetType], "what the platform exposed beyond the keys above") = UNSET


ENVIRONMENT_KEYS = frozenset(Environment.__struct_fields__) - {"extra"}


def environment(d: dict[str, Any] | None) -> Environment:
    """A collected environment (a plain dict, :func:`edgekv.machine.environment.collect`) as the typed block: the
    known keys typed, anything else under ``extra``."""
    d = dict(d or {})
    extra = {k: d.pop(k) for k in list(d) if k not in ENVIRONMENT_KEYS}
    if extra:
        d["extra"] = {**d.get("extra", {}), **extra} if isinstance(d.get("extra"), dict) else extra
    return msgspec.convert(d, Environment, strict=True)


