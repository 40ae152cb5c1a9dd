"""Will a configuration fit this machine now?  A pure decision on the predicted peak and the available memory.

The margin covers what the whole-process prediction does not hold (within 3 % and 8 MiB of the measured peak on
the configurations checked, docs/predict.md) and other programs' growth while the configuration runs: the larger of
5 % of the predicted peak and 256 MiB.  The watchdog's floor, below which a running configuration is stopped before
the kernel's OOM killer picks a process, is the larger of 2 % of the machine's memory and 256 MiB.
"""

from __future__ import annotations

from edgekv.core.units import MIB

GIB = 1024 * MIB
MARGIN_FRACTION, MARGIN_MIN = 0.05, 256 * MIB
FLOOR_FRACTION, FLOOR_MIN = 0.02, 256 * MIB


def margin(peak_bytes: int) -> int:
    return max(int(MARGIN_FRACTION * peak_bytes), MARGIN_MIN)


def fits(peak_bytes: int, available_bytes: int) -> bool:
    return peak_bytes + margin(peak_bytes) <= available_bytes


def watchdog_floor(total_bytes: int | None) -> int:
    return max(int(FLOOR_FRACTION * (total_bytes or 0)), FLOOR_MIN)


def size(n: float) -> str:
    """Bytes in the unit a reader compares at a glance: GiB from 1 GiB up, else MiB."""
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB else f"{n / MIB:.0f} MiB"


def unfit_reason(peak_bytes: int, available_bytes: int, source: str, basis: str = "predicted peak") -> str:
    """The one line a skipped configuration carries (the record's reason and the screen)."""
    return (f"{basis} {size(peak_bytes)} + {size(margin(peak_bytes))} margin > {size(available_bytes)} available "
            f"({source}); skipped (--force runs it anyway)")
