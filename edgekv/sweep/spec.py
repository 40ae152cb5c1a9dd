"""What a measured sweep is made of: its specification (:class:`SweepSpec`, the engines it can run) and one
configuration of it (:class:`Case`), shared by the sweep loop (edgekv.sweep.run), its predictions
(edgekv.sweep.predictions) and its records (edgekv.sweep.record).

A bench configuration has three forms: the command's flags, the :class:`~edgekv.records.schema.Settings` they
ask for (the record's ``settings`` block, which also yields llama.cpp's context parameters and the child's
workload), and the typed request and reply exchanged with the child (edgekv.core.benchwire).  A spec holds one
Settings that every case shares, the grid that varies it, and how to run; it restates no setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgekv.core.predict import ContextParams, KVPrediction
from edgekv.prediction.api import LoadedModel
from edgekv.records.schema import QualitySettings, Settings

ENGINE_PYTHON = "llama-cpp-python"
ENGINE_LLAMA_BENCH = "llama-bench"
ENGINE_SERVER = "llama-server"

SWEEP_CHUNKS = 2   # default chunks per context in a sweep: enough scored tokens for the KLD, minutes not hours


def bench_settings(**given: object) -> Settings:
    """The settings every case of a sweep shares: ``given`` (Settings' own names) over llama-bench's defaults."""
    defaults: dict[str, object] = dict(
        engine=ENGINE_PYTHON, n_ctx=None, type_k=None, type_v=None, flash_attn=None, swa_full=False, n_seq_max=1,
        kv_unified=False, n_batch=2048, n_ubatch=512, n_threads=0, n_gpu_layers=-1, n_prompt=512, n_gen=128,
        n_depth=None, repetitions=5, warmup=True, quality=None)
    return Settings(**{**defaults, **given})


def engine_for(llama_bench: str | None, llama_server: str | None) -> str:
    """The engine the flags choose: --llama-bench PATH, --llama-server PATH, else edgekv's own child."""
    return ENGINE_LLAMA_BENCH if llama_bench else ENGINE_SERVER if llama_server else ENGINE_PYTHON


def quality_settings(corpus: str | None, chunks: int | None) -> QualitySettings:
    """``--quality [--corpus C] [--chunks N]``: what the sweep's quality pass reads (None: pydoc, SWEEP_CHUNKS)."""
    return QualitySettings(corpus=corpus or "pydoc", chunks=chunks or SWEEP_CHUNKS)


@dataclass(frozen=True)
class SweepSpec:
    """What ``edgekv bench`` was asked to measure (frozen: the sweep derives what it decides, such as the
    --repack values, into a copy, never into the caller's spec)."""

    model: LoadedModel
    contexts: list[int]
    pairs: list[tuple[str, str]]
    settings: Settings = field(default_factory=bench_settings)   # what every case shares; the grid sets the rest
    # the grid: each case takes one value of each list
    flash_attn: list[str] = field(default_factory=lambda: ["auto"])
    depths: list[int] | None = None          # None: each context minus max(n_prompt, n_gen)
    # --repack 0,1: the CPU backend's extra buffer types (AMX, CPU_REPACK).  None: llama.cpp's default (1) unless
    # the extra-buffer preflight found that their kernels crash here (then 0, said before the plan;
    # edgekv.calibration.preflight.repack_choice)
    repack: list[bool] | None = None
    # -npl 1,2,4: sequences decoded at once (llama-batched-bench's pl; each case's n_seq_max), each with -p prompt
    # and -n generated tokens from an empty cache; None: the single-sequence workload at a depth
    n_parallel: list[int] | None = None
    # how it runs: not settings of a case
    timeout_s: float = 3600.0
    llama_bench: str | None = None
    llama_server: str | None = None          # --llama-server PATH: the user's server, one process per configuration
    retry_failed: bool = True                # resume measures failed configurations again (--no-retry: off)
    force_fit: bool = False                  # --force: run configurations predicted not to fit the memory available
    predict_speed: bool = True               # the speed model's prediction in every record (calibrating when needed)
    calibration_timeout_s: float = 180.0     # --calibration-timeout: past it, no speed predictions (said)
    # with the default -r: each test stops after this many repetitions once they agree (core.benchwire.tight), or
    # once it has run rep_budget_s seconds (core.benchwire.enough); 0: -r in full
    min_repetitions: int = 0
    rep_budget_s: float = 0.0

    @property
    def engine(self) -> str:
        """Which engine measures the cases (the settings' ``engine``): ENGINE_PYTHON, ENGINE_LLAMA_BENCH, ENGINE_SERVER."""
        return self.settings.engine or ENGINE_PYTHON

    @property
    def use_mmap(self) -> bool:
        return self.settings.no_mmap is not True


def sweep_spec(model: LoadedModel, contexts: list[int], pairs: list[tuple[str, str]], **kw: Any) -> SweepSpec:
    """A spec from keywords: the grid's and the run's names are the spec's, every other one a Settings field (its
    default :func:`bench_settings`'s); e.g. ``sweep_spec(m, [512], [("f16", "f16")], n_prompt=16, depths=[64])``."""
    own = {f for f in SweepSpec.__dataclass_fields__ if f not in ("model", "contexts", "pairs", "settings")}
    return SweepSpec(model=model, contexts=contexts, pairs=pairs, settings=bench_settings(
        **{k: v for k, v in kw.items() if k not in own}), **{k: v for k, v in kw.items() if k in own})


@dataclass
class Case:
    index: int
    settings: Settings           # what is asked: the record's ``settings`` block (plain dict: encode_block)
    params: ContextParams
    key: str
    prediction: KVPrediction
