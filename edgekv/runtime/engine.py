"""llama.cpp's own answer: a dry run through llama-cpp-python.

The model is loaded with ``no_alloc=True, load_mode=NONE``: llama.cpp reads the header, builds
every tensor and simulates every allocation, but reads no weights and allocates nothing.  Creating
a context then prints the exact ``llama_kv_cache: size = ...`` lines, the recurrent-state line,
and the compute and output buffer sizes that a real run would allocate.  We capture the log through
``llama_log_set`` and parse it (:mod:`edgekv.core.llamalog`).

The dry run runs in a child process (:func:`dry_run`): an assertion inside llama.cpp aborts the
whole process, and edgekv must report that, not die of it.  :func:`dry_run_inprocess` is what the
child executes.  This module and :mod:`edgekv.child.worker` are the only ones that import ``llama_cpp``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import msgspec
import psutil

from edgekv import heavy
from edgekv.core.cachetypes import cache_type
from edgekv.core.childwire import (
    EngineContext,
    EngineContexts,
    EngineLoad,
    EngineLoaded,
    engine_contexts_from,
    engine_loaded_from,
    to_wire,
)
from edgekv.core.llamalog import parse_memory_log
from edgekv.core.predict import ContextParams
from edgekv.core.units import mib_to_bytes
from edgekv.errors import EngineError
from edgekv.runtime.process import ChildDied, ChildSession, worker_argv
from edgekv.sources.gguf_header import GGUFHeader, read_header_file

FLASH_ATTN_C = {"auto": -1, "off": 0, "on": 1}   # enum llama_flash_attn_type
LOG_LEVEL_ERROR = 4


# -- child side ---------------------------------------------------------------------------------------

LOG_LEVEL_INFO = 2


class LogCapture:
    """Collects llama.cpp/ggml log messages, joining continuation pieces into lines.

    ``tee`` also receives each complete line of level INFO or above as it arrives: a measuring child forwards them
    to its parent, so that the last lines before a crash survive the process (``edgekv.core.diagnose``)."""

    def __init__(self, tee: Any = None) -> None:
        self.lines: list[tuple[int, str]] = []
        self._partial = ""
        self._level = 0
        self._cb = None
        self._tee = tee

    def install(self) -> None:
        llama_cpp = heavy.llama_cpp()

        def on_log(level: int, text: bytes, _ud: Any) -> None:
            s = text.decode("utf-8", "replace") if text else ""
            if level != 5:  # GGML_LOG_LEVEL_CONT continues the previous message
                self._level = level
            self._partial += s
            while "\n" in self._partial:
                line, self._partial = self._partial.split("\n", 1)
                self.lines.append((self._level, line))
                if self._tee is not None and self._level >= LOG_LEVEL_INFO and line.strip():
                    self._tee(line)

        self._cb = llama_cpp.llama_log_callback(on_log)   # keep a reference: ctypes must not free it
        llama_cpp.llama_log_set(self._cb, ctypes.c_void_p(0))

    def take(self) -> list[tuple[int, str]]:
        out, self.lines = self.lines, []
        if self._partial:
            out.append((self._level, self._partial))
            self._partial = ""
        return out


def model_params(n_gpu_layers: int, dry: bool, use_extra_bufts: bool = True):
    llama_cpp = heavy.llama_cpp()

    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = n_gpu_layers
    # llama-bench --repack / llama-cli -nr: the CPU backend's extra buffer types (AMX, CPU_REPACK)
    mp.use_extra_bufts = bool(use_extra_bufts)
    if dry:
        mp.no_alloc = True
        mp.load_mode = 0      # LLAMA_LOAD_MODE_NONE: with mmap, no_alloc asserts (reference §8)
    return mp


def context_params(p: ContextParams, n_threads: int | None = None, n_outputs_max: int = 0):
    llama_cpp = heavy.llama_cpp()

    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = p.n_ctx
    cp.n_batch = p.n_batch
    cp.n_ubatch = p.n_ubatch
    cp.n_seq_max = p.n_seq_max
    cp.type_k = cache_type(p.type_k).ggml_id
    cp.type_v = cache_type(p.type_v).ggml_id
    cp.flash_attn_type = FLASH_ATTN_C[p.flash_attn]
    cp.swa_full = p.swa_full
    cp.kv_unified = p.kv_unified
    if hasattr(cp, "n_rs_seq"):
        cp.n_rs_seq = p.n_rs_seq
    if n_threads:
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
    if n_outputs_max and hasattr(cp, "n_outputs_max"):
        cp.n_outputs_max = n_outputs_max     # llama.h:371: reserve the graph for this many outputs per ubatch
    return cp


def _rss_now() -> int | None:
    """This process's resident bytes (Linux /proc/self/statm; psutil elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError, AttributeError):
        try:
            return int(psutil.Process().memory_info().rss)
        except Exception:  # noqa: BLE001 - no reading is a None, never a zero
            return None


def _errors(lines: list[tuple[int, str]]) -> list[str]:
    return [t.strip() for lvl, t in lines if lvl == LOG_LEVEL_ERROR and t.strip()]


class DryRunner:
    """Child side: one model loaded with no_alloc, contexts created on request."""

    def __init__(self) -> None:
        llama_cpp = heavy.llama_cpp()

        self.llama_cpp = llama_cpp
        self.cap = LogCapture()
        self.cap.install()
        llama_cpp.llama_backend_init()
        self.model = None
        self.host_growth: dict[str, int | None] = {}

    def load(self, model_path: str, n_gpu_layers: int = -1, use_extra_bufts: bool = True,
             graph_listing: bool = True) -> EngineLoaded:
        lc = self.llama_cpp
        self.cap.take()
        rss0 = _rss_now()
        self.model = lc.llama_model_load_from_file(model_path.encode(),
                                                   model_params(n_gpu_layers, dry=True, use_extra_bufts=use_extra_bufts))
        rss1 = _rss_now()
        self.host_growth = {"load": rss1 - rss0 if rss0 is not None and rss1 is not None else None}
        lines = self.cap.take()
        if not self.model:
            errs = _errors(lines)
            # "llama_model_load: error loading model: <why>" says why; the last line only says that it failed
            why = next((e for e in errs if "error loading model" in e), errs[-1] if errs else None)
            return EngineLoaded(ok=False, error=why or "llama.cpp could not load the model", errors=errs)
        log = parse_memory_log([t for _, t in lines])
        # the contexts' reserve graphs then list every node a backend runs and where (ggml-backend.cpp:1018, 1878;
        # read when a context creates its scheduler): an op a device cannot run falls back to the CPU without a word
        # otherwise, and the speed model prices the nodes that run, not the views (llamalog.graph_ops).  A dry run
        # computes nothing, so the listing costs only its lines -- but they are many: a session that wants memory
        # only (graph_listing=False) creates its contexts about 3.5 times faster without them.
        if graph_listing:
            os.environ["GGML_SCHED_DEBUG"] = "2"
        # host_growth_load_bytes: what this process grew by while llama.cpp read the header and built its tensors
        # (nothing of the weights is read in a dry run): vocabulary, tensor metadata, code pages -- as in a real load
        return EngineLoaded(ok=True, model_size_bytes=int(lc.llama_model_size(self.model)),
                            n_params=int(lc.llama_model_n_params(self.model)), model_buffers_mib=log.model_buffers,
                            gpu_layers=log.gpu_layers, host_growth_load_bytes=self.host_growth["load"])

    def context(self, p: ContextParams, keep_log: bool = False, n_outputs_max: int = 0) -> EngineContext:
        lc = self.llama_cpp
        self.cap.take()
        rss0 = _rss_now()
        ctx = lc.llama_init_from_model(self.model, context_params(p, n_outputs_max=n_outputs_max))
        rss1 = _rss_now()
        lines = self.cap.take()
        log = parse_memory_log([t for _, t in lines])
        sizes: dict[str, int | None] = {}
        error = None
        if ctx and "context" not in self.host_growth and rss0 is not None and rss1 is not None:
            # the first context's host structures (freed contexts leave their pages to malloc, so later
            # contexts would show less): recorded once per session
            self.host_growth["context"] = rss1 - rss0
            # less that context's own output buffer (llama.cpp's line; its rows follow that context's -np), so the
            # figure holds for a context of any -np
            out = mib_to_bytes(sum(log.output_buffers.values()))
            self.host_growth["context_less_output"] = rss1 - rss0 - out
        if ctx:
            sizes = {"n_ctx": int(lc.llama_n_ctx(ctx)), "n_batch": int(lc.llama_n_batch(ctx)),
                     "n_ctx_seq": int(lc.llama_n_ctx_seq(ctx)) if hasattr(lc, "llama_n_ctx_seq") else None,
                     "n_ubatch": int(lc.llama_n_ubatch(ctx)), "n_seq_max": int(lc.llama_n_seq_max(ctx))}
            lc.llama_free(ctx)
            self.cap.take()
        else:
            errs = _errors(lines)
            error = errs[-1] if errs else "llama_init_from_model returned NULL"
        return EngineContext(ok=bool(ctx), log=log, n_outputs_max=n_outputs_max, error=error,
                             host_growth_context_less_output_bytes=self.host_growth.get("context_less_output"),
                             raw_log=[t for lvl, t in lines if lvl >= 2] if keep_log else None, **sizes)

    def close(self) -> None:
        if self.model:
            self.llama_cpp.llama_model_free(self.model)
            self.model = None


# -- parent side --------------------------------------------------------------------------------------

class EngineResult(EngineContext, frozen=True):
    """llama.cpp's dry-run figures for one context configuration: the child's EngineContext beside the
    configuration asked (``EngineResult(params, ok=..., log=...)``)."""

    params: ContextParams

    @property
    def compute_mib(self) -> float:
        return self.log.compute_mib_total

    @property
    def output_mib(self) -> float:
        return self.log.output_mib_total


@contextlib.contextmanager
def loadable_path(path: str, header: GGUFHeader | None = None) -> Iterator[tuple[str, bool]]:
    """Yield a path llama.cpp can load for a dry run, and whether it is a sparse stand-in.

    A header-only file (cut after the tensor-info table) fails llama.cpp's bounds check; a sparse
    file of the full size with the same header passes it and costs only the header on disk.  For a
    split model every file gets its stand-in, named as llama.cpp expects, in one directory.
    """
    header = header or read_header_file(path)
    # a split model: llama.cpp opens the siblings named like the first file, next to it
    files = [(s.source, s.file_size) for s in header.shards] or [(path, header.file_size)]
    if all(os.path.getsize(p) >= need for p, need in files):
        yield path, False
        return
    tmpdir = tempfile.mkdtemp(prefix="edgekv-sparse-")
    try:
        out = []
        for p, need in files:
            sparse = os.path.join(tmpdir, os.path.basename(p) or "model.gguf")
            if os.path.getsize(p) >= need:
                os.symlink(os.path.abspath(p), sparse)
            else:
                with open(p, "rb") as src, open(sparse, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 20)
                    dst.truncate(need)
            out.append(sparse)
        yield out[0], True
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _engine_result(c: ContextParams, r: EngineContext) -> EngineResult:
    """The child's answer for ``c`` beside the configuration asked."""
    return EngineResult(c, **msgspec.structs.asdict(r))


class EngineSession:
    """Parent side: a child process holding one dry-run model; ask it about any number of contexts.

    >>> with EngineSession(path) as eng:
    ...     results = eng.run([ContextParams(n_ctx=4096), ContextParams(n_ctx=8192, type_k="q8_0")])
    """

    def __init__(self, model_path: str, n_gpu_layers: int = -1, header: GGUFHeader | None = None,
                 timeout: float = 600.0, use_extra_bufts: bool = True, graph_listing: bool = True):
        self.model_path = model_path
        self.n_gpu_layers = n_gpu_layers
        self.use_extra_bufts = use_extra_bufts
        self.graph_listing = graph_listing
        self.header = header
        self.timeout = timeout
        self.model_size_bytes: int | None = None
        self.sparse = False
        self.graph: dict[str, int] | None = None
        # llama.cpp's default graph (n_outputs_max 0) per K/V type pair, from the first such context of the pair: a
        # quantized cache adds nodes of its own; the node count does not depend on n_ctx (edgekv predict prices
        # each pair's speed with it instead of asking a second session)
        self.graphs: dict[tuple[str, str], dict[str, int]] = {}
        self._stack = contextlib.ExitStack()
        self._child = None

    def __enter__(self) -> EngineSession:
        try:
            path, self.sparse = self._stack.enter_context(loadable_path(self.model_path, self.header))
            self._child = self._stack.enter_context(ChildSession(worker_argv("engine")))
            info = engine_loaded_from(self._child.request(to_wire(EngineLoad(
                model_path=path, n_gpu_layers=self.n_gpu_layers, use_extra_bufts=self.use_extra_bufts,
                graph_listing=self.graph_listing)),
                timeout=self.timeout))
        except ChildDied as e:
            self._stack.close()
            raise EngineError(f"{self.model_path}: llama.cpp dry run failed: {e}") from None
        except BaseException:
            self._stack.close()
            raise
        if not info.ok:
            self._stack.close()
            hint = ""
            header = self.header or read_header_file(self.model_path)
            if not header.tensors:
                # llama.cpp checks every tensor its architecture declares, even with no_alloc
                # (llama-model-loader.cpp create_tensor): a header with metadata only cannot pass
                hint = ("; the file has no tensor table (metadata only), and llama.cpp needs every tensor the "
                        "architecture declares even for a dry run: write the header with its tensor table "
                        "(tools/shape_headers.py does) or use the real file's header")
            if "tokenizer merges" in str(info.error):
                hint += ("; a BPE tokenizer model ('gpt2') needs its token list and merges, so a header without a "
                         "vocabulary should say tokenizer.ggml.model = 'none' (llama.cpp then sizes the embeddings from "
                         "{arch}.vocab_size)")
            raise EngineError(f"{self.model_path}: llama.cpp refused to load it: {info.error}{hint}")
        self.model_size_bytes = info.model_size_bytes
        self.model_info = info
        return self

    def run(self, configs: list[ContextParams], keep_log: bool = False, n_outputs_max: int = 0) -> list[EngineResult]:
        """llama.cpp's figures per configuration; ``n_outputs_max`` > 0 reserves the graph for that many
        outputs per ubatch (a workload's graph) instead of llama.cpp's default n_batch."""
        assert self._child is not None, "use EngineSession as a context manager"
        try:
            data = engine_contexts_from(self._child.request(to_wire(EngineContexts(
                configs=list(configs), keep_log=keep_log, n_outputs_max=n_outputs_max)), timeout=self.timeout))
        except ChildDied as e:
            raise EngineError(f"{self.model_path}: llama.cpp dry run failed: {e}") from None
        out = [_engine_result(c, r) for c, r in zip(configs, data.results)]
        if self.graph is None:          # llama.cpp's graph size (the speed model's node count), from the first context
            self.graph = next((r.log.graph for r in out if r.ok and r.log.graph), None)
        if not n_outputs_max:
            for c, r in zip(configs, out):
                if r.ok and r.log.graph:
                    self.graphs.setdefault((c.type_k, c.type_v), r.log.graph)
        return out

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
