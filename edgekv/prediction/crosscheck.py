"""Formula vs engine: does edgekv's prediction say exactly what llama.cpp said?

llama.cpp prints each cache object's size, K, V (or R, S) in MiB with two decimals, computed in
float32.  ``predict.llama_mib`` formats the predicted byte counts the same way, so the comparison is
an exact string comparison of every printed field, plus the cell, layer and stream counts.  Because
the cell counts are compared exactly and, at large contexts, 0.01 MiB is below one byte per cell,
agreement over a grid that includes large contexts pins the bytes exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil

from edgekv.core.childwire import ExtraBuffersRequest, to_wire
from edgekv.core.memmodel import extra_buffer_bytes
from edgekv.core.predict import STATUS_OK, STATUS_UNSUPPORTED, KVPrediction, llama_mib
from edgekv.core.units import MIB
from edgekv.runtime.engine import EngineResult, loadable_path
from edgekv.runtime.process import run_child, worker_argv


def _mib_double(n_bytes: int) -> str:
    """llama_dsv4_comp_state prints ``total_size()/1024.0/1024.0`` in double precision (llama-kv-cache-dsv4.cpp:998)."""
    return f"{n_bytes / 1048576.0:.2f}"


def expected_lines(pred: KVPrediction) -> list[dict]:
    out = []
    for c in pred.caches:
        if c.kind == "recurrent":
            out.append({"kind": "recurrent", "mib": llama_mib(c.bytes), "cells": c.cells,
                        "r_mib": llama_mib(c.r_bytes), "s_mib": llama_mib(c.s_bytes)})
        elif c.kind == "dsv4_state":
            out.append({"kind": "state", "role": c.name, "mib": _mib_double(c.state_bytes), "cells": c.cells,
                        "width": c.width, "layers": len(c.layers), "streams": c.n_stream, "rs_seq": c.rs_seq})
        else:
            out.append({"kind": "kv", "role": c.role,
                        "mib": llama_mib(c.bytes), "cells": c.cells, "layers": len(c.layers),
                        "streams": c.n_stream, "type_k": c.type_k, "type_v": c.type_v,
                        "k_mib": llama_mib(c.k_bytes), "v_mib": llama_mib(c.v_bytes)})
    return out


def engine_lines(res: EngineResult) -> list[dict]:
    out = []
    for c in res.log.caches:
        if c.kind == "recurrent":
            out.append({"kind": "recurrent", "mib": c.mib, "cells": c.cells, "r_mib": c.r_mib, "s_mib": c.s_mib})
        elif c.kind == "state":
            out.append({"kind": "state", "role": c.role, "mib": c.mib, "cells": c.cells, "width": c.width,
                        "layers": c.layers, "streams": c.streams, "rs_seq": c.rs_seq})
        else:
            out.append({"kind": "kv", "role": c.role, "mib": c.mib, "cells": c.cells, "layers": c.layers,
                        "streams": c.streams, "type_k": c.type_k, "type_v": c.type_v,
                        "k_mib": c.k_mib, "v_mib": c.v_mib})
    return out


def compare(pred: KVPrediction, res: EngineResult) -> list[str]:
    """Differences between formula and engine, as readable strings; empty when they agree."""
    diffs: list[str] = []
    pred_ok = pred.status == STATUS_OK
    if pred_ok != res.ok:
        if pred_ok:
            diffs.append(f"edgekv predicted a valid context but llama.cpp refused it: {res.error}")
        else:
            diffs.append(f"edgekv said {pred.status} ({pred.reason}) but llama.cpp created the context")
        return diffs
    if not pred_ok:
        return diffs
    for name, got, want in (("n_ctx", res.n_ctx, pred.n_ctx_padded), ("n_ctx_seq", res.n_ctx_seq, pred.n_ctx_seq),
                            ("n_ubatch", res.n_ubatch, pred.n_ubatch)):
        if got is not None and got != want:
            diffs.append(f"{name}: engine {got}, formula {want}")
    exp, got_lines = expected_lines(pred), engine_lines(res)
    # the recurrent line is printed in a position that depends on the memory type: compare by kind
    diffs += _compare_kind(exp, got_lines, "kv", "KV cache", lambda i, e: f"KV cache {i} ({e.get('role') or 'kv'})")
    diffs += _compare_kind(exp, got_lines, "state", "compressor state", lambda i, e: f"{e['role']} compressor state")
    diffs += _compare_kind(exp, got_lines, "recurrent", "recurrent state", lambda i, e: "recurrent state")
    return diffs


def _compare_kind(exp: list[dict], got: list[dict], kind: str, what: str,
                  label: Callable[[int, dict], str]) -> list[str]:
    """The differences between the formula's and llama.cpp's cache lines of one ``kind``: their count, then each
    line's fields in order (``label`` names the i-th line)."""
    exp_k, got_k = [x for x in exp if x["kind"] == kind], [x for x in got if x["kind"] == kind]
    diffs = [] if len(exp_k) == len(got_k) else [f"{what} objects: engine {len(got_k)}, formula {len(exp_k)}"]
    for i, (e, g) in enumerate(zip(exp_k, got_k)):
        diffs += [f"{label(i, e)} {k}: engine {g.get(k)}, formula {e[k]}" for k in e if e[k] != g.get(k)]
    return diffs


def engine_block(pred: Any, res: Any, weights_bytes: int | None = None) -> dict[str, Any]:
    """The one serialiser of llama.cpp's dry run beside the formula (``prediction.engine``; sweep and predict).

    ``pred`` a :class:`~edgekv.core.predict.KVPrediction`, ``res`` an :class:`~edgekv.runtime.engine.EngineResult`.
    With ``weights_bytes`` (the tensor table's weights), ``total_bytes`` = weights + caches + compute + output
    buffers.  ``match`` is None where edgekv does not model the cache (nothing to compare)."""
    if pred.status == STATUS_UNSUPPORTED:
        d: dict[str, Any] = {"ok": res.ok, "error": res.error, "match": None, "diffs": []}
    else:
        diffs = compare(pred, res)
        d = {"ok": res.ok, "error": res.error, "match": not diffs, "diffs": diffs}
    if res.ok:
        log = res.log
        d.update({"caches": engine_lines(res), "kv_mib": round(log.kv_mib_total, 2),
                  "recurrent_mib": round(log.recurrent_mib_total, 2), "state_mib": round(log.state_mib_total, 2),
                  "other_buffers_mib": log.other_buffers, "compute_mib": log.compute_buffers,
                  "output_mib": log.output_buffers, "flash_attn_resolved": log.fa_resolved, "n_ctx": res.n_ctx,
                  "graph": log.graph})
        if log.placement is not None and any(not b.upper().startswith("CPU") for b in log.placement["nodes"]):
            d["off_device"] = log.placement["off_device"]
        if weights_bytes is not None:
            # caches: the formula's bytes; llama.cpp's printed MiB where edgekv does not model the cache (buffers of
            # kinds the log parser does not know included, so a newer cache class never hides its bytes)
            other = sum(log.other_buffers.values())
            caches = pred.total_bytes if pred.status == STATUS_OK else (log.caches_mib_total + other) * MIB
            d["total_bytes"] = int(weights_bytes + caches + (log.compute_mib_total + log.output_mib_total) * MIB)
            d["total_caches_from"] = "formula" if pred.status == STATUS_OK else "llama.cpp"
    return d


# -- the CPU backend's extra buffers (AMX, CPU_REPACK): formula beside llama.cpp's own load ---------------------

EXTRA_CHECK_MAX_SHARE = 0.25      # a real load allocates the extra buffers: at most this share of available memory


def extra_buffer_check(m, cpu_features: list[str], use_extra_bufts: bool = True,
                       timeout: float = 300.0) -> dict[str, Any]:
    """{"formula": {buft: MiB}, "llama": {buft: MiB} | None, "same": bool | None, "note": str}.

    llama.cpp's dry run allocates no weights (its model buffer lines print 0.00), so its own figure for the extra
    buffers comes from a real load in a child (of the header's sparse stand-in when only the header is here: the
    holes read as zeros), skipped with the reason when the mapped file and the copies would take more than a quarter
    of the memory available now."""
    formula = {k: round(b / MIB, 2) for k, (b, _n) in
               extra_buffer_bytes(m.header.tensors, cpu_features, use_extra_bufts).items()}
    out: dict[str, Any] = {"formula": formula, "llama": None, "same": None, "note": ""}
    # a real load maps the whole file with MAP_POPULATE (src/llama-model.cpp:1812 init_mappings(prefetch=true),
    # src/llama-mmap.cpp:480): every page of it becomes resident, then the copies are allocated
    need = sum(formula.values()) * MIB + m.header.file_size
    avail = psutil.virtual_memory().available
    if need > EXTRA_CHECK_MAX_SHARE * avail:
        out["note"] = (f"llama.cpp's figure not read: a real load would map the {m.header.file_size / MIB:.0f} MiB file "
                       f"and allocate {sum(formula.values()):.0f} MiB of weight copies, more than a quarter of the "
                       f"{avail / MIB:.0f} MiB available")
        return out
    with loadable_path(m.ref.path, m.header) as (path, _sparse):
        res = run_child(worker_argv("extra_buffers"),
                        to_wire(ExtraBuffersRequest(model_path=path, repack=use_extra_bufts)), timeout=timeout)
    r = res.result or {}
    if not res.ok or not r.get("ok"):
        out["note"] = f"llama.cpp's figure not read: {res.failure_reason() or 'the load failed'}"
        return out
    llama = {k: float(v) for k, v in (r.get("buffers") or {}).items() if k in ("AMX", "CPU_REPACK")}
    out.update(llama=llama, same=llama == formula)
    return out


def extra_buffer_line(check: dict[str, Any]) -> str:
    """One line for ``predict --engine``: each extra buffer, formula and llama.cpp."""
    f, ll = check["formula"], check["llama"]
    names = sorted(set(f) | set(ll or {}))
    if not names:
        return "extra buffers (AMX, CPU_REPACK): none for this model on this build (formula" + (
            " and llama.cpp agree)" if ll is not None else f"; {check['note']})")
    cells = []
    for n in names:
        a = f"{f.get(n, 0.0):.2f} MiB formula"
        b = f", {ll.get(n, 0.0):.2f} MiB llama.cpp {'✓' if ll.get(n) == f.get(n) else '✗'}" if ll is not None else ""
        cells.append(f"{n} {a}{b}")
    return "extra buffers: " + "; ".join(cells) + (f" ({check['note']})" if check["note"] else "")
