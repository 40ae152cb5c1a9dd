"""Where speed calibrations are cached (``EDGEKV_HOME/calibration/``), keyed by the environment fingerprint, the
thread count, ``--repack`` and the runtime (and a GPU's cards), and how a cached one is checked against the machine
as it is now (the drift sentinel)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekv.calibration.baseline import fingerprint, fingerprint_key, gpu_identity, store_path, write_json
from edgekv.calibration.speedcal.errors import SPEED_CALIBRATE_ENV, CalibrationError
from edgekv.calibration.speedcal.plans import wide_model
from edgekv.core.probe import by_step, median_s, readable_results, to_wire
from edgekv.core.speed import SPEED_MODEL_VERSION, Calibration
from edgekv.sources.tinymodel import drop_plan_models

# The calibration's own version: what it measures and how it solves it (docs/calibration-history.md, each version's
# change).  A calibration cached by another version is measured again.
CAL_VERSION = 22
# a cached calibration is checked against the machine as it is now: the decode of its own weight model of the model's
# main weight type, timed again (a second or two); when that takes DRIFT_LIMIT more or less time than it did, the
# machine has changed under it (a virtual machine's host can) and everything is measured again
DRIFT_LIMIT = 0.20
# ... at most once in this many seconds: a calibration measured, or last found to hold, that recently (its
# -verified.json beside it) is used as it is.  The sentinel's decode is the largest share of a cached `edgekv
# predict`'s speed work, and machines drift over tens of minutes, not seconds.
DRIFT_RECHECK_S = 300.0
# the coefficient tables of a Calibration that a run may add to (merge_cached keeps another process's)
MERGED = ("matvec_s_per_byte", "matvec_s_per_row", "matvec_stream_s_per_byte", "matvec_stream_s_per_row",
          "matmul_s_per_byte", "matmul_s_per_flop", "matmul_s_per_dot", "matcols_s_per_byte", "matcols_s_per_row",
          "attn_tg_s", "attn_pp_s", "attn_pp_rows_s", "attn_pp_deep_s", "attn_pp_tile_share",
          "attn_pp_tile_share_deep", "node_tg_body_s", "node_pp_body_s")


def calibration_key(n_threads: int, repack: bool, llama_bench: str | None = None,
                    device: str = "") -> tuple[str, dict[str, Any]]:
    """(the key, the fingerprint it hashes) of a calibration in this environment."""
    base = fingerprint("llama-bench", llama_bench) if llama_bench else fingerprint("python")
    fp = {**base, "speed": CAL_VERSION, "model": SPEED_MODEL_VERSION, "threads": n_threads, "repack": repack}
    if device:      # a GPU calibration: also the cards and their driver (a new card or driver re-measures)

        fp.update({"device": device, **gpu_identity()})
    return fingerprint_key(fp), fp


def runtime_tag(llama_bench: str | None) -> str:
    """The file name's runtime part: "python", or "binary-" and a hash of the binary's path (untrusted input never
    chooses a path)."""
    return ("binary-" + hashlib.sha256(os.path.abspath(llama_bench).encode()).hexdigest()[:10]) if llama_bench \
        else "python"


def speed_name(tag: str, n_threads: int, repack: bool, device: str = "") -> str:
    """A speed calibration's file name (no suffix); a device name is llama.cpp's (CUDA0, Metal, Vulkan0): used when it
    is plain letters and digits, else hashed."""
    dev = ""
    if device:
        dev = "-" + (device if re.fullmatch(r"[A-Za-z0-9]{1,32}", device)
                     else "dev" + hashlib.sha256(device.encode()).hexdigest()[:10])
    return f"{tag}-speed-t{int(n_threads)}-r{int(bool(repack))}{dev}"


def calibration_path(n_threads: int, repack: bool, llama_bench: str | None = None, device: str = "") -> Path:
    """Where the calibration of this thread count, --repack, runtime and device is cached."""
    return store_path(speed_name(runtime_tag(llama_bench), n_threads, repack, device))


def runtime_name(llama_bench: str | None) -> str:
    """What a calibration was measured through, as its records say."""
    return f"llama-bench at {os.path.abspath(llama_bench)}" if llama_bench else "llama-cpp-python"


def read_cache(path: Path, key: str, refresh: bool) -> tuple[Calibration | None, str, list[Any]]:
    """The cached calibration when it was taken in this environment (None when absent, stale, unreadable or
    ``refresh``), the note that says why a cached one was not used, and its raw timings (the drift sentinel's
    reference)."""
    cal, note, raw = None, "", []
    if not refresh:
        try:
            c = json.loads(path.read_text())
            if c.get("key") == key:
                cal = Calibration.from_dict(c["calibration"])
                raw = c["raw"] if isinstance(c.get("raw"), list) else []
            else:
                note = "the calibration was taken in another environment (its fingerprint changed): re-measured"
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            note = f"the calibration in {path} was unreadable: re-measured"
    return cal, note, raw


def write_cache(path: Path, key: str, fp: dict[str, Any], cal: Calibration, raw: list[Any]) -> None:
    """Write ``cal`` and its timings ``raw`` to the cache at ``path``, with what another process cached meanwhile
    (merge_cached); OSError when it cannot be written."""
    raw = merge_cached(cal, path, key) + to_wire(list(raw))
    write_json(path, {"key": key, "fingerprint": fp, "calibration": to_wire(cal), "raw": raw})
    mark_verified(path, cal.id)        # just measured: the drift sentinel need not time it for DRIFT_RECHECK_S


def merge_cached(cal: Calibration, path: Path, key: str) -> list[Any]:
    """Keep what another edgekv process cached meanwhile for the same calibration (two predictions that each
    measured a different type must not erase each other's): its coefficients this run did not measure.  Returns
    the cached file's raw timings of the same calibration (to keep beside this run's)."""
    try:
        c = json.loads(path.read_text())
        other = Calibration.from_dict(c["calibration"]) if c.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    if other is None or other.id != cal.id:
        return []
    for name in MERGED:
        mine = getattr(cal, name)
        for k, v in getattr(other, name).items():
            if f"{name}:{k}" not in cal.dropped:        # a term this run dropped stays out
                mine.setdefault(k, v)
    cal.notes.extend(n for n in other.notes if n not in cal.notes)
    raw = c.get("raw")
    return raw if isinstance(raw, list) else []


def cached(n_threads: int, repack: bool = True, llama_bench: str | None = None, device: str = "") -> Calibration | None:
    """The calibration cached for this environment, or None."""
    key, _fp = calibration_key(n_threads, repack, llama_bench, device)
    try:
        c = json.loads(calibration_path(n_threads, repack, llama_bench, device).read_text())
        return Calibration.from_dict(c["calibration"]) if c.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def check_drift(raw: list[Any], weight_type: str, n_threads: int, repack: bool, run: Callable[..., Any],
                device: str = "") -> float | None:
    """How long the calibration's own decode of its ``weight_type`` weight model takes now, as a multiple of the time
    it took when calibrated (``raw``: the calibration's timings); None when the calibration holds no such timing.
    ``run``: (plan, progress) -> results (a Runner bound to its timeout)."""
    name = f"w_{weight_type.lower()}"
    then = [r for r in readable_results(raw) if r.model == name and r.step == "tg" and r.ns]
    if not then:
        return None

    plan = [wide_model(weight_type, n_threads, repack, device, decode_only=True)]   # no 384 MB model written
    try:
        now = by_step(run(plan, None), name).get("tg")
    finally:
        drop_plan_models([m.file_entry() for m in plan])
    if not now or not now.ns:
        return None
    return median_s(now.ns) / median_s(then[-1].ns)


def now() -> float:
    return time.time()


def verified_path(path: Path) -> Path:
    """Where the calibration cached at ``path`` records when it was last measured or found to hold (a file of its
    own: rewriting the calibration's file for that could lose what another edgekv process cached meanwhile)."""
    return path.with_name(path.stem + "-verified.json")


def verified_recently(path: Path, cal_id: str, clock: Callable[[], float] = now) -> bool:
    """Whether calibration ``cal_id``, cached at ``path``, was measured or found to hold by its sentinel within
    DRIFT_RECHECK_S."""
    try:
        v = json.loads(verified_path(path).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(v, dict) or v.get("id") != cal_id:
        return False
    t = v.get("unix")
    return isinstance(t, (int, float)) and 0 <= clock() - t < DRIFT_RECHECK_S


def mark_verified(path: Path, cal_id: str, clock: Callable[[], float] = now) -> None:
    """Record that calibration ``cal_id`` (cached at ``path``) was measured or found to hold now; OSError when it
    cannot be written."""
    write_json(verified_path(path), {"id": cal_id, "unix": clock()})


def drifted(cal: Calibration, raw: list[Any], sentinel: str, n_threads: int, repack: bool, run: Callable[..., Any],
            device: str, path: Path | None = None, clock: Callable[[], float] = now) -> str:
    """Why the cached ``cal`` is measured again (the machine now runs its sentinel DRIFT_LIMIT faster or slower), or
    "" when it still holds (measured or checked within DRIFT_RECHECK_S: not timed again; found to hold: ``path``,
    its cache file, says so)."""
    if path is not None and verified_recently(path, cal.id, clock):
        return ""
    try:
        ratio = check_drift(raw, sentinel, n_threads, repack, run, device)
    except CalibrationError:
        return ""
    if ratio is None or abs(ratio - 1.0) <= DRIFT_LIMIT:
        if ratio is not None and path is not None:
            with contextlib.suppress(OSError):      # not recorded: the next run times it again
                mark_verified(path, cal.id, clock)
        return ""
    # the limit is on the time, so the words are too: "18 % slower" of a decode that took 1.22x the time read as
    # within a limit of 20 %
    return (f"this machine now takes {ratio:.2f}x the time to decode the calibration's {sentinel} weight model that it "
            f"took when it was calibrated ({cal.id}; more than ±{100 * DRIFT_LIMIT:.0f} % apart): re-measured")


def still_holds(cal: Calibration, note: str, measure: bool, sentinel: str | None,
                is_drifted: Callable[[str], str]) -> tuple[Calibration | None, str]:
    """The cached ``cal`` when it may be used (None: measure again) and the note: one whose ``sentinel`` weight type
    now decodes DRIFT_LIMIT faster or slower (``is_drifted``) is measured again.  A calibration taken while other
    work used the CPUs is kept, its terms having passed their physical bounds (edgekv.core.speedbounds; those that
    did not were dropped and are measured again), and its predictions stay marked: a busy machine, a shared CI
    runner, does not pay for the whole calibration on every run.  Its sentinel, timed on a machine that is quiet
    again, measures it anew when it moved; 'edgekv calibrate' re-measures it at once."""
    if cal.busy:
        busy = ("the cached calibration was taken while other work used the CPUs: kept (its terms passed their "
                     "physical bounds), its predictions marked" + (f" ({SPEED_CALIBRATE_ENV}=cached)" if not measure
                                                                   else "; 'edgekv calibrate' re-measures it"))
        note = "; ".join(x for x in (note, busy) if x)
    if measure and sentinel and sentinel in cal.matvec_s_per_byte:
        why = is_drifted(sentinel)
        if why:
            return None, why
    return cal, note

