"""``edgekv explain``'s checks beyond the cache size lines: the KV buffer printed per device, a log cut short, a log
that loads its model twice, and the verdict ``explain --check`` gates on.

Pure: lines, the parsed log (:mod:`edgekv.core.llamalog`, :mod:`edgekv.core.logconfig`) and the prediction
:func:`edgekv.core.explain.kv_check` made.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from edgekv.core.explainschema import ExplainReport
from edgekv.core.llamalog import RE_KV_BUFFER, RE_KV_SELF, RE_KV_SIZE, RE_RS_SIZE, LlamaMemoryLog, is_host_buffer
from edgekv.core.logconfig import LogConfig
from edgekv.core.predict import llama_mib

RE_LOAD_START = re.compile(r"llama_model_loader: loaded meta data with \d+ key-value pairs and \d+ tensors from "
                           r"(?P<path>.*?) \(version")
MAIN_KV_KINDS = ("full", "swa", "mla", "indexer", "csa", "hca", "main")


def last_load(lines: list[str]) -> tuple[list[str], int]:
    """The lines of the last load of a model loaded more than once in one process (ollama loads the vocabulary
    first, then the model), and how many loads of it the log holds.  The lines before the first load (build,
    devices) and the device lines between loads are kept; a log whose loads are of different files is left whole
    (its first model is the one explained)."""
    starts = [(i, m["path"]) for i, x in enumerate(lines) if (m := RE_LOAD_START.search(x))]
    if len(starts) < 2 or len({p for _, p in starts}) != 1:
        return lines, len(starts)
    first, last = starts[0][0], starts[-1][0]
    between = [x for x in lines[first:last] if "using device" in x]
    return lines[:first] + between + lines[last:], len(starts)


# the oldest llama.cpp build whose log spellings explain reads; older logs use others
FIRST_BUILD = 4400
# spellings only builds from b4400 on print (the src/llama.cpp split renamed llm_load_print_meta and llm_load_tensors)
RE_CURRENT_SPELLING = re.compile(r"(?<!llm_)\b(?:print_info|load_tensors):")


def build_counter_note(lines: list[str], cfg: LogConfig) -> str | None:
    """When the build line gives a number below b4400 but the log is in the spelling of later builds, the number is
    not llama.cpp's (AMD's prebuilt Windows ROCm build prints its own counter, ``build: 1239 (b8372ee)`` for b7146):
    the build is taken as unknown and this note says so.  None when the number is plausible or the log is old."""
    if cfg.build_number is None or cfg.build_number >= FIRST_BUILD:
        return None
    if not any(RE_CURRENT_SPELLING.search(x) for x in lines):
        return None
    return (f"the build line says {cfg.build}, but the log is in the spelling of b{FIRST_BUILD} and later "
            "(print_info, load_tensors): the number is a packager's own counter, not llama.cpp's; the build is "
            "taken as unknown")


def cut_status(lines: list[str], mem: LlamaMemoryLog) -> str | None:
    """Why the log is cut short, or None.  A log whose last line is a KV line that stops mid-way, or that created a
    context (KV lines) yet printed no compute buffer, ends before llama.cpp finished allocating."""
    last = next((x for x in reversed(lines) if x.strip()), "")
    if ("kv_cache" in last or "KV self size" in last) and "size" in last and not any(
            rx.search(last) for rx in (RE_KV_SIZE, RE_KV_BUFFER, RE_KV_SELF, RE_RS_SIZE)):
        return f"cut: the log ends inside a KV line ({last.strip()[-60:]!r})"
    if (mem.kv_buffers or mem.caches or mem.kv_self) and not mem.compute_buffers:
        return ("cut: the log ends before llama.cpp reserved the compute buffers (truncated, or the context failed "
                "there); no device total is complete")
    return None


def _layer_devices(cfg: LogConfig, mem: LlamaMemoryLog, n_layer_all: int) -> tuple[dict[int, str], str] | None:
    """The device each layer's KV lives on, by llama.cpp's layer assignment (src/llama-model.cpp:1556-1600): the last
    ``ngl`` of the ``n_layer + 1`` layers on the GPUs, split by each device's share of free memory at load (the
    default, without -ts), the rest on the CPU; the KV follows its layer (src/llama-kv-cache.cpp:215-219, unless
    -nkvo).  None (with the reason) when the log does not state what that needs."""
    gpus = [d for d in cfg.devices if not str(d["name"]).upper().startswith("CPU")]
    dev_bufs = [k for k in mem.kv_buffers if not is_host_buffer(k)]
    if not dev_bufs:
        why = ("no KV offload (-nkvo): every layer's KV on the host" if gpus and cfg.offloaded and cfg.offloaded[0]
               else "no GPU device: every layer's KV on the CPU")
        return {il: "CPU" for il in range(n_layer_all)}, why
    if cfg.offloaded is None:
        return None
    n_gpu, total = cfg.offloaded
    if n_gpu and not gpus:
        names = sorted(dev_bufs)
        if len(names) != 1:
            return None
        gpus = [{"name": names[0], "free_mib": 1}]
    if n_gpu and any(d.get("free_mib") is None for d in gpus) and len(gpus) > 1:
        return None
    free = [float(d.get("free_mib") or 1) for d in gpus]
    splits, acc = [], 0.0
    for f in free:
        acc += f
        splits.append(acc / sum(free))
    # the first offloaded layer: 0 at full offload; else the log's "offloading N repeating layers" (builds before
    # mid-2025 counted -ngl from the repeating layers, n_layer - ngl; later ones count the output layer as layer
    # n_layer, n_layer + 1 - ngl)
    start = (0 if n_gpu >= total else n_layer_all - cfg.repeating_offloaded if cfg.repeating_offloaded is not None
             else total - n_gpu)
    out = {}
    for il in range(n_layer_all):
        if il < start or not gpus:
            out[il] = "CPU"
            continue
        x = (il - start) / n_gpu
        out[il] = gpus[next((i for i, s in enumerate(splits) if s > x), len(gpus) - 1)]["name"]
    how = f"{n_gpu}/{total} layers offloaded" + (f", split by free memory over {len(gpus)} devices" if len(gpus) > 1
                                                   else "")
    return out, how


def kv_buffer_rows(cfg: LogConfig, mem: LlamaMemoryLog, kv: dict[str, Any]) -> dict[str, Any]:
    """Each device's printed KV buffer against the bytes of the layers llama.cpp assigns it (:func:`_layer_devices`),
    at the log's cell counts."""
    pred = kv.get("prediction")
    if not mem.kv_buffers:
        return {"status": "no KV buffer line in the log", "rows": []}
    if pred is None or kv.get("shape") is None:
        return {"status": "not predicted: " + kv["status"], "rows": []}
    contexts = max([len(mem.kv_self), *Counter(c.role or "full" for c in mem.caches if c.kind == "kv").values()])
    if contexts > 1:                    # one size line per cache per context: several contexts, e.g. worker threads
        return {"status": f"not predicted: the log holds {contexts} contexts, and llama.cpp's KV buffer lines do not "
                          "say which context they belong to", "rows": []}
    if not any(c.kind in MAIN_KV_KINDS and c.per_layer for c in pred.caches):
        return _from_size_lines(mem, kv)
    where = _layer_devices(cfg, mem, kv["shape"].n_layer_all)
    if where is None:
        return {"status": "not predicted: the log does not state the offload (offloaded N/M layers) or each "
                          "device's free memory, which the layer split follows", "rows": []}
    layer_dev, how = where
    cells = {(c.role or "full"): c.cells for c in mem.caches if c.kind == "kv"}
    per_dev: dict[str, int] = {}
    for c in pred.caches:
        if c.kind not in MAIN_KV_KINDS or not c.per_layer:
            continue
        n = cells.get(c.role or "full", c.cells)
        for il, _kw, _vw, kb, vb in c.per_layer:
            dev = layer_dev.get(il, "CPU")
            per_dev[dev] = per_dev.get(dev, 0) + (kb + vb) // c.cells * n
    rows = []
    for name, printed in mem.kv_buffers.items():
        b = per_dev.pop(name, 0)
        row = {"device": name, "printed_mib": f"{printed:.2f}", "predicted_mib": llama_mib(b), "bytes": b}
        row["match"] = row["printed_mib"] == row["predicted_mib"]
        if not row["match"]:
            row["why"] = f"the layer split edgekv follows ({how}) gives {row['predicted_mib']} MiB"
        rows.append(row)
    for name, b in per_dev.items():
        rows.append({"device": name, "printed_mib": None, "predicted_mib": llama_mib(b), "bytes": b, "match": False,
                     "why": "predicted on this device, but the log prints no KV buffer for it"})
    return {"status": f"predicted: {how}", "rows": rows}


def _from_size_lines(mem: LlamaMemoryLog, kv: dict[str, Any]) -> dict[str, Any]:
    """Where edgekv's cache rules give no cache (the size line was recomputed from print_info's widths, e.g. an
    encoder in an early-2025 build), one device's buffer is the size line itself; a split is not predicted."""
    lines = [x for x in kv.get("lines", []) if x.get("role") != "recurrent"]
    if len(mem.kv_buffers) != 1 or not lines or any(x.get("bytes") is None for x in lines):
        return {"status": "not predicted: edgekv's cache rules give no per-layer cache for this build, and the split "
                          "over devices needs them", "rows": []}
    (name, printed), = mem.kv_buffers.items()
    b = sum(x["bytes"] for x in lines)
    row = {"device": name, "printed_mib": f"{printed:.2f}", "predicted_mib": llama_mib(b), "bytes": b}
    row["match"] = row["printed_mib"] == row["predicted_mib"]
    if not row["match"]:
        row["why"] = f"the size line's bytes, all on {name}, give {row['predicted_mib']} MiB"
    return {"status": "predicted: one device holds the KV, the size line's bytes (print_info widths)", "rows": [row]}


def withhold_unfinished_fits(devices: list[dict[str, Any]], cut: str | None) -> None:
    """No fit verdict stands on a log that ends before its compute buffers."""
    if not cut:
        return
    for d in devices:
        if "fits" in d:
            d["fits"] = None
            d["fit_withheld"] = "the log ends before the compute buffers: no verdict on part of the memory"


def disagreements(r: ExplainReport) -> list[str]:
    """What ``explain --check`` fails on: each KV or recurrent-state line that differs from edgekv's prediction, each
    KV buffer that differs from the layer split, a model residual beyond 0.5 % (or the print's rounding), and a log
    cut short.  A line edgekv could not predict is a disagreement too: the check cannot vouch for it."""
    out = [r.cut] if r.cut else []
    for x in r.kv.lines:
        if not x.match:
            out.append(f"KV {x.role}: llama.cpp {x.printed_mib} MiB, edgekv {x.predicted_mib or 'no prediction'} "
                       f"({x.why or 'not predicted'})")
    if not r.kv.lines and r.kv.status.startswith("not predicted"):
        out.append(f"KV: {r.kv.status}")
    for b in r.kv_buffers.rows if r.kv_buffers else []:
        if not b.match:
            out.append(f"KV buffer {b.device}: llama.cpp {b.printed_mib} MiB, edgekv {b.predicted_mib} MiB ({b.why})")
    m = r.model
    if m.status == "predicted" and m.residual_pct is not None and m.predicted_mib:
        slack = max(0.5, 100 * (m.rounding_mib or 0.0) / m.predicted_mib)
        if abs(m.residual_pct) > slack:
            out.append(f"model buffers: {m.compared_mib:.2f} MiB vs {m.predicted_mib:.2f} MiB of tensors "
                       f"({m.residual_pct:+.3f} %)")
    return out
