"""Parse what llama.cpp says about memory in its log.

Pure functions over text.  The format strings are quoted next to each pattern, with their place in
the llama.cpp tree vendored by llama-cpp-python 0.3.36.  Patterns use ``re.search`` so that the
timestamps and level letters that common-based tools (llama-cli, llama-bench -v) put in front of
each line do not matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# src/llama-kv-cache.cpp:301-304
# "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB"
# (older builds named the class llama_kv_cache_unified and printed "%2u seqs" without the stream count, or no
# sequence count at all)
RE_KV_SIZE = re.compile(
    r"llama_kv_cache(?:_unified)?: size = +(?P<mib>[\d.]+) MiB \( *(?P<cells>\d+) cells, +(?P<layers>\d+) layers"
    r"(?:, +(?P<seqs>\d+)(?:/(?P<streams>\d+))? seqs)?\), K \((?P<type_k>\w+)\): +(?P<k_mib>[\d.]+) MiB, "
    r"V \((?P<type_v>\w+)\): +(?P<v_mib>[\d.]+) MiB")
# src/llama-memory-recurrent.cpp:133-136
# "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u seqs %2u rs_seq), R (%s): %7.2f MiB, S (%s): %7.2f MiB, P (%s): %7.2f MiB"
RE_RS_SIZE = re.compile(
    r"llama_memory_recurrent: size = +(?P<mib>[\d.]+) MiB \( *(?P<cells>\d+) cells, +(?P<layers>\d+) layers, +"
    r"(?P<seqs>\d+) seqs(?: +(?P<rs_seq>\d+) rs_seq)?\), R \((?P<type_r>\w+)\): +(?P<r_mib>[\d.]+) MiB, "
    r"S \((?P<type_s>\w+)\): +(?P<s_mib>[\d.]+) MiB(?:, P \((?P<type_p>\w+)\): +(?P<p_mib>[\d.]+) MiB)?")
# src/llama-kv-cache-iswa.cpp:83,100  "creating non-SWA KV cache, size = %u cells" / "creating     SWA KV cache, ..."
RE_ISWA_CREATE = re.compile(r"llama_kv_cache(?:_unified)?_iswa: creating +(?P<which>non-SWA|SWA) KV cache, "
                            r"size = (?P<cells>\d+) cells")
RE_SWA_FULL = re.compile(r"using full-size SWA cache")
# the caches llama.cpp builds from several llama_kv_cache objects announce each one before its size line:
# src/llama-kv-cache-dsa.cpp:31,47 ("creating main KV cache" / "creating indexer KV cache"), llama-kv-cache-msa.cpp:32,44,
# llama-memory-hybrid-idx.cpp:67 (indexer), llama-kv-cache-dsa-iswa.cpp:62,69 ("creating DSA KV cache" then "creating
# SWA KV cache"), llama-kv-cache-dsv4.cpp:1289,1297,1305 (CSA / HCA compressed, lightning-indexer)
RE_CACHE_CREATE = re.compile(
    r"creating (?P<what>main KV cache|indexer KV cache|SWA KV cache|DSV4 CSA compressed KV cache|"
    r"DSV4 HCA compressed KV cache|DSV4 lightning-indexer KV cache)")
CACHE_CREATE_ROLES = {"main KV cache": "main", "indexer KV cache": "indexer", "SWA KV cache": "swa",
                      "DSV4 CSA compressed KV cache": "csa", "DSV4 HCA compressed KV cache": "hca",
                      "DSV4 lightning-indexer KV cache": "indexer"}
# src/llama-kv-cache-dsv4.cpp:998-999
# "%s: %s ratio = %u, state = %u x %u, streams = %u, rs_seq = %u, layers = %zu, size = %7.2f MiB"
RE_DSV4_STATE = re.compile(
    r"llama_dsv4_comp_state: (?P<name>\w+) ratio = (?P<ratio>\d+), state = (?P<rows>\d+) x (?P<width>\d+), "
    r"streams = (?P<streams>\d+), rs_seq = (?P<rs_seq>\d+), layers = (?P<layers>\d+), size = +(?P<mib>[\d.]+) MiB")
# src/llama-kv-cache-dsv4.cpp:992 "%s: %10s DSV4 %s state buffer size = %8.2f MiB"
RE_STATE_BUFFER = re.compile(r"llama_dsv4_comp_state: +(?P<dev>\S+) DSV4 \w+ state buffer size = +(?P<mib>[\d.]+) MiB")
# src/llama-kv-cache.cpp:291 "%s: %10s KV buffer size = %8.2f MiB"
# (llama_kv_cache_init / llama_kv_cache_unified / init in older builds)
RE_KV_BUFFER = re.compile(r"(?:llama_kv_cache\w*|init): +(?P<dev>\S+) KV buffer size = +(?P<mib>[\d.]+) MiB")
# src/llama-memory-recurrent.cpp:124 "%s: %10s RS buffer size = %8.2f MiB"
RE_RS_BUFFER = re.compile(r"llama_memory_recurrent: +(?P<dev>\S+) RS buffer size = +(?P<mib>[\d.]+) MiB")
# src/llama-context.cpp:740 "%s: %10s compute buffer size = %8.2f MiB"
RE_COMPUTE = re.compile(
    r"(?:sched_reserve|llama_context|graph_reserve|reserve|llama_init_from_model|llama_new_context_with_model)\w*: +"
    r"(?P<dev>\S+) compute buffer size = +(?P<mib>[\d.]+) MiB")
# src/llama-context.cpp:381 "%s: %10s  output buffer size = %8.2f MiB"
RE_OUTPUT = re.compile(r"(?:llama_context|llama_init_from_model|llama_new_context_with_model): +(?P<dev>\S+) +"
                       r"output buffer size = +(?P<mib>[\d.]+) MiB")
# src/llama-model.cpp:1930 "%s: %12s model buffer size = %8.2f MiB"
# (some builds print the same table from print_backend_buffers_info, a helper load_tensors calls)
RE_MODEL_BUFFER = re.compile(r"(?:(?:llm_)?load_tensors|print_backend_buffers_info): +(?P<dev>\S+) model buffer size = "
                             r"+(?P<mib>[\d.]+) MiB")
# src/llama-context.cpp:306-318 "%s: n_ctx                 = %u": a context parameter, the one reading of the line
# (edgekv.core.logconfig and the quality child read it through context_param).  Older builds printed it from
# llama_init_from_model / llama_new_context_with_model, and n_ctx_per_seq where later ones print n_ctx_seq.
RE_CTX_PARAM = re.compile(
    r"(?:llama_context|llama_init_from_model|llama_new_context_with_model): "
    r"(?P<key>n_seq_max|n_ctx|n_ctx_seq|n_ctx_per_seq|n_batch|n_ubatch|causal_attn|flash_attn|kv_unified|swa_full|"
    r"offload_kqv|n_rs_seq) +=\s+(?P<val>\S+)")
# src/llama-kv-cache.cpp:159
RE_V_PAD = re.compile(r"padding V cache to (?P<width>\d+)")
# src/llama-context.cpp:550-554 "%s: %s not supported, set to disabled" / "%s: %s enabled"
RE_FA_RESOLVED = re.compile(r"Flash Attention (?P<state>enabled|not supported, set to disabled)")


def context_param(line: str) -> tuple[str, str] | None:
    """(name, value) of a context-parameter line (``llama_context: n_ctx = 4096``), or None for any other line."""
    m = RE_CTX_PARAM.search(line)
    return (m["key"], m["val"]) if m else None
RE_FA_FORCED = re.compile(r"enabling flash_attn since it is required for quantized V cache")
# any other "<func>: <dev> <what> buffer size = X MiB" line: a buffer of a kind this parser does not know (a cache
# class newer than edgekv), so that its bytes are never silently dropped
RE_OTHER_BUFFER = re.compile(r"(?P<fn>\w+): +(?P<dev>\S+) (?P<what>[\w -]+?) buffer size = +(?P<mib>[\d.]+) MiB")
# the oldest builds read (llama_kv_cache_init): "%s: KV self size  = %7.2f MiB, K (%s): %7.2f MiB, V (%s): %7.2f MiB"
RE_KV_SELF = re.compile(r"KV self size += +(?P<mib>[\d.]+) MiB, K \((?P<type_k>\w+)\): +(?P<k_mib>[\d.]+) MiB, "
                        r"V \((?P<type_v>\w+)\): +(?P<v_mib>[\d.]+) MiB")
# src/llama-model.cpp (load_tensors, or print_backend_buffers_info): "%s: offloaded %d/%d layers to GPU"; the one
# reading of it (edgekv.core.logconfig reads it too), whatever the function name before it
RE_GPU_OFFLOAD = re.compile(r"offloaded (?P<n>\d+)/(?P<total>\d+) layers to GPU")
# a log printed under a locale whose decimal separator is a comma ("224,00 MiB", "14,19 GiB", "16,00 BPW"): printf's
# %f follows LC_NUMERIC, and some front ends set it from the user's locale.  The comma between digits before a unit
# is a decimal point; array items ("[8, 8]") and type names ("arr[i32,48]") are not followed by one.
RE_DECIMAL_COMMA = re.compile(r"(?<=\d),(?=\d+ ?(?:MiB|GiB|MB|BPW|B)\b)")


def decimal_points(line: str) -> str:
    """The line with a decimal-comma locale's figures written with points."""
    return RE_DECIMAL_COMMA.sub(".", line) if "," in line else line


@dataclass
class KVCacheLine:
    kind: str            # "kv" for an attention cache, "recurrent" for recurrent state, "state" for DSV4 compressor state
    role: str | None     # iSWA: "full" / "swa"; DSA, MSA, DSV4: "main", "indexer", "csa", "hca", "swa"; DSV4 state: its name
    mib: str             # the figure as printed ("68.91")
    cells: int
    layers: int
    seqs: int
    streams: int | None
    type_k: str | None = None
    type_v: str | None = None
    k_mib: str | None = None
    v_mib: str | None = None
    r_mib: str | None = None
    s_mib: str | None = None
    p_mib: str | None = None
    rs_seq: int | None = None
    width: int | None = None


@dataclass
class LlamaMemoryLog:
    """Everything memory-related one llama.cpp model load + context creation said."""

    caches: list[KVCacheLine] = field(default_factory=list)
    iswa_cells: dict[str, int] = field(default_factory=dict)
    swa_full_warned: bool = False
    kv_buffers: dict[str, float] = field(default_factory=dict)
    rs_buffers: dict[str, float] = field(default_factory=dict)
    state_buffers: dict[str, float] = field(default_factory=dict)
    other_buffers: dict[str, float] = field(default_factory=dict)   # "<func> <what> <dev>" -> MiB
    compute_buffers: dict[str, float] = field(default_factory=dict)
    output_buffers: dict[str, float] = field(default_factory=dict)
    model_buffers: dict[str, float] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)
    v_padding: int | None = None
    fa_resolved: str | None = None      # "enabled" | "disabled" | None (not auto, or not reached)
    fa_forced_for_quantized_v: bool = False
    gpu_layers: tuple[int, int] | None = None
    errors: list[str] = field(default_factory=list)
    kv_self: list[dict[str, str]] = field(default_factory=list)   # the "KV self size" lines of the oldest builds read
    graph: dict[str, int] | None = None   # llama.cpp's graph sizes (nodes, splits; parse_graph_line)
    placement: dict[str, Any] | None = None   # the scheduler's op placement (GGML_SCHED_DEBUG=2; parse_placement)

    @property
    def kv_mib_total(self) -> float:
        return sum(float(c.mib) for c in self.caches if c.kind == "kv")

    @property
    def recurrent_mib_total(self) -> float:
        return sum(float(c.mib) for c in self.caches if c.kind == "recurrent")

    @property
    def state_mib_total(self) -> float:
        return sum(float(c.mib) for c in self.caches if c.kind == "state")

    @property
    def caches_mib_total(self) -> float:
        """Every cache object llama.cpp printed a size for (KV, recurrent, compressor state)."""
        return self.kv_mib_total + self.recurrent_mib_total + self.state_mib_total

    @property
    def compute_mib_total(self) -> float:
        return sum(self.compute_buffers.values())

    @property
    def output_mib_total(self) -> float:
        return sum(self.output_buffers.values())


def _add(d: dict[str, float], dev: str, mib: str) -> None:
    d[dev] = round(d.get(dev, 0.0) + float(mib), 2)


# long: one branch per llama.cpp log line kind, in one pass over the lines
def parse_memory_log(text: str | list[str]) -> LlamaMemoryLog:
    """Parse llama.cpp log text (a string or a list of lines)."""
    lines = text.splitlines() if isinstance(text, str) else [x for chunk in text for x in chunk.splitlines()]
    lines = [decimal_points(x) for x in lines]
    out = LlamaMemoryLog()
    pending_role: str | None = None
    for line in lines:
        m = RE_ISWA_CREATE.search(line)
        if m:
            pending_role = "full" if m["which"] == "non-SWA" else "swa"
            out.iswa_cells[pending_role] = int(m["cells"])
            continue
        m = RE_CACHE_CREATE.search(line)
        if m:
            pending_role = CACHE_CREATE_ROLES[m["what"]]
            continue
        m = RE_DSV4_STATE.search(line)
        if m:
            out.caches.append(KVCacheLine(
                kind="state", role=m["name"], mib=m["mib"], cells=int(m["rows"]), layers=int(m["layers"]),
                seqs=int(m["streams"]), streams=int(m["streams"]), type_k="f32", type_v="f32", rs_seq=int(m["rs_seq"]),
                width=int(m["width"])))
            continue
        m = RE_KV_SIZE.search(line)
        if m:
            out.caches.append(KVCacheLine(
                kind="kv", role=pending_role, mib=m["mib"], cells=int(m["cells"]), layers=int(m["layers"]),
                seqs=int(m["seqs"] or 1), streams=int(m["streams"]) if m["streams"] else None, type_k=m["type_k"],
                type_v=m["type_v"], k_mib=m["k_mib"], v_mib=m["v_mib"]))
            pending_role = None
            continue
        m = RE_KV_SELF.search(line)
        if m:
            out.kv_self.append({k: m[k] for k in ("mib", "type_k", "k_mib", "type_v", "v_mib")})
            continue
        m = RE_RS_SIZE.search(line)
        if m:
            out.caches.append(KVCacheLine(
                kind="recurrent", role=None, mib=m["mib"], cells=int(m["cells"]), layers=int(m["layers"]),
                seqs=int(m["seqs"]), streams=None, type_k=m["type_r"], type_v=m["type_s"],
                r_mib=m["r_mib"], s_mib=m["s_mib"], p_mib=m["p_mib"], rs_seq=int(m["rs_seq"] or 0)))
            continue
        if RE_SWA_FULL.search(line):
            out.swa_full_warned = True
            continue
        for rx, target in ((RE_KV_BUFFER, out.kv_buffers), (RE_RS_BUFFER, out.rs_buffers),
                           (RE_STATE_BUFFER, out.state_buffers),
                           (RE_COMPUTE, out.compute_buffers), (RE_OUTPUT, out.output_buffers),
                           (RE_MODEL_BUFFER, out.model_buffers)):
            m = rx.search(line)
            if m:
                _add(target, m["dev"], m["mib"])
                break
        else:
            param = context_param(line)
            if param:
                out.context[param[0]] = param[1]
                continue
            m = RE_V_PAD.search(line)
            if m:
                out.v_padding = int(m["width"])
                continue
            m = RE_FA_RESOLVED.search(line)
            if m:
                out.fa_resolved = "enabled" if m["state"] == "enabled" else "disabled"
                continue
            if RE_FA_FORCED.search(line):
                out.fa_forced_for_quantized_v = True
                continue
            m = RE_GPU_OFFLOAD.search(line)
            if m:
                out.gpu_layers = (int(m["n"]), int(m["total"]))
                continue
            m = RE_OTHER_BUFFER.search(line)
            if m:
                _add(out.other_buffers, f"{m['fn']} {m['what'].strip()} {m['dev']}", m["mib"])
    out.graph = parse_graph_line(lines)
    out.placement = parse_placement(lines)
    return out


def is_host_buffer(name: str) -> bool:
    """llama.cpp buffer names: CPU, CPU_Mapped, CPU_REPACK and <backend>_Host live in host memory; the rest
    (CUDA0, Vulkan0, ROCm0, MTL0, ...) on a device."""
    return name.startswith("CPU") or name.endswith("_Host")


def device_mib(buffers: dict[str, float] | None) -> float:
    return sum(v for k, v in (buffers or {}).items() if not is_host_buffer(k))


# llama-context.cpp:754 (llama_context's graph reserve):
#   "sched_reserve: graph: nodes = 967, splits = 1, input objects = ..., input tensors = ..."
#   "sched_reserve: graph (pp bs=512, tg bs=1): nodes = 1011 / 985, splits = 1 / 1, ..."
RE_GRAPH = re.compile(r"graph(?: \(pp bs=(?P<bs_pp>\d+), tg bs=(?P<bs_tg>\d+)\))?: nodes = (?P<pp>\d+)(?: / (?P<tg>\d+))?, "
                      r"splits = (?P<spp>\d+)(?: / (?P<stg>\d+))?")


def parse_graph_line(text: str | list[str]) -> dict[str, int] | None:
    """llama.cpp's graph sizes at context creation: nodes and splits of the prompt (ubatch) graph and of the
    one-token graph (the same figure when llama.cpp prints one); None when no such line is there.  Where the log
    also holds the scheduler's listing of those graphs (GGML_SCHED_DEBUG=2), ``ops_pp``/``ops_tg`` are their nodes
    that a backend runs (:func:`graph_ops`)."""
    lines = text.splitlines() if isinstance(text, str) else text
    for line in lines:
        m = RE_GRAPH.search(line)
        if m:
            pp, spp = int(m["pp"]), int(m["spp"])
            out = {"nodes_pp": pp, "nodes_tg": int(m["tg"] or pp), "splits_pp": spp, "splits_tg": int(m["stg"] or spp)}
            ops = graph_ops(lines, out["nodes_pp"], out["nodes_tg"])
            return {**out, **ops} if ops else out
    return None


RE_LISTING_START = re.compile(r"## SPLIT #0:")


def graph_ops(lines: list[str], nodes_pp: int, nodes_tg: int) -> dict[str, int] | None:
    """The nodes of the prompt and one-token graphs that a backend runs: the scheduler lists every node but the
    views (ggml_backend_sched_print_assignments skips VIEW, RESHAPE, PERMUTE and TRANSPOSE, ggml-backend.cpp:757,
    1018), and neither the CPU backend (ggml-cpu.c:3132, ggml_op_is_empty) nor ggml-cuda computes them.  A listing
    starts at its first split; the graph it belongs to is the one whose node count is its last node's index + 1.
    None when no listing of either graph is in the log."""
    listings: list[tuple[int, int]] = []           # (last node index + 1, nodes listed)
    for line in lines:
        if RE_LISTING_START.search(line):
            listings.append((0, 0))
            continue
        m = RE_NODE.search(line) if listings else None
        if m:
            listings[-1] = (int(m["i"]) + 1, listings[-1][1] + 1)
    ops = {}
    for key, n in (("ops_pp", nodes_pp), ("ops_tg", nodes_tg)):
        counts = [c for size, c in listings if size == n]
        if counts:
            ops[key] = counts[-1]
    return ops if len(ops) == 2 else None


# ggml_backend_sched_print_assignments (ggml/src/ggml-backend.cpp:997-1037), printed for every graph the scheduler
# splits when GGML_SCHED_DEBUG=2 (ggml-backend.cpp:1877): one line per node that is not a view,
#   "node #%3d (%10.10s): %20.20s (%5.5s) [%5.5s %8.8s] use=%d,c=%d: <sources>"
# i.e. the op (ggml_op_desc, cut to 10 characters), the node's name (llama.cpp names a layer's nodes "<what>-<il>"),
# its size, and the backend the scheduler assigned it to (cut to 5 characters: "CUDA0", "CPU", "Vulka", "MTL0").
RE_NODE = re.compile(r"node #\s*(?P<i>\d+) \(\s*(?P<op>[^)]*?)\): *(?P<name>.*?) \(\s*[\d.]*[KMG]?\) \[\s*(?P<backend>[^\s\]]+)")
RE_LAYER_SUFFIX = re.compile(r"-(\d+)$")
# a node llama.cpp left unnamed ("node_30": flash attention, the K/V rotations) belongs to the layer of its sources:
# "Qcur-0 (view)", "cache_k_l0 (view)"
RE_SOURCE_LAYER = re.compile(r"(?:-|cache_[kv]_l)(\d+)\b")


def parse_placement(text: str | list[str]) -> dict[str, Any] | None:
    """Where llama.cpp's scheduler put each op of the graphs it reserved (GGML_SCHED_DEBUG=2), or None without such
    lines.  A layer is on a device when most of its nodes are; the nodes of such a layer that the scheduler put on
    another backend (the CPU) ran there because the device's backend does not support them (ggml's supports_op),
    e.g. flash attention over a K/V type the CUDA build has no kernel for.  Returns the node count per backend and
    those ops: ``{"nodes": {"CUDA0": 1820, "CPU": 64}, "off_device": [{"op": "FLASH_ATTN", "backend": "CPU",
    "device": "CUDA0", "layers": 30}]}``."""
    lines = text.splitlines() if isinstance(text, str) else text
    nodes: dict[str, int] = {}
    per_layer: dict[int, dict[str, int]] = {}
    layer_ops: list[tuple[int, str, str]] = []
    for line in lines:
        m = RE_NODE.search(line)
        if not m:
            continue
        be = m["backend"]
        nodes[be] = nodes.get(be, 0) + 1
        lm = RE_LAYER_SUFFIX.search(m["name"].strip())
        if lm is None and m["name"].strip().startswith("node_"):
            lm = RE_SOURCE_LAYER.search(line[m.end():])
        if lm:
            il = int(lm[1])
            per_layer.setdefault(il, {})
            per_layer[il][be] = per_layer[il].get(be, 0) + 1
            layer_ops.append((il, m["op"].strip(), be))
    if not nodes:
        return None
    home = {il: max(c, key=lambda b: c[b]) for il, c in per_layer.items()}
    off: dict[tuple[str, str, str], set[int]] = {}
    for il, op, be in layer_ops:
        dev = home[il]
        if dev != be and not dev.upper().startswith("CPU"):
            off.setdefault((op, be, dev), set()).add(il)
    return {"nodes": dict(sorted(nodes.items())),
            "layers_on": {b: sum(1 for h in home.values() if h == b) for b in sorted(set(home.values()))},
            "off_device": [{"op": op, "backend": be, "device": dev, "layers": len(ls)}
                           for (op, be, dev), ls in sorted(off.items())]}


def off_device_text(off: list[dict[str, Any]] | None) -> str | None:
    """One phrase for :func:`parse_placement`'s ``off_device`` (None when empty): "FLASH_ATTN of 30 offloaded
    layers runs on CPU"."""
    if not off:
        return None
    parts = [f"{o['op']} of {o['layers']} offloaded layer{'s' if o['layers'] != 1 else ''} runs on {o['backend']}"
             for o in off]
    return "; ".join(parts)
