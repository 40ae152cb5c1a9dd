"""The report's Environment section: where the measured records ran (machine, devices, llama.cpp and edgekv
builds, the edgekv commit, CPU, memory, GPU, OS, command), one column per machine; for predicted-only records, the
statement that nothing was measured and which speed calibration the predicted speeds come from."""

from __future__ import annotations

import os

from edgekv.output.inputs import KIND_PREDICT
from edgekv.output.render import DASH, Section, Table, md_safe
from edgekv.records import frame as F
from edgekv.records.frame import unset_none as _v
from edgekv.records.schema import Environment, Record


def env_section(records: list[Record]) -> Section:
    measured = [r for r in records if r.kind != KIND_PREDICT]
    sec = Section("Environment")
    if not measured:
        cals = _calibrations(records)
        if not cals:
            sec.paragraphs.append("**Predicted only — nothing here was measured.** Every figure in this report comes "
                                  "from the GGUF header (edgekv's formula, and llama.cpp's own dry run where a column "
                                  "says so); no model was run and no machine was measured.")
            return sec
        sec.paragraphs.append("**Predicted only — no model here was run.** Every memory figure comes from the GGUF "
                              "header (edgekv's formula, and llama.cpp's own dry run where a column says so). The "
                              "speed figures are the speed model's (`edgekv/core/speed.py`): the header's shapes and "
                              "weight types times the coefficients of one machine's speed calibration "
                              f"({'; '.join(cals)}), which `edgekv calibrate` measured on small synthetic models "
                              "through llama.cpp; they describe that machine only.")
        return sec
    by_machine: dict[str, list[Record]] = {}
    for r in measured:
        by_machine.setdefault(F.device_label(r), []).append(r)
    labels = sorted(by_machine)
    fields = [
        ("machine", lambda e, rs: F.machine_label(rs[0]) or DASH),
        ("devices (backends)", lambda e, rs: F.device_label(rs[0]).split(": ", 1)[-1]),
        ("llama.cpp", lambda e, rs: " ".join(x for x in (
            f"commit {e.llama_cpp_commit}" if e.llama_cpp_commit else "",
            f"(llama-cpp-python {e.llama_cpp_python})" if e.llama_cpp_python else "",
            f"llama-bench build {e.llama_bench_build_number}" if e.llama_bench_build_number else "") if x)
         or DASH),
        ("edgekv", lambda e, rs: e.edgekv or DASH),
        ("edgekv commit", lambda e, rs: ", ".join(dict.fromkeys(F.code_label(r) for r in rs))),
        ("CPU", lambda e, rs: _cpu(e)),
        ("RAM", lambda e, rs: f"{e.ram_bytes / 1024**3:.1f} GiB" if e.ram_bytes else DASH),
        ("GPU", lambda e, rs: gpu_text(e)),
        ("OS", lambda e, rs: " ".join(str(x) for x in (e.os, f"({e.arch})" if e.arch else "") if x) or DASH),
        ("Python", lambda e, rs: e.python or DASH),
        ("power / governor", lambda e, rs: f"{e.power or DASH} / {e.governor or DASH}"),
        ("llama.cpp system info", lambda e, rs: f"`{e.system_info}`" if e.system_info else DASH),
        ("measured", lambda e, rs: _time_range(rs)),
        ("command", lambda e, rs: f"`{_argv(e)}`" if e.argv else DASH),
        ("CI", lambda e, rs: "yes" if e.ci else "no"),
    ]
    if any(_v(rs[0].environment.extra_buffers_preflight) for rs in by_machine.values()):
        # records written before the preflight existed have no such row: their reports stay as they were
        fields.insert(-3, ("extra buffers (AMX, CPU_REPACK)", lambda e, rs: _extra_buffers(e, rs)))
    rows = []
    for name, fn in fields:
        cells = []
        for lab in labels:
            rs = by_machine[lab]
            cells.append(md_safe(str(fn(rs[0].environment, rs))))
        rows.append([name] + cells)
    heads = [""] + [f"machine {i + 1}" for i in range(len(labels))] if len(labels) > 1 else ["", "value"]
    sec.tables.append(Table("", "", heads, rows, ["l"] * (len(labels) + 1)))
    nmeas = len(measured)
    sec.paragraphs.append(f"{nmeas} measured configuration{'s' if nmeas != 1 else ''}"
                          + (f" on {len(labels)} machines" if len(labels) > 1 else "") + ". Each configuration ran in a "
                          "fresh process; the environment is recorded by the run itself, not typed in.")
    return sec


def _calibrations(records: list[Record]) -> list[str]:
    """The speed calibrations behind the records' predicted speeds: `id` (machine)."""
    out = set()
    for r in records:
        p = _v(r.prediction)
        sp = _v(p.speed) if p is not None else None
        if sp is not None and (_v(sp.tg) is not None or _v(sp.pp) is not None):
            m, via = _v(sp.machine), _v(sp.calibrated_with)
            out.add(f"`{sp.calibration_id}`" + (f" on {m}" if m else "")
                    + (f", measured through {via.split(' at ')[0]}" if via else "")
                    + (" (taken while other work used the CPUs: not this machine's own figures)"
                       if _v(sp.calibration_busy) else ""))
    return sorted(out)


def _extra_buffers(e: Environment, rs: list[Record]) -> str:
    """The extra-buffer preflight's verdict, and the --repack the configurations ran with."""
    pf = _v(e.extra_buffers_preflight)
    if pf is None:
        return DASH
    used = sorted({"1" if F.repack_of(r.settings) else "0" for r in rs})
    verdict = {True: "run here", False: "crash on this CPU" + (" (llama.cpp #20824)" if "AMX" in pf.extra_buffers_mib
                                                                else ""), None: "unknown"}[pf.runs]
    return f"kernels {verdict}: {pf.detail}; measured with --repack {','.join(used)}"


def _cpu(e: Environment) -> str:
    if not e.cpu_model:
        return DASH
    cores = ""
    if e.cpu_count_logical:
        cores = f", {e.cpu_count_logical} logical"
        if e.cpu_count_physical:
            cores += f" / {e.cpu_count_physical} physical cores"
        else:
            cores += " cores"
    return f"{e.cpu_model}{cores}"


def gpu_text(e: Environment) -> str:
    nv = _v(e.nvidia)
    parts = []
    if nv is not None:
        # the typed block names them ``devices`` (the report once read a ``gpus`` key no record had)
        for g in nv.devices or []:
            parts.append(f"{g.name} ({g.memory_total / 1024**3:.0f} GiB)")
        if nv.driver:
            parts.append(f"driver {nv.driver}")
    if _v(e.iogpu_wired_limit_mb) is not None:
        parts.append(f"iogpu.wired_limit_mb={e.iogpu_wired_limit_mb}")
    return ", ".join(parts) or DASH


def _time_range(rs: list[Record]) -> str:
    ts = sorted(str(r.time_utc) for r in rs if _v(r.time_utc))
    if not ts:
        return DASH
    return ts[0] if ts[0] == ts[-1] else f"{ts[0]} … {ts[-1]}"


def _argv(e: Environment) -> str:
    argv = list(e.argv or [])
    if argv:
        argv[0] = os.path.basename(str(argv[0]))
    return " ".join(str(a) for a in argv)
