"""edgekv writes whole files through one helper, edgekv.sources.safepath.atomic_write / atomic_path."""

from __future__ import annotations

import ast
import os
import threading
from pathlib import Path

import pytest

from edgekv.sources.safepath import UnsafePath, atomic_path, atomic_write

ROOT = Path(__file__).resolve().parents[3]


def test_writes_whole_file_with_plain_permissions(tmp_path):
    p = atomic_write(tmp_path / "a" / "b.json", "{\"x\": 1}\n")
    assert p.read_text() == "{\"x\": 1}\n"
    mask = os.umask(0o022)
    os.umask(mask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~mask
    atomic_write(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert sorted(x.name for x in p.parent.iterdir()) == ["b.json"]


def test_failure_leaves_the_old_file_and_no_temp(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_path(p) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert p.read_text() == "old\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.jsonl"]


def test_concurrent_writers_never_share_a_temp_name(tmp_path):
    p = tmp_path / "merged.jsonl"
    seen: list[Path] = []
    gate = threading.Barrier(2)

    def writer(text: str) -> None:
        with atomic_path(p) as tmp:
            seen.append(tmp)
            gate.wait(timeout=10)     # both temp files exist at once
            tmp.write_text(text * 1000)

    ts = [threading.Thread(target=writer, args=(c,)) for c in "ab"]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(set(seen)) == 2
    assert p.read_text() in ("a" * 1000, "b" * 1000)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["merged.jsonl"]


def test_root_check_refuses_a_symlink_out(tmp_path):
    root, out = tmp_path / "cache", tmp_path / "elsewhere"
    root.mkdir()
    out.mkdir()
    (root / "link").symlink_to(out)
    with pytest.raises(UnsafePath):
        atomic_write(root / "link" / "h.bin", b"x", root=root)
    assert list(out.iterdir()) == []


def test_no_hand_written_replace_outside_the_helper():
    """os.replace / os.rename / mkstemp appear only in edgekv/sources/safepath.py."""
    bad = []
    for path in sorted((ROOT / "edgekv").rglob("*.py")):
        if path.name == "safepath.py" and path.parent.name == "sources":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("replace", "rename", "mkstemp") and \
                    isinstance(node.value, ast.Name) and node.value.id in ("os", "tempfile"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, "write whole files with edgekv.sources.safepath.atomic_write:\n" + "\n".join(bad)
