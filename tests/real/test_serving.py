"""`edgekv bench --llama-server`: the real llama-server (built from the vendored tree) on the real SmolLM2, driven over
HTTP as a user runs it; servers that refuse to start or die mid-run; no server left behind on Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from edgekv.core.predict import MIB, ContextParams, predict
from edgekv.prediction.api import load_model
from tests.procs import default_signals

ARGS = ["-c", "1024", "-p", "32", "-n", "8", "-r", "2", "-t", "2", "-ctk", "f16"]


def _bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekv.cli", "bench", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def served(llama_server_exe, smollm2_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("srv") / "r.jsonl"
    p = _bench(str(smollm2_path), "--llama-server", str(llama_server_exe), "-npl", "1,2", *ARGS, "-o", str(out), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout), out


def test_each_configuration_is_one_server_under_concurrent_requests(served, smollm2_path, llama_server_exe):
    recs, _out = served
    shape = load_model(str(smollm2_path)).shape
    assert [r["settings"]["n_parallel"] for r in recs] == [1, 2]
    for r in recs:
        k, sv, sp = r["settings"]["n_parallel"], r["serving"], r["speed"]
        assert r["status"] == "ok" and r["reason"] is None, r["reason"]
        assert r["settings"]["engine"] == "llama-server" and sv["path"] == str(llama_server_exe)
        assert sv["concurrency"] == k and sv["n_requests"] == 2 * k and sv["n_failed"] == 0 and sv["failures"] == []
        # every request: its time to first token, and the server's own count of what it processed and generated
        assert len(sv["ttft_s"]) == 2 * k and all(0 < t < 60 for t in sv["ttft_s"])
        assert sv["ttft_p50_s"] <= sv["ttft_p95_s"] and sv["ready_s"] > 0
        assert [(t["prompt_n"], t["predicted_n"]) for t in sv["server_timings"]] == [(32, 8)] * (2 * k)
        assert sp["pp"]["n_tokens"] == 32 * k and sp["tg"]["n_tokens"] == 8 * k and sp["tg_seq"]["n_tokens"] == 8
        assert len(sp["tg"]["samples_ts"]) == 2 and len(sp["tg_seq"]["samples_ts"]) == 2 * k
        # llama.cpp's own KV lines in the server's log are the formula's, for -np k
        assert r["differences"]["llama_kv_matches_formula"], r["differences"].get("llama_kv_diffs")
        assert r["effective"]["n_seq_max"] == k
        assert r["prediction"]["formula"]["total_bytes"] == predict(shape, ContextParams(n_ctx=1024, n_seq_max=k)).total_bytes
        # the server process's peak, sampled from outside, beside the prediction over the binary's own baseline
        res = r["memory_residual"]
        assert abs(res["peak_rss_pct"]) <= 3 and abs(res["peak_rss_bytes"]) <= 8 * MIB, res
        parts = {p["name"] for p in r["prediction"]["process"]["parts"]}
        assert "llama-server samplers" in parts


def test_the_report_shows_throughput_latency_and_memory_against_n(served, tmp_path):
    _recs, out = served
    p = subprocess.run([sys.executable, "-m", "edgekv.cli", "report", str(out), "-o", str(tmp_path / "rep")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "rep" / "README.md").read_text()
    assert "### Sequences at once and serving, measured" in md and "TTFT p50 / p95 s" in md
    assert (tmp_path / "rep" / "parallel.png").stat().st_size > 1000
    head = (tmp_path / "rep" / "results.csv").read_text().splitlines()[0].split(",")
    assert {"engine", "n_parallel", "ttft_p50_s", "ttft_p95_s", "serving_ts"} <= set(head)


FAKE = textwrap.dedent('''\
    #!{python}
    # a stand-in for llama-server: refuses its flags, or serves /health and dies on the first completion
    import http.server, json, os, sys
    if "--help" in sys.argv:
        print("--host HOST\\n--port PORT\\n-np, --parallel N\\n--kv-unified\\n--no-kv-unified\\n-nr, --no-repack")
        sys.exit(0)
    if os.environ.get("FAKE_MODE", "{mode}") == "refuse":
        print("0.00.001.000 E error: invalid argument: -ctk f16", file=sys.stderr)
        sys.exit(1)
    with open(sys.argv[sys.argv.index("-m") + 1], "rb") as f:      # like llama.cpp: not a GGUF, no server
        if f.read(4) != b"GGUF":
            sys.exit(1)
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def _json(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self._json({{"status": "ok"}} if self.path == "/health" else {{"data": [{{"meta": {{"n_vocab": 100}}}}]}}
                       if self.path == "/v1/models" else {{"total_slots": 1}})
        def do_POST(self):
            print("0.00.002.000 E GGML_ASSERT(fake) failed", file=sys.stderr, flush=True)
            os._exit(3)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


@pytest.mark.parametrize("mode, needle", [
    ("refuse", "exited with status 1 before it was ready: error: invalid argument: -ctk f16"),
    ("die", "ended during the run (status 3): GGML_ASSERT(fake) failed"),
])
def test_a_server_that_fails_is_a_failed_record_and_the_sweep_goes_on(mode, needle, smollm2_path, tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text(FAKE.format(python=sys.executable, mode=mode))
    fake.chmod(0o755)
    out = tmp_path / "r.jsonl"
    p = _bench(str(smollm2_path), "--llama-server", str(fake), "-npl", "1,2", *ARGS, "-o", str(out))
    assert p.returncode == 1, p.stderr[-2000:]
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["status"] for r in recs] == ["failed", "failed"]          # the second configuration still ran
    assert all(needle in r["reason"] for r in recs), [r["reason"] for r in recs]
    assert "Traceback" not in p.stderr and needle in p.stderr.strip().splitlines()[-1]


def test_ctrl_c_stops_the_server(llama_server_exe, smollm2_path, tmp_path):
    """Ctrl-C (and SIGTERM, handled the same way) while the server generates: edgekv exits 130 and the server, in
    its own process group, is gone; the record file keeps nothing torn."""
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "edgekv.cli", "bench", str(smollm2_path), "--llama-server",
                             str(llama_server_exe), "-npl", "1", "-c", "4096", "-p", "32", "-n", "3000", "-r", "3",
                             "-t", "2", "-ctk", "f16", "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_signals(signal.SIGINT))
    server = None
    deadline = time.monotonic() + 120
    while server is None and time.monotonic() < deadline:
        kids = [c for c in psutil.Process(proc.pid).children(recursive=True) if "llama-server" in c.name()]
        server = kids[0] if kids else None
        time.sleep(0.2)
    assert server is not None, "the server never started"
    time.sleep(3)                                   # serving by now
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Interrupted" in err and "Traceback" not in err
    gone, _alive = psutil.wait_procs([server], timeout=10)
    assert gone, f"llama-server {server.pid} is still running"
    assert not out.exists() or all(json.loads(x) for x in out.read_text().splitlines())
    assert not Path(f"/proc/{server.pid}").exists() or psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE


def test_decode_of_all_requests_counts_only_the_time_all_of_them_decode():
    """The server prefills a late request between decode steps: the aggregate decode is taken from the last request's
    first token to the first request's last one, counting every request's tokens in that window."""
    from edgekv.runtime.server import RequestResult
    from edgekv.sweep.serving import all_decoding_rate

    def req(arrivals):
        return RequestResult(index=0, ok=True, reason=None, n_prompt=4, n_tokens=arrivals[-1][1], n_chunks=len(arrivals),
                             t_send_s=0.0, t_end_s=arrivals[-1][0], ttft_s=arrivals[0][0], decode_tps=None,
                             arrivals=arrivals)

    early = req([(1.0 + 0.1 * i, i + 1) for i in range(30)])          # 10 t/s from 1.0 s to 3.9 s
    late = req([(2.0 + 0.1 * i, i + 1) for i in range(30)])           # 10 t/s from 2.0 s to 4.9 s
    # window 2.0 .. 3.9 s: early goes from 11 to 30 tokens, late from 1 to 20: 38 tokens in 1.9 s
    assert all_decoding_rate([early, late]) == pytest.approx(38 / 1.9)
    assert all_decoding_rate([early]) == pytest.approx(29 / 2.9)
    apart = req([(5.0 + 0.1 * i, i + 1) for i in range(3)])             # starts after early ended: never together
    assert all_decoding_rate([early, apart]) is None
