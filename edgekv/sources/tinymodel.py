"""A tiny synthetic GGUF that llama.cpp loads and runs: the probe model of the extra-buffer preflight.

One llama block (n_embd 256, 4 heads of 64, n_ff 512, a 512-token vocabulary with no tokenizer) whose matrix
weights are Q4_0: a type both of the CPU backend's extra buffer types take (AMX packs Q4_0 when ne0 % 32 and
ne1 % 32 are 0; CPU_REPACK re-lays it on AVX2/NEON when ne1 % 8 is 0), so a build with either puts every matrix
there and the probe's batches run through those kernels.  The weights are zeros in a sparse file: a few KB on
disk, and llama.cpp computes on them like on any other weights (the probe asks whether the kernels run, not what
they compute).

The header is written with gguf-py's ``GGUFWriter`` (llama.cpp's own writer), the file then extended to the size
its tensor table implies.  The path is always edgekv's own (:func:`probe_model_path`), checked to stay inside
``EDGEKV_HOME``.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize

from edgekv.sources.gguf_header import read_header_file
from edgekv.sources.home import edgekv_home
from edgekv.sources.safepath import atomic_path

if TYPE_CHECKING:
    # one tensor of a table: (name, ne in ggml order, type); where it lies: (name, type, offset from the data, bytes)
    TensorInfo = tuple[str, Sequence[int], GGMLQuantizationType]
    Span = tuple[str, GGMLQuantizationType, int, int]

N_EMBD, N_HEAD, N_FF, N_VOCAB, N_CTX_TRAIN = 256, 4, 512, 512, 256
PROBE_VERSION = 1
# the RMS of a values model's weights at n_embd 512 (weight_rms; "values like a trained model's" below): half that
# of the Q8_0 models every calibration up to CAL_VERSION 16 was timed on
WEIGHT_RMS_512 = 0.042


def _tensors() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ne in ggml order, type) of the probe model."""
    e, f, v = N_EMBD, N_FF, N_VOCAB
    return [
        ("token_embd.weight", (e, v), "F32"),
        ("output_norm.weight", (e,), "F32"),
        ("output.weight", (e, v), "Q4_0"),
        ("blk.0.attn_norm.weight", (e,), "F32"),
        ("blk.0.attn_q.weight", (e, e), "Q4_0"),
        ("blk.0.attn_k.weight", (e, e), "Q4_0"),
        ("blk.0.attn_v.weight", (e, e), "Q4_0"),
        ("blk.0.attn_output.weight", (e, e), "Q4_0"),
        ("blk.0.ffn_norm.weight", (e,), "F32"),
        ("blk.0.ffn_gate.weight", (e, f), "Q4_0"),
        ("blk.0.ffn_up.weight", (e, f), "Q4_0"),
        ("blk.0.ffn_down.weight", (f, e), "Q4_0"),
    ]


def write_probe_model(path: str | os.PathLike) -> int:
    """Write the probe GGUF at ``path`` (header, then a hole to the full size); return the file size."""
    w = GGUFWriter(path, "llama", use_temp_file=False)
    w.add_name("edgekv extra-buffer probe")
    w.add_block_count(1)
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_tokenizer_model("none")     # no vocabulary: llama.cpp sizes the embeddings from llama.vocab_size
    return write_sparse(w, path, [(name, ne, GGMLQuantizationType[t]) for name, ne, t in _tensors()])


def tensor_nbytes(name: str, ne: Sequence[int], qt: GGMLQuantizationType) -> int:
    """Bytes of the tensor ``name`` of shape ``ne`` (ggml order) and type ``qt`` (a ``GGMLQuantizationType``); its
    first dimension must hold whole blocks of the type."""
    blck, tsize = GGML_QUANT_SIZES[qt]
    n = 1
    for x in ne:
        n *= int(x)
    if int(ne[0]) % blck:
        raise ValueError(f"{name}: ne0={ne[0]} is not a multiple of the {qt.name} block size {blck}")
    return n // blck * tsize


def write_table(w, tensors: Iterable[TensorInfo]) -> tuple[int, list[Span], int]:
    """Finish and close a ``GGUFWriter`` whose metadata is added: the tensor-info table of ``tensors`` (name, ne in
    ggml order, ``GGMLQuantizationType``) and the header, no tensor data.  Returns where the data starts, each
    tensor's (name, type, offset from the data start, bytes) and the data's size."""
    spans: list[Span] = []
    total = 0
    for name, ne, qt in tensors:
        nbytes = tensor_nbytes(name, ne, qt)
        # GGUFWriter takes numpy order (ne reversed) and writes ggml order back
        w.add_tensor_info(name, list(reversed([int(x) for x in ne])), None, nbytes, raw_dtype=qt)
        spans.append((name, qt, total, nbytes))
        total += _pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    header_end = w.fout[0].tell()
    w.close()
    return _pad(header_end, w.data_alignment), spans, total


def _pad(n: int, align: int) -> int:
    """``n`` rounded up to a multiple of ``align`` (gguf-py's ``GGUFWriter.ggml_pad``)."""
    return -(-n // align) * align


def write_sparse(w, path: str | os.PathLike, tensors: Iterable[TensorInfo],
                 values: bool = False, rms: float = WEIGHT_RMS_512) -> int:
    """Finish a ``GGUFWriter`` whose metadata is added (:func:`write_table`), then extend the file to the size the
    table implies (a hole: no tensor data is written; ``values``: each tensor then filled by :func:`fill_values`,
    weights of RMS ``rms``).  Returns the file size."""
    start, spans, total = write_table(w, tensors)
    size = start + total
    with open(path, "r+b") as f:
        f.truncate(size)
        if values:
            for name, qt, off, nbytes in spans:
                fill_values(f, start + off, nbytes, qt, name, rms)
    return size


# -- values like a trained model's ------------------------------------------------------------------------
#
# llama.cpp's CPU kernels do not take the same time on every value: on x86 each block's fp16 scales (a q4_1 block
# of 32 weights has two, the q8_1 block of activations it meets two more) are converted through ggml's 256 KB
# table (ggml-cpu/simd-mappings.h, ggml_lookup_fp16_to_fp32: only ARM and POWER convert in registers), so how many
# of its cache lines a mat-vec touches depends on how varied the scales are.  A model of zero weights touches one
# line and decodes faster than the trained model of the same shape; weights and activations whose block scales
# spread like a trained model's decode as fast as the real one (docs/speed-model.md has the measurements).  So the
# speed calibration's models carry values: every block's scale is 2^(base + U(-1, 1)) (a log2
# spread of 0.58, where SmolLM2's and Gemma 3's tensors measure 0.26-1.12), the quants random, the norms'
# gains log-normal (sigma 0.5) so that activations vary from channel to channel as a trained model's do.
#
# And their size: llama.cpp's flash attention on the CPU (an online softmax, one expf per cell, ggml-cpu/ops.cpp
# :8990-9030) costs more per cell when the attention scores spread so widely that most cells' weights underflow
# (glibc's expf is slower for arguments past about -100 than above it).  A query's scores grow with its
# activations, which grow with the weights' size times the square root of the hidden size, so weights that are too
# large put a wide model's attention in the expensive regime, where a trained model's is not (docs/speed-model.md
# has the measurements).  So the weights are centred (a trained model's tensors average about 0) and of RMS
# WEIGHT_RMS_512 x sqrt(512 / n_embd), whatever their type: a trained model's attention sits in the cheap regime
# at every width, and so does the calibration's, where types written at one base each (RMS 0.015 for MXFP4 to
# 10 for IQ3_S, Q4_K and Q5_K with a mean above their spread) had put wide models and some types in the other.

SCALE_SPREAD_OCTAVES = 1.0
NORM_GAIN_SIGMA = 0.5
_POOL_BLOCKS = 1 << 16
_RMS_SAMPLE_BLOCKS = 2048     # blocks dequantized to measure a pool's RMS
# the types whose block minimum centres the block: their second scale field (the minimum, or its scale) in units of
# the first (d): half the quants' range (for a K-quant times its mean sub-block scale over its mean sub-block
# minimum, both random 6- or 4-bit, so 1); an _1 block stores the minimum itself, negative
_CENTRE = {"Q4_1": -7.5, "Q5_1": -15.5, "Q4_K": 7.5, "Q5_K": 15.5, "Q2_K": 1.5}


def weight_rms(n_embd: int) -> float:
    """The RMS of a values model's weights at hidden size ``n_embd`` (the module comment above)."""
    return WEIGHT_RMS_512 * (512.0 / max(1, n_embd)) ** 0.5


def _scale_fields(type_name: str, block_bytes: int) -> tuple[tuple[int, ...], float]:
    """(byte offsets of a block's fp16 scales, log2 of their typical size) for a block type; () where the type
    has none edgekv knows (its bytes are then random, except an e8m0 scale: see _pool)."""
    t = type_name.upper()
    if t in ("Q3_K", "Q6_K", "TQ1_0", "TQ2_0"):              # the super-block scale last
        return (block_bytes - 2,), -11.0 if t.endswith("_K") else -4.0
    if t == "Q2_K":                                         # d and dmin last
        return (block_bytes - 4, block_bytes - 2), -9.0
    if t in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):               # d and the min's scale first
        return (0, 2), -11.0 if t.endswith("_K") else -6.0
    if t in ("Q4_0", "Q5_0"):
        return (0,), -6.0
    if t in ("Q8_0", "IQ4_NL"):                              # int8 quants (IQ4_NL: a 4-bit index into int8 values)
        return (0,), -10.0
    if t == "IQ4_XS":                                        # and a 6-bit scale per 32 on top
        return (0,), -14.0
    if t in ("Q1_0", "Q2_0") or t.startswith(("IQ1_S", "IQ2_", "IQ3_")):
        return (0,), -4.0
    return (), 0.0


def _pool(qt: Any, name: str, rng: Any, rms: float = WEIGHT_RMS_512) -> bytes:
    """A run of blocks of type ``qt`` whose values look like a trained model's (the module comment above): a norm's
    gains, or weights centred and of RMS ``rms``."""
    Q = GGMLQuantizationType
    blck, size = GGML_QUANT_SIZES[qt]
    n = _POOL_BLOCKS
    if qt in (Q.F32, Q.F16, Q.BF16):
        if "norm" in name:
            x = np.exp(rng.standard_normal(n) * NORM_GAIN_SIGMA)
        else:
            x = rng.standard_normal((n // 32, 32)) * np.exp2(rng.uniform(-1, 1, (n // 32, 1)) * SCALE_SPREAD_OCTAVES)
            x *= rms / np.sqrt((x ** 2).mean())
        x = x.astype(np.float32).reshape(-1)
        if qt == Q.F32:
            return x.tobytes()
        if qt == Q.F16:
            return x.astype(np.float16).tobytes()
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    fields, base = _scale_fields(qt.name, size)
    d = [np.exp2(base + rng.uniform(-1, 1, n) * SCALE_SPREAD_OCTAVES) for _ in fields]
    if qt.name in _CENTRE:                  # the second field: the block's minimum (or its scale), from the first
        d[1] = d[0] * _CENTRE[qt.name]
    if qt.name == "MXFP4":                  # one e8m0 exponent per block
        raw[:, 0] = rng.integers(118, 121, n, dtype=np.uint8)
    _set_fields(raw, fields, d)
    if fields or qt.name == "MXFP4":
        got = _rms_of(raw[:_RMS_SAMPLE_BLOCKS], qt)
        if got:                             # scale every block alike: the RMS asked for, the spread kept
            if qt.name == "MXFP4":
                shift = max(-8, min(8, round(float(np.log2(rms / got)))))
                raw[:, 0] = (raw[:, 0].astype(np.int16) + shift).astype(np.uint8)
            else:
                _set_fields(raw, fields, [x * (rms / got) for x in d])
    return raw.tobytes()


def _set_fields(raw: Any, fields: tuple[int, ...], values: list[Any]) -> None:
    for off, v in zip(fields, values):
        raw[:, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _rms_of(raw: Any, qt: Any) -> float | None:
    """The RMS of some blocks' weights (None where gguf-py cannot dequantize the type)."""
    if qt.name == "Q1_0":                   # each weight is +-d (its fp16 scale first): not in gguf-py yet
        d = raw[:, :2].copy().view(np.float16).astype(np.float64)
        return float(np.sqrt(np.mean(d ** 2)))
    try:
        w = dequantize(raw.reshape(-1), qt).astype(np.float64)
    except NotImplementedError:
        return None
    r = float(np.sqrt(np.mean(w ** 2)))
    return r if np.isfinite(r) and r > 0 else None


@functools.lru_cache(maxsize=16)
def _run_of(qt: Any, norm: bool, rms: float = WEIGHT_RMS_512, chunk: int = 16 << 20) -> memoryview:
    """About ``chunk`` bytes of ``_pool`` repeated, made once per type, norm or not and RMS per process: a model's
    hundreds of tensors of one type share it."""
    rng = np.random.default_rng(zlib.crc32(f"{qt.name}/{norm}".encode()))
    pool = _pool(qt, "norm" if norm else "", rng, rms)
    return memoryview(pool * max(1, chunk // len(pool)))


def fill_values(f: Any, offset: int, nbytes: int, qt: Any, name: str, rms: float = WEIGHT_RMS_512) -> None:
    """Write ``nbytes`` of values like a trained model's (``_pool``, repeated) at ``offset`` of the open file ``f``:
    a norm's gains, or weights of RMS ``rms`` (weight_rms of the model's hidden size)."""
    rep = _run_of(qt, "norm" in name, rms)
    f.seek(offset)
    left = nbytes
    while left > 0:
        piece = rep[:left]
        f.write(piece)
        left -= len(piece)


def probe_model_path() -> Path:
    """The probe model under ``EDGEKV_HOME/calibration/``, written on first use."""
    folder = edgekv_home() / "calibration"
    p = folder / f"extra-buffer-probe-v{PROBE_VERSION}.gguf"
    if not p.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(p, root=folder, what="the preflight's probe model") as tmp:
            write_probe_model(tmp)
    return p


# -- the speed calibration's models ----------------------------------------------------------------------

SPEED_MODELS_VERSION = 3      # 2: values like a trained model's (fill_values), not zeros; 3: centred, of RMS weight_rms


def write_llama(path: str | os.PathLike, *, n_embd: int, n_ff: int, n_layer: int, n_head: int, n_head_kv: int,
                mat_type: str, n_vocab: int = 256, head_dim: int | None = None, out_type: str | None = None,
                name: str = "edgekv speed calibration", values: bool = False, embd_type: str = "F32",
                arch: str = "llama", tied: bool = False, n_ctx_train: int = 32768, rms_eps: float = 1e-5) -> int:
    """A llama-architecture GGUF of zero weights in a sparse file (``values``: weights like a trained model's,
    fill_values; the speed calibration's models): ``n_layer`` blocks whose seven matrices are ``mat_type``, F32
    norms, a token embedding (``embd_type``, default F32) and a separate output matrix (``out_type``, default
    ``mat_type``; none when ``tied``: llama.cpp then reads the embedding).  ``arch`` "qwen2": the same blocks with
    F32 Q/K/V biases.  Returns the file size."""
    Q = GGMLQuantizationType
    hd = head_dim or n_embd // n_head
    w = GGUFWriter(path, arch, use_temp_file=False)
    w.add_name(name)
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("none")
    m, kv = Q[mat_type], n_head_kv * hd
    t: list[tuple[str, tuple[int, ...], Any]] = [("token_embd.weight", (n_embd, n_vocab), Q[embd_type])]
    if n_head * hd % 32 or n_embd % 32:
        raise ValueError(f"n_embd {n_embd} and n_head x head_dim {n_head * hd} must be multiples of 32")
    for i in range(n_layer):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", (n_embd,), Q.F32), (b + "ffn_norm.weight", (n_embd,), Q.F32),
              (b + "attn_q.weight", (n_embd, n_head * hd), m), (b + "attn_k.weight", (n_embd, kv), m),
              (b + "attn_v.weight", (n_embd, kv), m), (b + "attn_output.weight", (n_head * hd, n_embd), m),
              (b + "ffn_gate.weight", (n_embd, n_ff), m), (b + "ffn_up.weight", (n_embd, n_ff), m),
              (b + "ffn_down.weight", (n_ff, n_embd), m)]
        if arch == "qwen2":
            t += [(b + "attn_q.bias", (n_head * hd,), Q.F32), (b + "attn_k.bias", (kv,), Q.F32),
                  (b + "attn_v.bias", (kv,), Q.F32)]
    t.append(("output_norm.weight", (n_embd,), Q.F32))
    if not tied:
        t.append(("output.weight", (n_embd, n_vocab), Q[out_type or mat_type]))
    return write_sparse(w, path, t, values, weight_rms(n_embd))


def speed_model_file(name: str, owner: int | None = None, **shape: Any) -> Path:
    """The path of a calibration model (``name`` is edgekv's own, never user input; the shape is part of the file
    name's hash so a changed shape is another file): under ``EDGEKV_HOME/calibration/speed/``, or (``owner``, the
    process whose plan it belongs to) under its ``scratch/`` folder, named for that process (:func:`plan_model`).
    Nothing is written."""
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"bad calibration model name {name!r}")
    tag = hashlib.sha256(json.dumps([SPEED_MODELS_VERSION, shape], sort_keys=True).encode()).hexdigest()[:10]
    if owner is None:
        return speed_folder() / f"{name}-{tag}.gguf"
    return speed_folder() / SCRATCH / f"{name}-{tag}-p{int(owner)}.gguf"


def speed_folder() -> Path:
    return edgekv_home() / "calibration" / "speed"


def speed_model_path(name: str, **shape: Any) -> Path:
    """A model under ``EDGEKV_HOME/calibration/speed/``, written on first use and kept (bench scripts, the GPU graph
    probe); the speed calibration's own plans use :func:`plan_model` instead, which leaves nothing behind."""
    p = speed_model_file(name, **shape)
    if not p.is_file():
        _write_speed_model(p, name, shape)
    return p


# -- a calibration plan's models ------------------------------------------------------------------------
#
# The speed calibration's models carry values (not sparse holes: a model of zero weights decodes faster), and its
# streaming models are hundreds of MB each, three per weight type: written all at once, a calibration's models
# take gigabytes (enough to fill a CI machine's disk), and models kept between calibrations grow a home's
# calibration folder with files no later calibration reads.  So a plan names its models without
# writing them (plan_model): the probe writes each just before llama.cpp loads it and cuts it to its header (a few
# KB: what the solve reads back) once its steps are timed (plan_model_file), and the calibration deletes the plan's
# files when it ends (drop_plan_models).  At most one model's values are on disk at a time; writing one takes
# under a second.

SCRATCH = "scratch"
STALE_S = 3600.0     # a kept model unread this long is deleted by sweep_speed_models (any of them is rewritten in < 1 s)


def plan_model(name: str, **shape: Any) -> dict[str, Any]:
    """A calibration plan entry's model fields: its path (in the scratch folder, named for this process) and what to
    write there (:func:`plan_model_file`); nothing is written yet."""
    owner = os.getpid()
    return {"model_path": str(speed_model_file(name, owner, **shape)),
            "write": {"name": name, "shape": shape, "owner": owner}}


@contextmanager
def plan_model_file(m: dict[str, Any]) -> Iterator[str]:
    """The model file of the plan entry ``m`` for the block: written first when it is missing or was cut to its
    header (an entry written by :func:`plan_model`; the path is recomputed from its name, shape and owner and must
    be the entry's, so a plan never chooses a path), then cut to its header.  An entry without ``write`` (a user's
    file, a kept model) is used as it is."""
    w = m.get("write")
    if not w:
        yield m["model_path"]
        return
    p = _plan_path(m)
    if not _complete(p):
        _write_speed_model(p, str(w["name"]), w["shape"])
    try:
        yield str(p)
    finally:
        cut_to_header(p)


def plan_headers(plan: Iterable[dict[str, Any]]) -> None:
    """Give each of a plan's models written by :func:`plan_model` a file holding its header alone (what the solve
    reads), where none is: a plan solved again from recorded timings, or a test reading a plan's tensor tables.  No
    values are written (a sparse file, then cut), and :func:`plan_model_file` writes the whole model before a probe
    loads it."""
    for m in plan:
        w = m.get("write")
        if not w:
            continue
        p = _plan_path(m)
        if not p.is_file():
            with atomic_path(p, root=speed_folder(), what="a speed calibration model") as tmp:
                write_llama(tmp, **w["shape"])
                cut_to_header(tmp)


def _plan_path(m: dict[str, Any]) -> Path:
    """Where the plan entry ``m``'s model belongs, recomputed from its name, shape and owner: a plan whose path is
    another is refused (a plan never chooses a path)."""
    w = m["write"]
    p = speed_model_file(str(w["name"]), int(w["owner"]), **w["shape"])
    if str(p) != m["model_path"]:
        raise ValueError(f"the calibration model {m['model_path']!r} is not where {w['name']!r} belongs ({p})")
    return p


def cut_to_header(p: Path) -> None:
    """Cut the model at ``p`` to its header (the tensor table the calibration's solve reads back)."""
    try:
        os.truncate(p, read_header_file(p).data_offset)
    except (OSError, ValueError):
        p.unlink(missing_ok=True)


def _complete(p: Path) -> bool:
    """Whether ``p`` holds a whole model (not one cut to its header)."""
    try:
        return p.is_file() and p.stat().st_size >= read_header_file(p).file_size
    except (OSError, ValueError):
        return False


def drop_plan_models(plan: Iterable[dict[str, Any]]) -> None:
    """Delete the files of a plan's models written by :func:`plan_model` (only inside the scratch folder)."""
    folder = (speed_folder() / SCRATCH).resolve()
    for m in plan:
        if m.get("write"):
            p = Path(m["model_path"]).resolve()
            if p.parent == folder:
                p.unlink(missing_ok=True)


def sweep_speed_models() -> list[Path]:
    """Delete what calibrations left behind: scratch models of processes no longer running (a calibration killed
    before it dropped its plan's), and kept models nobody wrote or read for STALE_S (the models every calibration
    before this one kept).  Returns the paths deleted."""
    folder = speed_folder()
    now = time.time()
    gone = []
    for p in (folder / SCRATCH).glob("*.gguf") if (folder / SCRATCH).is_dir() else []:
        m = re.search(r"-p(\d+)\.gguf$", p.name)
        if m and not psutil.pid_exists(int(m.group(1))):
            p.unlink(missing_ok=True)
            gone.append(p)
    for p in folder.glob("*.gguf") if folder.is_dir() else []:
        try:
            st = p.stat()
        except OSError:
            continue
        if now - max(st.st_mtime, st.st_atime) > STALE_S:
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone


def _write_speed_model(p: Path, name: str, shape: dict[str, Any]) -> None:
    """Write the calibration model ``name`` of ``shape`` at ``p`` (atomically, inside the speed folder); a full disk
    is one clear error naming the folder and the size."""
    folder = speed_folder()
    try:
        with atomic_path(p, root=folder, what="a speed calibration model") as tmp:
            write_llama(tmp, **shape, values=True)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        mib = _model_mib(shape)
        raise OSError(e.errno, f"no space left on the disk of {folder} to write the speed calibration's model "
                               f"{name}{f' ({mib} MiB)' if mib else ''}: free that much there, or set EDGEKV_HOME to "
                               "a folder on a disk with room") from None


def _model_mib(shape: dict[str, Any]) -> int:
    """The size in MiB of the calibration model of ``shape`` (its header written to a sparse file, no values)."""
    with tempfile.TemporaryDirectory() as d:
        try:
            return -(-write_llama(Path(d) / "m.gguf", **shape) // (1 << 20))
        except OSError:
            return 0
