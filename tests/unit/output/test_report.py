"""`edgekv report`: golden Markdown and CSV, determinism, labels, inputs of every kind, and the HTML in Chromium.

The fixture ``tests/data/smollm2-sweep.jsonl`` is a real ``edgekv bench`` run of SmolLM2-135M
(512/1024/2048 x f16/q8_0/q4_0, -p 32 -n 16 -r 5) on a busy 2-core machine: its speed figures are noisy
on purpose-free grounds, which the report must show (``!``) rather than hide.  Regenerate the golden
files after an intended rendering change with ``EDGEKV_UPDATE_GOLDEN=1 pytest tests/unit/output/test_report.py`` (never
under CI: with ``CI`` set the switch fails the test instead of rewriting).
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgekv.cli.main import main
from edgekv.output import export as EX
from edgekv.output import render as RND
from edgekv.output import report as REP
from edgekv.output.envsection import gpu_text
from edgekv.records import results as R

DATA = Path(__file__).parents[2] / "data"
GOLDEN = Path(__file__).parents[2] / "golden" / "smollm2-sweep"
FIXTURE = DATA / "smollm2-sweep.jsonl"


def _golden(name: str, got: str, root: Path = GOLDEN) -> None:
    path = root / name
    if os.environ.get("EDGEKV_UPDATE_GOLDEN"):
        if os.environ.get("CI"):
            pytest.fail("EDGEKV_UPDATE_GOLDEN is set under CI: goldens are rewritten on a developer's machine only, "
                        "and the change committed (unset EDGEKV_UPDATE_GOLDEN)", pytrace=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"{path} missing: run with EDGEKV_UPDATE_GOLDEN=1 once"
    assert got == path.read_text(), f"{name} differs from {path} (EDGEKV_UPDATE_GOLDEN=1 to accept an intended change)"


def test_golden_rewrite_is_refused_under_ci(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text("old\n")
    monkeypatch.setenv("EDGEKV_UPDATE_GOLDEN", "1")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="EDGEKV_UPDATE_GOLDEN is set under CI"):
        _golden("README.md", "new\n", tmp_path)
    assert (tmp_path / "README.md").read_text() == "old\n"
    monkeypatch.delenv("CI")
    _golden("README.md", "new\n", tmp_path)          # the switch still works off CI
    assert (tmp_path / "README.md").read_text() == "new\n"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "smollm2"
    assert main(["report", str(FIXTURE), "-o", str(out)]) == 0
    return out


def test_golden_markdown_and_csv(written):
    _golden("README.md", (written / "README.md").read_text())
    _golden("results.csv", (written / "results.csv").read_text())


def test_the_environment_names_the_code_that_wrote_the_records():
    """Schema 4: each machine's column names the edgekv commits its records were written by (``-dirty``: with local
    changes); records older than that say ``unknown``, the one line the committed reports gained."""
    import msgspec

    typed = R.load_records(FIXTURE)

    def at(r, commit, dirty):
        return msgspec.structs.replace(r, environment=msgspec.structs.replace(r.environment, edgekv_commit=commit,
                                                                              edgekv_dirty=dirty))

    md = RND.render_markdown(REP.build(typed, plots=False))
    assert "| edgekv | 0.1.0 |\n| edgekv commit | unknown |\n" in md
    mixed = [at(r, "3f32cba" + "0" * 33, i % 2 == 1) for i, r in enumerate(typed)]
    md = RND.render_markdown(REP.build(mixed, plots=False))
    assert "| edgekv commit | 3f32cba, 3f32cba-dirty |" in md or "| edgekv commit | 3f32cba-dirty, 3f32cba |" in md


def test_every_file_is_written(written):
    names = sorted(p.name for p in written.iterdir())
    assert names == ["README.md", "memory_vs_context.png", "report.html", "results.csv", "results.json",
                     "speed_vs_depth.png"]
    for png in written.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"Software" not in png.read_bytes()[:4096]       # no matplotlib version stamp


def test_rendering_is_deterministic(written, tmp_path):
    again = tmp_path / "again"
    # another order of the same records, through the CLI with --json
    recs = R.load(FIXTURE)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in reversed(recs)))
    assert main(["report", str(shuffled), "-o", str(again)]) == 0
    for name in ("README.md", "results.csv", "results.json", "memory_vs_context.png", "speed_vs_depth.png",
                 "report.html"):
        assert (again / name).read_bytes() == (written / name).read_bytes(), name


def test_environment_heads_the_report_and_sources_are_labelled(written):
    md = (written / "README.md").read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Environment"
    env = md.split("## Environment", 1)[1].split("## Model", 1)[0]
    for words in ("commit 0c1e570", "llama-cpp-python 0.3.36", "AMD EPYC", "edgekv bench -c 512,1024,2048"):
        assert words in env
    # every memory figure says where it comes from
    for head in ("KV MiB, predicted (formula)", "KV MiB, llama.cpp dry run", "KV MiB, llama.cpp in the run",
                 "context memory MiB, measured (OS)", "peak RSS MiB", "KV saving vs f16, predicted",
                 "peak RSS saving vs f16, measured", "[95% CI]"):
        assert head in md, head
    assert "Quality" not in md             # the fixture has no quality block: no invented table


def test_figures_are_the_records_figures(written):
    recs = {(r["settings"]["n_ctx"], r["settings"]["type_k"]): r for r in R.load(FIXTURE)}
    rows = list(csv.DictReader(io.StringIO((written / "results.csv").read_text())))
    assert len(rows) == len(recs) == 9
    for row in rows:
        r = recs[(int(row["n_ctx"]), row["type_k"])]
        assert int(row["kv_predicted_bytes"]) == r["prediction"]["formula"]["total_bytes"]
        assert int(row["peak_rss_bytes"]) == r["memory"]["peak_rss_bytes"]
        assert float(row["tg_ts_mean"]) == pytest.approx(r["speed"]["tg"]["mean_ts"], abs=1e-3)
        assert int(row["tg_samples"]) == len(r["speed"]["tg"]["samples_ts"])
        growth = r["memory"]["anon_after_context_bytes"] - r["memory"]["anon_after_load_bytes"]
        assert int(row["context_growth_measured_bytes"]) == growth
        f16 = recs[(int(row["n_ctx"]), "f16")]
        assert float(row["kv_saving_vs_f16_predicted"]) == pytest.approx(
            f16["prediction"]["formula"]["total_bytes"] / r["prediction"]["formula"]["total_bytes"], abs=1e-3)
    js = json.loads((written / "results.json").read_text())
    assert js["rows"] == json.loads(json.dumps(EX.csv_rows(R.load(FIXTURE))))
    assert js["columns"] == list(EX.COLUMNS)


COMMITTED_SWEEP = Path(__file__).resolve().parents[3] / "reports" / "smollm2-135m"


def _frame_value(v):
    """A pandas cell as a plain value (pd.NA -> None, numpy scalars -> Python)."""
    import pandas as pd

    if v is pd.NA or (not isinstance(v, str) and pd.isna(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def test_results_csv_is_the_frame_through_one_mapping():
    """Every column of the committed results.csv is one column of the notebook frame (edgekv.results_frame), and
    its values are the frame's, rounded as the report prints them: the report has no flattener of its own."""
    import edgekv
    from edgekv.records import frame as F

    assert [c for c, _, _ in EX.EXPORT] == list(EX.COLUMNS)
    assert {f for _, f, _ in EX.EXPORT + EX.EXPORT_LOAD + EX.EXPORT_SPEED} <= set(F.COLUMNS)
    sweep = COMMITTED_SWEEP / "sweep.jsonl"
    df = edgekv.results_frame(sweep)
    committed = list(csv.DictReader(io.StringIO((COMMITTED_SWEEP / "results.csv").read_text())))
    settings = ("n_ctx", "n_depth", "type_k", "type_v", "flash_attn", "n_threads", "n_ubatch", "n_prompt", "n_gen")
    by_key = {tuple(str(_frame_value(x[k])) for k in settings): x for _, x in df.iterrows()}
    assert len(committed) == len(df) == len(by_key) == 12
    checked = 0
    for row in committed:
        x = by_key[tuple(row[k] or "None" for k in settings)]
        for col, fcol, nd in EX.EXPORT + EX.EXPORT_SPEED:      # the committed sweep holds speed predictions
            v = _frame_value(x[fcol])
            if row[col] == "":
                assert v is None, (col, v)
            elif isinstance(v, bool):
                assert row[col] == ("true" if v else "false"), col
            elif isinstance(v, (int, float)):
                assert float(row[col]) == (round(float(v), nd) if nd is not None else v), (col, row[col], v)
            else:
                assert row[col] == str(v), col
            checked += row[col] != ""
    assert checked > 12 * 30                 # most of the columns hold a figure in a measured sweep
    # results.json: the same rows, exact, from the frame's rows of the typed records (no pandas in between)
    js = json.loads((COMMITTED_SWEEP / "results.json").read_text())
    recs = EX.sort_records(edgekv.load_results(sweep))
    want = [{c: EX._r(x[f], nd) if nd is not None else x[f] for c, f, nd in EX.EXPORT + EX.EXPORT_SPEED}
            for x in F.frame_rows(recs)]
    assert js["rows"] == json.loads(json.dumps(want))


def test_build_accepts_dicts_and_records_alike():
    """report.build decodes what it is given once: plain dicts, typed Records or a mix give the same bytes."""
    dicts = R.load(FIXTURE)
    typed = R.load_records(FIXTURE)
    mixed = [d if i % 2 else t for i, (d, t) in enumerate(zip(dicts, typed))]
    out = []
    for recs in (dicts, typed, mixed):
        doc = REP.build(recs, plots=False)
        out.append((RND.render_markdown(doc), RND.render_csv(doc), RND.render_json(doc), RND.render_html(doc)))
    assert out[0] == out[1] == out[2]
    assert "KV MiB, llama.cpp in the run" in out[0][0] and out[0][1].count("\n") == 10
    from edgekv.errors import ResultsError

    with pytest.raises(ResultsError, match="record 2: settings.n_ctx"):
        REP.build([dicts[0], {**dicts[1], "settings": {**dicts[1]["settings"], "n_ctx": "4096"}}], plots=False)


def test_nothing_unmeasured_is_shown_as_measured(tmp_path):
    """A record without OS memory (e.g. from a run that died) shows dashes, not the prediction."""
    recs = R.load(FIXTURE)
    broken = copy.deepcopy(recs[0])
    broken["memory"] = None      # the schema's "nothing measured" (a run that died)
    broken.pop("llama_log")
    out = tmp_path / "r"
    REP.write_report([broken], out, plots=False)
    row = next(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert row["kv_predicted_bytes"] and row["peak_rss_bytes"] == "" and row["context_growth_measured_bytes"] == ""
    md = (out / "README.md").read_text()
    assert "Process memory, measured" not in md and "context memory MiB, measured" not in md


def real_quality_block() -> dict:
    """A quality block a real sweep wrote (reports/smollm2-135m), the schema's one layout."""
    sweep = Path(__file__).resolve().parents[3] / "reports" / "smollm2-135m" / "sweep.jsonl"
    return next(r["quality"] for r in map(json.loads, sweep.read_text().splitlines()) if r.get("quality"))


def _with_quality(rec, kld, ppl, base_ppl):
    r = copy.deepcopy(rec)
    # a real sweep's quality block with the figures replaced (test data, not a measurement)
    q = real_quality_block()
    q["quality"].update({"ppl": ppl, "ppl_err": 0.05, "base_ppl": base_ppl, "kld_mean": kld,
                         "kld_mean_err": kld / 20 if kld else 0.0, "kld_p99": kld * 8, "same_top_rate": 0.99 - kld})
    r["quality"] = {**q, "n_ctx": r["settings"]["n_ctx"], "type_k": r["settings"]["type_k"],
                    "type_v": r["settings"]["type_v"]}
    return r


def test_quality_table_and_plot_when_quality_blocks_exist(tmp_path):
    recs = [r for r in R.load(FIXTURE) if r["settings"]["n_ctx"] == 1024]
    q = {"f16": (0.0, 10.0), "q8_0": (0.002, 10.01), "q4_0": (0.03, 10.4)}
    recs = [_with_quality(r, q[r["settings"]["type_k"]][0], q[r["settings"]["type_k"]][1], 10.0) for r in recs]
    unavailable = {**recs[0]["quality"], "status": "unavailable", "error": "edgekv.quality.run is not installed",
                   "quality": None, "pass": None}
    recs.append({**copy.deepcopy(recs[0]), "quality": unavailable})
    recs[-1]["settings"] = {**recs[-1]["settings"], "n_ctx": 2048}
    out = tmp_path / "q"
    res = REP.write_report(recs, out)
    md = (out / "README.md").read_text()
    assert "### Quality, measured" in md
    assert "| 1024 | q4_0 | 10.4000 ± 0.0500 | +4.00% | 0.030000 ± 0.001500 |" in md
    assert "quality unavailable: edgekv.quality.run is not installed" in md
    assert any(f.endswith("kld.png") for f in res["files"])


def test_predict_json_and_llama_bench_inputs(tmp_path, smollm2_header, cli):
    preds = tmp_path / "p.json"
    r = cli("predict", smollm2_header, "-c", "4096,16384", "--kv-only", "--json")
    assert r.returncode == 0, r.stderr
    preds.write_text(r.stdout)
    out = tmp_path / "pred"
    assert cli("report", preds, "-o", out, "--no-plots").returncode == 0
    md = (out / "README.md").read_text()
    assert "**Predicted only.**" in md and "Nothing in this report was measured" in md
    assert "measured" not in md.split("## Model", 1)[1].split("## How to read", 1)[0].replace("Nothing", "")
    # llama-bench JSONL: speed only
    lb = tmp_path / "lb.jsonl"
    row = {"build_commit": "0c1e570", "build_number": 1, "cpu_info": "AMD EPYC", "gpu_info": "", "backends": "CPU",
           "model_filename": "m.gguf", "model_type": "llama 135M", "model_size": 1, "n_batch": 2048, "n_ubatch": 512,
           "n_threads": 2, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 99, "flash_attn": False, "n_prompt": 0,
           "n_gen": 16, "n_depth": 0, "samples_ns": [1, 2], "samples_ts": [50.0, 52.0]}
    lb.write_text(json.dumps(row) + "\n")
    out2 = tmp_path / "lb"
    assert cli("report", lb, "-o", out2, "--no-plots").returncode == 0
    md = (out2 / "README.md").read_text()
    assert "decode t/s (tg16)" in md and "51.0 [" in md and "llama-bench measures no memory" in md


@pytest.mark.parametrize("make,code,words", [
    (lambda d: d / "nope.jsonl", 1, "no such file"),
    (lambda d: (d / "x.jsonl").write_text("hello\n") and d / "x.jsonl", 1, "neither edgekv results"),
    (lambda d: (d / "e.jsonl").write_text("") or d / "e.jsonl", 1, "empty"),
])
def test_bad_inputs_are_one_line(tmp_path, make, code, words, cli):
    p = make(tmp_path)
    r = cli("report", p, "-o", tmp_path / "o")
    assert r.returncode == code
    assert words in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


# -- the HTML in a real browser -------------------------------------------------------------------------

def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def _screenshot(page: Path, shot: Path, height: int = 4200) -> list[str]:
    """Open ``page`` in headless Chromium, screenshot it, and return the page's console messages."""
    exe = _chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is needed for this test: apt-get install -y chromium")
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={shot.parent / (shot.stem + '-profile')}", "--enable-logging=stderr", "--v=0",
            f"--window-size=1280,{height}", f"--screenshot={shot}", page.resolve().as_uri()]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    return [line for line in r.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@pytest.mark.slow
def test_the_chromium_check_sees_console_errors(tmp_path):
    """The console check below is not vacuous: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><p>x</p><script>undefined_fn();</script></body></html>')
    console = _screenshot(bad, tmp_path / "bad.png", height=300)
    assert any("undefined_fn is not defined" in line for line in console), console


@pytest.mark.slow
def test_html_is_self_contained_and_renders_in_headless_chromium(written, tmp_path):
    html = (written / "report.html").read_text()
    assert "<script" not in html                    # nothing to throw a JS error
    assert "http://" not in html and "https://" not in html and "src=\"data:image/png;base64," in html
    assert html.count("<img ") == 2
    shot = tmp_path / "report.png"
    console = _screenshot(written / "report.html", shot)
    assert not console, console
    # the screenshot shows the page and the embedded plots: the exact colours of the f16 and q4_0 series
    from matplotlib.image import imread

    img = imread(shot)
    assert img.shape[0] >= 4000 and img.shape[1] >= 1200
    rgb = (img[..., :3] * 255).round().astype(int)
    flat = rgb[..., 0] * 65536 + rgb[..., 1] * 256 + rgb[..., 2]
    colours = set(flat.ravel().tolist())
    for hexcol in ("1f77b4", "d62728", "2ca02c"):          # f16, q4_0, q8_0 in the plots
        assert int(hexcol, 16) in colours, hexcol
    assert len(colours) > 200                      # text, tables and plots, not a blank page
    if os.environ.get("EDGEKV_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["EDGEKV_KEEP_SCREENSHOT"])


def test_kv_on_a_gpu_is_compared_with_device_memory(tmp_path):
    """Records of a real CUDA sweep (H100, recorded): the report compares the device memory the context added,
    less llama.cpp's device compute buffers, with the prediction, and shows no host-side error for a cache
    that is not in host memory."""
    from edgekv.core.llamalog import device_mib, is_host_buffer

    assert [n for n in ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "Vulkan_Host", "CUDA0", "MTL0", "Vulkan1")
            if not is_host_buffer(n)] == ["CUDA0", "MTL0", "Vulkan1"]
    src = DATA / "cuda-h100-smollm2.jsonl"
    recs = [json.loads(x) for x in src.read_text().splitlines()]
    assert main(["report", str(src), "-o", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == len(recs) == 8
    for rec, row in zip(recs, rows):
        mem, log = rec["memory"], rec["llama_log"]
        growth = mem["gpu_used_after_context_bytes"] - mem["gpu_used_after_load_bytes"]
        want = growth - round(device_mib(log["compute_mib"]) * REP.MIB) - rec["prediction"]["formula"]["total_bytes"]
        assert row["kv_on_device"] is True and row["context_gpu_growth_bytes"] == growth
        assert row["context_gpu_growth_minus_predicted_bytes"] == want
        assert 0 < want < 8 * REP.MIB                 # device rounding: a few MiB, never the KV itself
        assert row["context_growth_minus_predicted_bytes"] is None and row["context_growth_error_pct"] is None
        assert row["kv_llama_matches_formula"] is True
    md = (tmp_path / "README.md").read_text()
    assert "context GPU memory MiB, measured (device)" in md and "GPU − compute − predicted MiB" in md
    f16_8k = next(r for r in rows if r["n_ctx"] == 8192 and r["type_k"] == "f16")
    assert f"| {f16_8k['context_gpu_growth_minus_predicted_bytes'] / REP.MIB:+,.2f} |" in md


def test_bench_summary_shows_gpu_columns(capsys):
    from rich.console import Console

    from edgekv.output.benchview import render_summary

    recs = [json.loads(x) for x in (DATA / "cuda-h100-smollm2.jsonl").read_text().splitlines()]
    con = Console(width=250, force_terminal=False)
    render_summary(con, recs, "x.jsonl")
    out = capsys.readouterr().out
    assert "GPU MiB" in out and "peak" in out and "context" in out
    r = recs[4]
    assert f"{r['memory']['peak_gpu_bytes'] / REP.MIB:.1f}" in out
    assert f"{r['differences']['context_gpu_growth_bytes'] / REP.MIB:.1f}" in out


def test_quality_json_output_loads_in_report_and_merge(tmp_path, smollm2_path):
    """`edgekv quality --json` prints records of kind quality: report and merge read them like bench records."""
    out = subprocess.run([sys.executable, "-m", "edgekv.cli", "quality", str(smollm2_path), "-c", "128", "--chunks", "1",
                          "-ctk", "f16,q8_0", "-t", "2", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    qfile = tmp_path / "quality.json"
    qfile.write_text(out.stdout)
    recs = json.loads(out.stdout)
    assert [r["kind"] for r in recs] == ["quality", "quality"]
    kld = recs[1]["quality"]["quality"]["kld_mean"]
    from edgekv.output.inputs import load_any

    REP.write_report(load_any(qfile), tmp_path / "r", plots=False)      # dicts or Records: report decodes them once
    md = (tmp_path / "r" / "README.md").read_text()
    assert "### Quality, measured" in md and f"{kld:.6f}" in md
    merged = tmp_path / "merged.jsonl"
    r = subprocess.run([sys.executable, "-m", "edgekv.cli", "merge", str(qfile), "-o", str(merged)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [x["kind"] for x in R.load(merged)] == ["quality", "quality"]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_h100_report_names_the_gpu(name):
    """The environment stores NVML's GPUs under nvidia.devices; the report read nvidia.gpus and showed only the
    driver (issue 30 point 5). The recorded H100 runs and their committed reports name the card and its memory."""
    root = DATA / "cuda-h100"
    recs = [json.loads(x) for x in (root / f"{name}.jsonl").read_text().splitlines()]
    assert all(r["environment"]["nvidia"]["devices"] for r in recs)
    typed = R.load_records(root / f"{name}.jsonl")          # the typed environment: nvidia.devices, never a dict key
    assert gpu_text(typed[0].environment) == "NVIDIA H100 80GB HBM3 (80 GiB), driver 580.159.04"
    assert "| GPU | NVIDIA H100 80GB HBM3 (80 GiB), driver 580.159.04 |" in (root / f"report-{name}" / "README.md").read_text()
