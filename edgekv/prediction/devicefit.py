"""``predict --device metal --device-memory SIZE``: will each configuration fit a Mac with that much unified memory?

The rules are llama.cpp's Metal backend as edgekv.core.devicemem states them (with the public logs that show each):
every Metal buffer is shared RAM that also counts against the GPU working set, and memory-mapped weights are wrapped
as ``Metal_Mapped`` buffers, not copied.  So the working set holds the weights and the KV cache, both predicted
exactly from the header, plus Metal's compute buffer, which llama.cpp sizes by a Metal dry run that cannot run here:
it is not predicted, and the answer says "at least" rather than guess it.  The rest of the process (runtime,
llama.cpp's host structures, the output buffer) is host RAM from the same prediction as this machine's rows.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from edgekv.core.devicemem import metal_fit
from edgekv.core.fit import size

ON_DEVICE = ("weights (mmap)", "weights (--no-mmap)", "KV cache")     # Metal_Mapped / Metal buffers
NOT_PREDICTED = ("compute buffer", "thread work buffer")              # Metal's own compute buffer replaces these
# this CPU's load phases of the mapping (pages unmapped after a CPU load, held until loaded): on a Mac every tensor
# stays in the Metal mapping, so neither applies.  The weights are counted once, as "weights (mmap)": the Metal
# buffer is the file mapping itself (src/llama-model.cpp:1854-1868, ggml-metal-device.m:2214), and the CPU_Mapped
# token_embd buffer a Metal log prints beside it is pages of the same file, not more memory.
CPU_PHASES = ("weights (mmap) unmapped after loading", "weights (mmap) until loaded")


def metal_rows(records: list[Any], ram_bytes: int, working_set_bytes: int | None = None) -> list[dict[str, Any]]:
    """One row per predicted configuration: its Metal buffers, its host RAM and whether it fits (edgekv.core.devicemem
    metal_fit), the compute buffer left out and said so."""
    rows = []
    for r in records:
        proc = r.prediction.process
        if proc is UNSET or proc is None or not proc.parts:
            continue
        parts = {p.name: int(p.bytes) for p in proc.parts}
        device = sum(b for n, b in parts.items() if n in ON_DEVICE)
        # CPU_REPACK / AMX copies are this CPU's: with every layer on Metal there is none
        host = sum(b for n, b in parts.items() if n not in ON_DEVICE and n not in NOT_PREDICTED
                   and n not in CPU_PHASES and not n.endswith(" copy)"))
        f = r.prediction.formula
        rows.append({"n_ctx": f.n_ctx, "type_k": f.type_k, "type_v": f.type_v, **metal_fit(device, host, ram_bytes,
                                                                                             working_set_bytes),
                     "ram_bytes": ram_bytes, "compute_buffer": "not predicted: llama.cpp sizes Metal's by a Metal "
                                                               "dry run, which cannot run here"})
    return rows


def metal_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What predict prints: the limits once, then a line per configuration."""
    if not rows:
        return []
    r0 = rows[0]
    out = [f"on a Mac with {size(r0['ram_bytes'])} (Metal, GPU working set {size(r0['working_set_bytes'])}: "
           f"{r0['basis']}); weights and KV on the GPU, the compute buffer not predicted for Metal, so each is a lower "
           f"bound; {r0['overhead']}:"]
    for r in rows:
        kv = r["type_k"] if r["type_k"] == r["type_v"] else f"{r['type_k']}/{r['type_v']}"
        verdict = ("fits" if r["fits_working_set"] and r["fits_ram"] else
                   "does not fit the working set (macOS pages it: slow)" if r["fits_ram"] else "does not fit in RAM")
        out.append(f"  {r['n_ctx']} {kv}: at least {size(r['device_bytes'])} on the GPU + "
                   f"{size(r['host_bytes'])} host: {verdict}")
    return out
