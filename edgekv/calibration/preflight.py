"""The extra-buffer preflight: do llama.cpp's AMX / CPU_REPACK kernels run on this machine?

On CPUs with AMX (many cloud machines and CI runners) llama.cpp copies eligible weights into its AMX buffer, and on
some of them its AMX matrix kernels crash on every batch of 2 or more tokens (llama.cpp #20824, open;
docs/hardware.md).  A run that only learns that when each configuration dies
measures nothing.  So once per environment (cached with the runtime baseline under ``EDGEKV_HOME/calibration/``,
keyed by the same fingerprint, re-run when it changes) a child loads a tiny Q4_0 model
(:mod:`edgekv.sources.tinymodel`) with the extra buffer types on and decodes a batch of 2 and a batch of 32 tokens
(about 2 s).  If it dies, edgekv measures with ``--repack 0`` (``use_extra_bufts = false``), the setting that
runs there, and says so; an explicit ``--repack 1`` still runs as asked.

For a user's llama-bench the probe is that binary itself: ``-p 2,32 -n 0 -r 1`` on the same model (its default
``--repack 1``, not passed: builds older than the flag refuse it).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from dataclasses import asdict, dataclass, field
from typing import Any

from edgekv.calibration.baseline import fingerprint, fingerprint_key, store_path, write_json
from edgekv.core.childwire import PreflightRequest, to_wire
from edgekv.core.llamalog import parse_memory_log
from edgekv.runtime.childside import EMULATE_CRASH_ENV
from edgekv.runtime.process import run_child, worker_argv
from edgekv.sources.tinymodel import probe_model_path

PREFLIGHT_VERSION = 2     # 2: a probe that died names the buffers it loaded (its "buffers" event)
ISSUE = "llama.cpp #20824"
CRASH_TEXT = f"llama.cpp's AMX kernels crash on this CPU ({ISSUE})"


@dataclass
class Preflight:
    """The preflight's verdict for one environment."""

    runs: bool | None                    # True: the extra buffer types run; False: they kill the process; None: unknown
    detail: str                          # one line: what ran, or how it died
    extra_buffers: dict[str, float] = field(default_factory=dict)   # the probe's extra buffers (MiB), from its log
    fingerprint_key: str = ""
    remeasured: bool = False

    @property
    def repack(self) -> bool:
        """The --repack setting to measure with when the user gives none: llama.cpp's default (1) unless it crashes."""
        return self.runs is not False

    @property
    def fallback_line(self) -> str:
        """What bench and quality print before their plan when they fall back to --repack 0."""
        return f"{self.crash_cause}: measuring with --repack 0, the setting that runs here ({self.detail})"

    @property
    def crash_cause(self) -> str:
        return CRASH_TEXT if "AMX" in self.extra_buffers else (
            f"llama.cpp's {'/'.join(self.extra_buffers) or 'extra buffer'} kernels crash on this CPU")

    def environment_block(self) -> dict[str, Any]:
        """What a record's environment says of it (``extra_buffers_preflight``)."""
        return {"runs": self.runs, "detail": self.detail, "extra_buffers_mib": dict(self.extra_buffers)}


def verdict(ok: bool, signal_no: int | None, step: str | None, buffers: dict[str, float], why: str | None) -> Preflight:
    """The verdict from what the probe did (pure): died by a signal in a decode -> the kernels crash here."""
    extra = {k: v for k, v in (buffers or {}).items() if k in ("AMX", "CPU_REPACK") or "REPACK" in k or "KLEIDI" in k}
    names = ", ".join(f"{k} {v:.2f} MiB" for k, v in extra.items()) or "no extra buffer"
    if ok:
        return Preflight(True, f"the probe decoded batches of 2 and 32 tokens with {names}", extra)
    if signal_no is not None:
        sig = signal.Signals(signal_no).name if signal_no in signal.Signals._value2member_map_ else str(signal_no)
        where = {"batch2": "a batch of 2 tokens", "batch32": "a batch of 32 tokens"}.get(step or "", step or "start-up")
        return Preflight(False, f"the probe died with {sig} decoding {where} with {names}", extra)
    return Preflight(None, f"the probe could not run: {why or 'no result'}", extra)


def _key(runtime: str, binary: str | None) -> str:
    """The verdict's cache key: the environment's fingerprint (and, under the crash emulation that the suite uses,
    that too: an emulated verdict never stands for the machine's own)."""
    extra = {"emulated_crash": True} if runtime == "python" and os.environ.get(EMULATE_CRASH_ENV) == "1" else {}
    return fingerprint_key({**fingerprint(runtime, binary), "preflight": PREFLIGHT_VERSION, **extra})


def _cache_path(runtime: str, binary: str | None):
    digest = hashlib.sha256(os.path.abspath(binary or "").encode()).hexdigest()[:10]
    name = "python" if runtime == "python" else "binary-" + digest
    return store_path(f"{name}-preflight")


def _probe_python() -> Preflight:
    res = run_child(worker_argv("preflight"), to_wire(PreflightRequest(model_path=str(probe_model_path()))),
                    timeout=120.0)
    r = res.result or {}
    step = next((e.get("phase") for e in reversed(res.events) if e.get("event") == "phase"), None)
    if res.timed_out:
        return Preflight(None, f"the probe timed out in {step or 'start-up'}")
    return verdict(bool(res.ok and r.get("ok")), res.signal, r.get("step") or step, r.get("buffers") or _buffers(res),
                   r.get("reason") or res.failure_reason())


def _buffers(res) -> dict[str, float]:
    """The model buffers of a probe that died before its result: its ``buffers`` event, else llama.cpp's own
    ``load_tensors: ... model buffer size`` lines among those it forwarded."""
    said = next((e.get("buffers") for e in res.events if e.get("event") == "buffers"), None)
    if isinstance(said, dict) and said:
        return {str(k): float(v) for k, v in said.items() if isinstance(v, (int, float))}
    return parse_memory_log(list(res.log_tail or [])).model_buffers


def _probe_binary(binary: str) -> Preflight:
    argv = [binary, "-m", str(probe_model_path()), "-p", "2,32", "-n", "0", "-r", "1", "-o", "jsonl", "-v"]
    res = run_child(argv, None, stdin_data=b"", timeout=120.0, capture_output=True)
    buffers = parse_memory_log(res.stderr or "").model_buffers
    if res.timed_out:
        return Preflight(None, "the probe (llama-bench) timed out", buffers)
    ok = res.returncode == 0 and '"n_prompt"' in (res.stdout or "")
    step = "batch32" if (res.stdout or "").count('"n_prompt"') == 1 else "batch2"
    return verdict(ok, res.signal, step, buffers, res.failure_reason() or "llama-bench printed no result")


def cached(runtime: str = "python", binary: str | None = None) -> Preflight | None:
    """The verdict already cached for this environment, or None (nothing is probed)."""
    key = _key(runtime, binary)
    try:
        c = json.loads(_cache_path(runtime, binary).read_text())
        if c.get("fingerprint_key") == key:
            return Preflight(c["runs"], c["detail"], dict(c.get("extra_buffers") or {}), key)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def preflight(runtime: str = "python", binary: str | None = None, refresh: bool = False) -> Preflight:
    """The cached verdict for this environment, probing when absent, stale, or ``refresh``."""
    key = _key(runtime, binary)
    path = _cache_path(runtime, binary)
    known = None if refresh else cached(runtime, binary)
    if known is not None:
        return known
    pf = _probe_python() if runtime == "python" else _probe_binary(binary or "")
    pf.fingerprint_key, pf.remeasured = key, True
    if pf.runs is not None:       # an unknown verdict is said, never cached
        try:
            write_json(path, {**asdict(pf), "remeasured": False})
        except OSError:
            pass
    return pf


@dataclass(frozen=True)
class RepackChoice:
    """The --repack values a run uses and why: the ones asked (``asked``), else llama.cpp's default (1) unless this
    environment's preflight saw its extra-buffer kernels kill the probe (then 0, the setting that runs here).
    ``preflight``: the verdict it read (None: none cached and none probed); the one choice bench, quality and
    predict make, each saying it in its own words."""

    values: list[bool]
    asked: bool
    preflight: Preflight | None

    @property
    def crashes(self) -> bool:
        return self.preflight is not None and self.preflight.runs is False

    @property
    def fell_back(self) -> bool:
        """Nothing asked, and the kernels crash here: the run uses --repack 0."""
        return self.crashes and not self.asked

    def measure_note(self) -> str | None:
        """What a measured run (bench, quality) says before its plan, once its inputs were accepted."""
        pf = self.preflight
        if pf is None or not self.crashes:
            return None
        if not self.asked:
            return pf.fallback_line
        if True in self.values:
            return (f"{pf.crash_cause}: --repack 1 runs as asked, and every configuration that runs a prompt batch is "
                    f"expected to fail there ({pf.detail})")
        return None

    def predict_notes(self) -> list[str]:
        """What ``edgekv predict`` says of the setting it predicts."""
        pf = self.preflight
        if pf is None or not self.crashes:
            return []
        if not self.asked:
            return [f"{pf.crash_cause}: predicting --repack 0, the setting that runs here ({pf.detail}); '--repack 1' "
                    "predicts llama.cpp's default, which dies on its first prompt batch here"]
        if True in self.values:
            return [f"{pf.crash_cause}: llama.cpp with its default (--repack 1) dies on the first prompt batch here; "
                    "`--repack 0` (llama.cpp's -nr) predicts the setting that runs"]
        return []


def repack_choice(asked: list[bool] | None, binary: str | None = None, probe: bool = True) -> RepackChoice:
    """The --repack values to run (or predict) with: ``asked`` when given, else the preflight's (llama.cpp's default
    unless its kernels crash here).  ``binary``: the user's llama-bench, the build that would run (else
    llama-cpp-python's).  ``probe``: probe when nothing is cached (a few seconds, once per environment); off, only
    a cached verdict is read."""
    who = ("binary", binary) if binary else ("python", None)
    pf = preflight(*who) if probe else cached(*who)
    if asked:
        return RepackChoice(list(asked), True, pf)
    return RepackChoice([pf is None or pf.runs is not False], False, pf)
