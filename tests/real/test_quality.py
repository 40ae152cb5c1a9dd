"""edgekv quality on the real SmolLM2 model, checked against an independent reference.

The reference below uses llama-cpp-python's high-level ``Llama`` API and scipy directly: it shares
no code with edgekv's quality pass (not its tokenizer call, batches, softmax or statistics).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from edgekv.cli.main import main
from edgekv.quality.run import measure
from edgekv.records import results as R
from edgekv.sources.corpus import resolve_corpus

N_CTX = 128
CHUNKS = 4


@pytest.fixture(scope="module")
def cli_rows(smollm2_path):
    """One real pass through the CLI (--json): f16, q8_0 and q4_0 against the f16 baseline."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["quality", str(smollm2_path), "-c", str(N_CTX), "--chunks", str(CHUNKS), "-ctk", "f16,q8_0,q4_0",
                   "-t", "2", "--json"])
    assert rc == 0, buf.getvalue()
    recs = json.loads(buf.getvalue())
    # records of kind quality (issue 17): the measured row is their quality block
    assert {r["kind"] for r in recs} == {"quality"} and all(r["schema_version"] == R.SCHEMA_VERSION for r in recs)
    return {r["quality"]["type_k"]: r["quality"] for r in recs}


def _reference(model_path, corpus_path, type_k: str, chunks: int = CHUNKS):
    """Per-chunk scored log-probs with llama-perplexity's rules, from raw logits of llama_cpp.Llama."""
    import llama_cpp
    from scipy.special import log_softmax

    from tests.llamaparams import preflight_model_params

    ggml = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
    with preflight_model_params():      # on a CPU whose AMX kernels crash, the setting that runs there (--repack 0)
        llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True,
                              flash_attn=True, type_k=ggml[type_k], type_v=ggml[type_k], n_threads=2, verbose=False)
    data = Path(corpus_path).read_bytes()
    if data.endswith(b"\n"):          # llama-perplexity -f drops one trailing newline
        data = data[:-1]
    tokens = llm.tokenize(data, add_bos=True, special=False)
    add_bos = llama_cpp.llama_vocab_get_add_bos(llm._model.vocab)
    out = []
    for c in range(chunks):
        chunk = tokens[c * N_CTX:(c + 1) * N_CTX]
        inp = list(chunk)
        if add_bos:
            inp[0] = llm.token_bos()
        llm.reset()
        llm.eval(inp)
        logits = np.array(llm.scores[:N_CTX], dtype=np.float64)
        first = N_CTX // 2
        lp = log_softmax(logits[first:N_CTX - 1], axis=1)          # predicts tokens first+1 .. n_ctx-1
        out.append((lp, np.array(chunk[first + 1:N_CTX])))
    llm.close()
    return out


@pytest.fixture(scope="module")
def reference(smollm2_path):
    corpus = resolve_corpus(None)
    return {t: _reference(smollm2_path, corpus.path, t) for t in ("f16", "q8_0")}


def test_f16_against_f16_is_zero(cli_rows):
    q = cli_rows["f16"]["quality"]
    assert cli_rows["f16"]["status"] == "ok"
    assert abs(q["kld_mean"]) < 1e-9 and q["kld_max"] < 1e-9
    assert q["same_top_rate"] == 1.0
    assert q["ppl"] == pytest.approx(q["base_ppl"], rel=1e-12)
    assert q["n_tokens_scored"] == CHUNKS * (N_CTX - 1 - N_CTX // 2)


def test_quantized_caches_diverge_in_order(cli_rows):
    k8, k4 = cli_rows["q8_0"]["quality"]["kld_mean"], cli_rows["q4_0"]["quality"]["kld_mean"]
    assert k4 > k8 > 0
    assert cli_rows["q4_0"]["quality"]["same_top_rate"] < 1.0
    for r in cli_rows.values():
        q = r["quality"]
        assert q["kld_median"] <= q["kld_p90"] <= q["kld_p95"] <= q["kld_p99"] <= q["kld_p999"] <= q["kld_max"]
        assert q["baseline"] == {"type_k": "f16", "type_v": "f16"}
        assert q["method"] == "llama-perplexity"


def test_result_records_corpus_and_settings(cli_rows):
    corpus = resolve_corpus(None)
    q = cli_rows["q8_0"]["quality"]
    assert q["corpus"]["name"].startswith("pydoc-")
    assert q["corpus"]["sha256"] == corpus.sha256 and q["corpus"]["n_bytes"] == corpus.n_bytes
    assert q["corpus"]["n_tokens"] > 100_000
    assert (q["n_chunks"], cli_rows["q8_0"]["n_ctx"]) == (CHUNKS, N_CTX)
    assert q["n_seq"] == 2048 // N_CTX and q["n_batch"] == 2048
    assert q["flash_attn_resolved"] == "on" and q["attn_rot_k"] is True
    p = cli_rows["q8_0"]["pass"]
    assert p["n_contexts"] == 4 and p["peak_rss_bytes"] > 0


def test_ppl_equals_independent_recomputation(cli_rows, reference):
    for t in ("f16", "q8_0"):
        nll = np.concatenate([-lp[np.arange(len(y)), y] for lp, y in reference[t]])
        ppl = math.exp(nll.mean())
        err = ppl * math.sqrt(nll.var() / (nll.size - 1))
        q = cli_rows[t]["quality"]
        assert q["ppl"] == pytest.approx(ppl, rel=1e-6), t     # bitwise-equal logits give ~1e-15 on CPU
        assert q["ppl_err"] == pytest.approx(err, rel=1e-6), t


def test_kld_equals_independent_recomputation(cli_rows, reference):
    kld = np.concatenate([(np.exp(b) * (b - q)).sum(axis=1) for (b, _), (q, _) in zip(reference["f16"], reference["q8_0"])])
    q = cli_rows["q8_0"]["quality"]
    assert q["kld_mean"] == pytest.approx(kld.mean(), rel=1e-6)
    assert q["kld_max"] == pytest.approx(kld.max(), rel=1e-6)


def test_invalid_config_is_reported_not_run(smollm2_path):
    """Quantized V with flash attention off: llama.cpp refuses it; edgekv says so without starting a pass."""
    rows = measure(smollm2_path, [("f16", "q4_0")], None, N_CTX, 2, flash_attn="off")
    assert rows[0].status == "invalid" and "flash" in rows[0].error.lower()
    assert rows[0].quality is None and rows[0].pass_ is None


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"PK\x03\x04\x00\x00binary\x00\xff", "not a text file"),
    (b"\xff\xfe\xfa not utf-8", "not UTF-8"),
    ("A short text. " * 20, "needs at least 256"),
])
def test_bad_corpus_is_one_clear_line(tmp_path, capsys, smollm2_path, content, message):
    f = tmp_path / "corpus.txt"
    f.write_bytes(content.encode() if isinstance(content, str) else content)
    rc = main(["quality", str(smollm2_path), "-c", str(N_CTX), "-ctk", "q8_0", "--corpus", str(f)])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.count("\n") == 1 and err.startswith("edgekv: error: ") and message in err, err


def test_a_dying_pass_is_a_clean_error(smollm2_path):
    """llama.cpp aborting (here: SIGABRT sent to the child once it has tokenized) is one RunFailed line."""
    import os
    import signal

    from edgekv.errors import RunFailed

    def kill(ev):
        if ev.get("event") == "tokens":
            os.kill(ev["pid"], signal.SIGABRT)

    with pytest.raises(RunFailed, match="SIGABRT") as e:
        measure(smollm2_path, ["q8_0"], None, N_CTX, 2, on_event=kill)
    assert "\n" not in str(e.value)


def test_bos_model_against_independent_recomputation(gemma3_path):
    """Gemma 3 adds BOS: the first token of every chunk is replaced by BOS (llama-perplexity's rule)."""
    corpus = resolve_corpus(None)
    rows = {r.type_k: r for r in measure(gemma3_path, ["f16", "q8_0"], corpus, N_CTX, 2, n_threads=2)}
    assert rows["q8_0"].pass_.add_bos is True
    ref = {t: _reference(gemma3_path, corpus.path, t, chunks=2) for t in ("f16", "q8_0")}
    for t in ("f16", "q8_0"):
        nll = np.concatenate([-lp[np.arange(len(y)), y] for lp, y in ref[t]])
        assert rows[t].quality.ppl == pytest.approx(math.exp(nll.mean()), rel=1e-6), t
    kld = np.concatenate([(np.exp(b) * (b - q)).sum(axis=1) for (b, _), (q, _) in zip(ref["f16"], ref["q8_0"])])
    assert rows["q8_0"].quality.kld_mean == pytest.approx(kld.mean(), rel=1e-6)
    assert rows["f16"].quality.kld_max == 0.0


def test_bench_quality_joins_each_record(smollm2_path, tmp_path, cli_rows):
    """edgekv bench --quality: one pass per context, its rows in each record, equal to edgekv quality's own."""
    out = tmp_path / "q.jsonl"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["bench", str(smollm2_path), "-c", str(N_CTX), "-ctk", "f16,q8_0,q4_0", "-p", "16", "-n", "4",
                   "-r", "1", "-t", "2", "--quality", "--chunks", str(CHUNKS), "-o", str(out), "--json"])
    assert rc == 0, buf.getvalue()
    recs = {r["settings"]["type_k"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(recs) == {"f16", "q8_0", "q4_0"}
    for t, r in recs.items():
        assert r["status"] == "ok" and r["quality"]["status"] == "ok", r["quality"]
        assert r["settings"]["quality"] == {"corpus": "pydoc", "chunks": CHUNKS}
        q, ref = r["quality"]["quality"], cli_rows[t]["quality"]
        # same model, tokens, chunks and contexts as the CLI pass: the same figures
        for k in ("ppl", "kld_mean", "kld_max", "same_top_rate"):
            assert q[k] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), (t, k)
    # the three rows came from one pass (the baseline evaluated once for the group)
    assert len({r["quality"]["pass"]["wall_s"] for r in recs.values()}) == 1
    assert recs["q4_0"]["quality"]["quality"]["kld_mean"] > recs["q8_0"]["quality"]["quality"]["kld_mean"] > 0


def test_bench_quality_options_need_quality(capsys):
    assert main(["bench", "--chunks", "2"]) == 2   # a usage error, like click's
    err = capsys.readouterr().err
    assert err.startswith("edgekv: error: ") and "--quality" in err and err.count("\n") == 1


# -- the child's result, decoded once into the schema's typed blocks (no model: the child is replaced) -------------

def _child_rows() -> list[dict]:
    """What the quality child sends for -c 64 and two configs: q8_0 measured, q4_0 whose context failed."""
    from edgekv.core.klstats import summarize

    rng = np.random.default_rng(0)
    nll, base = rng.random(40) + 1.0, rng.random(40) + 1.0
    stats = summarize(nll, base, rng.random(40) / 100, rng.random(40) / 50 - 0.01, rng.random(40) > 0.1)
    shared = {"n_ctx": 64, "n_chunks": 2, "n_seq": 32, "n_batch": 2048, "n_ubatch": 512, "n_ctx_total": 2048,
              "eval_tokens": 128, "pass_wall_s": 1.5, "pass_stats_s": 0.25, "pass_contexts": 3, "pass_tokens_per_s": 256.0}
    ok = {"type_k": "q8_0", "type_v": "q8_0", "flash_attn": "auto", "flash_attn_resolved": "on", "attn_rot_k": True,
          "attn_rot_v": False, **stats, "status": "ok", "eval_s": 0.5, "eval_tokens_per_s": 256.0, "base_eval_s": 0.4,
          "base_flash_attn_resolved": "on", **shared}
    failed = {"type_k": "q4_0", "type_v": "q4_0", "flash_attn": "auto", "flash_attn_resolved": "on", "status": "error",
              "error": "llama_init_from_model: failed", **shared}
    return [ok, failed]


def _pass_with(monkeypatch, rows: list[dict]):
    """measure's run and shape phases on a child that answers ``rows``: the typed rows."""
    from types import SimpleNamespace

    from edgekv.core.corpus import CorpusFile
    from edgekv.quality import run as Q

    res = SimpleNamespace(events=[], ok=True, peak_rss_bytes=2**20, kernel_maxrss_bytes=None,
                          result={"rows": rows, "n_tokens": 5000, "add_bos": False, "n_vocab": 49152,
                                  "llama_cpp_python": "0.3.16", "system_info": "CPU : AVX2 = 1", "pid": 42})
    monkeypatch.setattr(Q, "run_child", lambda *a, **k: res)
    m = SimpleNamespace(ref=SimpleNamespace(path="/m/model.gguf", name="model"), shape=SimpleNamespace(name="SmolLM2"))
    corp = CorpusFile(name="pydoc-3.12", path="/c/pydoc.txt", n_bytes=5000, sha256="ab" * 32, source="builtin",
                      detail="CPython's docs")
    cfgs = [Q.QualityConfig("q8_0", "q8_0"), Q.QualityConfig("q4_0", "q4_0"), Q.QualityConfig("q5_0", "q5_0")]
    opts = Q.QualityOptions(n_batch=2048, n_ubatch=512, n_threads=2, base_type_k="f16", base_type_v="f16")
    got, info, peak = Q._run_pass(m, corp, [64], cfgs, [0, 1], -1, True, opts, None, None)
    return rows, Q._shape_rows([64], cfgs, {(64, 2): "refused"}, got, info, peak, corp, m, "f16", "f16", 2)


def test_child_rows_become_typed_quality_blocks(monkeypatch):
    """Issue 29: the child's rows are decoded once into the schema's Quality/QualityStats/QualityPass, whose JSON is
    the block a record carries (the schema's key order) and reads back strictly."""
    import msgspec

    from edgekv.records import schema as S

    sent, rows = _pass_with(monkeypatch, _child_rows())
    assert [type(r) for r in rows] == [S.Quality] * 3 and [r.status for r in rows] == ["ok", "error", "invalid"]
    ok, failed, refused = rows
    assert type(ok.quality) is S.QualityStats and type(ok.pass_) is S.QualityPass
    block = S.encode_block(ok)
    assert block == S.encode_block(msgspec.convert(block, S.Quality, strict=True))
    assert list(block) == ["n_ctx", "type_k", "type_v", "flash_attn", "status", "error", "quality", "pass"]
    q = block["quality"]
    assert list(q) == list(S.QualityStats.__struct_fields__)
    assert q["corpus"] == {"name": "pydoc-3.12", "path": "/c/pydoc.txt", "n_bytes": 5000, "sha256": "ab" * 32,
                           "source": "builtin", "detail": "CPython's docs", "n_tokens": 5000}
    assert (q["baseline"], q["method"], q["n_threads"]) == ({"type_k": "f16", "type_v": "f16"}, "llama-perplexity", 2)
    assert all(q[k] == v for k, v in sent[0].items() if k in q and k != "n_ctx")
    assert block["pass"] == {"wall_s": 1.5, "stats_s": 0.25, "n_contexts": 3, "tokens_per_s": 256.0, "n_ctx_total": 2048,
                             "eval_tokens": 128, "base_eval_s": 0.4, "base_flash_attn_resolved": "on",
                             "peak_rss_bytes": 2**20, "model": "/m/model.gguf", "model_name": "SmolLM2", "n_vocab": 49152,
                             "add_bos": False, "llama_cpp_python": "0.3.16", "system_info": "CPU : AVX2 = 1"}
    assert (failed.error, failed.quality, failed.pass_) == ("llama_init_from_model: failed", None, None)
    assert S.encode_block(refused) == {"n_ctx": 64, "type_k": "q5_0", "type_v": "q5_0", "flash_attn": "auto",
                                       "status": "invalid", "error": "refused", "quality": None, "pass": None}


def test_child_row_missing_or_unknown(monkeypatch):
    """A config the child sent no row for is 'not evaluated'; a key the parent does not know is one RunFailed line."""
    from edgekv.errors import RunFailed

    _, rows = _pass_with(monkeypatch, _child_rows()[:1])
    assert (rows[1].status, rows[1].error) == ("error", "not evaluated")
    with pytest.raises(RunFailed, match="its result does not read") as e:
        _pass_with(monkeypatch, [{**_child_rows()[0], "new_key": 1}])
    assert "\n" not in str(e.value)


def test_sweep_provider_returns_typed_quality(monkeypatch):
    """edgekv bench --quality: one measure call per (n_ctx, -fa) group, each case answered with a typed Quality (the
    BenchRecord's quality block); a failed pass is an error block per configuration of its group."""
    from types import SimpleNamespace

    from edgekv.core.predict import ContextParams
    from edgekv.errors import RunFailed
    from edgekv.quality import run as Q
    from edgekv.records import schema as S
    from edgekv.sweep.listener import QuietListener
    from edgekv.sweep.spec import bench_settings, quality_settings

    calls = []

    def fake_measure(path, cfgs, corpus, n_ctx, chunks, **kw):
        calls.append((n_ctx, kw["flash_attn"], [c.type_k for c in cfgs], chunks, corpus))
        if kw["flash_attn"] == "off":
            raise RunFailed("quality pass on m.gguf: died")
        return [Q._not_measured(n_ctx, c, "ok", None) for c in cfgs]

    monkeypatch.setattr(Q, "measure", fake_measure)
    spec = SimpleNamespace(model=SimpleNamespace(ref=SimpleNamespace(path="m.gguf")), repack=None, timeout_s=60.0,
                           settings=bench_settings(quality=quality_settings("wikitext-2", None)))
    cases = [SimpleNamespace(params=ContextParams(n_ctx=n, type_k=t, type_v=t, flash_attn=fa))
             for n in (64, 128) for fa in ("auto", "off") for t in ("f16", "q8_0")]
    provider = Q.for_sweep(spec, cases)
    got = [provider(c, QuietListener()) for c in cases]
    assert all(type(q) is S.Quality for q in got)
    assert calls == [(64, "auto", ["f16", "q8_0"], Q.SWEEP_CHUNKS, "wikitext-2"), (64, "off", ["f16", "q8_0"], 2, "wikitext-2"),
                     (128, "auto", ["f16", "q8_0"], 2, "wikitext-2"), (128, "off", ["f16", "q8_0"], 2, "wikitext-2")]
    assert [(q.n_ctx, q.flash_attn, q.type_k, q.status) for q in got[2:4]] == [(64, "off", "f16", "error"),
                                                                               (64, "off", "q8_0", "error")]
    assert S.encode_block(got[2]) == {"n_ctx": 64, "type_k": "f16", "type_v": "f16", "flash_attn": "off", "status": "error",
                                      "error": "quality pass on m.gguf: died", "quality": None, "pass": None}
