"""edgekv explain on logs of backends, locales and loaders it had not seen (issue 69): each defect, on a real public
log of tests/data/logs (sources in its README)."""

from __future__ import annotations

import io
from pathlib import Path

from edgekv.core.explain import explain_lines
from edgekv.core.logconfig import read_bounded

LOGS = Path(__file__).parent / "data" / "logs"


def explain_file(name: str, lines: list[str] | None = None) -> dict:
    with open(LOGS / name, "rb") as f:
        b = read_bounded(f)
    return explain_lines(name, lines if lines is not None else b.lines)


def text_of(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


SYCL_COMMA = "sycl-arc-a770-qwen2-7b-f16-decimal-comma-b7300.log"


def test_decimal_comma_locale_is_read():
    r = explain_file(SYCL_COMMA)
    (kv,) = r["kv"]["lines"]
    assert kv["printed_mib"] == "224.00" and kv["match"] is True
    sycl = next(g for g in r["buffers"] if g["device"] == "SYCL0")
    assert sycl["total_mib"] == round(13486.77 + 224.00 + 304.00, 2)
    assert r["config"]["file_size"].startswith("14.19 GiB")
    m = r["model"]
    assert m["status"] == "predicted" and abs(m["residual_pct"]) < 0.01
    # the same log with points reads the same
    dots = explain_lines("dots", text_of(SYCL_COMMA).replace(",00 MiB", ".00 MiB").splitlines())
    assert dots["kv"]["lines"] == r["kv"]["lines"]


def test_device_name_with_nested_parentheses_keeps_name_and_free_memory():
    r = explain_file(SYCL_COMMA)
    (d,) = r["config"]["devices"]
    assert d == {"name": "SYCL0", "description": "Intel(R) Arc(TM) A770 Graphics", "free_mib": 15473}
    row = next(x for x in r["devices"] if x["device"] == "SYCL0")
    assert row["limit"] == "free at load" and row["fits"] is True


def test_replacement_character_is_text_not_binary():
    real = (LOGS / SYCL_COMMA).read_bytes()
    b = read_bounded(io.BytesIO("print_info: general.name     = caf\ufffd\n".encode() + real))
    assert b.binary_lines == 0
    b = read_bounded(io.BytesIO(b"print_info: x = \xff\xfe\n" + real))
    assert b.binary_lines == 1
