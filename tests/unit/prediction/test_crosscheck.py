"""crosscheck.compare names every way llama.cpp's dry run can differ from the formula: the context sizes, and the
cache lines of each kind (their count, then each field), in that order."""

from __future__ import annotations

from types import SimpleNamespace as NS

from edgekv.prediction import crosscheck


def _compare(monkeypatch, exp, got, **res):
    monkeypatch.setattr(crosscheck, "expected_lines", lambda pred: exp)
    monkeypatch.setattr(crosscheck, "engine_lines", lambda r: got)
    pred = NS(status="ok", reason=None, n_ctx_padded=512, n_ctx_seq=512, n_ubatch=512)
    base = {"ok": True, "error": None, "n_ctx": 512, "n_ctx_seq": 512, "n_ubatch": 512}
    return crosscheck.compare(pred, NS(**{**base, **res}))


def test_agreement_is_no_difference(monkeypatch):
    lines = [{"kind": "kv", "role": "swa", "cells": 256}, {"kind": "recurrent", "role": "", "bytes": 8}]
    assert _compare(monkeypatch, lines, [dict(x) for x in lines], n_ctx=None) == []


def test_each_difference_is_named(monkeypatch):
    exp = [{"kind": "kv", "role": "", "cells": 512}, {"kind": "state", "role": "csa", "bytes": 10},
           {"kind": "recurrent", "role": "", "bytes": 8}]
    got = [{"kind": "kv", "role": "", "cells": 256}, {"kind": "state", "role": "csa", "bytes": 12}]
    assert _compare(monkeypatch, exp, got, n_ctx=1024, n_ubatch=256) == [
        "n_ctx: engine 1024, formula 512",
        "n_ubatch: engine 256, formula 512",
        "KV cache 0 (kv) cells: engine 256, formula 512",
        "csa compressor state bytes: engine 12, formula 10",
        "recurrent state objects: engine 0, formula 1",
    ]
