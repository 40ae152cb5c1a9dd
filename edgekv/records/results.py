"""THE results schema: one JSON object per configuration, one per line (JSONL).

Schema history (``schema_version``):

* 1 -- first version: ``settings`` (what was asked), ``effective`` (what llama.cpp did),
  ``prediction`` (formula + engine), ``llama_log`` (what llama.cpp reported in the measured run),
  ``memory`` (what the OS measured), ``speed`` (every sample, with summaries), ``timing``,
  ``differences``, ``environment``, optional ``quality``.
* 2 -- the whole-process prediction: ``prediction.process`` (``workload``, ``peak_rss_bytes``,
  ``device_bytes`` per device, ``parts``: name, bytes, source, where, kind, note; see
  :mod:`edgekv.core.memmodel`) and ``memory_residual`` (measured - predicted peak RSS, bytes and %);
  optional ``settings.no_mmap``.  v1 records are upgraded with ``prediction.process = None`` (never
  predicted) and no residual: nothing is invented for them.
* 3 -- the speed model (issue 26): ``prediction.speed`` (``pp`` and ``tg``: predicted tokens/s at the depth, the
  parts in seconds per token with their sources, the decode roofline, the calibration id; see
  :mod:`edgekv.core.speed`) and ``speed_residual`` (measured - predicted, % of predicted).  v2 records are
  upgraded with ``prediction.speed = None`` (never predicted).
* 4 -- the code identity: ``environment.edgekv_commit`` and ``environment.edgekv_dirty`` (the edgekv commit that
  wrote the record, and whether its files had local changes).  v3 records are upgraded without them (absent: the
  commit is unknown, never guessed); their speed tests' ``ci95_ts`` is recomputed from their samples on the
  logarithm, as edgekv computes it today (:func:`edgekv.core.stats.summarize`): records written before that rule
  held a linear interval, which could reach below zero.

Loading upgrades older records step by step (``UPGRADES``, on plain dicts), refuses records written
by a newer edgekv, then decodes each record strictly into :class:`edgekv.records.schema.Record`
(msgspec): a missing, unknown or mistyped key refuses in one line ``file:line: key: what; what to do``.
The types live in :mod:`edgekv.records.schema` (``SCHEMA_VERSION`` too); their JSON Schema is the
committed ``results.schema.json`` (``edgekv.records.schema.write_schema_file()`` regenerates it).

Writing is append-only: each record is one ``write()`` of one line on an ``O_APPEND``
descriptor followed by ``fsync``, so an interrupted sweep leaves complete lines plus at most one
torn last line, which loading ignores (and a resumed sweep redoes).

Faults (issue 18): a bench holds an advisory lock (``flock``) on its results file from before the
first measurement to the end (:class:`ResultsWriter`), so a second ``bench -o SAME`` refuses in one
line and appends never interleave; :func:`append` takes the same lock for each record.  Before
appending, a last line without its final newline is repaired: a complete record gets the newline
appended (never truncated); only bytes that are not a JSON record (a torn write) are cut, and that
is said in one line naming ``file:line``.  Readers either refuse with ``file:line`` (strict
:func:`load`) or collect what they skip (``load(..., skipped=[])``) so a report can say how many
lines it left out and why.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgspec import UNSET

from edgekv.core.stats import summarize
from edgekv.errors import ResultsError
from edgekv.records.schema import SCHEMA_VERSION, Environment, Record, decode, encode
from edgekv.sources.safepath import atomic_write


def _v1_to_v2(r: dict[str, Any]) -> dict[str, Any]:
    """v1 records predicted no whole-process memory: mark it absent (None), add no residual."""
    r = dict(r)
    pred = dict(r.get("prediction") or {})
    pred.setdefault("process", None)
    r["prediction"] = pred
    r["schema_version"] = 2
    return r


def _v2_to_v3(r: dict[str, Any]) -> dict[str, Any]:
    """v2 records predicted no speed: mark it absent (None)."""
    r = dict(r)
    if isinstance(r.get("prediction"), dict):
        pred = dict(r["prediction"])
        pred.setdefault("speed", None)
        r["prediction"] = pred
    r["schema_version"] = 3
    return r


SPEED_TESTS = ("pp", "tg", "pg", "tg_seq")


def _v3_to_v4(r: dict[str, Any]) -> dict[str, Any]:
    """v3 records carry no code identity (left absent: unknown); a speed test's 95 % interval is recomputed from its
    samples where they are all positive (the interval on the logarithm; an older record may hold a linear one)."""

    r = dict(r)
    speed = r.get("speed")
    if isinstance(speed, dict):
        speed = dict(speed)
        for test in SPEED_TESTS:
            t = speed.get(test)
            xs = t.get("samples_ts") if isinstance(t, dict) else None
            if (isinstance(xs, list) and len(xs) >= 2
                    and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in xs)):
                speed[test] = {**t, "ci95_ts": summarize(xs)["ci95"]}
        r["speed"] = speed
    r["schema_version"] = 4
    return r


def _v4_to_v5(r: dict[str, Any]) -> dict[str, Any]:
    """v4 records never adjusted a speed prediction after a far miss (prediction.speed.far_miss and .adjusted,
    issue 68): left absent."""
    return {**r, "schema_version": 5}


# v -> function upgrading a v record to v+1, in order.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4,
                                                                   4: _v4_to_v5}

# The settings that identify a configuration: two records with equal values describe the same
# measurement (resume skips it; compare pairs them).
KEY_SETTINGS = (
    "engine", "n_ctx", "type_k", "type_v", "flash_attn", "swa_full", "n_seq_max", "kv_unified", "n_batch",
    "n_ubatch", "n_threads", "n_gpu_layers", "n_prompt", "n_gen", "n_depth", "repetitions", "warmup", "quality",
)

# Environment facts that must agree before records are merged into one file or compared without
# --force (the pyperf habit: never silently mix runs from different setups).
CHECKED_ENVIRONMENT = (
    "machine_id", "cpu_model", "cpu_count_logical", "os", "llama_cpp_python", "llama_cpp_commit", "backends",
    "devices",
)


def config_key(model_sha256: str | None, settings: dict[str, Any]) -> str:
    key = {"model_sha256": model_sha256, **{k: settings.get(k) for k in KEY_SETTINGS}}
    if settings.get("no_mmap"):          # only when set, so the keys of earlier records stay the same
        key["no_mmap"] = True
    if settings.get("repack") is False:   # likewise: on is llama.cpp's default and what earlier records ran
        key["repack"] = False
    if settings.get("n_parallel") is not None:    # -npl: sequences decoded at once (absent: the one-sequence workload)
        key["n_parallel"] = settings["n_parallel"]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def latest(records: list[Record]) -> list[Record]:
    """One record per configuration and machine: the last one a file holds for each ``config_key`` on each machine
    (a failed configuration measured again on resume leaves its earlier record in the file as history), in the order
    of first appearance; records without a key (imported llama-bench rows, predictions) are all kept."""
    def key(r: Record) -> Any:
        if not r.config_key:
            return None
        machine = r.machine or None                       # `edgekv merge`'s label
        return r.config_key, machine or r.environment.machine_id or None   # the same configuration on another machine

    last = {key(r): i for i, r in enumerate(records) if key(r)}
    first: dict[Any, int] = {}
    for i, r in enumerate(records):
        if key(r):
            first.setdefault(key(r), i)
    return [records[last[key(r)]] if key(r) else r for i, r in enumerate(records) if not key(r) or first[key(r)] == i]


def env_differences(a: Environment, b: Environment) -> list[str]:
    """The :data:`CHECKED_ENVIRONMENT` facts two environments disagree on, one line each (a key one lacks: None)."""
    out = []
    for k in CHECKED_ENVIRONMENT:
        x, y = (None if v is UNSET else v for v in (getattr(a, k), getattr(b, k)))
        if x != y:
            out.append(f"{k}: {x!r} vs {y!r}")
    return out


def _llama_bench_environment(r: dict[str, Any]) -> dict[str, Any]:
    """An imported llama-bench row written before the environment was typed kept llama-bench's strings: ``backends``
    "Metal,BLAS" and ``devices`` "GPU name" are the lists ["Metal", "BLAS"] and ["GPU name"] now (same facts)."""
    env = r.get("environment")
    if r.get("kind") != "llama-bench" or not isinstance(env, dict):
        return r
    env = dict(env)
    if isinstance(env.get("backends"), str):
        env["backends"] = [b.strip() for b in env["backends"].split(",") if b.strip()] or None
    if isinstance(env.get("devices"), str):
        env["devices"] = [env["devices"]] if env["devices"] else None
    return {**r, "environment": env}


def upgrade(record: dict[str, Any], where: str) -> dict[str, Any]:
    record = _llama_bench_environment(record)
    v = record.get("schema_version")
    if not isinstance(v, int):
        raise ResultsError(f"{where}: no integer schema_version; not an edgekv result")
    if v > SCHEMA_VERSION:
        raise ResultsError(
            f"{where}: written by a newer edgekv (schema {v}, this edgekv reads up to {SCHEMA_VERSION}); "
            "upgrade edgekv (pip install -U edgekv)")
    while v < SCHEMA_VERSION:
        fn = UPGRADES.get(v)
        if fn is None:
            raise ResultsError(f"{where}: schema {v} has no upgrade path to {SCHEMA_VERSION}")
        record = fn(record)
        v = record["schema_version"]
    return record


@dataclass(frozen=True)
class Skipped:
    """A line of a results file a reader could not use, and why."""

    file: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.why}"


def as_record(x: Record | dict[str, Any], where: str = "record") -> Record:
    """A :class:`Record` as it is, or a plain record dict upgraded and strictly decoded (the consumers' entry:
    report, compare, benchview and merge read attributes, whatever they were handed)."""
    if isinstance(x, Record):
        return x
    if not isinstance(x, dict):
        raise ResultsError(f"{where}: expected a results record (a JSON object), got {type(x).__name__}")
    return decode(upgrade(x, where), where)


def load_records(path: str | os.PathLike, tolerate_torn_tail: bool = True,
                 skipped: list[Skipped] | None = None) -> list[Record]:
    """Load an edgekv JSONL results file as typed :class:`Record` objects (upgrades, then strict decoding).

    Same rules as :func:`load` (strict by default; a ``skipped`` list collects unusable lines instead).
    """
    return _load(path, tolerate_torn_tail, skipped, typed=True)


def load(path: str | os.PathLike, tolerate_torn_tail: bool = True,
         skipped: list[Skipped] | None = None) -> list[dict[str, Any]]:
    """Load an edgekv JSONL results file (with upgrades) as plain dicts, each checked strictly against the schema.

    Strict by default: the first unusable line raises :class:`ResultsError` naming ``file:line``.
    With a ``skipped`` list, unusable lines are left out and described there instead (a torn last
    line too), so the caller can say how many it skipped and why.
    """
    return _load(path, tolerate_torn_tail, skipped, typed=False)


def _load(path: str | os.PathLike, tolerate_torn_tail: bool, skipped: list[Skipped] | None, typed: bool) -> list[Any]:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such results file") from None
    except IsADirectoryError:
        raise ResultsError(f"{p}: is a directory; pass a .jsonl results file") from None
    except OSError as e:
        raise ResultsError(f"{p}: cannot read ({e.strerror or e})") from None
    lines = raw.split(b"\n")
    complete = raw.endswith(b"\n")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = i == len(lines) or (i == len(lines) - 1 and not lines[-1])
        try:
            try:
                obj = json.loads(line)
            except ValueError:
                if last and tolerate_torn_tail and not complete:
                    if skipped is not None:
                        skipped.append(Skipped(str(p), i, "torn last line (an interrupted write; "
                                                          f"{len(line)} bytes without a newline)"))
                    break      # a write interrupted mid-line: the sweep will redo it
                raise ResultsError(f"{p}:{i}: not valid JSON; the results file is damaged") from None
            if not isinstance(obj, dict):
                raise ResultsError(f"{p}:{i}: expected a JSON object per line")
            up = upgrade(obj, f"{p}:{i}")
            rec = decode(up, f"{p}:{i}")
            out.append(rec if typed else up)
        except ResultsError as e:
            if skipped is None:
                raise
            msg = str(e)
            prefix = f"{p}:{i}: "
            skipped.append(Skipped(str(p), i, msg[len(prefix):] if msg.startswith(prefix) else msg))
    return out


def append(path: str | os.PathLike, record: Record) -> None:
    """Append one record atomically (one write of one line, then fsync), under the file's lock.

    Waits for a lock another process holds (a running bench holds it for its whole sweep: use
    :class:`ResultsWriter` there).  The tail is repaired under the lock, so no writer can cut
    another's record.
    """
    p = Path(path)
    _make_parent(p)
    fd = _open_for_append(p)
    try:
        _lock(fd, p, wait=True)
        _repair_tail(fd, p)
        _write_record(fd, record, str(p))
    finally:
        os.close(fd)      # releases the lock


class ResultsWriter:
    """The single writer of a results file for a whole bench.

    Opening it checks that the file can be written (before anything is measured), takes an
    exclusive advisory lock (``flock``; a second bench on the same file refuses in one line),
    repairs a last line without its newline, and loads the records already there (strict: an
    unusable line refuses with ``file:line``).  ``notes`` says what the repair did.
    """

    def __init__(self, path: str | os.PathLike):
        p = self.path = Path(path)
        if p.is_dir():
            raise ResultsError(f"{p}: is a directory; -o takes a results file (.jsonl)")
        _make_parent(p)
        self.created = not p.exists()
        self.appended = 0
        self.fd = _open_for_append(p)
        try:
            _lock(self.fd, p, wait=False)
            self.notes = _repair_tail(self.fd, p)
            self.existing = load_records(p)
        except BaseException:
            self.close()
            raise

    def append(self, record: Record) -> None:
        """Append one record whole, or nothing: a write that fails (a full disk) is cut back to the last complete
        line and refused in one line saying how many records the file keeps."""
        size = os.fstat(self.fd).st_size
        try:
            _write_record(self.fd, record, str(self.path))
        except OSError as e:
            try:
                os.ftruncate(self.fd, size)           # no torn record stays behind
            except OSError:
                pass
            kept = len(self.existing) + self.appended
            why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            raise ResultsError(f"{self.path}: results file: {why}; {kept} records kept, the {_ordinal(kept + 1)} not "
                               "written (free space, then rerun the same command to resume)") from None
        self.appended += 1

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            if self.created and os.fstat(self.fd).st_size == 0:
                self.path.unlink(missing_ok=True)     # nothing was written: leave no empty file behind
        finally:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _make_parent(p: Path) -> None:
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResultsError(f"{p}: cannot create its folder {p.parent} ({e.strerror or e}); choose another -o") from None


def _open_for_append(p: Path) -> int:
    try:
        return os.open(p, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    except IsADirectoryError:
        raise ResultsError(f"{p}: is a directory; -o takes a results file (.jsonl)") from None
    except OSError as e:
        raise ResultsError(f"{p}: cannot write the results file ({e.strerror or e}); choose another -o") from None


def _lock(fd: int, p: Path, wait: bool) -> None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock (Windows): appends stay single write() calls
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        raise ResultsError(f"{p}: another edgekv process is writing this results file (it holds the lock); "
                           "wait for it to finish, or write to another file with -o") from None
    except OSError as e:  # a file system without locks (some network mounts)
        if wait:
            return
        raise ResultsError(f"{p}: cannot lock the results file ({e.strerror or e}); write it on a local disk") from None


def _checked(record: Record, where: str) -> str:
    """The line to write: the typed record encoded, after checking it reads back (a producer that built a block of
    the wrong type fails here, naming the key, instead of writing a file nothing can read)."""
    if not isinstance(record, Record):
        raise TypeError(f"{where}: a results line is a typed record (edgekv.records.schema), not {type(record).__name__}")
    line = json.dumps(encode(record), sort_keys=False)
    decode(json.loads(line), f"{where} (record being written)")
    return line


def _write_record(fd: int, record: Record, where: str = "results") -> None:
    data = (_checked(record, where) + "\n").encode()
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.fsync(fd)


def _repair_tail(fd: int, p: Path) -> list[str]:
    """Make the file end with a newline, under the lock: append it after a complete record, or cut
    only a torn (not JSON) last line.  Returns one line per repair, naming ``file:line``."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return []
    pos, start = size, 0
    while pos > 0:              # the start of the last line
        lo = max(0, pos - 65536)
        k = os.pread(fd, pos - lo, lo).rfind(b"\n")
        if k >= 0:
            start = lo + k + 1
            break
        pos = lo
    tail = os.pread(fd, size - start, start)
    line_no = os.pread(fd, start, 0).count(b"\n") + 1 if start <= (64 << 20) else 0
    where = f"{p}:{line_no}" if line_no else str(p)
    try:
        complete = isinstance(json.loads(tail), dict)
    except ValueError:
        complete = False
    if complete:
        os.write(fd, b"\n")
        os.fsync(fd)
        return [f"{where}: the last record had no final newline; added it (the record is kept)"]
    os.ftruncate(fd, start)
    os.fsync(fd)
    return [f"{where}: removed a torn last line ({size - start} bytes of an interrupted write); "
            "its configuration is measured again"]


def write_all(path: str | os.PathLike, records: Iterable[Record]) -> None:
    """Write a whole results file atomically (temp file + os.replace), e.g. for merge."""
    p = Path(path)
    lines = [_checked(r, str(p)) for r in records]      # all checked before the file is touched
    atomic_write(p, "".join(line + "\n" for line in lines))

