"""``edgekv info``: what this machine's llama.cpp build can do, gathered from the per-environment calibrations."""

from __future__ import annotations

from typing import Any

from edgekv.calibration.baseline import runtime_baseline
from edgekv.calibration.preflight import preflight
from edgekv.core.memmodel import extra_buffer_types
from edgekv.machine.environment import package_version


def machine_info(llama_bench: str | None = None, refresh: bool = False) -> dict[str, Any]:
    """CPU features and extra buffer types of the llama.cpp build edgekv drives, the runtime baseline, and the
    extra-buffer preflight's verdict (also for a user's llama-bench when given)."""
    base = runtime_baseline(remeasure=refresh)
    pf = preflight(refresh=refresh)
    out: dict[str, Any] = {
        "llama_cpp_python": package_version("llama-cpp-python"),
        "cpu_features": list(base.cpu_features),
        "extra_buffer_types": list(extra_buffer_types(base.cpu_features)),
        "runtime_baseline_bytes": base.bytes,
        "runtime_baseline_note": base.note,
        "preflight": {**pf.environment_block(), "repack_default": pf.repack, "remeasured": pf.remeasured},
    }
    if llama_bench:
        bp = preflight("binary", llama_bench, refresh=refresh)
        out["llama_bench"] = {"path": llama_bench, **bp.environment_block(), "repack_default": bp.repack}
    return out
