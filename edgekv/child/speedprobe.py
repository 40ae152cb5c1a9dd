"""Child side of the speed calibration (``python -m edgekv.child.worker speed_probe``): the plan of
edgekv.calibration.speedcal (a :class:`edgekv.core.probe.ProbeRequest`) timed through llama-cpp-python, one
:class:`edgekv.core.probe.ProbeResult` per step and depth reported in a :class:`edgekv.core.probe.ProbeReply`."""

from __future__ import annotations

import os
import random
import time

from edgekv import heavy
from edgekv.child.tokens import TokenRunner, decode_timed, seq_tokens
from edgekv.child.workload import SEED
from edgekv.core.llamalog import parse_graph_line
from edgekv.core.predict import ContextParams
from edgekv.core.probe import ProbeModel, ProbeReply, ProbeResult, ProbeStep, request_from, to_wire
from edgekv.runtime.childside import EventWriter
from edgekv.runtime.engine import LogCapture, context_params, model_params
from edgekv.sources.tinymodel import plan_model_file


def _listed_graph(L, cap, model, params) -> dict[str, int] | None:
    """llama.cpp's graph sizes for a context with these parameters, the nodes a backend runs included: a context
    created and freed at once with the scheduler's listing on (GGML_SCHED_DEBUG=2, read when the context creates its
    scheduler, ggml-backend.cpp:1878).  The timed context is another one, created without it: a scheduler that lists
    prints every graph it computes."""
    cap.take()
    os.environ["GGML_SCHED_DEBUG"] = "2"
    try:
        ctx = L.llama_init_from_model(model, params)
    finally:
        del os.environ["GGML_SCHED_DEBUG"]
    graph = parse_graph_line([x for _, x in cap.take()])
    if ctx:
        L.llama_free(ctx)
    return graph


def speed_probe(payload: dict, ev: EventWriter) -> None:
    """The speed calibration's measurements (edgekv.calibration.speedcal): for each model, each context, each
    step, the KV cache filled to a depth and then ``reps`` timed runs of a prompt of ``n`` tokens ("pp") or of
    ``n`` generated tokens ("tg"), back at that depth before each.  Steps in order of depth share the fill: a
    deeper step adds only the cells between the two depths (half the prompt work of refilling from zero).
    Reports every timed run in nanoseconds and llama.cpp's own graph sizes (``graph: nodes = ...``) for each
    context."""
    L = heavy.llama_cpp()

    request = request_from(payload)     # a payload that is not a plan: the worker reports the error
    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    rng = random.Random(SEED)
    out: list[ProbeResult] = []
    for m in request.models:
        try:
            with plan_model_file(m.file_entry()) as path:        # written now, cut to its header once timed
                why = _probe_model(L, cap, m, path, rng, out, ev)
        except OSError as e:        # a full disk: its one line, naming the folder
            why = e.strerror or str(e)
        if why:
            ev.result(to_wire(ProbeReply(ok=False, reason=why)))
            return
    ev.result(to_wire(ProbeReply(ok=True, results=out)))


def _probe_model(L, cap, m: ProbeModel, path: str, rng: random.Random, out: list[ProbeResult],
                 ev: EventWriter) -> str:
    """Time every context and step of the plan entry ``m`` (its model at ``path``) into ``out``; why llama.cpp
    refused it, or ""."""
    # a GPU calibration offloads every layer (n_gpu_layers -1), as the configurations it predicts do
    model = L.llama_model_load_from_file(path.encode(), model_params(m.n_gpu_layers, dry=False,
                                                                     use_extra_bufts=m.repack))
    cap.take()
    if not model:
        return f"llama.cpp could not load the calibration model {m.key}"
    try:
        n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)))
        for c in m.contexts:
            p = c.params
            params = context_params(ContextParams(n_ctx=p.n_ctx, n_batch=p.n_batch, n_ubatch=p.n_ubatch,
                                                  type_k=p.type_k, type_v=p.type_v, flash_attn=p.flash_attn,
                                                  n_seq_max=p.n_seq_max), n_threads=c.n_threads)
            graph = _listed_graph(L, cap, model, params)
            ctx = L.llama_init_from_model(model, params)
            cap.take()
            if not ctx:
                return f"llama.cpp could not create a context for {m.key}/{c.key}"
            runner = TokenRunner(L, ctx, int(L.llama_n_batch(ctx)), n_vocab, False, 0, rng,
                                 threads=(c.n_threads, c.fill_threads or c.n_threads))
            for r in _probe_steps(L, runner, L.llama_get_memory(ctx), c.steps, f"{m.key}/{c.key}", ev):
                r.model, r.context, r.graph = m.key, c.key, graph
                out.append(r)
            runner.close()
            L.llama_free(ctx)
    finally:
        L.llama_model_free(model)       # before its file is cut
    return ""


def _probe_steps(L, runner: TokenRunner, mem, steps: list[ProbeStep], where: str,
                 ev: EventWriter) -> list[ProbeResult]:
    """One calibration context's steps: each step's timed runs in nanoseconds (warm-up runs dropped)."""
    out = []
    cur = 0     # cells [0, cur) hold the last step's fill: a deeper step extends it instead of refilling
    for group in _turns(steps):
        st = group[0]
        ev.emit("progress", phase="calibrate", step=f"{where}/{'+'.join(g.key for g in group)}")
        if st.depths:          # sequences at several depths, their runs taken in turn
            out += _probe_interleaved(L, runner, mem, group, where)
            cur = L.llama_memory_seq_pos_max(mem, 0) + 1
            continue
        d = st.depth
        # back to min(d, cur) cells: a shallower step after a deeper one only drops cells (no refill)
        cur = min(d, cur)
        if not L.llama_memory_seq_rm(mem, 0, cur, -1):
            L.llama_memory_clear(mem, True)
            cur = 0
        if d > cur:
            with runner.filling():
                runner.run_prompt(runner.prompt_chunks(d - cur))
        cur = d
        ns = _timed_runs(L, runner, mem, st, where)
        out.append(ProbeResult(step=st.key, test=st.test, depth=d, n=st.n, ns=ns[st.warmup:], **_threads(L, runner)))
    return out


def _timed_runs(L, runner: TokenRunner, mem, st: ProbeStep, where: str) -> list[int]:
    """The step's warm-up and timed runs (nanoseconds each), every one from a cache of exactly ``st.depth`` cells."""
    d, ns = st.depth, []
    for _ in range(st.warmup + st.reps):
        if not L.llama_memory_seq_rm(mem, 0, d, -1):
            L.llama_memory_clear(mem, True)
            if d:
                runner.run_prompt(runner.prompt_chunks(d))
        if L.llama_memory_seq_pos_max(mem, 0) != d - 1:     # the timed run starts at exactly this depth
            raise RuntimeError(f"the calibration cache holds {L.llama_memory_seq_pos_max(mem, 0) + 1} cells, "
                               f"not {d}, before {where}/{st.key}")
        if st.test == "pp":
            work = runner.prompt_chunks(st.n)
            t0 = time.perf_counter_ns()
            runner.run_prompt(work)
        else:
            toks = runner.gen_tokens(st.n)
            t0 = time.perf_counter_ns()
            runner.run_gen(toks, d)
        ns.append(time.perf_counter_ns() - t0)
    return ns


def _turns(steps: list[ProbeStep]) -> list[list[ProbeStep]]:
    """The steps in the groups they are taken in: consecutive steps with the same non-empty ``turn`` and the same
    depths, warm-up and reps form one group (ProbeStep.turn); every other step is a group of its own."""
    out: list[list[ProbeStep]] = []
    for st in steps:
        last = out[-1][0] if out else None
        if (last is not None and st.turn and st.turn == last.turn and st.depths and st.depths == last.depths
                and (st.warmup, st.reps) == (last.warmup, last.reps)):
            out[-1].append(st)
        else:
            out.append([st])
    return out


def _probe_interleaved(L, runner: TokenRunner, mem, group: list[ProbeStep], where: str) -> list[ProbeResult]:
    """Steps of the same depths at once: sequence i (its own KV stream: the context has a stream per sequence)
    filled to ``depths[i]``, then the runs taken in turn (each step shallow, deep, then the next step, ...; then
    again), each from exactly its depth.  A machine that slows down for seconds at a time slows both depths, and
    every step of the group, alike, where timing all runs at one depth and then all at the other puts the slow
    stretch into the difference."""
    first = group[0]
    depths = list(first.depths or [])
    for s, d in enumerate(depths):
        have = L.llama_memory_seq_pos_max(mem, s) + 1
        if have > d and not L.llama_memory_seq_rm(mem, s, d, -1):
            raise RuntimeError(f"llama.cpp could not shorten sequence {s} to {d} cells before {where}/{first.key}")
        if have < d:
            with runner.filling():
                decode_timed(L, runner.ctx, seq_tokens(L, runner, s, have, d - have, False), "filling the cache")
    ns: list[list[list[int]]] = [[[] for _ in depths] for _ in group]
    for _ in range(first.warmup + first.reps):
        for g, st in enumerate(group):
            gen = st.test == "tg"
            for s, d in enumerate(depths):
                L.llama_memory_seq_rm(mem, s, d, -1)
                if L.llama_memory_seq_pos_max(mem, s) != d - 1:
                    raise RuntimeError(f"the calibration cache holds {L.llama_memory_seq_pos_max(mem, s) + 1} cells "
                                       f"of sequence {s}, not {d}, before {where}/{st.key}")
                work = seq_tokens(L, runner, s, d, st.n, gen)
                ns[g][s].append(decode_timed(L, runner.ctx, work, "generating" if gen else "processing a prompt"))
    # in_turn: run i of each depth was taken one after the other, so the solver may pair them (solve.difference_s)
    return [ProbeResult(step=f"{st.key}{d}", test=st.test, depth=d, n=st.n, ns=ns[g][s][st.warmup:], in_turn=True,
                        **_threads(L, runner)) for g, st in enumerate(group) for s, d in enumerate(depths)]


def _threads(L, runner: TokenRunner) -> dict[str, int | None]:
    """The thread counts a step ran on, as llama.cpp holds them: its timed runs' and its fill's (None: no fill on
    other threads)."""
    return {"threads": int(L.llama_n_threads(runner.ctx)), "fill_threads": runner.filled_on}
