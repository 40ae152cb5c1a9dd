"""The tensor table a model family implies, rebuilt from a log's hyperparameters and tensor type counts.

Pure.  A llama.cpp log names the hyperparameters (``print_info``), the number of tensors of each type
(``llama_model_loader: - type q4_K: 193 tensors``) and the parameter count, not each tensor's shape and type.  For the
families whose table is known here (llama, mistral-style llama, qwen2, qwen3: the per-layer tensors of
src/models/llama.cpp, qwen2.cpp, qwen3.cpp), the table is rebuilt and checked against the log: the tensor count and
the parameter count pick whether the output layer is tied to the token embeddings and whether a ``rope_freqs``
tensor is there.  The bytes are exact only when every matrix has one type; a mixed quantization (Q4_K_M's q4_K and
q6_K) does not say which tensor has which type, and the rebuild says so instead of guessing.
"""

from __future__ import annotations

import re
from typing import Any

from gguf import GGMLQuantizationType

from edgekv.core.cachetypes import tensor_nbytes

FAMILIES = {"llama": {}, "qwen2": {"bias": True}, "qwen3": {"qk_norm": True}}


def _hp(meta: dict[str, Any], pi: dict[str, str], arch: str) -> dict[str, int] | None:
    def get(key: str, pkey: str) -> int | None:
        v = meta.get(f"{arch}.{key}")
        if isinstance(v, int):
            return v
        p = pi.get(pkey, "")
        return int(p) if p.isdigit() else None

    hp = {"n_embd": get("embedding_length", "n_embd"), "n_layer": get("block_count", "n_layer"),
          "n_head": get("attention.head_count", "n_head"), "n_head_kv": get("attention.head_count_kv", "n_head_kv"),
          "n_ff": get("feed_forward_length", "n_ff"), "n_vocab": get("vocab_size", "n_vocab")}
    if any(v is None for v in hp.values()):
        return None
    hd = hp["n_embd"] // hp["n_head"]
    hp["hd_k"] = get("attention.key_length", "n_embd_head_k") or hd
    hp["hd_v"] = get("attention.value_length", "n_embd_head_v") or hd
    return hp  # type: ignore[return-value]


def _layer(hp: dict[str, int], fam: dict[str, bool]) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """One layer's matrices and its small (f32) tensors, as ggml shapes (ne0 first)."""
    e, q, kv_k, kv_v = hp["n_embd"], hp["n_head"] * hp["hd_k"], hp["n_head_kv"] * hp["hd_k"], hp["n_head_kv"] * hp["hd_v"]
    mats = [(e, q), (e, kv_k), (e, kv_v), (hp["n_head"] * hp["hd_v"], e), (e, hp["n_ff"]), (e, hp["n_ff"]),
            (hp["n_ff"], e)]
    small = [(e,), (e,)]
    if fam.get("bias"):
        small += [(q,), (kv_k,), (kv_v,)]
    if fam.get("qk_norm"):
        small += [(hp["hd_k"],), (hp["hd_k"],)]
    return mats, small


def _params(shapes: list[tuple[int, ...]]) -> int:
    n = 0
    for s in shapes:
        p = 1
        for d in s:
            p *= d
        n += p
    return n


def _printed_params(pi: dict[str, str]) -> tuple[float, float] | None:
    m = re.match(r"([\d.]+) ([KMBT])$", pi.get("model params", ""))
    if not m:
        return None
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[m[2]]
    return float(m[1]) * scale, 0.005 * scale


def _variants(hp: dict[str, int], fam: dict[str, bool]):
    mats, small = _layer(hp, fam)
    emb = (hp["n_embd"], hp["n_vocab"])
    for tied in (True, False):
        for rope in (False, True):
            m = [emb] + mats * hp["n_layer"] + ([] if tied else [emb])
            s = [(hp["n_embd"],)] + small * hp["n_layer"] + ([(hp["hd_k"] // 2,)] if rope else [])
            yield tied, rope, m, s


def rebuild(meta: dict[str, Any], pi: dict[str, str], type_counts: dict[str, int]) -> dict[str, Any] | None:
    """The family's tensor table against the log; None where the family is not one rebuilt here."""
    arch = meta.get("general.architecture") or pi.get("arch")
    if arch not in FAMILIES or not type_counts:
        return None
    hp = _hp(meta, pi, arch)
    if hp is None:
        return {"status": "the log lacks a hyperparameter the table needs"}
    printed = _printed_params(pi)
    n_tensors = sum(type_counts.values())
    fits = [(tied, rope, m, s) for tied, rope, m, s in _variants(hp, FAMILIES[arch])
            if len(m) + len(s) == n_tensors and (printed is None or abs(_params(m + s) - printed[0]) <= printed[1])]
    if len(fits) != 1:
        return {"status": f"the {n_tensors} tensors and the parameter count do not fit one {arch} table "
                          "(needs the header)"}
    tied, rope, mats, small = fits[0]
    out: dict[str, Any] = {"family": arch, "tied_output": tied, "rope_freqs": rope, "tensors": n_tensors,
                           "params": _params(mats + small)}
    return {**out, **_bytes(mats, small, type_counts)}


def _bytes(mats: list[tuple[int, ...]], small: list[tuple[int, ...]], type_counts: dict[str, int]) -> dict[str, Any]:
    """Exact bytes when every matrix has one type and every small tensor is f32."""
    matrix_types = {t: n for t, n in type_counts.items() if t != "f32"}
    if type_counts.get("f32", 0) != len(small) or len(matrix_types) != 1:
        mixed = ", ".join(f"{t} {n}" for t, n in matrix_types.items())
        return {"status": f"the matrices mix types ({mixed}): which tensor has which type needs the header"}
    (t, n), = matrix_types.items()
    if n != len(mats):
        return {"status": "the type counts do not match the table: needs the header"}
    try:
        gid = GGMLQuantizationType[t.upper()]
    except KeyError:
        return {"status": f"tensor type {t} is not one edgekv sizes"}
    total = sum(tensor_nbytes(gid, s) for s in mats) + sum(4 * _params([s]) for s in small)
    return {"status": "rebuilt", "bytes": total}
