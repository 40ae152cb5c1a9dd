"""The two real models' headers without their weights or tokenizer: what the formula reads, committed, so that a test
of a formula on SmolLM2's or Gemma 3's shape needs neither model (the fast tier).

A header keeps every metadata key but the tokenizer's arrays (their length becomes ``{arch}.vocab_size``) and the
whole tensor table (names, shapes, types, offsets); the file ends where the tensor data would start.  It is written
with gguf-py's own writer.  tests/real/test_shape_headers.py rewrites both from the real models and checks that
they equal the committed files, byte for byte; ``python -m tests.headers`` rewrites them after a model changes.
"""

from __future__ import annotations

from pathlib import Path

HEADERS = Path(__file__).resolve().parent / "data" / "headers"
SMOLLM2 = HEADERS / "SmolLM2-135M-Instruct.Q4_1-header.gguf"
GEMMA3 = HEADERS / "gemma-3-270m-q4_k_m-header.gguf"
# the arrays only a tokenizer reads (a few MB for a 262K vocabulary)
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.scores")


def write_header(src: Path, out: Path) -> Path:
    """``src``'s header, less the tokenizer's arrays, into ``out``."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    n_vocab = next((len(f.data) for f in r.fields.values() if f.name in TOKENIZER_ARRAYS), None)

    def vocab_size(w) -> None:
        if n_vocab is not None and r.get_field(f"{arch}.vocab_size") is None:
            w.add_uint32(f"{arch}.vocab_size", n_vocab)

    return rewrite_header(r, out, vocab_size)


def rewrite_header(r, out: Path | str, more=None) -> Path | str:
    """The header of the GGUFReader ``r`` written to ``out`` by gguf-py's writer: every key but the tokenizer's
    arrays, then what ``more(writer)`` adds, then the whole tensor table; the file ends where the tensor data would
    start."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(out, r.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF.") or f.name in TOKENIZER_ARRAYS:
            continue
        vtype = f.types[0]
        w.add_key_value(f.name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    if more is not None:
        more(w)
    for t in r.tensors:
        w.add_tensor_info(t.name, [int(x) for x in reversed(t.shape)], np.dtype(np.float32), int(t.n_bytes),
                          raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return out


def sparse_model(header: Path, out: Path) -> Path:
    """A stand-in for the whole model: ``header`` (one of the committed headers) extended with a hole to the size
    its tensor table implies, so that a server serves it, ranges and all, like the real file, and a header read
    over HTTP sees the same bytes and size (the weights are zeros; the tokenizer's arrays are not there)."""
    from edgekv.sources.gguf_header import read_header_file

    out.write_bytes(header.read_bytes())
    with open(out, "r+b") as f:
        f.truncate(read_header_file(header).file_size)
    return out


if __name__ == "__main__":          # python -m tests.headers: rewrite both from the real models
    from edgekv.sources.resolve import resolve_model

    write_header(Path(resolve_model("smollm2-135m").path), SMOLLM2)
    write_header(Path(resolve_model("gemma3-270m").path), GEMMA3)
