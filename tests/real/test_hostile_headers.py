"""Hostile GGUF headers: shapes llama.cpp refuses get `invalid` with the reason (checked against llama.cpp's
own dry run, ``--engine``), and reading a header is bounded in time and memory whatever it declares.
"""

from __future__ import annotations

import copy
import json
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekv.errors import GGUFFormatError
from edgekv.sources.gguf_header import MAX_KEPT_STRING_BYTES, read_header_file
from tests.tiny.writer import write_spec

SPEC = json.loads((Path(__file__).parents[1] / "tiny" / "specs.json").read_text())["families"]["llama-gqa"]

# header edits llama.cpp refuses (each checked below against the engine's refusal)
BAD = {
    "head_count 0": [("llama.attention.head_count", 0)],
    "head_count 0xFFFFFFFF": [("llama.attention.head_count", 0xFFFFFFFF)],
    "head_count_kv 0xFFFFFFFF": [("llama.attention.head_count_kv", 0xFFFFFFFF)],
    "head_count_kv 0": [("llama.attention.head_count_kv", 0)],
    "head_count_kv 3 (not the tensors')": [("llama.attention.head_count_kv", 3)],
    "head_count_kv 8 > head_count": [("llama.attention.head_count_kv", 8)],
    "key_length 0": [("llama.attention.key_length", 0)],
    "key/value length 33": [("llama.attention.key_length", 33), ("llama.attention.value_length", 33)],
    "key_length 0xFFFFFFFF": [("llama.attention.key_length", 0xFFFFFFFF)],
    "embedding_length 257": [("llama.embedding_length", 257)],
    "embedding_length 0": [("llama.embedding_length", 0)],
}


def variant(path: Path, edits) -> Path:
    s = copy.deepcopy(SPEC)
    md = {m[0]: m for m in s["metadata"]}
    for k, v in edits:
        if k in md:
            md[k][2] = v
        else:
            s["metadata"].append([k, "uint32", v])
    write_spec(path, s)
    return path


@pytest.mark.slow
def test_the_unedited_model_is_valid_for_both(tmp_path, cli):
    p = variant(tmp_path / "ok.gguf", [])
    rc, out, err = cli("predict", str(p), "-c", "512", "-ctk", "f16", "--engine", "--json")
    assert rc == 0, err
    row = json.loads(out)[0]
    e, f = row["prediction"]["engine"], row["prediction"]["formula"]
    assert row["status"] == "ok" and e["ok"] and e["match"] and f["kv_bytes"] == 1 << 20


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_a_shape_llama_cpp_refuses_is_invalid_never_a_number(tmp_path, cli, case):
    p = variant(tmp_path / "bad.gguf", BAD[case])
    rc, out, err = cli("predict", str(p), "-c", "512,4096", "-ctk", "f16,q8_0", "--json")
    rows = [r["prediction"]["formula"] for r in json.loads(out)]
    assert rc == 1 and len(rows) == 4
    assert all(r["status"] == "invalid" and r["total_bytes"] is None and r["kv_bytes"] is None for r in rows)
    assert all(r["reason"].startswith("llama.cpp refuses to load this model") for r in rows)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgekv: error: ") and "no figure given" in lines[0]
    # llama.cpp itself: the same file does not load
    rc, out, err = cli("predict", str(p), "-c", "512", "-ctk", "f16", "--engine")
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and "llama.cpp refused to load it" in lines[0], err


# -- bounded reading -------------------------------------------------------------------------------

def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def header(n_tensors: int, kvs: list[bytes]) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kvs)) + b"".join(kvs)


def kv_array(key: str, item_type: int, n: int, body: bytes = b"") -> bytes:
    return _s(key.encode()) + struct.pack("<IIQ", 9, item_type, n) + body


@pytest.mark.parametrize("name,data,words", [
    ("2^32 empty strings", header(0, [kv_array("a", 8, 1 << 32)]), "absurd array length"),
    ("2^24 empty strings in a small file", header(0, [kv_array("a", 8, 1 << 24)]), "declares 16777216 items"),
    ("2^32 nested arrays", header(0, [kv_array("a", 9, 1 << 32)]), "absurd array length"),
    ("2^22 tensor infos", header(1 << 22, []), "absurd tensor count"),
    ("2^20 metadata keys", b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 20), "absurd metadata count"),
    ("a 32 MiB string", header(0, [_s(b"k") + struct.pack("<IQ", 8, 32 << 20)]), "absurd string length"),
])
def test_absurd_declarations_are_refused_before_walking(tmp_path, name, data, words):
    p = tmp_path / "h.gguf"
    p.write_bytes(data)
    t0 = time.monotonic()
    with pytest.raises(GGUFFormatError, match=words):
        read_header_file(p)
    assert time.monotonic() - t0 < 10      # refused from the declaration, not after walking it


_RSS_CHILD = """
import resource, sys
from edgekv.errors import GGUFFormatError
from edgekv.sources.gguf_header import read_header_file
try:
    read_header_file(sys.argv[1])
    print("read", end=" ")
except GGUFFormatError as e:
    print("refused:", str(e)[-160:], end=" ")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
def test_many_large_strings_are_bounded_in_memory(tmp_path):
    """32 strings of 16 MiB in a sparse file (the issue's 2,164 MiB case, at the per-string cap)."""
    p = tmp_path / "strings.gguf"
    n, size = 32, 16 << 20
    with open(p, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, n))
        for i in range(n):
            f.write(_s(f"k{i}".encode()) + struct.pack("<IQ", 8, size))
            f.seek(size, 1)     # a hole: the string's bytes
        f.write(b"\0")
    baseline = subprocess.run([sys.executable, "-c", "import resource, edgekv.sources.gguf_header; "
                               "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
                              capture_output=True, text=True, check=True)
    r = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    words, rss_kib = r.stdout.rsplit(" ", 1)
    assert words.startswith("refused:") and f"exceed {MAX_KEPT_STRING_BYTES >> 20} MiB" in words
    growth_mib = (int(rss_kib) - int(baseline.stdout)) / 1024
    assert growth_mib < 3 * (MAX_KEPT_STRING_BYTES >> 20), growth_mib    # was 2,164 MiB before the cap
    assert resource.getpagesize() > 0
