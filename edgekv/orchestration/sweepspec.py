"""What a measured sweep is made of: its specification (:class:`SweepSpec`, the engines it can run) and one
configuration of it (:class:`Case`), shared by the sweep loop (edgekv.orchestration.sweep), its predictions
(edgekv.orchestration.sweepplan) and its records (edgekv.orchestration.sweeprecord)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgekv.core.predict import ContextParams, KVPrediction
from edgekv.orchestration.api import LoadedModel
from edgekv.records.schema import Settings

ENGINE_PYTHON = "llama-cpp-python"
ENGINE_LLAMA_BENCH = "llama-bench"
ENGINE_SERVER = "llama-server"


@dataclass(frozen=True)
class QualityAsk:
    """``edgekv bench --quality``: the quality pass asked with the sweep, its corpus and chunks (None: the
    defaults, edgekv.orchestration.quality)."""

    corpus: str | None = None
    chunks: int | None = None


@dataclass(frozen=True)
class SweepSpec:
    """What ``edgekv bench`` was asked to measure (frozen: the sweep derives what it decides, such as the
    --repack values, into a copy, never into the caller's spec)."""

    model: LoadedModel
    contexts: list[int]
    pairs: list[tuple[str, str]]
    flash_attn: list[str] = field(default_factory=lambda: ["auto"])
    depths: list[int] | None = None          # None: each context minus max(n_prompt, n_gen)
    n_prompt: int = 512
    n_gen: int = 128
    repetitions: int = 5
    n_threads: int = 0
    n_gpu_layers: int = -1
    n_batch: int = 2048
    n_ubatch: int = 512
    swa_full: bool = False
    n_seq_max: int = 1
    kv_unified: bool = False
    warmup: bool = True
    timeout_s: float = 3600.0
    engine: str = ENGINE_PYTHON
    llama_bench: str | None = None
    llama_server: str | None = None          # --llama-server PATH: the user's server, one process per configuration
    quality: QualityAsk | None = None
    use_mmap: bool = True
    # --repack 0,1: the CPU backend's extra buffer types (AMX, CPU_REPACK).  None: llama.cpp's default (1) unless
    # the extra-buffer preflight found that their kernels crash here (then 0, said before the plan;
    # edgekv.orchestration.preflight.repack_choice)
    repack: list[bool] | None = None
    retry_failed: bool = True                # resume measures failed configurations again (--no-retry: off)
    force_fit: bool = False                  # --force: run configurations predicted not to fit the memory available
    predict_speed: bool = True               # the speed model's prediction in every record (calibrating when needed)
    calibration_timeout_s: float = 180.0     # --calibration-timeout: past it, no speed predictions (said)
    # -npl 1,2,4: sequences decoded at once (llama-batched-bench's pl; each case's n_seq_max), each with -p prompt
    # and -n generated tokens from an empty cache; None: the single-sequence workload at a depth
    n_parallel: list[int] | None = None


@dataclass
class Case:
    index: int
    settings: Settings           # what is asked: the record's ``settings`` block (plain dict: encode_block)
    params: ContextParams
    key: str
    prediction: KVPrediction
