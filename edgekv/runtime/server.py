"""Start the user's own ``llama-server``; :mod:`edgekv.runtime.serverclient` drives it with a real HTTP client.

The server runs as a child in its own process group that dies with edgekv, even when edgekv is SIGKILLed
(``PR_SET_PDEATHSIG``, :func:`edgekv.runtime.process.die_with_parent`); its stdout and stderr go to a file (a pipe
could fill and stall it), which holds llama.cpp's memory lines for :func:`edgekv.core.llamalog.parse_memory_log`;
its resident memory is sampled from outside on a thread.  Only 127.0.0.1 is ever contacted.

PR_SET_PDEATHSIG fires when the *thread* that started the server ends: start a :class:`ServerProcess` from a thread
that outlives it (the main thread, normally).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from edgekv import heavy
from edgekv.errors import EngineError, UsageError
from edgekv.runtime.process import die_with_parent, kill_group
from edgekv.runtime.sampler import memory_sampler
from edgekv.runtime.serverclient import (
    LOCALHOST,
    AllRequestsFailed,
    LevelResult,
    RequestResult,
    ServerProps,
    adrive,
    check_local,
    completion_payload,
    drive,
    fetch_props,
    one_line,
    random_prompts,
)

# the client's public names, importable from here as before the split
__all__ = ["GUARD_FLAGS", "LOCALHOST", "PORT_TRIES", "READY_TIMEOUT_S", "SERVER_SAMPLE_INTERVAL_S", "STOP_GRACE_S",
           "AllRequestsFailed", "LevelResult", "RequestResult", "ServerProcess", "ServerProps", "adrive", "check_local",
           "completion_payload", "drive", "fetch_props", "free_port", "log_reason", "parse_help_flags",
           "random_prompts", "server_argv", "server_env", "server_flags"]

READY_TIMEOUT_S = 600.0               # a large model read from a slow disk (an exit is seen at once)
STOP_GRACE_S = 5.0
SERVER_SAMPLE_INTERVAL_S = 0.02      # the server's memory only grows while it serves: 50 readings a second suffice
PORT_TRIES = 3

# Flags that keep llama-server from changing its memory, or the work it does, behind the benchmark's back.  Each is
# passed only where this llama-server lists it in its --help (an older build refuses a flag it does not know), and
# each says why.
GUARD_FLAGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("--cache-ram", "0"), "no host-memory prompt cache: finished slots' KV would be copied into RAM (8 GiB by default)"),
    (("--ctx-checkpoints", "0"), "no context checkpoints: SWA and recurrent models keep up to 32 state copies per slot"),
    (("--no-cache-prompt",), "no prompt reuse between requests (each request also says cache_prompt: false)"),
    (("--no-context-shift",), "a full context ends the request rather than dropping tokens and going on"),
    (("--fit", "off"), "the layers and context asked for run as given, not shrunk to the device memory free at start"),
    (("--no-webui",), "no web UI: edgekv only talks to the HTTP API"),
    (("--log-colors", "off"), "plain log lines for the log parser"),
)
# the user's environment must not change the server's settings: llama.cpp reads LLAMA_ARG_<FLAG> for most flags
_ENV_DROP = ("LLAMA_ARG_", "LLAMA_API_KEY")


# -- the command line ------------------------------------------------------------------------------------

_FLAGS: dict[tuple[str, int], frozenset[str]] = {}     # (binary, its mtime) -> what its --help lists


def _ask_help(exe: str, env: dict[str, str]) -> tuple[int, frozenset[str]]:
    try:
        out = subprocess.run([exe, "--help"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60, env=env,
                             start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"{Path(exe).name} --help failed: {one_line(e)}") from None
    return out.returncode, parse_help_flags(out.stdout.decode("utf-8", "replace") + out.stderr.decode("utf-8", "replace"))


def parse_help_flags(text: str) -> frozenset[str]:
    """The flags a llama.cpp tool's ``--help`` lists: the comma-separated names that open an option line
    (``-c,    --ctx-size N      size of ...``), not those its descriptions mention."""
    flags: set[str] = set()
    for line in text.splitlines():
        for tok in line.split():
            m = re.fullmatch(r"(--?[A-Za-z][\w-]*),?", tok)
            if m is None:
                break
            flags.add(m[1])
            if not tok.endswith(","):      # the last name: its argument and the description follow
                break
    return frozenset(flags)


def server_flags(exe: str | os.PathLike, env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The flags this llama-server accepts: what its ``--help`` lists (asked once per binary and build; a binary
    that cannot run gives an empty set, and fails again, with its reason, when started)."""
    p = Path(exe)
    try:
        key = (str(p), p.stat().st_mtime_ns)
    except OSError as e:
        raise EngineError(f"llama-server {p}: {e.strerror or e}") from None
    if key not in _FLAGS:
        rc, flags = _ask_help(str(p), server_env(env))
        if rc != 0 or not flags:
            return flags
        _FLAGS[key] = flags
    return _FLAGS[key]


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without llama.cpp's own settings variables."""
    env = dict(os.environ if base is None else base)
    return {k: v for k, v in env.items() if not k.startswith(_ENV_DROP)}


def _pick(known: frozenset[str], *names: str) -> str | None:
    return next((n for n in names if n in known), None)


def server_argv(exe: str | os.PathLike, model_path: str | os.PathLike, settings: Mapping[str, Any], port: int,
                flags: frozenset[str] | None = None) -> list[str]:
    """llama-server's command line for edgekv's settings (``n_ctx, n_parallel, type_k, type_v, flash_attn,
    n_threads, n_gpu_layers, n_batch, n_ubatch, kv_unified``; optional ``repack, no_mmap, swa_full, warmup``).
    ``flags``: what the server accepts (default: its ``--help``)."""
    s = settings
    known = server_flags(exe) if flags is None else flags
    argv = [str(exe), "-m", str(model_path), "--host", LOCALHOST, "--port", str(port),
            "-c", str(s["n_ctx"]), "-np", str(s["n_parallel"]), "-ctk", str(s["type_k"]), "-ctv", str(s["type_v"]),
            "-fa", str(s["flash_attn"]), "-t", str(s["n_threads"]), "-tb", str(s["n_threads"]),
            "-b", str(s["n_batch"]), "-ub", str(s["n_ubatch"]),
            # said both ways: the server's own default depends on -np (unified only for -np auto)
            "--kv-unified" if s["kv_unified"] else "--no-kv-unified"]
    if s.get("n_gpu_layers", -1) != -1:
        argv += ["-ngl", str(s["n_gpu_layers"])]
    if s.get("swa_full"):
        argv.append("--swa-full")
    if s.get("warmup") is False:
        argv.append("--no-warmup")
    if s.get("repack") is False:          # a bool pair in llama-server (--repack / --no-repack), unlike llama-bench's
        flag = _pick(known, "--no-repack", "-nr")      # --repack 0, which llama-server would read as a stray "0"
        if flag is None:
            raise UsageError(f"{Path(exe).name} has no --no-repack: it cannot run with repack off")
        argv.append(flag)
    if s.get("no_mmap"):                  # --no-mmap before llama.cpp's --load-mode, --load-mode none after it
        if "--no-mmap" in known:
            argv.append("--no-mmap")
        elif "--load-mode" in known:
            argv += ["--load-mode", "none"]
        else:
            raise UsageError(f"{Path(exe).name} has neither --no-mmap nor --load-mode: it cannot load without mmap")
    # llama.cpp's own INFO lines (the KV cache, compute and model buffer sizes) are verbosity 4 ("trace") in the
    # server's log: its default of 3 leaves them out, and -v (everything) would log every token at debug level
    lv = _pick(known, "--log-verbosity", "-lv", "--verbosity")
    if lv is not None:
        argv += [lv, "4"]
    for guard, _why in GUARD_FLAGS:
        if guard[0] in known:
            argv += list(guard)
    return argv


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return int(s.getsockname()[1])


# -- the server process -----------------------------------------------------------------------------------

_ERROR_MARKS = ("error", "failed", "invalid", "couldn't", "unknown", "cannot", "unable", "unsupported")
_ABORT_MARKS = ("GGML_ASSERT", "GGML_ABORT", "terminate called", "what():", "Assertion")
# the lines that follow the one saying why, and a backtrace's frames
_GENERIC = ("exiting due to", "failed to load model", "failed to create context", "failed to create_context",
            "error loading model: llama_model_loader: failed")
_PREFIX = re.compile(r"^\d+(?:\.\d+){3} (?P<level>[A-Z]) ")     # the server's "0.00.008.247 E " in front of each line
_BIND_FAILED = "couldn't bind HTTP server socket"


def log_reason(text: str) -> str:
    """What a llama-server log says went wrong, on one line: an abort's own line, else the first error line
    (the cause; the ones after it repeat it) and, when it says more, the last one."""
    lines: list[tuple[str, str]] = []        # (level letter or "", line without the prefix)
    for raw in text.splitlines():
        m = _PREFIX.match(raw)
        line = raw[m.end():].strip() if m else raw.strip()
        if line and not line.startswith("#") and not line.startswith(("[New ", "[Thread ", "[Inferior")):
            lines.append((m["level"] if m else "", line))
    aborts = [x for _, x in lines if any(k in x for k in _ABORT_MARKS)]
    if aborts:
        return aborts[-1][:500]
    # a line with a level letter is an error when the server says so (E); one without (an argument refused before
    # logging starts, an older build) when it reads like one
    said = [x for lvl, x in lines if lvl == "E" or (not lvl and any(k in x.lower() for k in _ERROR_MARKS))]
    errors = [x for x in said if not any(g in x for g in _GENERIC)] or said
    if not errors:
        return f"its log ends with: {lines[-1][1]}"[:500] if lines else ""
    picked = [errors[0]]
    if len(errors) > 1 and errors[-1] != errors[0]:
        picked.append(errors[-1])
    return " | ".join(picked)[:500]


class ServerProcess:
    """The user's llama-server on a free port of 127.0.0.1, ready (``/health`` answered 200) once started.

    ``with ServerProcess(exe, model, settings) as srv:`` starts it and always stops it (SIGTERM to its group, then
    SIGKILL after :data:`STOP_GRACE_S`), on an exception or Ctrl-C too.  A server that exits, or is not ready within
    ``ready_timeout_s``, is stopped and :class:`EngineError` raised in one line naming the cause and its log's last
    error lines."""

    def __init__(self, exe: str | os.PathLike, model_path: str | os.PathLike, settings: Mapping[str, Any], *,
                 env: Mapping[str, str] | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
                 sample_interval_s: float = SERVER_SAMPLE_INTERVAL_S,
                 gpu_probe: Callable[[int], int | None] | None = None):
        self.exe = Path(exe)
        self.model_path = Path(model_path)
        self.settings = dict(settings)
        self.env = server_env(env)
        self.env.setdefault("GGML_NO_BACKTRACE", "1")     # an abort should not spend seconds in gdb
        self.ready_timeout_s = ready_timeout_s
        self.sample_interval_s = sample_interval_s
        self.gpu_probe = gpu_probe
        self.port: int | None = None
        self.argv: list[str] = []
        self.returncode: int | None = None
        self.kernel_maxrss_bytes: int | None = None   # wait4's ru_maxrss: may hold the forking parent's high-water mark
        self.ready_s: float | None = None              # seconds from start to the first 200 from /health
        self._proc: subprocess.Popen | None = None
        self._sampler = None
        self._log_fd: int | None = None        # the log file, already unlinked: nothing is left behind, even on SIGKILL
        self._log_final: str | None = None

    # -- what callers read
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def base_url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    @property
    def peak_rss_bytes(self) -> int | None:
        return (self._sampler.peak_rss or None) if self._sampler is not None else None

    @property
    def peak_gpu_bytes(self) -> int | None:
        return self._sampler.peak_gpu if self._sampler is not None else None

    @property
    def n_samples(self) -> int:
        return self._sampler.n if self._sampler is not None else 0

    def log_text(self) -> str:
        """The server's whole log so far (after stop: including what it printed while shutting down)."""
        if self._log_final is not None:
            return self._log_final
        if self._log_fd is None:
            return ""
        return os.pread(self._log_fd, os.fstat(self._log_fd).st_size, 0).decode("utf-8", "replace")

    def alive(self) -> bool:
        return self._proc is not None and self._poll() is None

    # -- life
    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> ServerProcess:
        """Start the server and wait until it is ready; a port taken meanwhile by another program is retried."""
        flags = server_flags(self.exe, self.env)
        t0 = time.monotonic()
        try:
            for attempt in range(PORT_TRIES):
                self.port = free_port()
                self.argv = server_argv(self.exe, self.model_path, self.settings, self.port, flags)
                self._spawn()
                why = self._wait_ready(t0 + self.ready_timeout_s)
                if why is None:
                    self.ready_s = time.monotonic() - t0
                    return self
                text = self.log_text()
                self.stop()
                if _BIND_FAILED in text and attempt + 1 < PORT_TRIES:
                    continue
                raise EngineError(f"{self.exe.name} {why}: {log_reason(text) or 'its log is empty'}")
        except BaseException:
            self.stop()
            raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        # a file without a name (O_TMPFILE where the OS has it, else unlinked at once): read back through the same
        # open file the server writes into, and nothing is left behind, even on SIGKILL
        with tempfile.TemporaryFile(prefix="edgekv-llama-server-", suffix=".log") as tmp:
            fd = os.dup(tmp.fileno())
        self._log_fd, self._log_final = fd, None
        self.returncode = self.kernel_maxrss_bytes = None
        try:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                          env=self.env, start_new_session=True, preexec_fn=die_with_parent())
        except OSError as e:
            self._keep_log()
            raise EngineError(f"{self.exe.name} could not be started: {e.strerror or e}") from None
        self._sampler = memory_sampler(self._proc.pid, self.sample_interval_s, self.gpu_probe)

    def _wait_ready(self, deadline: float) -> str | None:
        """None once /health answers 200; else why not ("exited with status 1 before it was ready")."""
        httpx2 = heavy.httpx2()

        with httpx2.Client(trust_env=False, timeout=httpx2.Timeout(2.0)) as client:
            while True:
                rc = self._poll()
                if rc is not None:
                    how = f"died with {_signal_name(-rc)}" if rc < 0 else f"exited with status {rc}"
                    return f"{how} before it was ready"
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return None
                except httpx2.HTTPError:
                    pass                        # not listening yet
                if time.monotonic() >= deadline:
                    return f"was not ready within {self.ready_timeout_s:g} s"
                time.sleep(0.05)

    def _poll(self) -> int | None:
        """The exit status once the server has ended (reaped here with wait4, for its ru_maxrss), else None."""
        if self._proc is None or self.returncode is not None:
            return self.returncode
        try:
            pid, status, rusage = os.wait4(self._proc.pid, os.WNOHANG)
        except ChildProcessError:             # reaped elsewhere
            self.returncode = self._proc.returncode if self._proc.returncode is not None else -1
            return self.returncode
        if pid == 0:
            return None
        self.returncode = self._proc.returncode = os.waitstatus_to_exitcode(status)
        self.kernel_maxrss_bytes = rusage.ru_maxrss * 1024
        return self.returncode

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after :data:`STOP_GRACE_S`; reap it; keep its log."""
        if self._proc is None or self._log_final is not None:
            return                             # never started, or stopped already
        if self._sampler is not None and self._poll() is None:
            self._sampler.sample_once()        # the last reading while it still holds everything
        if self._poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            end = time.monotonic() + STOP_GRACE_S
            while self._poll() is None and time.monotonic() < end:
                time.sleep(0.02)
        if self._poll() is None:              # SIGKILL to the group while its leader still holds the id
            kill_group(self._proc.pid)
            while self._poll() is None:
                time.sleep(0.01)
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler.join()
            self._sampler.close()
        self._keep_log()

    def _keep_log(self) -> None:
        if self._log_fd is None:
            return
        try:
            self._log_final = self.log_text()
        except OSError:
            self._log_final = ""
        finally:
            os.close(self._log_fd)
            self._log_fd = None


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
