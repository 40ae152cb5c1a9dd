"""Export and import of the calibration store (``EDGEKV_HOME/calibration/``) as one JSON bundle, so that a CI job
reuses a calibration another job measured (``edgekv calibrate --export FILE`` / ``--import FILE``).

The bundle holds the speed calibrations, the runtime baselines and the preflight verdicts.  An import is untrusted
input: the bundle is decoded strictly (msgspec), every entry is checked before any is written, and each is written
under a name edgekv derives from the entry's own runtime, fingerprint and settings, checked against
``[A-Za-z0-9_.-]`` and to stay inside the store.  A speed calibration of another version is refused.  An entry
measured in another environment is written all the same and simply not used there: each reader compares the
entry's key with this environment's own."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import msgspec

from edgekv.calibration.baseline import CALIBRATION_VERSION, fingerprint_key, store_path, write_json
from edgekv.calibration.speedcal.errors import CalibrationError
from edgekv.calibration.speedcal.store import CAL_VERSION, speed_name
from edgekv.core.speed import SPEED_MODEL_VERSION, Calibration

BUNDLE_VERSION = 1
TAG = r"python|binary-[0-9a-f]{10}"
# the store's file names edgekv writes (calibrate.store_path adds "-baseline.json" to each)
FILE_NAME = re.compile(rf"^(?P<tag>{TAG})(?:-(?P<pre>preflight)|(?P<speed>-speed-t\d+-r[01](?:-[A-Za-z0-9]{{1,32}})?))?"
                       r"-baseline\.json$")
SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")

Kind = Literal["baseline", "preflight", "speed"]


class Entry(msgspec.Struct, forbid_unknown_fields=True):
    kind: Kind
    runtime: str                # "python", or "binary-" and a hash of the binary's path
    content: dict[str, Any]


class Bundle(msgspec.Struct, forbid_unknown_fields=True):
    edgekv_calibrations: int    # BUNDLE_VERSION
    entries: list[Entry]


class _Head(msgspec.Struct):
    edgekv_calibrations: int


class _Fingerprint(msgspec.Struct):
    runtime: str
    calibration: int = 0
    binary: list[Any] | None = None


class _SpeedFingerprint(_Fingerprint):
    speed: int = 0
    model: int = 0
    threads: int = 0
    repack: bool = True
    device: str = ""


class _Keyed(msgspec.Struct):
    key: str
    fingerprint: dict[str, Any]


class _Preflight(msgspec.Struct):
    fingerprint_key: str


def _store_dir() -> Path:
    return store_path("x").parent


def export_calibrations(dest: Path) -> int:
    """Write every calibration file of the store (speed calibrations, runtime baselines, preflight verdicts) into
    one JSON bundle at ``dest``; returns how many.  Unreadable files are left out."""
    entries = []
    folder = _store_dir()
    for p in sorted(folder.glob("*-baseline.json")) if folder.is_dir() else []:
        m = FILE_NAME.match(p.name)
        if not m:
            continue
        try:
            content = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(content, dict):
            kind = "preflight" if m["pre"] else "speed" if m["speed"] else "baseline"
            entries.append(Entry(kind, m["tag"], content))
    Path(dest).write_bytes(msgspec.json.encode(Bundle(BUNDLE_VERSION, entries)))
    return len(entries)


def _tag_of(fp: _Fingerprint) -> str:
    """The runtime part of a file name, from an entry's fingerprint (as store.runtime_tag derives it)."""
    if fp.runtime == "python":
        return "python"
    if not fp.binary or not isinstance(fp.binary[0], str):
        raise ValueError("its fingerprint names no binary")
    return "binary-" + hashlib.sha256(fp.binary[0].encode()).hexdigest()[:10]


def _keyed(content: dict[str, Any], fp_type: type[_Fingerprint]) -> Any:
    """The fingerprint of a keyed entry (baseline, speed), checked against its own key."""
    k = msgspec.convert(content, _Keyed)
    if fingerprint_key(k.fingerprint) != k.key:
        raise ValueError("its key is not its fingerprint's")
    return msgspec.convert(k.fingerprint, fp_type)


def entry_name(e: Entry) -> str:
    """The store name edgekv gives an entry (ValueError or msgspec.ValidationError when it is not a calibration
    edgekv wrote, or of another version)."""
    if not re.fullmatch(TAG, e.runtime):
        raise ValueError(f"its runtime {e.runtime[:40]!r} is not one edgekv writes")
    if e.kind == "preflight":
        if not re.fullmatch(r"[0-9a-f]{16}", msgspec.convert(e.content, _Preflight).fingerprint_key):
            raise ValueError("its fingerprint_key is not one edgekv writes")
        return f"{e.runtime}-preflight"
    fp = _keyed(e.content, _SpeedFingerprint if e.kind == "speed" else _Fingerprint)
    if _tag_of(fp) != e.runtime:
        raise ValueError("its runtime is not its fingerprint's")
    if e.kind == "baseline":
        if fp.calibration != CALIBRATION_VERSION:
            raise ValueError(f"it is a runtime baseline of version {fp.calibration}; this edgekv reads "
                             f"{CALIBRATION_VERSION}: export it again with this edgekv")
        return e.runtime
    if (fp.speed, fp.model) != (CAL_VERSION, SPEED_MODEL_VERSION):
        raise ValueError(f"it is a speed calibration of version {fp.speed}/{fp.model}; this edgekv reads "
                         f"{CAL_VERSION}/{SPEED_MODEL_VERSION}: export it again with this edgekv")
    Calibration.from_dict(e.content["calibration"])
    if fp.threads < 1:
        raise ValueError("its thread count is not positive")
    return speed_name(e.runtime, fp.threads, fp.repack, fp.device)


def _path_for(e: Entry) -> Path:
    name = entry_name(e)
    if not SAFE_NAME.fullmatch(name):
        raise ValueError("its name is not one edgekv writes")
    path = store_path(name)
    if path.resolve().parent != _store_dir().resolve():
        raise ValueError("its name leaves the calibration store")
    return path


def import_calibrations(src: Path) -> int:
    """Write every entry of the bundle at ``src`` into the store (each under the name edgekv derives for it);
    returns how many.  CalibrationError, one line naming the file and the entry, when the file is not a bundle of
    this version or any entry is not a calibration edgekv wrote: nothing is written then."""
    try:
        data = Path(src).read_bytes()
        version = msgspec.json.decode(data, type=_Head).edgekv_calibrations
    except OSError as e:
        raise CalibrationError(f"{src}: cannot read it ({e.strerror})") from None
    except msgspec.DecodeError as e:        # ValidationError is one
        raise CalibrationError(f"{src}: not an edgekv calibration bundle ({e})") from None
    if version != BUNDLE_VERSION:
        raise CalibrationError(f"{src}: a calibration bundle of version {version}; this edgekv reads version "
                               f"{BUNDLE_VERSION}: export it again with this edgekv")
    try:
        bundle = msgspec.json.decode(data, type=Bundle)
    except msgspec.DecodeError as e:
        raise CalibrationError(f"{src}: not an edgekv calibration bundle ({e})") from None
    out = []
    for i, e in enumerate(bundle.entries):
        try:
            out.append((_path_for(e), e.content))
        except (ValueError, KeyError, TypeError, AttributeError, msgspec.ValidationError) as why:
            raise CalibrationError(f"{src}: entry {i} ({e.kind}) is refused: {why}") from None
    for path, content in out:
        write_json(path, content)
    return len(out)
