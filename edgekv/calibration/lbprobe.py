"""The speed calibration's measurements through the user's own ``llama-bench`` (``--llama-bench PATH``): the same
plan as the in-process probe (edgekv.child.speedprobe), run by that binary, so that the coefficients are
those of the build the user benchmarks (its compiler flags, its backends), not llama-cpp-python's.

Each group of a context's steps that share a test, a token count and a repetition count is one llama-bench
process with their depths as a list (``-d 640,1664,640``): llama-bench runs them in that order, each in a new
context filled to its depth once (tools/llama-bench/llama-bench.cpp: its ``ctx_state`` restores the fill between
repetitions), and prints one JSON line per depth with every timed repetition (``samples_ns``).  Its ``-v`` log
carries llama.cpp's graph size (``graph nodes = ...``).  The results are the probe's
(edgekv.core.probe.ProbeResult), so the same solvers (edgekv.calibration.speedcal.solve) read them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import msgspec

from edgekv.core.llamalog import parse_graph_line
from edgekv.core.probe import ProbeContext, ProbeModel, ProbeResult, ProbeStep
from edgekv.runtime.process import run_child
from edgekv.sources.tinymodel import plan_model_file

LB_TIMEOUT_S = 600.0


class ProbeError(RuntimeError):
    pass


class BenchRow(msgspec.Struct):
    """What edgekv reads of one of llama-bench's ``-o jsonl`` lines (it prints many more fields)."""

    n_depth: int = -1
    samples_ns: list[int] = []


def step_groups(steps: list[ProbeStep]) -> list[list[ProbeStep]]:
    """The context's steps grouped by (test, tokens, repetitions), each group in the plan's order (a shallow,
    deep, shallow sequence stays one)."""
    groups: dict[tuple[str, int, int], list[ProbeStep]] = {}
    for st in steps:
        groups.setdefault((st.test, st.n, st.reps), []).append(st)
    return list(groups.values())


def group_argv(exe: str, model_path: str, ctx: ProbeContext, group: list[ProbeStep], repack: bool,
               n_gpu_layers: int = 0) -> list[str]:
    """The llama-bench command line of one group of steps (``-ngl`` always: llama-bench's own default offloads
    99 layers on a GPU build, which would time the GPU in a CPU calibration)."""
    p, st = ctx.params, group[0]
    argv = [exe, "-m", model_path, "-d", ",".join(str(s.depth) for s in group),
            "-ctk", p.type_k, "-ctv", p.type_v, "-fa", p.flash_attn, "-t", str(ctx.n_threads),
            "-r", str(st.reps), "-b", str(p.n_batch), "-ub", str(p.n_ubatch), "-o", "jsonl", "-v"]
    argv += ["-p", str(st.n), "-n", "0"] if st.test == "pp" else ["-p", "0", "-n", str(st.n)]
    argv += ["-ngl", "99" if n_gpu_layers < 0 else str(int(n_gpu_layers))]
    if not repack:                 # passed only when off: builds older than the flag refuse it
        argv += ["--repack", "0"]
    return argv


def parse_group(stdout: str, stderr: str, group: list[ProbeStep], where: str) -> list[ProbeResult]:
    """One group's results: a JSON line per step, in order; the graph size from the log."""
    rows = []
    for line in stdout.splitlines():
        if line.strip().startswith("{"):
            try:
                rows.append(msgspec.json.decode(line, type=BenchRow))
            except msgspec.ValidationError as e:
                raise ProbeError(f"llama-bench printed a result for {where} that is not one ({e})") from None
            except msgspec.DecodeError:
                raise ProbeError(f"llama-bench printed a line that is not JSON for {where}: {line[:80]!r}") from None
    if len(rows) != len(group):
        raise ProbeError(f"llama-bench printed {len(rows)} results for {where}, not {len(group)}")
    graph = parse_graph_line(stderr.splitlines())
    out = []
    for st, row in zip(group, rows):
        if row.n_depth != st.depth or len(row.samples_ns) != st.reps:
            raise ProbeError(f"llama-bench's result for {where}/{st.key} is not the test asked for "
                             f"(depth {row.n_depth}, {len(row.samples_ns)} samples)")
        out.append(ProbeResult(step=st.key, test=st.test, depth=st.depth, n=st.n, ns=row.samples_ns, graph=graph))
    return out


def run_probe(exe: str, models: list[ProbeModel], progress: Callable[[str], None] | None = None,
              timeout: float = float("inf")) -> list[ProbeResult]:
    """The calibration plan ``models`` (edgekv.calibration.speedcal's) measured by llama-bench at ``exe``: each
    llama-bench process within LB_TIMEOUT_S, and all of them within ``timeout`` seconds of the call (the
    calibration's deadline)."""
    end = time.monotonic() + timeout

    out: list[ProbeResult] = []
    for m in models:
        try:
            with plan_model_file(m.file_entry()) as path:        # written now, cut to its header once timed
                out += _probe_model(exe, m, os.path.abspath(path), progress, end)
        except OSError as e:        # a full disk: its one line, naming the folder
            raise ProbeError(e.strerror or str(e)) from None
    return out


def _probe_model(exe: str, m: ProbeModel, model_path: str, progress: Callable[[str], None] | None,
                 end: float) -> list[ProbeResult]:
    """Every context and step of the plan entry ``m`` (its model at ``model_path``) through llama-bench, by the
    time.monotonic() time ``end``."""
    out: list[ProbeResult] = []
    rp, ngl = m.repack, m.n_gpu_layers
    for c in m.contexts:
        where = f"{m.key}/{c.key}"
        graph = _listed_graph(exe, model_path, c, rp, ngl, where, end)
        for group in step_groups(c.steps):
            if progress:
                progress(f"{where}/{','.join(st.key for st in group)} (llama-bench)")
            child = _run(group_argv(exe, model_path, c, group, rp, ngl), where, end)
            for r in parse_group(child.stdout or "", child.stderr or "", group, where):
                r.model, r.context, r.graph = m.key, c.key, graph or r.graph
                out.append(r)
    return out


def _run(argv: list[str], where: str, end: float, env: dict[str, str] | None = None):
    left = min(LB_TIMEOUT_S, end - time.monotonic())
    if left <= 0:
        raise ProbeError(f"llama-bench timed out on {where}: the calibration's time ran out")
    child = run_child(argv, stdin_data=b"", timeout=left, capture_output=True, env=env)
    if child.timed_out or child.returncode != 0:
        why = "timed out" if child.timed_out else (
            f"died of {child.signal_name}" if child.signal is not None else f"exited {child.returncode}")
        raise ProbeError(f"llama-bench {why} on {where}: {child.last_error() or 'no output'}")
    return child


def _listed_graph(exe: str, model_path: str, ctx: ProbeContext, repack: bool, n_gpu_layers: int, where: str,
                  end: float) -> dict[str, int] | None:
    """The context's graph sizes with the nodes a backend runs, from one untimed single-token run of the same
    binary with the scheduler's listing on (GGML_SCHED_DEBUG=2): the timed runs go without it, since a scheduler
    that lists prints every graph it computes."""
    one = [ProbeStep(key="ops", test="tg", n=1, reps=1, depth=0)]
    child = _run(group_argv(exe, model_path, ctx, one, repack, n_gpu_layers), where, end,
                 env={**os.environ, "GGML_SCHED_DEBUG": "2"})
    return parse_graph_line((child.stderr or "").splitlines())
