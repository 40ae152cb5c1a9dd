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

import functools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from edgekv.edges.home import edgekv_home
from edgekv.edges.safepath import atomic_path

N_EMBD, N_HEAD, N_FF, N_VOCAB, N_CTX_TRAIN = 256, 4, 512, 512, 256
PROBE_VERSION = 1


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
    from gguf import GGMLQuantizationType, GGUFWriter

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


def write_sparse(w, path: str | os.PathLike, tensors: Iterable[tuple[str, Sequence[int], Any]],
                 values: bool = False) -> int:
    """Finish a ``GGUFWriter`` whose metadata is added: the tensor-info table of ``tensors`` (name, ne in ggml
    order, ``GGMLQuantizationType``), the header written, then the file extended to the size the table implies
    (a hole: no tensor data is written; ``values``: each tensor then filled by :func:`fill_values`).  Returns the
    file size."""
    from gguf import GGML_QUANT_SIZES, GGUFWriter

    tensors = list(tensors)
    spans: list[tuple[str, Any, int, int]] = []      # (name, type, offset from the data start, bytes)
    total = 0
    for name, ne, qt in tensors:
        blck, tsize = GGML_QUANT_SIZES[qt]
        n = 1
        for x in ne:
            n *= int(x)
        if int(ne[0]) % blck:
            raise ValueError(f"{name}: ne0={ne[0]} is not a multiple of the {qt.name} block size {blck}")
        nbytes = n // blck * tsize
        # GGUFWriter takes numpy order (ne reversed) and writes ggml order back
        w.add_tensor_info(name, list(reversed([int(x) for x in ne])), None, nbytes, raw_dtype=qt)
        spans.append((name, qt, total, nbytes))
        total += GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    header_end = w.fout[0].tell()
    w.close()
    start = GGUFWriter.ggml_pad(header_end, w.data_alignment)
    size = start + total
    with open(path, "r+b") as f:
        f.truncate(size)
        if values:
            for name, qt, off, nbytes in spans:
                fill_values(f, start + off, nbytes, qt, name)
    return size


# -- values like a trained model's ------------------------------------------------------------------------
#
# llama.cpp's CPU kernels do not take the same time on every value: on x86 each block's fp16 scales (a q4_1 block
# of 32 weights has two, the q8_1 block of activations it meets two more) are converted through ggml's 256 KB
# table (ggml-cpu/simd-mappings.h, ggml_lookup_fp16_to_fp32: only ARM and POWER convert in registers), so how many
# of its cache lines a mat-vec touches depends on how varied the scales are.  A model of zero weights touches one
# line and decoded SmolLM2's shape 25-35 % faster than SmolLM2 itself on a 2-vCPU EPYC VM; weights and activations
# whose block scales spread like a trained model's decoded as fast as the real one (bench/README.md, the speed
# model).  So the speed calibration's models carry values: every block's scale is 2^(base + U(-1, 1)) (a log2
# spread of 0.58, where SmolLM2's and Gemma 3's tensors measure 0.26-1.12), the quants random, the norms'
# gains log-normal (sigma 0.5) so that activations vary from channel to channel as a trained model's do.

SCALE_SPREAD_OCTAVES = 1.0
NORM_GAIN_SIGMA = 0.5
_POOL_BLOCKS = 1 << 16


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


def _pool(qt: Any, name: str, rng: Any) -> bytes:
    """A run of blocks of type ``qt`` whose values look like a trained model's (the module comment above)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    Q = GGMLQuantizationType
    blck, size = GGML_QUANT_SIZES[qt]
    n = _POOL_BLOCKS
    if qt in (Q.F32, Q.F16, Q.BF16):
        if "norm" in name:
            x = np.exp(rng.standard_normal(n) * NORM_GAIN_SIGMA)
        else:
            x = rng.standard_normal((n // 32, 32)) * 0.02 * np.exp2(rng.uniform(-1, 1, (n // 32, 1)) * SCALE_SPREAD_OCTAVES)
        x = x.astype(np.float32).reshape(-1)
        if qt == Q.F32:
            return x.tobytes()
        if qt == Q.F16:
            return x.astype(np.float16).tobytes()
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    fields, base = _scale_fields(qt.name, size)
    for off in fields:
        d = np.exp2(base + rng.uniform(-1, 1, n) * SCALE_SPREAD_OCTAVES).astype(np.float16)
        if off and qt.name in ("Q4_1", "Q5_1"):     # the block's minimum: below zero
            d = -d
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n, 2)
    if qt.name == "MXFP4":                  # one e8m0 exponent per block
        raw[:, 0] = rng.integers(118, 121, n, dtype=np.uint8)
    return raw.tobytes()


@functools.lru_cache(maxsize=16)
def _run_of(qt: Any, norm: bool, chunk: int = 16 << 20) -> memoryview:
    """About ``chunk`` bytes of ``_pool`` repeated, made once per type (and norm or not) per process: a model's
    hundreds of tensors of one type share it."""
    import zlib

    import numpy as np

    rng = np.random.default_rng(zlib.crc32(f"{qt.name}/{norm}".encode()))
    pool = _pool(qt, "norm" if norm else "", rng)
    return memoryview(pool * max(1, chunk // len(pool)))


def fill_values(f: Any, offset: int, nbytes: int, qt: Any, name: str) -> None:
    """Write ``nbytes`` of values like a trained model's (``_pool``, repeated) at ``offset`` of the open file ``f``."""
    rep = _run_of(qt, "norm" in name)
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

SPEED_MODELS_VERSION = 2      # 2: values like a trained model's (fill_values), not zeros


def write_llama(path: str | os.PathLike, *, n_embd: int, n_ff: int, n_layer: int, n_head: int, n_head_kv: int,
                mat_type: str, n_vocab: int = 256, head_dim: int | None = None, out_type: str | None = None,
                name: str = "edgekv speed calibration", values: bool = False) -> int:
    """A llama-architecture GGUF of zero weights in a sparse file (``values``: weights like a trained model's,
    fill_values; the speed calibration's models): ``n_layer`` blocks whose seven matrices are ``mat_type``, F32
    norms, an F32 token embedding and a separate output matrix (``out_type``, default ``mat_type``).  Returns the
    file size."""
    from gguf import GGMLQuantizationType, GGUFWriter

    Q = GGMLQuantizationType
    hd = head_dim or n_embd // n_head
    w = GGUFWriter(path, "llama", use_temp_file=False)
    w.add_name(name)
    w.add_block_count(n_layer)
    w.add_context_length(32768)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("none")
    m = Q[mat_type]
    t: list[tuple[str, tuple[int, ...], Any]] = [("token_embd.weight", (n_embd, n_vocab), Q.F32)]
    if n_head * hd % 32 or n_embd % 32:
        raise ValueError(f"n_embd {n_embd} and n_head x head_dim {n_head * hd} must be multiples of 32")
    for i in range(n_layer):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", (n_embd,), Q.F32), (b + "ffn_norm.weight", (n_embd,), Q.F32),
              (b + "attn_q.weight", (n_embd, n_head * hd), m), (b + "attn_k.weight", (n_embd, n_head_kv * hd), m),
              (b + "attn_v.weight", (n_embd, n_head_kv * hd), m), (b + "attn_output.weight", (n_head * hd, n_embd), m),
              (b + "ffn_gate.weight", (n_embd, n_ff), m), (b + "ffn_up.weight", (n_embd, n_ff), m),
              (b + "ffn_down.weight", (n_ff, n_embd), m)]
    t += [("output_norm.weight", (n_embd,), Q.F32), ("output.weight", (n_embd, n_vocab), Q[out_type or mat_type])]
    return write_sparse(w, path, t, values)


def speed_model_path(name: str, **shape: Any) -> Path:
    """A calibration model under ``EDGEKV_HOME/calibration/speed/`` (``name`` is edgekv's own, never user
    input), written on first use; the shape is part of the file name's hash so a changed shape is rewritten."""
    import hashlib
    import json
    import re

    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"bad calibration model name {name!r}")
    folder = edgekv_home() / "calibration" / "speed"
    tag = hashlib.sha256(json.dumps([SPEED_MODELS_VERSION, shape], sort_keys=True).encode()).hexdigest()[:10]
    p = folder / f"{name}-{tag}.gguf"
    if not p.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(p, root=folder, what="a speed calibration model") as tmp:
            write_llama(tmp, **shape, values=True)
    return p
