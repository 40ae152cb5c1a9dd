"""edgekv.runtime.server against the real llama-server (built from the vendored tree) on the real SmolLM2 model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from edgekv.core.llamalog import parse_memory_log
from edgekv.core.predict import ContextParams, llama_mib, predict
from edgekv.errors import EngineError, UsageError
from edgekv.prediction.api import load_model
from edgekv.prediction.crosscheck import compare
from edgekv.runtime.engine import EngineResult
from edgekv.runtime.server import (
    AllRequestsFailed,
    ServerProcess,
    check_local,
    drive,
    fetch_props,
    log_reason,
    parse_help_flags,
    random_prompts,
    server_argv,
    server_flags,
)

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"n_ctx": 1024, "n_parallel": 2, "type_k": "f16", "type_v": "f16", "flash_attn": "auto", "n_threads": 2,
            "n_gpu_layers": -1, "n_batch": 2048, "n_ubatch": 512, "kv_unified": False}
N_PROMPT, N_GEN = 32, 8


def _env(exe: Path) -> dict[str, str]:
    from tools.llama_tools import tool_env

    return tool_env(exe)


def _our_servers() -> set[int]:
    """llama-server processes started by this test process that are still running (not zombies)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name().startswith("llama-server") and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _gone(pid: int, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def running() -> dict:
    """SETTINGS for a server that decodes: with the CPU backend's extra buffers only where their kernels run here (the
    server's warm-up already decodes a batch of two; on a CPU whose AMX kernels crash it would die there, see
    ../shared/reference/amx.md): edgekv bench decides the same way (edgekv.calibration.preflight)."""
    from edgekv.calibration.preflight import preflight

    return {**SETTINGS, "repack": preflight().repack}


@pytest.fixture(scope="module")
def server(llama_server_exe, smollm2_path, running):
    with ServerProcess(llama_server_exe, smollm2_path, running, env=_env(llama_server_exe)) as srv:
        yield srv
    assert not _our_servers()


def test_argv_spells_the_settings_and_the_guards():
    known = frozenset({"--cache-ram", "--ctx-checkpoints", "--no-cache-prompt", "--no-context-shift", "--fit",
                       "--no-webui", "--log-colors", "--no-repack", "--load-mode"})
    argv = server_argv("/x/llama-server", "/m.gguf", {**SETTINGS, "n_gpu_layers": 7, "repack": False, "no_mmap": True},
                       4321, known)
    line = " ".join(argv)
    for part in ("-m /m.gguf", "--host 127.0.0.1 --port 4321", "-c 1024", "-np 2", "-ctk f16 -ctv f16", "-fa auto",
                 "-t 2 -tb 2", "-b 2048 -ub 512", "--no-kv-unified", "-ngl 7", "--no-repack", "--load-mode none",
                 "--cache-ram 0", "--ctx-checkpoints 0", "--no-cache-prompt", "--no-context-shift", "--fit off",
                 "--no-webui", "--log-colors off"):
        assert part in line, part
    # the defaults pass nothing, a guard the server does not know is left out, an older build's --no-mmap is used
    argv = server_argv("/x/llama-server", "/m.gguf", {**SETTINGS, "kv_unified": True, "no_mmap": True}, 1,
                       frozenset({"--no-mmap"}))
    assert "-ngl" not in argv and "--kv-unified" in argv and "--no-mmap" in argv and "--cache-ram" not in argv
    with pytest.raises(UsageError, match="no --no-repack"):
        server_argv("/x/llama-server", "/m.gguf", {**SETTINGS, "repack": False}, 1, frozenset())
    with pytest.raises(UsageError):
        check_local("http://example.com:80")
    prompts = random_prompts(3, 5, 10, seed=7)
    assert prompts == random_prompts(3, 5, 10, seed=7) != random_prompts(3, 5, 10, seed=8)
    assert len(prompts) == 3 and all(len(x) == 5 and all(0 <= i < 10 for i in x) for x in prompts)
    assert check_local("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"


def test_help_flags_of_the_real_server(llama_server_exe):
    flags = server_flags(llama_server_exe)
    for f in ("--cache-ram", "--kv-unified", "--no-kv-unified", "--no-repack", "--fit", "--no-webui", "-ctk", "-np"):
        assert f in flags, f
    assert "--no-mmap" not in flags           # this llama.cpp has --load-mode instead
    assert parse_help_flags("-c,    --ctx-size N      size (see --not-a-flag)\n") == {"-c", "--ctx-size"}


def test_serves_timed_requests(server, smollm2_path):
    import httpx2

    assert httpx2.get(f"{server.base_url}/health", trust_env=False).status_code == 200
    assert server.alive() and server.port and server.pid
    props = fetch_props(server.base_url)
    assert props.total_slots == 2 and props.n_ctx_slot == 512 and props.n_vocab == 49152
    assert props.n_ctx_train == 8192 and props.build_info and server.ready_s > 0 and server.peak_gpu_bytes is None
    for conc in (1, 2):
        level = drive(server.base_url, conc, 2, N_PROMPT, N_GEN, props.n_vocab, seed=1, request_timeout_s=60)
        assert level.concurrency == conc and level.n_failed == 0 and level.wall_s > 0
        for r in level.requests:
            assert r.ok and r.reason is None and r.n_tokens == N_GEN, r
            assert r.ttft_s is not None and 0 < r.ttft_s < r.t_end_s - r.t_send_s
            assert r.decode_tps and r.decode_tps > 0
            assert r.timings["prompt_n"] == N_PROMPT and r.timings["predicted_n"] == N_GEN, r.timings
            assert r.stop_type == "limit" and not r.truncated
        assert level.generated_tokens == 2 * N_GEN and level.tokens_per_s == pytest.approx(2 * N_GEN / level.wall_s)
    assert server.peak_rss_bytes > smollm2_path.stat().st_size and server.n_samples > 10


def test_log_holds_the_predicted_kv_cache(server, smollm2_path):
    log = parse_memory_log(server.log_text())
    params = ContextParams(n_ctx=1024, n_seq_max=2, kv_unified=False, flash_attn="auto")
    pred = predict(load_model(str(smollm2_path)).shape, params)
    assert [c.mib for c in log.caches] == [llama_mib(pred.total_bytes)]
    assert (log.caches[0].cells, log.caches[0].seqs, log.caches[0].streams) == (512, 2, 2)
    assert log.context["n_ctx"] == "1024" and log.context["kv_unified"] == "false"
    assert log.compute_buffers and log.kv_buffers
    assert compare(pred, EngineResult(params, ok=True, log=log)) == []


def test_a_request_deadline_fails_the_request_not_the_run(server):
    t = time.monotonic()
    with pytest.raises(AllRequestsFailed, match="all 2 requests") as e:
        drive(server.base_url, 1, 2, N_PROMPT, 400, 49152, request_timeout_s=0.3)
    assert time.monotonic() - t < 5
    assert all(not r.ok and "no complete answer within 0.3 s" in r.reason for r in e.value.level.requests)
    # the server dropped the abandoned requests and serves the next ones
    level = drive(server.base_url, 2, 2, 8, 2, 49152, request_timeout_s=60, warmup=True)
    assert level.n_failed == 0


@pytest.mark.parametrize("case", ["bogus cache type", "not a gguf", "deadline"])
def test_a_server_that_cannot_start_says_why_in_one_line(case, llama_server_exe, smollm2_path, tmp_path):
    model, settings, deadline = smollm2_path, SETTINGS, 60.0
    if case == "bogus cache type":
        settings = {**SETTINGS, "type_k": "bogus"}
    elif case == "not a gguf":
        model = tmp_path / "model.gguf"
        model.write_bytes(b"this is not a gguf file\n" * 100)
    else:
        deadline = 0.01
    before, t = _our_servers(), time.monotonic()
    with pytest.raises(EngineError) as e:
        ServerProcess(llama_server_exe, model, settings, env=_env(llama_server_exe), ready_timeout_s=deadline).start()
    msg = str(e.value)
    assert time.monotonic() - t < 20 and "\n" not in msg, msg
    if case == "bogus cache type":
        assert msg == ('llama-server exited with status 1 before it was ready: '
                       'error while handling argument "-ctk": Unsupported cache type: bogus')
    elif case == "not a gguf":
        assert msg == ("llama-server exited with status 1 before it was ready: "
                       "gguf_init_from_reader: invalid magic characters: 'this', expected 'GGUF'")
    else:
        assert msg.startswith("llama-server was not ready within 0.01 s: "), msg     # then its log's last line, if any
    assert _our_servers() <= before


def test_an_exception_inside_the_with_stops_the_server(llama_server_exe, smollm2_path, running):
    before = _our_servers()
    with pytest.raises(KeyboardInterrupt), ServerProcess(llama_server_exe, smollm2_path, running,
                                                         env=_env(llama_server_exe)) as srv:
        pid = srv.pid
        raise KeyboardInterrupt
    assert _gone(pid, 1) and not srv.alive() and srv.returncode == 0     # SIGTERM: it shut down cleanly
    assert "memory breakdown" in srv.log_text()
    # the kernel's peak bounds the sampled one (statm is read from per-CPU counters: within a few pages)
    assert srv.kernel_maxrss_bytes >= 0.99 * srv.peak_rss_bytes > 0
    assert _our_servers() <= before


def test_a_server_deaf_to_sigterm_is_killed(monkeypatch, llama_server_exe, smollm2_path, running):
    import edgekv.runtime.server as server_mod

    monkeypatch.setattr(server_mod, "STOP_GRACE_S", 0.5)
    with ServerProcess(llama_server_exe, smollm2_path, running, env=_env(llama_server_exe)) as srv:
        os.kill(srv.pid, signal.SIGSTOP)         # a stopped process leaves SIGTERM pending; SIGKILL still ends it
        t = time.monotonic()
    assert srv.returncode == -signal.SIGKILL and time.monotonic() - t < 3


def test_a_port_taken_meanwhile_is_retried(monkeypatch, llama_server_exe, smollm2_path, running):
    import socket

    import edgekv.runtime.server as server_mod

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken])
        real = server_mod.free_port
        monkeypatch.setattr(server_mod, "free_port", lambda: next(ports, None) or real())
        with ServerProcess(llama_server_exe, smollm2_path, running, env=_env(llama_server_exe)) as srv:
            assert srv.port != taken and srv.alive()
            assert "couldn't bind" not in srv.log_text()      # the log of the server that runs, not of the first try


def test_the_server_dies_with_a_killed_edgekv(llama_server_exe, smollm2_path, running):
    script = textwrap.dedent("""
        import sys, time
        from edgekv.runtime.server import ServerProcess
        from edgekv.core.llamalog import parse_memory_log
        srv = ServerProcess(sys.argv[1], sys.argv[2], {"n_ctx": 256, "n_parallel": 1, "type_k": "f16", "type_v": "f16",
                            "flash_attn": "auto", "n_threads": 1, "n_batch": 256, "n_ubatch": 256, "kv_unified": False,
                            "repack": sys.argv[3] == "1"})
        srv.start()
        print(srv.pid, flush=True)
        time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", script, str(llama_server_exe), str(smollm2_path),
                          "1" if running["repack"] else "0"], stdout=subprocess.PIPE,
                         env=_env(llama_server_exe), cwd=ROOT, text=True)
    try:
        pid = int(p.stdout.readline())
        assert psutil.Process(pid).name().startswith("llama-server")
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert _gone(pid, 5), "llama-server outlived the edgekv that started it"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_log_reason_picks_the_line_that_says_why():
    assert log_reason("load_backend: loaded CPU\nerror: invalid argument: -ctk bogus\nusage: ...\n") == \
        "error: invalid argument: -ctk bogus"
    log = ("0.00.198.624 I print_info: n_expert = 0 (unknown_token_id: 0)\n"
           "0.00.217.316 E llama_init_from_model: quantized V cache requires flash_attn to be enabled\n"
           "0.00.217.326 E cmn  common_init_: failed to create context with model 'm.gguf'\n"
           "0.00.217.343 E srv    load_model: failed to create_context with model 'm.gguf'\n"
           "0.00.217.957 E srv  llama_server: exiting due to model loading error\n")
    assert log_reason(log) == "llama_init_from_model: quantized V cache requires flash_attn to be enabled"
    log = ("0.00.100.000 E gguf_init_from_file_impl: invalid magic characters: 'this'\n"
           "0.00.100.001 E llama_model_load: error loading model: tensor 'x' is corrupted\n"
           "0.00.100.002 E srv  llama_server: exiting due to model loading error\n")
    assert log_reason(log) == ("gguf_init_from_file_impl: invalid magic characters: 'this' | "
                               "llama_model_load: error loading model: tensor 'x' is corrupted")
    log = "0.00.1.2 I x: y\n/src/ggml.c:12: GGML_ASSERT(n > 0) failed\n#0  0x1 in ggml_abort ()\n"
    assert log_reason(log) == "/src/ggml.c:12: GGML_ASSERT(n > 0) failed"
