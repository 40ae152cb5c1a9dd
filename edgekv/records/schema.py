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
The environment is typed too (:class:`Environment`: the keys edgekv collects, and ``extra`` for the rest); from
schema 4 it carries the code identity, ``edgekv_commit`` and ``edgekv_dirty`` (older records: unknown).

The blocks are defined in :mod:`edgekv.records.blocks` (asked, predicted, environment) and
:mod:`edgekv.records.measured` (reported by llama.cpp, measured); this module is their public namespace (every block
is importable from here, as callers do: ``from edgekv.records import schema as S``), and holds the record kinds,
decoding and encoding, the builders and the JSON Schema.

Units are in the field names (``_bytes``, ``_mib``, ``_s``, ``_ns``, ``_ts`` = tokens per second).
The keys of committed schema-2 files are kept as they are (``mean_ts`` etc.).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any, Union

import msgspec
from msgspec import UNSET, Struct, UnsetType

from edgekv.core.memmodel import ProcessPrediction
from edgekv.core.stats import summarize
from edgekv.errors import ResultsError
from edgekv.records.blocks import (
    ENVIRONMENT_KEYS,
    BufMiB,
    CacheLine,
    Engine,
    Environment,
    ExtraBuffersPreflight,
    Formula,
    FormulaCache,
    Model,
    Nvidia,
    NvidiaDevice,
    OptFloat,
    OptInt,
    OptStr,
    PredictedAfter,
    Prediction,
    Process,
    ProcessPart,
    QualitySettings,
    Settings,
    SpeedAdjustment,
    SpeedPart,
    SpeedPrediction,
    SpeedTestPrediction,
    doc,
    environment,
)
from edgekv.records.measured import (
    CacheTypes,
    Corpus,
    Differences,
    Effective,
    Failure,
    LlamaBench,
    LlamaBenchContext,
    LlamaLog,
    Load,
    LoadWindow,
    Memory,
    MemoryResidual,
    Plan,
    Quality,
    QualityPass,
    QualityStats,
    Serving,
    Speed,
    SpeedResidual,
    SpeedTest,
    TestMemory,
    Timing,
)

SCHEMA_VERSION = 5

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


# -- the record ---------------------------------------------------------------------------------------

class Record(Struct, kw_only=True, forbid_unknown_fields=True, tag_field="kind"):
    """One configuration: what was asked, predicted, reported by llama.cpp, and measured.

    The blocks every kind may carry; each kind is its own type (:data:`AnyRecord`, a union tagged by ``kind``)
    and declares the blocks it requires.  Use a kind's type, never this base.
    """

    schema_version: doc(int, "schema version (see edgekv.records.results)")
    config_key: doc(OptStr, "hash of the model sha256 and the key settings (edgekv.records.results.KEY_SETTINGS); "
                           "None for an imported llama-bench row")
    status: doc(str, "ok | failed | skipped | invalid | ...")
    reason: doc(OptStr, "why not ok")
    time_utc: doc(Union[str, None, UnsetType], "when (ISO 8601, UTC)") = UNSET
    edgekv: doc(Union[str, UnsetType], "edgekv version that wrote it (absent: an imported llama-bench row)") = UNSET
    source_file: doc(Union[str, UnsetType], "the llama-bench file an imported row came from") = UNSET
    model: doc(Model, "the model")
    settings: doc(Settings, "what was asked")
    prediction: doc(Union[Prediction, UnsetType], "predicted: formula, llama.cpp dry run, whole process "
                                                 "(absent only in an imported llama-bench row)") = UNSET
    environment: doc(Environment, "reproducibility fingerprint (typed; what else a platform exposes: extra)")
    effective: doc(Union[Effective, None, UnsetType], "what llama.cpp used") = UNSET
    llama_log: doc(Union[LlamaLog, None, UnsetType], "what llama.cpp printed in the run") = UNSET
    speed: doc(Union[Speed, None, UnsetType], "speed per test (pp, tg)") = UNSET
    serving: doc(Union[Serving, UnsetType], "llama-server under a real client: latency and throughput "
                                           "(settings.engine llama-server)") = UNSET
    timing: doc(Union[Timing, None, UnsetType], "wall-clock phases") = UNSET
    restore: doc(Union[str, None, UnsetType], "how depth state was restored between repetitions") = UNSET
    snapshot_bytes: doc(Union[int, UnsetType], "bytes of the saved depth state") = UNSET
    memory: doc(Union[Memory, None, UnsetType], "measured memory") = UNSET
    llama_bench: doc(Union[LlamaBench, None, UnsetType], "llama-bench's own fields (kind llama-bench)") = UNSET
    differences: doc(Union[Differences, None, UnsetType], "measured - predicted") = UNSET
    quality: doc(Union[Quality, None, UnsetType], "perplexity / KL divergence") = UNSET
    memory_residual: doc(Union[MemoryResidual, None, UnsetType], "measured - predicted peak RSS") = UNSET
    speed_residual: doc(Union[SpeedResidual, None, UnsetType], "measured - predicted tokens/s (schema 3)") = UNSET
    load: doc(Union[Load, None, UnsetType], "other work on the machine during the run (edgekv bench)") = UNSET
    plan: doc(Union[Plan, None, UnsetType], "time estimate vs wall time (edgekv bench)") = UNSET
    machine: doc(Union[str, UnsetType], "machine label added by `edgekv merge` (device and host)") = UNSET
    failure: doc(Union[Failure, UnsetType], "where and why the measuring process died (status failed)") = UNSET
    llama_cpp_args: doc(Union[list[str], UnsetType], "the llama-cli / llama-server arguments of this configuration "
                                                     "(edgekv.core.llamacmd): reproduce it with llama.cpp alone") = UNSET

    @property
    def kind(self) -> str:
        """What produced the record: ``bench``, ``llama-bench``, ``predict`` or ``quality`` (the type's tag)."""
        return self.__struct_config__.tag


class BenchRecord(Record, kw_only=True, tag="bench"):
    """``edgekv bench`` (edgekv's child process, the user's llama-bench or llama-server): every identifying block
    is required, and the measured ones are present unless the configuration was skipped or failed."""

    config_key: doc(str, "hash of the model sha256 and the key settings (edgekv.records.results.KEY_SETTINGS)")
    time_utc: doc(str, "when (ISO 8601, UTC)")
    edgekv: doc(str, "edgekv version that wrote it")
    prediction: doc(Prediction, "predicted: formula, llama.cpp dry run, whole process, speed")

    def __post_init__(self) -> None:
        for key, value in (("model.arch", self.model.arch), ("settings.n_ctx", self.settings.n_ctx),
                           ("settings.engine", self.settings.engine)):
            if value is UNSET or value is None:
                raise ValueError(f"{key}: missing in a bench record")


class LlamaBenchRecord(Record, kw_only=True, tag="llama-bench"):
    """One row of a llama-bench JSON file, imported (``edgekv report FILE.json``): no prediction, no config key;
    its environment is what llama-bench printed."""

    config_key: doc(None, "an imported row identifies no edgekv configuration") = None


class PredictRecord(Record, kw_only=True, tag="predict"):
    """``edgekv predict --json``: the formula, and llama.cpp's dry run and the whole-process prediction when they
    were asked; nothing measured (built by :func:`predict_record`)."""

    config_key: doc(None, "a prediction is not a measured configuration") = None
    prediction: doc(Prediction, "predicted: formula, llama.cpp dry run, whole process")


class QualityRecord(Record, kw_only=True, tag="quality"):
    """``edgekv quality --json``: perplexity and KL divergence of one configuration against the f16-KV baseline."""

    quality: doc(Union[Quality, None], "perplexity / KL divergence (None: the pass computed none)")


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

    summ = summarize(samples_ts)
    return SpeedTest(
        n_tokens=n_tokens, samples_ns=samples_ns, samples_ts=samples_ts, mean_ts=summ["mean"], stdev_ts=summ["stdev"],
        ci95_ts=summ["ci95"], cv=summ["cv"], unstable=summ["unstable"], llama_bench_avg_ts=llama_bench_avg_ts)


def predict_record(*, model_path: str, arch: str | None, weights_bytes: int | None, formula: Formula | dict[str, Any],
                   engine: Any = UNSET, process: Any = UNSET, settings: dict[str, Any] | None = None,
                   source_file: str | None = None, key_settings: tuple[str, ...] = (),
                   environment: dict[str, Any] | None = None) -> PredictRecord:
    """A record of kind ``predict`` (``edgekv predict --json``): the formula, and llama.cpp's dry run and the
    whole-process prediction when they were made; nothing measured.

    ``formula`` is :func:`edgekv.core.formula.formula_block`'s (with its ``saving_vs_f16`` for predict), or an
    older ``predict --json`` row's formula keys (a dict, checked here);
    ``engine`` and ``process`` are left out when ``UNSET`` (not asked) and kept as None when asked but not
    predicted.  ``settings`` are the asked values (every key setting present, None where a prediction has none:
    pass ``key_settings`` to name them all).  The model is named after its file (the reports' model column).
    ``environment``: what the caller collected (e.g. the edgekv version and code identity); empty by default.
    Decoded strictly: a block of the wrong shape is an error here, not a dash later.  Encode with :func:`encode`."""
    def get(k: str) -> Any:
        return getattr(formula, k) if isinstance(formula, Formula) else formula.get(k)

    st: dict[str, Any] = {k: None for k in key_settings}
    st.update(settings or {k: get(k) for k in ("n_ctx", "type_k", "type_v", "flash_attn", "swa_full", "n_seq_max",
                                               "kv_unified", "n_batch", "n_ubatch")})
    prediction: dict[str, Any] = {"formula": formula}
    if engine is not UNSET:
        prediction["engine"] = engine
    if process is not UNSET:
        prediction["process"] = process
    obj: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "kind": "predict", "config_key": None,
        "status": "ok" if get("status") == "ok" else "skipped", "reason": get("reason"),
        "model": {"path": model_path, "name": Path(model_path).stem if model_path else None, "arch": arch,
                  "sha256": None, "size_bytes": weights_bytes},
        "settings": st, "prediction": prediction, "environment": dict(environment or {}),
    }
    if source_file is not None:
        obj["source_file"] = source_file
    return msgspec.convert(obj, PredictRecord, strict=True)


def process_block(p: ProcessPrediction) -> Process:
    """``prediction.process`` from the whole-process model's prediction: its parts embedded as they are."""
    return Process(workload=p.workload, peak_rss_bytes=p.peak_rss_bytes, device_bytes=dict(p.device_bytes),
                   parts=list(p.parts), notes=list(p.notes))


def model_block(m: Any, sha: str | None) -> Model:
    """The one builder of the ``model`` block, from a loaded model (:class:`edgekv.prediction.api.LoadedModel`)."""

    sh = m.shape
    attn = [lay for lay in sh.layers if lay.attn_cache]
    return Model(
        path=os.path.abspath(m.ref.path), name=sh.name or m.ref.name, spec=m.ref.spec, source=m.ref.source,
        sha256=sha, arch=sh.arch, memory=sh.memory, size_bytes=m.header.weights_bytes, file_bytes=m.header.file_size,
        n_layer=sh.n_layer_all, n_ctx_train=sh.n_ctx_train,
        n_head_kv=sorted({lay.n_head_kv for lay in attn}) or None, head_dim_k=sorted({lay.head_k for lay in attn}) or None,
        n_swa=sh.n_swa or None, swa_layers=len([lay for lay in sh.layers if lay.is_swa and lay.attn_cache]),
        shared_kv_layers=len([lay for lay in sh.layers if not lay.has_kv]),
        recurrent_layers=len([lay for lay in sh.layers if lay.recr_state]), mla=sh.is_mla)


def growth_minus_formula_bytes(growth_bytes: int | None, formula_bytes: int | None) -> int | None:
    """The one measured-minus-formula difference: memory a context added (measured) minus the formula's cache bytes."""
    if growth_bytes is None or formula_bytes is None:
        return None
    return growth_bytes - formula_bytes

def json_schema() -> dict[str, Any]:
    """The JSON Schema of a record, generated from the types (committed as results.schema.json).  Every description
    is the type's docstring as :func:`inspect.cleandoc` cleans it: msgspec 0.23 cleans them itself, 0.22 and before
    kept their indentation, and the committed file must not depend on which one pip chose."""

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

    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def write_schema_file() -> Path:
    """Regenerate the committed JSON Schema:
    ``python -c "from edgekv.records.schema import write_schema_file as w; print(w())"``."""
    SCHEMA_FILE.write_text(schema_text())
    return SCHEMA_FILE



__all__ = [
    "SCHEMA_VERSION", "KINDS", "PROVENANCE", "UNSET", "Record", "BenchRecord", "LlamaBenchRecord", "PredictRecord",
    "QualityRecord", "AnyRecord", "KIND_TYPES", "RECORD_KEYS", "decode", "encode", "encode_block", "speed_test",
    "predict_record", "process_block", "model_block", "growth_minus_formula_bytes", "json_schema", "SCHEMA_FILE", "schema_text",
    "write_schema_file",
    # the blocks (edgekv.records.blocks, edgekv.records.measured)
    "BufMiB", "CacheLine", "CacheTypes", "Corpus", "Differences", "Effective", "Engine", "environment",
    "Environment", "ENVIRONMENT_KEYS", "ExtraBuffersPreflight", "Failure", "Formula", "FormulaCache", "LlamaBench",
    "LlamaBenchContext", "LlamaLog", "Load", "LoadWindow", "Memory", "MemoryResidual", "Model", "Nvidia",
    "NvidiaDevice", "OptFloat", "OptInt", "OptStr", "Plan", "PredictedAfter", "Prediction", "Process", "ProcessPart",
    "Quality", "QualityPass", "QualitySettings", "QualityStats", "Serving", "Settings", "Speed", "SpeedAdjustment",
    "SpeedPart", "SpeedPrediction", "SpeedResidual", "SpeedTest", "SpeedTestPrediction", "TestMemory", "Timing",
]
