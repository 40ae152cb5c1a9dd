"""The one module that starts processes.

A child runs ``python -m edgekv.child.worker SUBCOMMAND`` with a JSON payload on stdin.  It reports
through a dedicated pipe (not stdout, which native code may write to): one JSON object per line,
``{"event": ...}``.  The parent samples the child's memory every few milliseconds on a thread,
reads the kernel's own peak (``os.wait4``), enforces a timeout, and turns a crash, an abort, an
OOM kill or a timeout into a :class:`ChildResult` with the reason instead of an exception.

The sampling thread lives in :mod:`edgekv.runtime.sampler`; what the child runs to write its events
(:class:`~edgekv.runtime.childside.EventWriter`) in :mod:`edgekv.runtime.childside`.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from edgekv.runtime.childside import EVENT_FD_ENV
from edgekv.runtime.sampler import PAGE, Sampler, oom_kill_count


@dataclass
class ChildResult:
    returncode: int | None
    signal: int | None
    timed_out: bool
    wall_s: float
    events: list[dict[str, Any]]
    result: dict[str, Any] | None
    stderr_tail: str
    peak_rss_bytes: int | None = None
    peak_anon_bytes: int | None = None       # anonymous part of RSS at the RSS peak (Linux)
    peak_file_bytes: int | None = None       # file-backed part of RSS at the RSS peak (Linux)
    peak_footprint_bytes: int | None = None  # macOS phys_footprint peak
    peak_gpu_bytes: int | None = None        # NVML per-process GPU memory peak
    kernel_maxrss_bytes: int | None = None   # os.wait4 ru_maxrss
    n_samples: int = 0
    sample_interval_max_s: float | None = None      # outside the timed tests
    timed_unsampled_s: float = 0.0                  # time the child spent in timed tests (the parent did not sample)
    n_child_samples: int = 0                        # readings the child took of itself after timed repetitions
    phase_peaks: dict[str, int] = field(default_factory=dict)
    gpu_phase_peaks: dict[str, int] = field(default_factory=dict)   # NVML, per phase of the child
    stdout: str | None = None
    stderr: str | None = None
    log_tail: list[str] = field(default_factory=list)   # the last llama.cpp lines the child forwarded ("log" events)
    last_phase: str | None = None                       # the last phase the child announced
    oom_kills_rose: bool = False                        # the kernel's oom_kill counter rose while the child ran
    stopped_reason: str | None = None                   # why the parent's watchdog stopped it

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        return signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else \
            f"signal {self.signal}"

    def last_error(self) -> str | None:
        """The line of the child's stderr that explains its death (an assert, an exception), if any."""
        return _last_meaningful_line(self.stderr_tail) or None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.result is not None and not self.timed_out

    def failure_reason(self) -> str | None:
        if self.ok:
            return None
        if self.timed_out:
            return f"timed out after {self.wall_s:.0f} s"
        if self.signal is not None:
            name = signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else str(self.signal)
            hint = ""
            if self.signal == signal.SIGKILL:      # OOM is said only where the kernel's counter says so
                hint = " (killed by the kernel's OOM killer)" if self.oom_kills_rose else " (killed)"
            if self.signal == signal.SIGABRT:
                hint = " (llama.cpp aborted)"
            last = _last_meaningful_line(self.stderr_tail)
            return f"child died with {name}{hint}" + (f": {last}" if last else "")
        if self.result is None:
            last = _last_meaningful_line(self.stderr_tail)
            return f"child exited with code {self.returncode} without a result" + (f": {last}" if last else "")
        return f"child exited with code {self.returncode}"


_NOISE = ("No such file or directory", "warning: File ", "auto-load", "[Inferior", "#0 ", "#1 ")


def _last_meaningful_line(text: str) -> str:
    """The line that explains a death: a GGML_ASSERT/abort/exception first, else the last real line."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    for line in reversed(lines):
        if any(k in line for k in ("GGML_ASSERT", "GGML_ABORT", "terminate called", "what():", "Error:", "error:")):
            return line[:400]
    for line in reversed(lines):
        if not line.startswith("Traceback") and not any(n in line for n in _NOISE):
            return line[:400]
    return ""


def die_with_parent() -> Callable[[], None] | None:
    """Linux: a function for ``Popen(preexec_fn=...)`` that asks the kernel to SIGKILL the child when the process
    that started it dies, even by SIGKILL (``prctl(PR_SET_PDEATHSIG)``), so a measuring child never runs on as an
    orphan at full CPU.  Resolved here, before any fork, so the forked child only makes the call; the parent's pid
    is checked after it, since the parent may have died before the call was made."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()                 # the process about to start the child
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return set_pdeathsig


# Every child loads libllama (``import llama_cpp``) before anything imports numpy: with numpy imported first, a
# CUDA build of llama.cpp can die with SIGSEGV inside std::regex while loading a model's tokenizer, and with
# llama_cpp imported first the same process loads and runs (docs/hardware.md, CUDA).
# ``python -m edgekv.child.worker`` would import the edgekv package (and so gguf and numpy) first.
_WORKER_BOOT = ("import sys\n"
                "try:\n    import llama_cpp  # noqa: F401  (first: see edgekv.runtime.process.worker_argv)\n"
                "except Exception:\n    pass  # the worker reports a missing or broken llama-cpp-python itself\n"
                "from edgekv.child.worker import main\n"
                "sys.exit(main(sys.argv[1:]))\n")


def worker_argv(subcommand: str) -> list[str]:
    return [sys.executable, "-c", _WORKER_BOOT, subcommand]


def _spawn(argv: list[str], env: dict[str, str] | None, *, stdout: int, unbuffered: bool,
           cwd: str | None = None) -> tuple[subprocess.Popen, int]:
    """Start a child with stdin and stderr piped, in a session (process group) of its own, killed when its parent
    dies (die_with_parent), the write end of a new event pipe passed to it in EVENT_FD_ENV.  Returns the process and
    the read end of the event pipe."""
    r_fd, w_fd = os.pipe()
    child_env = dict(os.environ if env is None else env)
    child_env[EVENT_FD_ENV] = str(w_fd)
    if unbuffered:
        child_env.setdefault("PYTHONUNBUFFERED", "1")
    child_env.setdefault("GGML_NO_BACKTRACE", "1")   # an abort should not spend seconds in gdb
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.PIPE, pass_fds=(w_fd,), env=child_env,
        start_new_session=True, cwd=cwd, preexec_fn=die_with_parent(),
    )
    os.close(w_fd)
    return proc, r_fd


def _tell(on_event: Callable[[dict[str, Any]], None] | None, ev: dict[str, Any]) -> None:
    if on_event is not None:
        try:
            on_event(ev)
        except Exception:  # a display callback must never kill a measurement
            pass


class _ChildRun:
    """What run_child's threads share while one child runs: its process, its memory sampler, the three pipe pumps
    and what they collected (events, the tail of stderr, llama.cpp's last log lines, captured output)."""

    def __init__(self, proc: subprocess.Popen, r_fd: int, sampler: Sampler | None,
                 on_event: Callable[[dict[str, Any]], None] | None, capture_output: bool):
        self.proc = proc
        self.r_fd = r_fd
        self.sampler = sampler
        self.on_event = on_event
        self.capture_output = capture_output
        self.stdout_chunks: list[bytes] = []
        self.all_stderr: list[bytes] = []
        self.events: list[dict[str, Any]] = []
        self.stderr_chunks: list[bytes] = []
        self.log_tail: collections.deque[str] = collections.deque(maxlen=8)
        self.t_err = threading.Thread(target=self._pump_stderr, daemon=True)
        self.t_ev = threading.Thread(target=self._pump_events, daemon=True)
        self.t_out = threading.Thread(target=self._pump_stdout, daemon=True) if capture_output else None

    def start(self) -> None:
        if self.sampler:
            self.sampler.start()
        self.t_err.start()
        self.t_ev.start()
        if self.t_out:
            self.t_out.start()

    def stop_sampler(self) -> None:
        if self.sampler:
            self.sampler.stop()
            self.sampler.join()
            self.sampler.close()

    def join_pumps(self) -> None:
        self.t_ev.join(timeout=5)
        self.t_err.join(timeout=5)
        if self.t_out:
            self.t_out.join(timeout=5)

    def _pump_stderr(self) -> None:
        proc = self.proc
        assert proc.stderr is not None
        for chunk in iter(lambda: proc.stderr.read(65536), b""):
            self.stderr_chunks.append(chunk)
            if self.capture_output:
                self.all_stderr.append(chunk)
            if len(self.stderr_chunks) > 64:
                del self.stderr_chunks[:-32]

    def _pump_stdout(self) -> None:
        proc = self.proc
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read(65536), b""):
            self.stdout_chunks.append(chunk)

    def _pump_events(self) -> None:
        sampler = self.sampler
        with os.fdopen(self.r_fd, "rb") as r:
            for raw in r:
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if ev.get("event") == "log":       # llama.cpp's lines: only the tail is kept, nobody else sees them
                    self.log_tail.append(str(ev.get("line", "")))
                    continue
                self.events.append(ev)
                if sampler is not None:
                    if ev.get("event") == "phase":
                        sampler.set_phase(str(ev.get("phase")), bool(ev.get("timed")))
                    elif ev.get("event") == "mem":
                        sampler.record_child(ev.get("rss"), ev.get("footprint"))
                _tell(self.on_event, ev)


def run_child(
    argv: list[str],
    payload: dict[str, Any] | None = None,
    *,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    sample_memory: bool = False,
    gpu_probe: Callable[[int], int | None] | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    watchdog: Callable[[], str | None] | None = None,
    stdin_data: bytes | None = None,
    capture_output: bool = False,
    cwd: str | None = None,
) -> ChildResult:
    """Run a child; collect its events, memory peaks and exit status.  Never raises for child failures.

    ``capture_output`` keeps the child's whole stdout and stderr (for external programs such as
    llama-bench, whose results and logs arrive there) in ``ChildResult.stdout``/``stderr``.
    """
    data = stdin_data if stdin_data is not None else json.dumps(payload or {}).encode()
    oom0 = oom_kill_count()
    t0 = time.perf_counter()
    proc, r_fd = _spawn(argv, env, stdout=subprocess.PIPE if capture_output else subprocess.DEVNULL, unbuffered=True,
                        cwd=cwd)
    _tell(on_event, {"event": "spawned", "pid": proc.pid})
    run = _ChildRun(proc, r_fd, Sampler(proc.pid, gpu_probe) if sample_memory else None, on_event, capture_output)
    run.start()
    try:
        status, rusage, timed_out, stopped = _feed_and_reap(proc, data, t0, timeout, watchdog)
    finally:
        run.stop_sampler()
    proc.returncode = os.waitstatus_to_exitcode(status) if status is not None else None
    wall = time.perf_counter() - t0
    run.join_pumps()
    return _child_result(run, timed_out, wall, rusage, stopped, oom0)


def _feed_and_reap(proc: subprocess.Popen, data: bytes, t0: float, timeout: float | None,
                   watchdog: Callable[[], str | None] | None) -> tuple[Any, Any, bool, str | None]:
    """Write ``data`` to the child's stdin and reap it: (wait status, rusage, timed out, the watchdog's reason or
    None).  Anything raised here (Ctrl-C included) kills the child's process group and reaps it first."""
    waiter: threading.Thread | None = None
    try:
        assert proc.stdin is not None
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        # A thread blocks in wait4 (no polling: on a 2-core machine every wake-up of ours is time taken
        # from llama.cpp's threads); this thread waits on an Event in short slices so Ctrl-C still works.
        reaped: dict[str, Any] = {}
        done = threading.Event()

        def reap() -> None:
            try:
                reaped["r"] = os.wait4(proc.pid, 0)
            finally:
                done.set()

        waiter = threading.Thread(target=reap, daemon=True)
        waiter.start()
        timed_out, stopped = _wait_or_stop(proc.pid, done, None if timeout is None else t0 + timeout, watchdog)
        _, status, rusage = reaped["r"]
    except BaseException:
        kill_group(proc.pid)
        if waiter is not None:
            waiter.join()
        else:
            try:
                os.wait4(proc.pid, 0)
            except ChildProcessError:
                pass
        raise
    return status, rusage, timed_out, stopped


def _wait_or_stop(pid: int, done: threading.Event, deadline: float | None,
                  watchdog: Callable[[], str | None] | None) -> tuple[bool, str | None]:
    """Wait until ``done`` (the child reaped), killing the child's process group at ``deadline`` or when the
    watchdog gives a reason: (timed out, the watchdog's reason or None)."""
    timed_out = False
    stopped: str | None = None
    while not done.wait(0.25 if deadline is None else max(0.0, min(0.25, deadline - time.perf_counter()))):
        if deadline is not None and time.perf_counter() >= deadline:
            timed_out = True
            kill_group(pid)
            done.wait()
            break
        stopped = _watch(watchdog, pid, done)     # e.g. the machine's memory nearly exhausted
        if stopped:
            break
    return timed_out, stopped


def _child_result(run: _ChildRun, timed_out: bool, wall: float, rusage: Any, stopped: str | None,
                  oom0: int | None) -> ChildResult:
    """The ChildResult of a reaped child from what the run collected."""
    proc, events = run.proc, run.events
    sig = -proc.returncode if proc.returncode is not None and proc.returncode < 0 else None
    result = None
    for ev in events:
        if ev.get("event") == "result":
            result = ev.get("data")
    maxrss = None
    if rusage is not None:
        maxrss = rusage.ru_maxrss if sys.platform == "darwin" else rusage.ru_maxrss * 1024
    res = ChildResult(
        returncode=proc.returncode, signal=sig, timed_out=timed_out, wall_s=wall, events=events, result=result,
        stderr_tail=b"".join(run.stderr_chunks)[-8000:].decode("utf-8", "replace"),
        kernel_maxrss_bytes=maxrss, log_tail=list(run.log_tail), stopped_reason=stopped,
        last_phase=next((str(e.get("phase")) for e in reversed(events) if e.get("event") == "phase"), None),
    )
    if sig is not None:
        oom1 = oom_kill_count()
        res.oom_kills_rose = oom0 is not None and oom1 is not None and oom1 > oom0
    if run.capture_output:
        res.stdout = b"".join(run.stdout_chunks).decode("utf-8", "replace")
        res.stderr = b"".join(run.all_stderr).decode("utf-8", "replace")
    if run.sampler:
        _copy_peaks(res, run.sampler)
    return res


def _copy_peaks(res: ChildResult, sampler: Sampler) -> None:
    res.peak_rss_bytes = sampler.peak_rss or None
    res.peak_anon_bytes = sampler.peak_anon
    res.peak_file_bytes = sampler.peak_file
    res.peak_footprint_bytes = sampler.peak_footprint
    res.peak_gpu_bytes = sampler.peak_gpu
    res.n_samples = sampler.n
    res.sample_interval_max_s = sampler.max_gap
    res.timed_unsampled_s = sampler.timed_s
    res.n_child_samples = sampler.n_child
    res.phase_peaks = dict(sampler.phase_peaks)
    res.gpu_phase_peaks = dict(sampler.gpu_phase_peaks)


def _watch(watchdog: Callable[[], str | None] | None, pid: int, done: threading.Event) -> str | None:
    """Ask the watchdog (every wake-up of the parent's wait, 0.25 s); when it gives a reason, stop the child's process
    group and return the reason with the child's resident memory at that moment."""
    if watchdog is None:
        return None
    why = watchdog()
    if not why:
        return None
    try:
        rss = psutil.Process(pid).memory_info().rss
        why += f" at {rss / (1 << 30):.1f} GiB RSS" if rss >= 1 << 30 else f" at {rss / (1 << 20):.0f} MiB RSS"
    except psutil.Error:
        pass
    kill_group(pid)
    done.wait()
    return why


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ChildDied(RuntimeError):
    pass


class ChildSession:
    """A long-lived child answering JSON requests (one per line on stdin) with ``response`` events."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None):
        self.proc, r_fd = _spawn(argv, env, stdout=subprocess.DEVNULL, unbuffered=False)
        self._q: queue.Queue = queue.Queue()
        self._stderr: list[bytes] = []

        def pump_events() -> None:
            with os.fdopen(r_fd, "rb") as r:
                for raw in r:
                    try:
                        self._q.put(json.loads(raw))
                    except ValueError:
                        continue
            self._q.put(None)

        def pump_stderr() -> None:
            assert self.proc.stderr is not None
            for chunk in iter(lambda: self.proc.stderr.read(65536), b""):
                self._stderr.append(chunk)
                if len(self._stderr) > 64:
                    del self._stderr[:-32]

        threading.Thread(target=pump_events, daemon=True).start()
        self._t_err = threading.Thread(target=pump_stderr, daemon=True)
        self._t_err.start()

    def stderr_tail(self) -> str:
        return b"".join(self._stderr)[-8000:].decode("utf-8", "replace")

    def _died(self) -> ChildDied:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        # the stderr reader may still hold the last lines (the GGML_ASSERT): let it drain first
        self._t_err.join(timeout=5)
        res = ChildResult(returncode=rc, signal=-rc if rc is not None and rc < 0 else None, timed_out=False,
                          wall_s=0.0, events=[], result=None, stderr_tail=self.stderr_tail())
        return ChildDied(res.failure_reason() or "child exited")

    def request(self, obj: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died() from None
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.perf_counter())
            try:
                ev = self._q.get(timeout=wait)
            except queue.Empty:
                self.kill()
                raise ChildDied(f"no answer within {timeout:.0f} s") from None
            if ev is None:
                raise self._died()
            if ev.get("event") == "response":
                return ev.get("data") or {}
            if ev.get("event") == "error":
                raise ChildDied(ev.get("error", "child error"))

    def kill(self) -> None:
        kill_group(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.kill()

    def __enter__(self) -> ChildSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def rss_before_model(argv_for_model: Callable[[str], list[str]], timeout: float = 60.0) -> tuple[int | None, str]:
    """Resident memory of a program at the moment it opens its model file, before reading any of it.

    The model path handed to the program is a FIFO: opening it blocks until a writer appears, so the program
    waits there with its libraries and backends loaded and nothing of a model read.  Its RSS is read then
    (Linux /proc/PID/statm); the FIFO is fed a few bytes that are not a GGUF so the program gives up, and it is
    reaped (killed after ``timeout``).  The kernel's ``ru_maxrss`` cannot serve here: it keeps the forking
    parent's high-water mark across exec.  Returns (bytes or None, reason when None)."""
    if not hasattr(os, "mkfifo") or not sys.platform.startswith("linux"):
        return None, "needs Linux (/proc and FIFOs)"
    with tempfile.TemporaryDirectory(prefix="edgekv-baseline-") as d:
        fifo = os.path.join(d, "model.gguf")
        os.mkfifo(fifo)
        proc = subprocess.Popen(argv_for_model(fifo), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent())
        rss: int | None = None
        reason = ""
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < timeout:
                if proc.poll() is not None:
                    reason = f"exited with code {proc.returncode} before opening its model"
                    break
                try:
                    with open(f"/proc/{proc.pid}/wchan") as f:
                        waiting = f.read().strip()
                except OSError:
                    waiting = ""
                if waiting == "wait_for_partner":        # blocked in open() on the FIFO
                    with open(f"/proc/{proc.pid}/statm", "rb") as f:
                        rss = int(f.read().split()[1]) * PAGE
                    break
                time.sleep(0.01)
            else:
                reason = f"did not open its model within {timeout:.0f} s"
            if rss is not None:
                try:
                    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                    os.write(fd, b"not a gguf\n")
                    os.close(fd)
                except OSError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                proc.wait()
        finally:
            if proc.poll() is None:
                kill_group(proc.pid)
                proc.wait()
        return rss, reason
