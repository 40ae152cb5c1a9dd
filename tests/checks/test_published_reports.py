"""The committed predicted-only reports reproduce the published figures and are what the script makes;
the real-model publishing script works end to end (with tiny settings)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "publish" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    out = tmp_path_factory.mktemp("predicted")
    # 0: every published figure matched; the speed predictions (one machine's calibration) are the committed ones
    assert _load("predicted_reports").main(out, speed_from=REPORTS) == 0
    return out


@pytest.mark.parametrize("name,figures", [
    ("bonsai-8b-predicted", {("32768", "f16"): "4608.0", ("32768", "q4_0"): "1296.0"}),
    ("gemma4-e4b-predicted", {("4096", "f16"): "104.0", ("16384", "f16"): "296.0", ("32768", "f16"): "552.0",
                              ("4096", "q4_0"): "29.25", ("16384", "q4_0"): "83.25", ("32768", "q4_0"): "155.25"}),
])
@pytest.mark.slow
def test_committed_predicted_reports(name, figures, regenerated):
    d = REPORTS / name
    rows = {(r["n_ctx"], r["type_k"]): r for r in csv.DictReader(io.StringIO((d / "results.csv").read_text()))}
    for key, mib in figures.items():
        assert rows[key]["kv_predicted_mib"] == mib, key
        assert rows[key]["kind"] == "predict" and rows[key]["peak_rss_bytes"] == ""     # nothing measured
    md = (d / "README.md").read_text()
    assert "**Predicted only.**" in md and "Where the numbers come from" in md
    # predicted speed for the machine that made the report, labelled, with the calibration that made it
    assert "### Speed, predicted" in md and "On other hardware every coefficient changes" in md
    assert all(float(r["tg_ts_predicted"]) > 0 and r["speed_calibration_id"] for r in rows.values())
    # the committed files are exactly what the script makes today
    for f in ("README.md", "results.csv", "results.json"):
        assert (regenerated / name / f).read_text() == (d / f).read_text(), f"{name}/{f}: rerun tools.publish.predicted_reports"
    gguf_file = next(d.glob("*.gguf"))
    assert gguf_file.stat().st_size < 100_000                                         # a header, no tensor data
    assert (regenerated / name / gguf_file.name).read_bytes() == gguf_file.read_bytes()
    # the script's `edgekv predict --engine` on that header: what the next test checks of the other headers
    assert set(SCRIPT_HEADERS) == set(_load("predicted_reports").MODELS)
    _engine_agrees(json.loads((regenerated / name / "predictions.json").read_text()))


def _engine_agrees(recs: list[dict]) -> None:
    """llama.cpp loaded the header (its full tensor table; a sparse stand-in of the full size), agreed with the
    formula, and its own weights figure equals the tensor table's."""
    assert recs
    for rec in recs:
        e = rec["prediction"]["engine"]
        assert e["ok"] and e["match"] is True, e
        assert e["weights_bytes"] == rec["model"]["size_bytes"] > 0
        assert sum(e["compute_mib"].values()) > 0


# the predicted reports' own headers go through `predict --engine` in the script the test above runs
SCRIPT_HEADERS = ("bonsai-8b-predicted", "gemma4-e4b-predicted")


@pytest.mark.slow
@pytest.mark.parametrize("header", sorted(p.relative_to(ROOT) for p in REPORTS.glob("*-predicted/*.gguf")
                                          if p.parent.name not in SCRIPT_HEADERS))
def test_predict_engine_works_on_every_committed_header(header):
    """`edgekv predict --engine` on each metadata-only header edgekv ships (the predicted reports' own: above)."""
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "predict", str(header), "-c", "4096,32768", "-ctk",
                        "f16,q4_0", "--engine", "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = json.loads(r.stdout)
    assert len(recs) == 4
    _engine_agrees(recs)


@pytest.mark.slow
def test_publish_script_quick(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tools.publish.publish_reports", "--quick", "--models", "smollm2-135m",
                        "--contexts", "512", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    d = tmp_path / "smollm2-135m"
    assert {"README.md", "results.csv", "results.json", "report.html", "sweep.jsonl", "memory_vs_context.png",
            "speed_vs_depth.png"} <= {p.name for p in d.iterdir()}
    md = (d / "README.md").read_text()
    assert "Quick settings" in md and "edgekv bench smollm2-135m -c 512 -ctk f16,q4_0" in md
    res = json.loads((d / "results.json").read_text())
    assert [(x["n_ctx"], x["type_k"], x["status"]) for x in res["rows"]] == [(512, "f16", "ok"), (512, "q4_0", "ok")]
    assert all(x["peak_rss_bytes"] and x["tg_ts_mean"] and x["kv_llama_matches_formula"] for x in res["rows"])


@pytest.mark.parametrize("name,lines", [("smollm2-135m", 1), ("gemma3-270m", 2)])
def test_committed_measured_reports_render_from_their_sweep(name, lines, tmp_path, cli):
    """Every figure in a committed measured report comes from its sweep.jsonl: rendering it again gives the same
    files, and llama.cpp's own KV lines agree with the formula in every configuration."""
    d = REPORTS / name
    md = (d / "README.md").read_text().split("\n")
    title, note = md[0].removeprefix("# "), md[2]
    r = cli("report", d / "sweep.jsonl", "-o", tmp_path, "--title", title, "--note", note)
    assert r.returncode == 0, r.stderr[-3000:]
    for f in ("README.md", "results.csv", "results.json"):
        assert (tmp_path / f).read_text() == (d / f).read_text(), f"{name}/{f}: rerun tools/publish/publish_reports.py"
    rows = json.loads((d / "results.json").read_text())["rows"]
    assert len(rows) == 12 and all(x["status"] == "ok" and x["kv_llama_matches_formula"] is True for x in rows)
    assert {x["kv_llama_cache_lines"] for x in rows} == {lines}
    # several cache objects (full + sliding window): the report says why llama.cpp's sum may differ by 0.01 MiB
    assert ("several cache objects" in "\n".join(md)) == (lines > 1)


LONG = REPORTS / "long-context-1m-predicted"


def test_long_context_report_is_consistent_and_agrees_with_llama_cpp():
    """reports/long-context-1m-predicted: every row agrees with llama.cpp's dry run, README.md and results.csv are
    what the script renders from predictions.json, and the formula on the committed headers still gives every
    committed figure (regenerating the dry runs takes minutes: tools/publish/long_context_report.py)."""
    from edgekv.core.predict import ContextParams, predict
    from edgekv.prediction.api import load_model

    mod = _load("long_context_report")
    recs = mod.load(LONG / "predictions.json")           # kind-predict records, strictly decoded
    assert len(recs) == len(mod.MODELS) * len(mod.CONTEXTS) * len(mod.TYPES)
    assert all(r.kind == "predict" and r.status == "ok" and r.prediction.engine.ok and r.prediction.engine.match is True
               for r in recs)
    assert (LONG / "README.md").read_text() == mod.readme(recs), "rerun tools/publish/long_context_report.py --render-only"
    assert (LONG / "results.csv").read_text() == mod.results_csv(recs)
    for model, (fname, *_rest) in mod.MODELS.items():
        shape = load_model(str(LONG / fname)).shape
        for r in (x for x in recs if mod.label(x) == model):
            f = r.prediction.formula
            p = predict(shape, ContextParams(n_ctx=f.n_ctx, type_k=f.type_k, type_v=f.type_v))
            assert p.total_bytes == f.total_bytes and [c.kind for c in p.caches] == [c.kind for c in f.caches]
    md = (LONG / "README.md").read_text()
    # the articles' figures, from their per-token formula at 1,000,000 tokens of f16
    for article in ("305.18", "65.45", "28.61"):
        assert article in md, article


@pytest.mark.slow
@pytest.mark.parametrize("fname", ["DeepSeek-V4-Flash-shape.gguf", "Qwen3.5-397B-A17B-shape.gguf"])
def test_long_context_headers_dry_run_at_one_million_tokens(fname):
    """llama.cpp itself, on the committed header, at 1,048,576 tokens: its figures equal the formula's."""
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "predict", str((LONG / fname).relative_to(ROOT)), "-c",
                        "1048576", "-ctk", "q8_0", "--engine", "--json"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = json.loads(r.stdout)
    e = rec["prediction"]["engine"]
    assert e["ok"] and e["match"] is True, e
