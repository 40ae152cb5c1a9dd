"""Child side of a measured run: load, create the context, warm up, fill to depth, time pp and tg.

Runs inside ``python -m edgekv.child.worker bench`` (one fresh process per configuration).  The workload
mirrors llama-bench (tools/llama-bench/llama-bench.cpp, test_prompt/test_gen and the repetition
loop): random tokens with BOS first, prompt processing in ``n_batch`` chunks followed by
``llama_synchronize``, generation one token at a time with a synchronize after each, a warm-up prompt
run and one warm-up token, and every repetition timed from a cache holding exactly ``n_depth``
tokens.  Between repetitions the cache goes back to that depth by removing the tokens the test added
(plain caches) or, where that cannot be exact (sliding-window and recurrent caches), by restoring a
state snapshot taken after the fill, as llama-bench always does (kept in a file under ``TMPDIR`` so
that it never counts in the measured memory).  The parent samples memory; phase
events tell it which part of the run each peak belongs to.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from edgekv.edges.childside import EventWriter

SEED = 1234


def _mem() -> dict[str, int | None]:
    import psutil

    rss = psutil.Process().memory_info().rss
    anon = None
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Anonymous:"):
                        anon = int(line.split()[1]) * 1024
        except OSError:
            pass
    return {"rss": rss, "anon": anon}


def self_memory() -> dict[str, int | None]:
    """This process's resident memory (and macOS phys_footprint) now: one read of /proc/self/statm on Linux."""
    rss = None
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/self/statm", "rb") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            rss = None
    if rss is None:
        import psutil

        rss = psutil.Process().memory_info().rss
    footprint = None
    if sys.platform == "darwin":
        from edgekv.edges.sampler import macos_footprint

        footprint = macos_footprint(os.getpid())
    return {"rss": rss, "footprint": footprint}


class DeviceMemory:
    """Memory in use on the process's accelerators (every ggml device that is not the CPU), from
    ``ggml_backend_dev_memory`` (CUDA: cudaMemGetInfo): total minus free, summed.  Read synchronously at the
    run's checkpoints, so what llama.cpp allocated between two of them is their difference (a parent sampling
    the child cannot tell which side of a phase change an allocation fell on).  The device-wide figure
    includes other processes' memory: on a shared GPU the differences are what to read."""

    def __init__(self) -> None:
        self.lib, self.devs = None, []
        try:
            import llama_cpp

            libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
            cands = [p for pat in ("libggml.so", "libggml.dylib", "ggml.dll") for p in glob.glob(os.path.join(libdir, pat))]
            if not cands:
                return
            lib = ctypes.CDLL(cands[0])
            lib.ggml_backend_dev_count.restype = ctypes.c_size_t
            lib.ggml_backend_dev_get.restype = ctypes.c_void_p
            lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
            lib.ggml_backend_dev_type.restype = ctypes.c_int
            lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
            lib.ggml_backend_dev_memory.restype = None
            lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                    ctypes.POINTER(ctypes.c_size_t)]
            devs = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
            self.devs = [d for d in devs if lib.ggml_backend_dev_type(d) in (1, 2)]   # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
            self.lib = lib
        except (OSError, AttributeError, ImportError):
            self.lib, self.devs = None, []

    def used(self) -> int | None:
        if self.lib is None or not self.devs:
            return None
        total_used = 0
        for d in self.devs:
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            self.lib.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
            total_used += total.value - free.value
        return total_used


# -- ggml device registry (not bound by llama-cpp-python; a few functions through ctypes) ------------

def ggml_devices() -> dict[str, Any]:
    import llama_cpp

    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    cands = [p for pat in ("libggml.so", "libggml.dylib", "ggml.dll") for p in glob.glob(os.path.join(libdir, pat))]
    out: dict[str, Any] = {"backends": None, "devices": None}
    if not cands:
        return out
    lib = ctypes.CDLL(cands[0])
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_description.restype = ctypes.c_char_p
    lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    types = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
    out["backends"] = [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
                       for i in range(lib.ggml_backend_reg_count())]
    devs = []
    for i in range(lib.ggml_backend_dev_count()):
        d = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        devs.append({"name": lib.ggml_backend_dev_name(d).decode(), "description": lib.ggml_backend_dev_description(d).decode(),
                     "type": types.get(lib.ggml_backend_dev_type(d), "?"), "memory_total": total.value,
                     "memory_free": free.value})
    out["devices"] = devs
    return out


def env_info(_payload: dict, ev: EventWriter) -> None:
    import llama_cpp

    llama_cpp.llama_backend_init()
    info = ggml_devices()
    info["system_info"] = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    info["supports_gpu_offload"] = bool(llama_cpp.llama_supports_gpu_offload())
    ev.result(info)


def baseline(_payload: dict, ev: EventWriter) -> None:
    """The runtime baseline: exactly what a bench child does before it loads the model, then its RSS."""
    import llama_cpp as L

    from edgekv.edges.engine import LogCapture

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    m = _mem()
    ev.result({"rss": m["rss"], "anon": m["anon"],
               "system_info": L.llama_print_system_info().decode("utf-8", "replace").strip()})


def preflight(payload: dict, ev: EventWriter) -> None:
    """The extra-buffer preflight (edgekv.orchestration.preflight): load the probe model with the CPU backend's
    extra buffer types on, then decode a batch of 2 and a batch of 32 tokens.  Each step is announced first
    (``phase`` events), so a parent that sees this process die knows which step killed it."""
    import llama_cpp as L

    from edgekv.core.llamalog import parse_memory_log
    from edgekv.edges.engine import LogCapture, context_params, model_params

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    system_info = L.llama_print_system_info().decode("utf-8", "replace").strip()
    ev.emit("phase", phase="load")
    model = L.llama_model_load_from_file(payload["model_path"].encode(), model_params(0, dry=False, use_extra_bufts=True))
    buffers = parse_memory_log([x for _, x in cap.take()]).model_buffers
    ev.emit("buffers", buffers=buffers)     # before any decode: a parent that sees this process die still knows them
    if not model:
        ev.result({"ok": False, "step": "load", "reason": "llama.cpp could not load the probe model",
                   "buffers": buffers, "system_info": system_info})
        return
    from edgekv.core.predict import ContextParams

    ev.emit("phase", phase="context")
    ctx = L.llama_init_from_model(model, context_params(ContextParams(n_ctx=64, n_batch=32, n_ubatch=32),
                                                         n_threads=int(payload.get("n_threads") or 0) or None))
    if not ctx:
        ev.result({"ok": False, "step": "context", "reason": "llama.cpp could not create the probe's context",
                   "buffers": buffers, "system_info": system_info})
        return
    mem = L.llama_get_memory(ctx)
    for n in (2, 32):
        ev.emit("phase", phase=f"batch{n}")
        L.llama_memory_clear(mem, True)
        toks = (L.llama_token * n)(*[(7 * i + 1) % 512 for i in range(n)])
        rc = L.llama_decode(ctx, L.llama_batch_get_one(toks, n))
        if rc != 0:
            ev.result({"ok": False, "step": f"batch{n}", "reason": f"llama_decode returned {rc}", "buffers": buffers,
                       "system_info": system_info})
            return
        L.llama_synchronize(ctx)
    ev.result({"ok": True, "buffers": buffers, "system_info": system_info})
    L.llama_free(ctx)
    L.llama_model_free(model)


def _nvml_self() -> int | None:
    """GPU memory this process holds (NVML, every GPU), or None without NVML."""
    from edgekv.edges.environment import nvml_process_probe

    probe = nvml_process_probe()
    return probe(os.getpid()) if probe else None


def device_runtime(payload: dict, ev: EventWriter) -> None:
    """What a GPU backend's runtime holds on the device beside llama.cpp's buffers: device memory in use (ggml's
    ``ggml_backend_dev_memory``, device-wide) and this process's own (NVML) after the backend is initialised, after
    the model is loaded with every layer offloaded, after the context, after a prompt batch of ``n_ubatch`` tokens,
    after the first single-token decode and after ``n_decode`` of them; with llama.cpp's buffer lines, so that the
    runtime's share is the reading less the buffers."""
    import llama_cpp as L

    from edgekv.core.llamalog import parse_memory_log
    from edgekv.core.predict import ContextParams
    from edgekv.edges.engine import LogCapture, context_params, model_params

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    dm = DeviceMemory()
    readings: dict[str, Any] = {}

    def read(step: str) -> None:
        readings[step] = {"device_used": dm.used(), "process_nvml": _nvml_self(), "rss": _mem()["rss"]}

    read("init")
    model = L.llama_model_load_from_file(payload["model_path"].encode(), model_params(-1, dry=False))
    if not model:
        ev.result({"ok": False, "step": "load", "readings": readings})
        return
    read("load")
    n_ub = int(payload.get("n_ubatch") or 512)
    cp = ContextParams(n_ctx=int(payload.get("n_ctx") or 1024), n_batch=n_ub, n_ubatch=n_ub,
                       type_k=payload.get("type_k") or "f16", type_v=payload.get("type_v") or payload.get("type_k") or "f16",
                       flash_attn=payload.get("flash_attn") or "auto")
    ctx = L.llama_init_from_model(model, context_params(cp))
    if not ctx:
        ev.result({"ok": False, "step": "context", "readings": readings})
        return
    read("context")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    toks = (L.llama_token * n_ub)(*[(7 * i + 1) % n_vocab for i in range(n_ub)])
    rc = L.llama_decode(ctx, L.llama_batch_get_one(toks, n_ub))
    L.llama_synchronize(ctx)
    read("prompt")
    # single-token decodes as a generation makes them: ggml-cuda captures the one-token graph as a CUDA graph once
    # it has seen it repeat, which holds memory of its own
    for i in range(int(payload.get("n_decode") or 16)):
        one = (L.llama_token * 1)((i * 13 + 1) % n_vocab)
        rc = rc or L.llama_decode(ctx, L.llama_batch_get_one(one, 1))
        L.llama_synchronize(ctx)
        if i == 0:
            read("decode1")
    read("decode")
    log = parse_memory_log([x for _, x in cap.take()])
    ev.result({"ok": rc == 0, "readings": readings, "model_buffers_mib": log.model_buffers,
               "compute_mib": log.compute_buffers, "kv_buffers_mib": log.kv_buffers, "graph": log.graph})
    L.llama_free(ctx)
    L.llama_model_free(model)


def extra_buffers(payload: dict, ev: EventWriter) -> None:
    """llama.cpp's own sizes of the CPU backend's extra buffers (AMX, CPU_REPACK) for a model: a real load (the
    dry run allocates no weights, so its model buffer lines say 0.00), its ``load_tensors: ... model buffer size``
    lines, and nothing else (no context)."""
    import llama_cpp as L

    from edgekv.core.llamalog import parse_memory_log
    from edgekv.edges.engine import LogCapture, model_params

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    model = L.llama_model_load_from_file(payload["model_path"].encode(),
                                         model_params(0, dry=False, use_extra_bufts=bool(payload.get("repack", True))))
    lines = [x for _, x in cap.take()]
    ev.result({"ok": bool(model), "buffers": parse_memory_log(lines).model_buffers})
    if model:
        L.llama_model_free(model)


def _listed_graph(L, cap, model, params) -> dict[str, int] | None:
    """llama.cpp's graph sizes for a context with these parameters, the nodes a backend runs included: a context
    created and freed at once with the scheduler's listing on (GGML_SCHED_DEBUG=2, read when the context creates its
    scheduler, ggml-backend.cpp:1878).  The timed context is another one, created without it: a scheduler that lists
    prints every graph it computes."""
    from edgekv.core.llamalog import parse_graph_line

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
    """The speed calibration's measurements (edgekv.orchestration.speedcal): for each model, each context, each
    step, the KV cache filled to a depth and then ``reps`` timed runs of a prompt of ``n`` tokens ("pp") or of
    ``n`` generated tokens ("tg"), back at that depth before each.  Steps in order of depth share the fill: a
    deeper step adds only the cells between the two depths (half the prompt work of refilling from zero).
    Reports every timed run in nanoseconds and llama.cpp's own graph sizes (``graph: nodes = ...``) for each
    context."""
    import llama_cpp as L

    from edgekv.edges.engine import LogCapture
    from edgekv.edges.tinymodel import plan_model_file

    cap = LogCapture()
    cap.install()
    L.llama_backend_init()
    rng = random.Random(SEED)
    out: list[dict[str, Any]] = []
    for m in payload["models"]:
        try:
            with plan_model_file(m) as path:        # written now, cut to its header once timed
                if not _probe_model(L, cap, m, path, rng, out, ev):
                    return
        except OSError as e:        # a full disk: its one line, naming the folder
            ev.result({"ok": False, "reason": e.strerror or str(e)})
            return
    ev.result({"ok": True, "results": out})


def _probe_model(L, cap, m: dict, path: str, rng: random.Random, out: list[dict[str, Any]], ev: EventWriter) -> bool:
    """Time every context and step of the plan entry ``m`` (its model at ``path``) into ``out``; False when llama.cpp
    refused it (the result is reported)."""
    from edgekv.core.predict import ContextParams
    from edgekv.edges.engine import context_params, model_params

    # a GPU calibration offloads every layer (n_gpu_layers -1), as the configurations it predicts do
    model = L.llama_model_load_from_file(path.encode(),
                                         model_params(int(m.get("n_gpu_layers", 0)), dry=False,
                                                      use_extra_bufts=bool(m.get("repack", True))))
    cap.take()
    if not model:
        ev.result({"ok": False, "reason": f"llama.cpp could not load the calibration model {m['key']}"})
        return False
    try:
        n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)))
        for c in m["contexts"]:
            params = context_params(ContextParams(**c["params"]), n_threads=c["n_threads"])
            graph = _listed_graph(L, cap, model, params)
            ctx = L.llama_init_from_model(model, params)
            cap.take()
            if not ctx:
                ev.result({"ok": False, "reason": f"llama.cpp could not create a context for {m['key']}/{c['key']}"})
                return False
            runner = _Runner(L, ctx, int(L.llama_n_batch(ctx)), n_vocab, False, 0, rng,
                             threads=(int(c["n_threads"]), int(c.get("fill_threads") or c["n_threads"])))
            out += [{"model": m["key"], "context": c["key"], **r, "graph": graph}
                    for r in _probe_steps(L, runner, L.llama_get_memory(ctx), c["steps"], f"{m['key']}/{c['key']}", ev)]
            runner.close()
            L.llama_free(ctx)
    finally:
        L.llama_model_free(model)       # before its file is cut
    return True


def _probe_steps(L, runner: _Runner, mem, steps: list[dict], where: str, ev: EventWriter) -> list[dict[str, Any]]:
    """One calibration context's steps: each step's timed runs in nanoseconds (warm-up runs dropped)."""
    out = []
    cur = 0     # cells [0, cur) hold the last step's fill: a deeper step extends it instead of refilling
    for st in steps:
        ev.emit("progress", phase="calibrate", step=f"{where}/{st['key']}")
        if "depths" in st:          # sequences at several depths, their runs taken in turn
            out += _probe_interleaved(L, runner, mem, st, where)
            cur = L.llama_memory_seq_pos_max(mem, 0) + 1
            continue
        d, n = int(st["depth"]), int(st["n"])
        # back to min(d, cur) cells: a shallower step after a deeper one only drops cells (no refill)
        cur = min(d, cur)
        if not L.llama_memory_seq_rm(mem, 0, cur, -1):
            L.llama_memory_clear(mem, True)
            cur = 0
        if d > cur:
            with runner.filling():
                runner.run_prompt(runner.prompt_chunks(d - cur))
        cur = d
        ns, w = [], int(st.get("warmup", 1))
        for _ in range(w + int(st["reps"])):
            if not L.llama_memory_seq_rm(mem, 0, d, -1):
                L.llama_memory_clear(mem, True)
                if d:
                    runner.run_prompt(runner.prompt_chunks(d))
            if L.llama_memory_seq_pos_max(mem, 0) != d - 1:     # the timed run starts at exactly this depth
                raise RuntimeError(f"the calibration cache holds {L.llama_memory_seq_pos_max(mem, 0) + 1} cells, "
                                   f"not {d}, before {where}/{st['key']}")
            if st["test"] == "pp":
                work = runner.prompt_chunks(n)
                t0 = time.perf_counter_ns()
                runner.run_prompt(work)
            else:
                toks = runner.gen_tokens(n)
                t0 = time.perf_counter_ns()
                runner.run_gen(toks, d)
            ns.append(time.perf_counter_ns() - t0)
        out.append({"step": st["key"], "test": st["test"], "depth": d, "n": n, "ns": ns[w:], **_threads(L, runner)})
    return out


def _seq_tokens(L, runner: _Runner, seq: int, pos0: int, n: int, one_by_one: bool) -> list[_SeqBatch]:
    """``n`` random tokens of sequence ``seq`` from position ``pos0``: batches of at most n_batch tokens (a prompt,
    logits for its last token) or (``one_by_one``) one token each (generation, logits for each)."""
    out: list[_SeqBatch] = []
    for i in range(n):
        if one_by_one or not out or out[-1].b.n_tokens == runner.n_batch:
            out.append(_SeqBatch(L, runner.ctx, 1 if one_by_one else min(runner.n_batch, n - i), 1))
        out[-1].add(runner.rng.randrange(runner.n_vocab), pos0 + i, seq, one_by_one or i == n - 1)
    return out


def _decode_timed(L, ctx, batches: list[_SeqBatch], what: str) -> int:
    """The batches decoded, each synchronised (a generated token waits for the one before), in nanoseconds; then
    freed."""
    t0 = time.perf_counter_ns()
    for b in batches:
        b.decode(what)
        L.llama_synchronize(ctx)
    dt = time.perf_counter_ns() - t0
    for b in batches:
        b.free()
    return dt


def _probe_interleaved(L, runner: _Runner, mem, st: dict, where: str) -> list[dict[str, Any]]:
    """One calibration step at several depths at once: sequence i (its own KV stream: the context has a stream per
    sequence) filled to ``depths[i]``, then the runs taken in turn (shallow, deep, shallow, deep, ...), each from
    exactly its depth.  A machine that slows down for seconds at a time slows both depths alike, where timing all
    runs at one depth and then all at the other puts the slow stretch into the difference (bench/README.md: a step
    repeated after the deep one ran up to 37 % slower on a 2-vCPU VM)."""
    depths, n, gen = [int(d) for d in st["depths"]], int(st["n"]), st["test"] == "tg"
    for s, d in enumerate(depths):
        have = L.llama_memory_seq_pos_max(mem, s) + 1
        if have > d and not L.llama_memory_seq_rm(mem, s, d, -1):
            raise RuntimeError(f"llama.cpp could not shorten sequence {s} to {d} cells before {where}/{st['key']}")
        if have < d:
            with runner.filling():
                _decode_timed(L, runner.ctx, _seq_tokens(L, runner, s, have, d - have, False), "filling the cache")
    ns: list[list[int]] = [[] for _ in depths]
    w = int(st.get("warmup", 1))
    for _ in range(w + int(st["reps"])):
        for s, d in enumerate(depths):
            L.llama_memory_seq_rm(mem, s, d, -1)
            if L.llama_memory_seq_pos_max(mem, s) != d - 1:
                raise RuntimeError(f"the calibration cache holds {L.llama_memory_seq_pos_max(mem, s) + 1} cells of "
                                   f"sequence {s}, not {d}, before {where}/{st['key']}")
            work = _seq_tokens(L, runner, s, d, n, gen)
            ns[s].append(_decode_timed(L, runner.ctx, work, "generating" if gen else "processing a prompt"))
    # "in_turn": run i of each depth was taken one after the other, so the solver may pair them (speedcal._difference_s)
    return [{"step": f"{st['key']}{d}", "test": st["test"], "depth": d, "n": n, "ns": ns[s][w:], "in_turn": True,
             **_threads(L, runner)} for s, d in enumerate(depths)]


def _threads(L, runner: _Runner) -> dict[str, int | None]:
    """The thread counts a step ran on, as llama.cpp holds them: its timed runs' and its fill's (None: no fill on
    other threads)."""
    return {"threads": int(L.llama_n_threads(runner.ctx)), "fill_threads": runner.filled_on}


# -- the measured run ---------------------------------------------------------------------------------

class _Runner:
    def __init__(self, L, ctx, n_batch: int, n_vocab: int, add_bos: bool, bos: int, rng: random.Random,
                 threads: tuple[int, int] | None = None):
        self.L, self.ctx, self.n_batch, self.n_vocab = L, ctx, n_batch, n_vocab
        self.add_bos, self.bos, self.rng = add_bos, bos, rng
        self.gen_batch = L.llama_batch_init(1, 0, 1)
        # (the timed thread count, the untimed fills'): a calibration fills its caches on every core it may use
        self.threads = threads
        self.filled_on: int | None = None     # the thread count llama.cpp held during the last fill at fill threads

    @contextlib.contextmanager
    def filling(self) -> Iterator[None]:
        """Untimed work (a calibration's cache fill) at the fill thread count, then back to the timed one."""
        t = self.threads
        if not t or t[1] == t[0]:
            yield
            return
        self.L.llama_set_n_threads(self.ctx, t[1], t[1])
        self.filled_on = int(self.L.llama_n_threads_batch(self.ctx))
        try:
            yield
        finally:
            self.L.llama_set_n_threads(self.ctx, t[0], t[0])

    def prompt_chunks(self, n: int) -> list[tuple[Any, int]]:
        """Random tokens for a prompt of n tokens in n_batch chunks; BOS first like llama-bench."""
        chunks, done = [], 0
        while done < n:
            k = min(n - done, self.n_batch)
            arr = (self.L.llama_token * k)(*[self.rng.randrange(self.n_vocab) for _ in range(k)])
            if done == 0 and self.add_bos:
                arr[0] = self.bos
            chunks.append((arr, k))
            done += k
        return chunks

    def run_prompt(self, chunks) -> None:
        L = self.L
        for arr, k in chunks:
            rc = L.llama_decode(self.ctx, L.llama_batch_get_one(arr, k))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} while processing a prompt batch"
                                   + (" (the KV cache is full)" if rc == 1 else ""))
        L.llama_synchronize(self.ctx)

    def gen_tokens(self, n: int) -> list[int]:
        toks = [self.rng.randrange(self.n_vocab) for _ in range(n)]
        if n and self.add_bos:
            toks[0] = self.bos
        return toks

    def run_gen(self, toks: list[int], pos0: int) -> None:
        L, b, ctx = self.L, self.gen_batch, self.ctx
        b.n_tokens = 1
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = 0
        b.logits[0] = 1
        pos = pos0
        for t in toks:
            b.token[0] = t
            b.pos[0] = pos
            pos += 1
            rc = L.llama_decode(ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} while generating"
                                   + (" (the KV cache is full)" if rc == 1 else ""))
            L.llama_synchronize(ctx)

    def close(self) -> None:
        self.L.llama_batch_free(self.gen_batch)


def _finish_ok(L, ctx, model, ev: EventWriter, devmem: DeviceMemory, t_begin: float, samples: dict[str, Any],
               untimed: dict[str, Any], out: dict[str, Any]) -> None:
    """A measured run's end: the last memory checkpoint, its total and timed seconds (``samples``; ``untimed``: views
    of the same samples, not counted again), the result, then llama.cpp's context and model freed."""
    cps, timing = out["checkpoints"], out["timing"]
    cps["end"] = _mem()
    cps["end"]["gpu_used"] = devmem.used()
    timing["child_total_s"] = time.perf_counter() - t_begin
    timing["timed_s"] = sum(sum(v["samples_ns"]) for v in samples.values()) / 1e9
    ev.result({**out, "status": "ok", "samples": {**samples, **untimed}})
    L.llama_free(ctx)
    L.llama_model_free(model)


class _SeqBatch:
    """A llama_batch of tokens spread over sequences, filled before the clock starts (llama-batched-bench's
    ``common_batch``): ``add`` appends one token of one sequence, ``decode`` runs it."""

    def __init__(self, L, ctx, capacity: int, n_seq: int):
        self.L, self.ctx = L, ctx
        self.b = L.llama_batch_init(capacity, 0, n_seq)
        self.b.n_tokens = 0

    def clear(self) -> None:
        self.b.n_tokens = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> None:
        b, i = self.b, self.b.n_tokens
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, int(logits)
        b.seq_id[i][0] = seq
        b.n_tokens = i + 1

    def decode(self, what: str) -> None:
        rc = self.L.llama_decode(self.ctx, self.b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} while {what}" + (" (the KV cache is full)" if rc == 1 else ""))

    def free(self) -> None:
        self.L.llama_batch_free(self.b)


def _batched_prompt(L, ctx, rng: random.Random, n_vocab: int, n_seq: int, n_prompt: int, n_batch: int) -> list[_SeqBatch]:
    """llama-batched-bench's prompt: ``n_seq`` sequences of ``n_prompt`` random tokens (positions 0..p-1, logits for
    each sequence's last token), cut into batches of at most ``n_batch`` tokens."""
    out: list[_SeqBatch] = []
    left = n_seq * n_prompt
    for j in range(n_seq):
        for i in range(n_prompt):
            if not out or out[-1].b.n_tokens == n_batch:
                out.append(_SeqBatch(L, ctx, min(n_batch, left), n_seq))
            out[-1].add(rng.randrange(n_vocab), i, j, i == n_prompt - 1)
            left -= 1
    return out


@dataclass
class _BenchRun:
    """What the phases of one measured run share: llama.cpp's module, the event writer, the settings, the log
    capture, the run's start, its timings and memory checkpoints so far; then the accelerators' memory reader (set
    by the load), llama.cpp's logs and the model's size (``base``) and the context's sizes (set by the context)."""

    L: Any
    ev: EventWriter
    s: dict[str, Any]
    cap: Any
    t_begin: float
    timing: dict[str, float]
    checkpoints: dict[str, Any]
    devmem: DeviceMemory | None = None
    base: dict[str, Any] = field(default_factory=dict)
    effective: dict[str, int] = field(default_factory=dict)


def _batched_prompts_timed(L, ctx, prompt: list[_SeqBatch]) -> int:
    """The prompts' batches decoded and synchronised, in nanoseconds; the batches freed after the clock stops."""
    t0 = time.perf_counter_ns()
    for b in prompt:
        b.decode("processing the prompts")
    L.llama_synchronize(ctx)
    t_pp = time.perf_counter_ns() - t0
    for b in prompt:
        b.free()
    return t_pp


def _batched_steps_timed(L, ctx, step: _SeqBatch, toks: list[list[int]], p: int) -> int:
    """Generation in nanoseconds: per row of ``toks``, one token of every sequence (positions from ``p``) in one
    batch, synchronised after each."""
    t0 = time.perf_counter_ns()
    for i, row in enumerate(toks):
        step.clear()
        for j, tok in enumerate(row):
            step.add(tok, p + i, j, True)
        step.decode("generating")
        L.llama_synchronize(ctx)
    return time.perf_counter_ns() - t0


# llama-batched-bench's loop (tools/batched-bench/batched-bench.cpp) with edgekv's phases and memory events
def _batched_run(run: _BenchRun, ctx, model, runner: _Runner) -> None:
    """``-npl N``: each repetition clears the cache, decodes N prompts of ``-p`` tokens in one go (timed: aggregate
    prefill = N·p / t) and then ``-n`` steps of one token for each sequence (timed: aggregate decode = N·n / t), as
    llama-batched-bench does with its default ``is_pp_shared = 0, is_tg_separate = 0``."""
    L, ev, s, timing = run.L, run.ev, run.s, run.timing
    n_seq, p, n, reps = int(s["n_parallel"]), s["n_prompt"], s["n_gen"], s["repetitions"]
    mem = L.llama_get_memory(ctx)
    rng, n_vocab, n_batch = runner.rng, runner.n_vocab, run.effective["n_batch"]
    step = _SeqBatch(L, ctx, n_seq, n_seq)
    ns: dict[str, list[int]] = {"pp": [], "tg": []}
    try:
        for r in range(reps + (1 if s["warmup"] else 0)):
            warm = s["warmup"] and r == 0
            rep = r if s["warmup"] else r + 1
            if warm:
                ev.emit("phase", phase="warmup")
            L.llama_memory_clear(mem, False)
            prompt = _batched_prompt(L, ctx, rng, n_vocab, n_seq, p, n_batch) if p > 0 else []
            toks = [[rng.randrange(n_vocab) for _ in range(n_seq)] for _ in range(1 if warm else n)]
            if not warm:
                ev.emit("phase", phase="pp", rep=rep, reps=reps, timed=True)
            t_pp = _batched_prompts_timed(L, ctx, prompt)
            if not warm:
                ev.emit("mem", **self_memory())
                ev.emit("phase", phase="tg", rep=rep, reps=reps, timed=True)
            t_tg = _batched_steps_timed(L, ctx, step, toks, p)
            if warm:
                timing["warmup_s"] = (t_pp + t_tg) / 1e9
                continue
            ev.emit("mem", **self_memory())
            ns["pp"].append(t_pp)
            ns["tg"].append(t_tg)
    except RuntimeError as e:
        ev.result({**run.base, "status": "failed", "reason": str(e), "checkpoints": run.checkpoints, "timing": timing,
                   "effective": run.effective})
        return
    finally:
        step.free()
        runner.close()
    _batched_finish(run, ctx, model, runner, ns)


def _batched_finish(run: _BenchRun, ctx, model, runner: _Runner, ns: dict[str, list[int]]) -> None:
    """The batched run's statistics and result: each test's aggregate rate over all sequences (timed), and what each
    sequence sees of the decode (the same samples, not counted again)."""
    s, timing = run.s, run.timing
    n_seq, p, n = int(s["n_parallel"]), s["n_prompt"], s["n_gen"]
    samples = {}
    for test, per_seq in (("pp", p), ("tg", n)):
        if per_seq > 0:
            total = n_seq * per_seq
            timing[f"{test}_s"] = sum(ns[test]) / 1e9
            samples[test] = {"n_tokens": total, "samples_ns": ns[test], "samples_ts": [total * 1e9 / x for x in ns[test]]}
    timing["fill_s"] = 0.0
    # what each sequence sees: its own decode rate while the others decode beside it (not timed again)
    per_seq = {"tg_seq": {"n_tokens": n, "samples_ns": ns["tg"], "samples_ts": [n * 1e9 / x for x in ns["tg"]]}} \
        if n > 0 else {}
    _finish_ok(run.L, ctx, model, run.ev, run.devmem, run.t_begin, samples, per_seq,
               {**run.base, "effective": run.effective, "checkpoints": run.checkpoints, "timing": timing,
                "restore": "clear", "snapshot_bytes": None, "n_vocab": runner.n_vocab, "add_bos": runner.add_bos})


def _bench_load(run: _BenchRun, payload: dict) -> tuple[Any, list[tuple[int, str]], Any] | None:
    """The load phase: the model loaded as the settings say (timed), llama.cpp's log of the load parsed, the memory
    checkpoint after it.  The model, the log lines and the parsed log; None after a failed result."""
    from edgekv.core.llamalog import parse_memory_log
    from edgekv.edges.engine import model_params

    L, s, ev, timing, cap = run.L, run.s, run.ev, run.timing, run.cap
    ev.emit("phase", phase="load")
    t = time.perf_counter()
    mparams = model_params(s["n_gpu_layers"], dry=False, use_extra_bufts=s.get("repack", True) is not False)
    if s.get("no_mmap"):
        mparams.load_mode = 0     # LLAMA_LOAD_MODE_NONE: llama.cpp's `-lm none` (older builds: --no-mmap)
    model = L.llama_model_load_from_file(payload["model_path"].encode(), mparams)
    timing["load_s"] = time.perf_counter() - t
    load_lines = cap.take()
    load_log = parse_memory_log([x for _, x in load_lines])
    if not model:
        errs = [x.strip() for lvl, x in load_lines if lvl == 4 and x.strip()]
        ev.result({"status": "failed", "reason": f"llama.cpp could not load the model: {errs[-1] if errs else '?'}"})
        return None
    run.checkpoints["after_load"] = _mem()
    run.devmem = DeviceMemory()          # after the load: reading a CUDA device's memory creates its context
    run.checkpoints["after_load"]["gpu_used"] = run.devmem.used()
    return model, load_lines, load_log


def _bench_context(run: _BenchRun, model, load_lines: list[tuple[int, str]], load_log) -> Any:
    """The context phase: the context created with the settings' sizes and cache types (timed), ``run.base`` (both
    logs parsed, the model's size, the device notes), the memory checkpoint and ``run.effective`` (the sizes
    llama.cpp chose).  The context; None after a failed result, the model freed."""
    from edgekv.core.llamalog import parse_memory_log
    from edgekv.core.predict import ContextParams
    from edgekv.edges.engine import context_params

    L, s, ev, timing, cap, checkpoints = run.L, run.s, run.ev, run.timing, run.cap, run.checkpoints
    ev.emit("phase", phase="context")
    cp = ContextParams(n_ctx=s["n_ctx"], type_k=s["type_k"], type_v=s["type_v"], flash_attn=s["flash_attn"],
                       swa_full=s["swa_full"], n_seq_max=s["n_seq_max"], kv_unified=s["kv_unified"],
                       n_batch=s["n_batch"], n_ubatch=s["n_ubatch"])
    t = time.perf_counter()
    ctx = L.llama_init_from_model(model, context_params(cp, n_threads=s["n_threads"]))
    timing["context_s"] = time.perf_counter() - t
    ctx_lines = cap.take()
    ctx_log = parse_memory_log([x for _, x in ctx_lines])
    extra_lines = [x.strip() for _, x in load_lines + ctx_lines if "recommendedMaxWorkingSetSize" in x]
    run.base = {
        "load_log": load_log.to_dict(), "ctx_log": ctx_log.to_dict(),
        "model": {"size_bytes": int(L.llama_model_size(model)), "n_params": int(L.llama_model_n_params(model))},
        "device_notes": extra_lines,
    }
    if not ctx:
        errs = [x.strip() for lvl, x in ctx_lines if lvl == 4 and x.strip()]
        ev.result({**run.base, "status": "failed", "reason": errs[-1] if errs else "llama_init_from_model returned NULL",
                   "checkpoints": checkpoints, "timing": timing})
        L.llama_model_free(model)
        return None
    checkpoints["after_context"] = _mem()
    checkpoints["after_context"]["gpu_used"] = run.devmem.used()
    run.effective = {"n_ctx": int(L.llama_n_ctx(ctx)), "n_batch": int(L.llama_n_batch(ctx)),
                     "n_ubatch": int(L.llama_n_ubatch(ctx)), "n_seq_max": int(L.llama_n_seq_max(ctx))}
    if hasattr(L, "llama_n_ctx_seq"):
        run.effective["n_ctx_seq"] = int(L.llama_n_ctx_seq(ctx))
    return ctx


def _bench_runner(run: _BenchRun, model, ctx) -> _Runner:
    """The run's token source: random tokens from the fixed seed in ``n_batch`` chunks, BOS first where the
    vocabulary adds it (llama-bench)."""
    L = run.L
    vocab = L.llama_model_get_vocab(model)
    n_vocab = int(L.llama_vocab_n_tokens(vocab))
    add_bos = bool(L.llama_vocab_get_add_bos(vocab))
    bos = int(L.llama_vocab_bos(vocab))
    return _Runner(L, ctx, run.effective["n_batch"], n_vocab, add_bos, bos, random.Random(SEED))


def _bench_warmup(run: _BenchRun, runner: _Runner, mem) -> None:
    """llama-bench's warm-up, timed: a prompt of ``n_prompt`` tokens and one generated token."""
    L, p, n, timing = run.L, run.s["n_prompt"], run.s["n_gen"], run.timing
    run.ev.emit("phase", phase="warmup")
    t = time.perf_counter()
    if p > 0:
        runner.run_prompt(runner.prompt_chunks(p))
    if n > 0:
        runner.run_gen(runner.gen_tokens(1), int(L.llama_memory_seq_pos_max(mem, 0)) + 1)
    timing["warmup_s"] = time.perf_counter() - t


def _bench_fill(run: _BenchRun, runner: _Runner, d: int) -> None:
    """The depth fill, timed: ``d`` tokens in ``n_batch`` chunks with progress after each; then the memory
    checkpoint after it."""
    ev, timing, checkpoints = run.ev, run.timing, run.checkpoints
    t = time.perf_counter()
    if d > 0:
        chunks = runner.prompt_chunks(d)
        done = 0
        ev.emit("phase", phase="fill", done=0, total=d)
        for arr, k in chunks:
            runner.run_prompt([(arr, k)])
            done += k
            ev.emit("progress", phase="fill", done=done, total=d)
    timing["fill_s"] = time.perf_counter() - t
    checkpoints["after_fill"] = _mem()
    checkpoints["after_fill"]["gpu_used"] = run.devmem.used()


def _save_depth_state(L, ctx, state_path: str) -> int:
    """Sequence 0's state (the cache at depth) saved to ``state_path``; the file's size in bytes."""
    if L.llama_state_seq_save_file(ctx, state_path.encode(), 0, (L.llama_token * 1)(), 0) == 0:
        raise RuntimeError(f"llama.cpp could not save the depth state to {state_path}: "
                           "free disk space there or point TMPDIR elsewhere")
    return os.path.getsize(state_path)


def _back_to_depth(L, ctx, mem, d: int, state_path: str | None) -> None:
    """The cache back to exactly ``d`` tokens: cleared at depth 0, else the snapshot restored where there is one,
    else the tokens after the depth removed."""
    if d == 0:
        L.llama_memory_clear(mem, True)
    elif state_path is not None:
        L.llama_memory_clear(mem, False)
        n_tok = ctypes.c_size_t(0)
        if L.llama_state_seq_load_file(ctx, state_path.encode(), 0, (L.llama_token * 1)(), 1,
                                       ctypes.byref(n_tok)) == 0:
            raise RuntimeError(f"llama.cpp could not restore the depth state from {state_path}")
    elif not L.llama_memory_seq_rm(mem, 0, d, -1):
        raise RuntimeError("llama.cpp could not remove the tokens added after the depth fill")


def _bench_timed_test(run: _BenchRun, runner: _Runner, ctx, mem, test: str, count: int,
                      state_path: str | None) -> dict[str, Any]:
    """One test's repetitions ("pp": a prompt of ``count`` tokens, "tg": ``count`` generated tokens), each from the
    cache back at depth and timed alone, this process's memory read after each; the test's samples."""
    L, ev, timing, d, reps = run.L, run.ev, run.timing, run.s["n_depth"], run.s["repetitions"]
    ns: list[int] = []
    t_test = time.perf_counter()
    for r in range(reps):
        if state_path is not None:
            ev.emit("phase", phase="restore")
        _back_to_depth(L, ctx, mem, d, state_path)
        # timed: the parent stops sampling until the next phase (its wake-ups would take CPU from
        # llama.cpp's threads); this process reads its own memory after the repetition instead
        ev.emit("phase", phase=test, rep=r + 1, reps=reps, timed=True)
        if test == "pp":
            work = runner.prompt_chunks(count)
            t0 = time.perf_counter_ns()
            runner.run_prompt(work)
        else:
            toks = runner.gen_tokens(count)
            pos0 = int(L.llama_memory_seq_pos_max(mem, 0)) + 1
            t0 = time.perf_counter_ns()
            runner.run_gen(toks, pos0)
        ns.append(time.perf_counter_ns() - t0)
        ev.emit("mem", **self_memory())
    timing[f"{test}_s"] = time.perf_counter() - t_test
    return {"n_tokens": count, "samples_ns": ns, "samples_ts": [count * 1e9 / x for x in ns]}


def _bench_repetitions(run: _BenchRun, restore: str, model, ctx, runner: _Runner, mem) -> None:
    """llama-bench's workload from a cache of ``n_depth`` tokens: the warm-up, the depth fill, the state snapshot
    where the depth comes back from one, then each test's timed repetitions; the result, failed or ok."""
    L, ev, s = run.L, run.ev, run.s
    p, n, d = s["n_prompt"], s["n_gen"], s["n_depth"]
    samples: dict[str, Any] = {}
    snapshot_bytes = None
    state_path: str | None = None
    try:
        if s["warmup"]:
            _bench_warmup(run, runner, mem)
        L.llama_memory_clear(mem, True)
        _bench_fill(run, runner, d)
        if d > 0 and restore == "snapshot":
            # The depth state goes to a file, not to memory: an in-memory copy is as large as the cache and
            # would sit in the measured RSS for the rest of the run.  Saving and restoring pass through one
            # layer's rows at a time; those two phases are the only ones the peak leaves out.
            ev.emit("phase", phase="snapshot")
            state_path = os.path.join(tempfile.mkdtemp(prefix="edgekv-state-"), "depth.state")
            snapshot_bytes = _save_depth_state(L, ctx, state_path)
        for test, count in (("pp", p), ("tg", n)):
            if count > 0:
                samples[test] = _bench_timed_test(run, runner, ctx, mem, test, count, state_path)
    except RuntimeError as e:
        ev.result({**run.base, "status": "failed", "reason": str(e), "checkpoints": run.checkpoints,
                   "timing": run.timing, "effective": run.effective})
        return
    finally:
        runner.close()
        if state_path is not None:
            shutil.rmtree(os.path.dirname(state_path), ignore_errors=True)
    _finish_ok(L, ctx, model, ev, run.devmem, run.t_begin, samples, {},
               {**run.base, "effective": run.effective, "checkpoints": run.checkpoints, "timing": run.timing,
                "restore": restore if d > 0 else "clear", "snapshot_bytes": snapshot_bytes, "n_vocab": runner.n_vocab,
                "add_bos": runner.add_bos})


def bench(payload: dict, ev: EventWriter) -> None:
    """One measured run, phase by phase: import, load, context, then llama-bench's repetitions (or, with
    ``n_parallel``, llama-batched-bench's loop); each phase announced to the parent before it starts."""
    t_begin = time.perf_counter()
    s = payload["settings"]
    timing: dict[str, float] = {}
    checkpoints: dict[str, Any] = {}
    ev.emit("phase", phase="import")
    import llama_cpp as L

    # edgekv.edges.engine brings llama.cpp's log parser and ContextParams (edgekv.core) in with it: the load and
    # context phases find them imported
    from edgekv.edges.engine import LogCapture

    cap = LogCapture(tee=lambda line: ev.emit("log", line=line))     # survives a crash: the parent keeps the tail
    cap.install()
    L.llama_backend_init()
    timing["import_s"] = time.perf_counter() - t_begin
    checkpoints["start"] = _mem()
    run = _BenchRun(L, ev, s, cap, t_begin, timing, checkpoints)
    loaded = _bench_load(run, payload)
    if loaded is None:
        return
    model, load_lines, load_log = loaded
    ctx = _bench_context(run, model, load_lines, load_log)
    if ctx is None:
        return
    runner = _bench_runner(run, model, ctx)
    mem = L.llama_get_memory(ctx)
    if s.get("n_parallel"):
        return _batched_run(run, ctx, model, runner)
    _bench_repetitions(run, payload.get("restore", "snapshot"), model, ctx, runner, mem)
