"""Read a llama.cpp log, bounded, and recover the configuration it states.

Pure functions over bytes and text.  :func:`read_bounded` takes any byte stream (a pasted log may be
hostile: one huge line, binary bytes, millions of lines) and keeps at most :data:`MAX_KEPT` lines of at most
:data:`MAX_LINE` characters that name something llama.cpp prints at load; :func:`parse_config` turns those
lines into a :class:`LogConfig`: the build, the devices, the GGUF metadata llama.cpp dumped
(``llama_model_loader: - kv``), its ``print_info`` hyperparameters, the tensor type counts and the context
settings.  The memory lines themselves are :mod:`edgekv.core.llamalog`'s.

Formats covered (llama.cpp builds b4400 and later, and the older ``llm_load_print_meta`` spelling of the same
lines): llama-cli, llama-server, llama-bench -v, llama-cpp-python ``verbose=True``, with or without the
common logger's ``0.00.045.180 I`` prefix, ANSI colours, journald or container prefixes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from edgekv.core.llamalog import RE_GPU_OFFLOAD, context_param, decimal_points

MAX_LINE = 4096             # characters kept of one line; the rest of a longer line is skipped unread
MAX_BYTES = 256 * 2**20     # bytes read from one log
MAX_KEPT = 100_000          # relevant lines kept (a llama.cpp load prints a few thousand)
_CHUNK = 1 << 16

# substrings of every line this module or llamalog reads; any other line is dropped at once
KEEP = ("buffer size", "print_info", "llm_load_print_meta", "llama_model_loader", "llama_context", "kv_cache",
        "load_tensors", "build", "version", "device", "ggml_", "KV self size", "system_info", "init_from_model",
        "new_context_with_model", "sched_reserve", "llama_memory", "graph", "Flash Attention", "flash_attn",
        "padding V", "SWA", "offloaded", "llama_cpp", "Device ", "kv_size", "unused tensor")
RE_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class BoundedLog:
    lines: list[str]
    bytes_read: int
    lines_seen: int
    long_lines: int = 0       # lines cut to MAX_LINE
    binary_lines: int = 0     # lines that held NUL or undecodable bytes
    stopped: str | None = None    # why reading stopped early


def _relevant(line: str) -> bool:
    return any(k in line for k in KEEP)


def read_bounded(stream: BinaryIO, max_bytes: int = MAX_BYTES, max_kept: int = MAX_KEPT,
                 max_line: int = MAX_LINE) -> BoundedLog:
    """The relevant lines of a byte stream, within fixed time and memory whatever it holds."""
    out = BoundedLog(lines=[], bytes_read=0, lines_seen=0)
    while out.bytes_read < max_bytes:
        raw = stream.readline(max_line + 1)
        if not raw:
            break
        out.bytes_read += len(raw)
        cut = len(raw) > max_line and not raw.endswith(b"\n")
        if cut:
            out.long_lines += 1
            while out.bytes_read < max_bytes:          # skip the rest of that line in chunks
                rest = stream.readline(_CHUNK)
                out.bytes_read += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            raw = raw[:max_line]
        out.lines_seen += 1
        binary = b"\x00" in raw
        raw = raw.replace(b"\x00", b"")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            # bytes that are not UTF-8 (a line that holds U+FFFD itself is text; so is a character cut at MAX_LINE)
            binary = binary or not (cut and e.start >= len(raw) - 3)
            text = raw.decode("utf-8", errors="replace")
        out.binary_lines += binary
        text = RE_ANSI.sub("", text.rstrip("\r\n"))
        if "\r" in text:                                # progress bars: keep what the last redraw left
            text = text.rsplit("\r", 1)[-1]
        if _relevant(text):
            if len(out.lines) >= max_kept:
                out.stopped = f"more than {max_kept} llama.cpp lines; the rest was not read"
                break
            out.lines.append(text)
    else:
        out.stopped = f"more than {max_bytes // 2**20} MiB; the rest was not read"
    return out


# build: 4658 (855cd073) with Apple clang ...  (common/common.cpp, every common-based tool); version: 4658 (855cd073)
RE_BUILD = re.compile(r"\b(?:build|version)(?: = |: )(?P<n>\d+) \((?P<commit>[0-9a-f]{6,40}|unknown)\)"
                      r"|build_info: b(?P<n2>\d+)-(?P<commit2>[0-9a-f]{6,40})")
# llama-cpp-python prints no build line; a pasted version is the best there is
RE_PYVER = re.compile(r"llama[-_]cpp[-_]python[ =:v]*(?P<v>\d+\.\d+\.\d+)|llama_cpp\.__version__\D*(?P<v2>\d+\.\d+\.\d+)")
# llama_model_loader: - kv   2:   llama.context_length u32 = 32768  (src/llama-model-loader.cpp, gguf_kv_to_str)
RE_KV = re.compile(r"llama_model_loader: - kv +\d+: +(?P<key>\S+) +(?P<type>arr\[\w+, *\d+\]|\w+) += (?P<val>.*)$")
RE_TYPE_COUNT = re.compile(r"llama_model_loader: - type +(?P<t>\w+): +(?P<n>\d+) tensors")
RE_PRINT_INFO = re.compile(r"(?:print_info|llm_load_print_meta): (?P<key>[\w .]+?) += (?P<val>.*)$")
# oldest:     llama_kv_cache_init: kv_size = 512, offload = 1, type_k = 'f16', type_v = 'f16', n_layer = 12
# later:      llama_kv_cache_unified: kv_size = 4096, type_k = 'f16', type_v = 'f16', n_layer = 36, ...
RE_KV_INIT = re.compile(r"kv_size = (?P<cells>\d+),(?: offload = \d+,)? type_k = '(?P<tk>\w+)', type_v = '(?P<tv>\w+)', "
                        r"n_layer = (?P<layers>\d+)")
# "using device SYCL0 (Intel(R) Arc(TM) A770 Graphics) (unknown id) - 15473 MiB free": the name may hold parentheses
RE_USING_DEVICE = re.compile(r"using device (?P<dev>\S+) \((?P<name>(?:[^()]|\([^()]*\))*)\)(?: \([^()]*\))?"
                             r"(?: - (?P<free>\d+) MiB free)?")
RE_CUDA_DEVICE = re.compile(r"Device (?P<i>\d+): (?P<name>[^,]+), (?:compute capability|gfx)")
RE_CUDA_FOUND = re.compile(r"ggml_cuda_init: found \d+ (?P<kind>CUDA|ROCm|MUSA) devices")
RE_METAL_NAME = re.compile(r"ggml_metal_(?:device_)?init: GPU name: +(?:MTL\d+ \()?(?P<name>[^)\n]+?)\)?\s*$")
RE_WORKING_SET = re.compile(r"recommendedMaxWorkingSetSize += +(?P<mb>[\d.]+) MB")
RE_VULKAN = re.compile(r"ggml_vulkan: (?P<i>\d+) = (?P<name>[^|]+?) \|")
# "offloading 93 repeating layers to GPU": the last 93 of n_layer (the output layer is counted apart)
RE_REPEATING = re.compile(r"offloading (?P<n>\d+) repeating layers to GPU")
RE_SYSINFO = re.compile(r"system_info: .*")
# src/llama-model.cpp (create_tensor): "model has unused tensor %s (size = %zu bytes) -- ignoring" for a tensor of the
# file the graph never uses (a NextN/MTP layer without speculative decoding); it gets no buffer.  Some builds print
# no size.
RE_UNUSED = re.compile(r"model has unused tensor (?P<name>\S+)(?: \((?:size = )?(?P<bytes>\d+) bytes\))? -- ignoring")
RE_MMAP = re.compile(r"load_tensors: loading model tensors, this can take a while\.\.\. \(mmap = (?P<v>\w+)")

SCALAR_TYPES = {"u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64"}

# print_info keys that are GGUF hyperparameters under {arch}. (src/llama-model.cpp print_info)
PRINT_INFO_KEYS = {
    "n_ctx_train": "context_length", "n_embd": "embedding_length", "n_layer": "block_count",
    "n_head": "attention.head_count", "n_head_kv": "attention.head_count_kv", "n_ff": "feed_forward_length",
    "n_embd_head_k": "attention.key_length", "n_embd_head_v": "attention.value_length",
    "n_swa": "attention.sliding_window", "n_swa_pattern": "attention.sliding_window_pattern",
    "n_expert": "expert_count", "n_expert_used": "expert_used_count", "ssm_d_conv": "ssm.conv_kernel",
    "ssm_d_inner": "ssm.inner_size", "ssm_d_state": "ssm.state_size", "ssm_dt_rank": "ssm.time_step_rank",
    "ssm_n_group": "ssm.group_count", "n_lora_kv": "attention.kv_lora_rank", "n_embd_head_k_mla":
    "attention.key_length_mla", "n_embd_head_v_mla": "attention.value_length_mla",
    "n_vocab": "vocab_size", "n_layer_dense_lead": "leading_dense_block_count",
}


@dataclass
class LogConfig:
    build: str | None = None            # "4658 (855cd073)"
    build_number: int | None = None
    python_version: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)    # GGUF keys recovered (dump, then print_info)
    from_dump: set[str] = field(default_factory=set)           # keys read from the loader's dump
    truncated_arrays: list[str] = field(default_factory=list)
    print_info: dict[str, str] = field(default_factory=dict)
    type_counts: dict[str, int] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)
    kv_init: dict[str, Any] | None = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    gpu_family: str | None = None       # CUDA | ROCm | MUSA | Metal | Vulkan
    working_set_mb: float | None = None
    offloaded: tuple[int, int] | None = None
    repeating_offloaded: int | None = None
    unused_tensors: dict[str, int | None] = field(default_factory=dict)   # name -> bytes (None: not printed)
    system_info: str | None = None
    mmap: bool | None = None

    @property
    def arch(self) -> str | None:
        a = self.metadata.get("general.architecture")
        return a if isinstance(a, str) else None


def _scalar(typ: str, val: str) -> Any:
    val = val.strip()
    if typ in SCALAR_TYPES:
        return int(val) if re.fullmatch(r"-?\d+", val) else None
    if typ in ("f32", "f64"):
        try:
            return float(val)
        except ValueError:
            return None
    if typ == "bool":
        return {"true": True, "false": False}.get(val)
    if typ == "str":
        return val
    return None


def _array(typ: str, val: str) -> list[Any] | None:
    """A whole array from its printed value, or None when llama.cpp cut it short ("...")."""
    m = re.fullmatch(r"arr\[(\w+), *(\d+)\]", typ)
    if not m or val.rstrip().endswith("...") or m[1] not in SCALAR_TYPES | {"bool"}:
        return None
    body = val.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    items = [x.strip() for x in body[1:-1].split(",") if x.strip()]
    if len(items) != int(m[2]):
        return None
    out = [_scalar(m[1], x) for x in items]
    return None if any(x is None for x in out) else out


def _int_or_list(val: str) -> int | list[int] | None:
    """print_info prints a per-layer value once when every layer has it, else the whole list (print_f)."""
    v = val.strip()
    if re.fullmatch(r"\d+", v):
        return int(v)
    if v.startswith("[") and v.endswith("]") and "..." not in v:
        items = [x.strip() for x in v[1:-1].split(",") if x.strip()]
        if items and all(re.fullmatch(r"\d+", x) for x in items):
            return [int(x) for x in items]
    return None


def _device_line(cfg: LogConfig, line: str) -> bool:
    m = RE_USING_DEVICE.search(line)
    if m:
        row = {"name": m["dev"], "description": m["name"].strip(), "free_mib": int(m["free"]) if m["free"] else None}
        same = ("Metal",) if row["name"].startswith("MTL") else ()      # the Metal GPU line named it already
        cfg.devices = [d for d in cfg.devices if d["name"] not in (row["name"], *same)] + [row]   # listed once
        return True
    m = RE_CUDA_FOUND.search(line)
    if m:
        cfg.gpu_family = m["kind"]
        return True
    m = RE_CUDA_DEVICE.search(line)
    if m and cfg.gpu_family in ("CUDA", "ROCm", "MUSA", None):
        name = f"{'ROCm' if cfg.gpu_family == 'ROCm' else cfg.gpu_family or 'CUDA'}{m['i']}"
        if not any(d["name"] == name for d in cfg.devices):
            cfg.devices.append({"name": name, "description": m["name"].strip(), "free_mib": None})
        return True
    m = RE_METAL_NAME.search(line)
    if m:
        cfg.gpu_family = "Metal"
        name = m["name"].strip()
        # "GPU name:   MTL0" (later builds name the device, and "using device MTL0 (<the GPU>)" describes it)
        dev = name if re.fullmatch(r"MTL\d+", name) else "Metal"
        if not any(d["description"] == name or d["name"].startswith("MTL") for d in cfg.devices):
            cfg.devices.append({"name": dev, "description": name, "free_mib": None})
        return True
    m = RE_WORKING_SET.search(line)
    if m:
        cfg.working_set_mb = float(m["mb"])
        return True
    m = RE_VULKAN.search(line)
    if m:
        cfg.gpu_family = "Vulkan"
        name = f"Vulkan{m['i']}"
        if not any(d["name"] == name for d in cfg.devices):
            cfg.devices.append({"name": name, "description": m["name"].strip(), "free_mib": None})
        return True
    return False


def _meta_line(cfg: LogConfig, line: str) -> bool:
    m = RE_KV.search(line)
    if m:
        key, typ, val = m["key"], m["type"], m["val"]
        v = _array(typ, val) if typ.startswith("arr") else _scalar(typ, val)
        if v is None and typ.startswith("arr"):
            if key not in cfg.truncated_arrays:
                cfg.truncated_arrays.append(key)
        elif v is not None:
            cfg.metadata[key] = v
            cfg.from_dump.add(key)
        return True
    m = RE_TYPE_COUNT.search(line)
    if m:
        cfg.type_counts[m["t"]] = cfg.type_counts.get(m["t"], 0) + int(m["n"])
        return True
    m = RE_PRINT_INFO.search(line)
    if m:
        cfg.print_info.setdefault(m["key"].strip(), m["val"].strip())
        return True
    return False


def parse_config(lines: list[str]) -> LogConfig:
    """The configuration a llama.cpp log states (the first model load in it)."""
    cfg = LogConfig()
    for line in map(decimal_points, lines):
        if cfg.build is None:
            m = RE_BUILD.search(line)
            if m:
                if m["n"]:
                    # packagers that build without git history print "build: 0 (unknown)" or "1 (<commit>)"
                    cfg.build = f"{m['n']} ({m['commit']})"
                    cfg.build_number = int(m["n"]) if int(m["n"]) >= 100 else None
                else:               # a packager's own build counter ("b1-e365e65"): the commit is what identifies it
                    cfg.build = f"b{m['n2']}-{m['commit2']}"
                continue
        if cfg.python_version is None:
            m = RE_PYVER.search(line)
            if m:
                cfg.python_version = m["v"] or m["v2"]
                continue
        if _meta_line(cfg, line) or _device_line(cfg, line):
            continue
        param = context_param(line)
        if param:
            cfg.context.setdefault(*param)
            continue
        m = RE_KV_INIT.search(line)
        if m and cfg.kv_init is None:
            cfg.kv_init = {"cells": int(m["cells"]), "type_k": m["tk"], "type_v": m["tv"], "layers": int(m["layers"])}
            continue
        m = RE_UNUSED.search(line)
        if m:
            cfg.unused_tensors[m["name"]] = int(m["bytes"]) if m["bytes"] else None
            continue
        m = RE_REPEATING.search(line)
        if m and cfg.repeating_offloaded is None:
            cfg.repeating_offloaded = int(m["n"])
            continue
        m = RE_GPU_OFFLOAD.search(line)
        if m and cfg.offloaded is None:
            cfg.offloaded = (int(m["n"]), int(m["total"]))
            continue
        m = RE_MMAP.search(line)
        if m:
            cfg.mmap = m["v"] == "true"
            continue
        if cfg.system_info is None and RE_SYSINFO.search(line):
            cfg.system_info = RE_SYSINFO.search(line)[0][:400]
    _fill_from_print_info(cfg)
    return cfg


def _fill_from_print_info(cfg: LogConfig) -> None:
    """GGUF keys the loader's dump lacked (or cut short), from print_info's hyperparameters."""
    pi = cfg.print_info
    arch = cfg.arch or pi.get("arch")
    if not arch:
        return
    cfg.metadata.setdefault("general.architecture", arch)
    for pkey, gkey in PRINT_INFO_KEYS.items():
        full = f"{arch}.{gkey}"
        if pkey not in pi or full in cfg.from_dump:
            continue
        v = _int_or_list(pi[pkey])
        if v is None or (pkey in ("n_swa", "n_swa_pattern", "n_vocab") and v == 0):
            continue
        if pkey == "n_vocab":
            # only where the token list was cut from the dump: the vocabulary size, not a GGUF key llama.cpp needs
            cfg.metadata.setdefault(f"{arch}.vocab_size", v)
            continue
        cfg.metadata[full] = v
    if pi.get("causal attn") == "0":
        cfg.metadata.setdefault(f"{arch}.attention.causal", False)
