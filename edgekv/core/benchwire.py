"""The measured run's protocol: what edgekv asks a bench child to run and what the child replies.

Shared by the sweep (edgekv.sweep.run, which sends a :class:`BenchRequest` and builds a record from the
:class:`BenchReply`), the child (edgekv.child.bench_child, which reads the request and builds the reply, never a
dict) and the replay runner of the tests (edgekv.sweep.runners, which reads recorded replies).  The
request crosses to the child as JSON on its stdin and the reply comes back as JSON on its event pipe:
:func:`to_wire` encodes, :func:`request_from` and :func:`reply_from` decode strictly (msgspec.ValidationError when
a payload is not one), as edgekv.core.probe does for the speed calibration.

A memory checkpoint is a named field of :class:`Checkpoints`, so that a record's ``memory.rss_after_load_bytes``
is assigned from ``checkpoints.after_load.rss``: renaming one side is an error, not a field that goes missing.
"""

from __future__ import annotations

import math

import msgspec

from edgekv.core.llamalog import LlamaMemoryLog
from edgekv.core.predict import ContextParams
from edgekv.core.wire import decoder
from edgekv.core.wire import to_wire as to_wire


class BenchWorkload(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """llama-bench's workload of one configuration (its record's ``settings`` names): threads, offload, the tests'
    lengths, the depth, the repetitions; ``n_parallel``: llama-batched-bench's loop of that many sequences."""

    n_threads: int
    n_gpu_layers: int
    n_prompt: int
    n_gen: int
    n_depth: int
    repetitions: int
    warmup: bool
    repack: bool = True
    no_mmap: bool = False
    n_parallel: int | None = None
    # the default -r only: stop after this many repetitions once they agree (tight(); 0: run them all), or once the
    # test has run rep_budget_s seconds (enough(); 0: no budget)
    min_repetitions: int = 0
    rep_budget_s: float = 0.0


# the default -r stops early once the mean's 95 % interval (Student t on the logarithm, as the records compute it:
# core.stats.summarize) is within TIGHT_HALF_WIDTH of it; t's 97.5 % quantile by degrees of freedom
# (scipy.stats.t.ppf(0.975, df), written out: the bench child imports no scipy)
TIGHT_HALF_WIDTH = 0.05
T975 = {2: 4.302653, 3: 3.182446, 4: 2.776445, 5: 2.570582, 6: 2.446912, 7: 2.364624, 8: 2.306004, 9: 2.262157}


def tight(ns: list[int], least: int) -> bool:
    """Whether the repetitions timed so far (``ns``, nanoseconds) are enough: at least ``least`` of them (0: never
    enough) and their mean's 95 % interval within TIGHT_HALF_WIDTH."""
    n = len(ns)
    if not 0 < least <= n or n - 1 not in T975:
        return False
    logs = [math.log(x) for x in ns]
    mean = sum(logs) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))
    return T975[n - 1] * sd / math.sqrt(n) <= math.log1p(TIGHT_HALF_WIDTH)


def enough(ns: list[int], least: int, budget_s: float, elapsed_s: float) -> bool:
    """Whether a test stops after the repetitions timed so far (``ns``): they agree (tight), or there are at least
    ``least`` of them and the test has run ``budget_s`` seconds (``elapsed_s``; 0: no budget).  A long test's
    interval is then its minimum's, wider where they spread: the records' intervals say so."""
    over = budget_s > 0 and 0 < least <= len(ns) and elapsed_s >= budget_s
    return over or tight(ns, least)


def expected_reps(reps: int, per_rep_s: float, least: int, budget_s: float) -> int:
    """The repetitions a test of ``reps`` runs at most when each takes ``per_rep_s`` (enough's budget; the
    interval may stop it sooner): what the sweep's time plan counts."""
    if not (least > 0 and budget_s > 0 and per_rep_s > 0):
        return reps
    return min(reps, max(least, math.ceil(budget_s / per_rep_s - 1e-9)))


class DepthSeed(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A depth state handed from one configuration to a deeper one of the same cache (edgekv.sweep.seeds): ``load``,
    restored before the fill, holds the first ``tokens`` of the depth (the fill adds the rest); ``save`` receives this
    run's state at its depth for a later configuration.  Both are files the sweep made under edgekv's home."""

    load: str | None = None
    tokens: int = 0
    save: str | None = None


class BenchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One measured run: the model file, llama.cpp's context parameters, the workload, how the cache goes back to
    its depth between repetitions (``snapshot`` or ``truncate``) and the depth state it starts from or leaves."""

    model_path: str
    params: ContextParams
    workload: BenchWorkload
    restore: str = "snapshot"
    seed: DepthSeed | None = None


class Checkpoint(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One memory reading the bench child takes of itself: resident and anonymous bytes, and the accelerators'
    memory in use (None: no accelerator, or not read)."""

    rss: int | None = None
    anon: int | None = None
    gpu_used: int | None = None


class Checkpoints(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """The child's readings at the points of its run; None where the run did not get there."""

    start: Checkpoint | None = None
    after_load: Checkpoint | None = None
    after_context: Checkpoint | None = None
    after_fill: Checkpoint | None = None
    end: Checkpoint | None = None


class ChildTiming(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """The child's phases in seconds (None: the run did not get there): importing llama.cpp, the load, the context,
    the warm-up, the depth fill, each test's timed repetitions, the child's whole life and the timed tests' sum."""

    import_s: float | None = None
    load_s: float | None = None
    context_s: float | None = None
    warmup_s: float | None = None
    fill_s: float | None = None
    fill_from: int | None = None         # tokens of the depth restored from an earlier configuration's state
    pp_s: float | None = None
    tg_s: float | None = None
    child_total_s: float | None = None
    timed_s: float | None = None

    def llama_s(self) -> float:
        """The seconds llama.cpp worked (load to the last test)."""
        parts = (self.load_s, self.context_s, self.warmup_s, self.fill_s, self.pp_s, self.tg_s)
        return sum(x for x in parts if x is not None)


class Samples(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One test's timed repetitions: its tokens, each repetition's nanoseconds and tokens per second."""

    n_tokens: int
    samples_ns: list[int]
    samples_ts: list[float]

    @classmethod
    def of(cls, n_tokens: int, ns: list[int]) -> Samples:
        return cls(n_tokens=n_tokens, samples_ns=ns, samples_ts=[n_tokens * 1e9 / x for x in ns])


class BenchSamples(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """The tests' samples: the prompt, the generation and, with ``n_parallel``, what one sequence sees of the
    generation (the same samples, not timed again)."""

    pp: Samples | None = None
    tg: Samples | None = None
    tg_seq: Samples | None = None

    def timed_ns(self) -> int:
        return sum(sum(s.samples_ns) for s in (self.pp, self.tg) if s is not None)


class Effective(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """The sizes llama.cpp chose for the context (``llama_n_ctx`` ...; ``n_ctx_seq`` where the build has it)."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_ctx_seq: int | None = None


class ModelFacts(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The loaded model's size as llama.cpp counts it."""

    size_bytes: int
    n_params: int


class BenchReply(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """What the bench child reports: ``ok`` with everything it measured, or ``failed`` with why and what it had
    measured before (the logs, the checkpoints and timings so far)."""

    status: str                                  # REPLY_OK | REPLY_FAILED
    reason: str | None = None
    effective: Effective | None = None
    checkpoints: Checkpoints = msgspec.field(default_factory=Checkpoints)
    timing: ChildTiming = msgspec.field(default_factory=ChildTiming)
    samples: BenchSamples = msgspec.field(default_factory=BenchSamples)
    restore: str | None = None                   # snapshot | truncate | clear
    snapshot_bytes: int | None = None
    load_log: LlamaMemoryLog | None = None
    ctx_log: LlamaMemoryLog | None = None
    model: ModelFacts | None = None
    device_notes: list[str] = []
    n_vocab: int | None = None
    add_bos: bool | None = None


REPLY_OK = "ok"
REPLY_FAILED = "failed"


request_from = decoder(BenchRequest)
reply_from = decoder(BenchReply)
