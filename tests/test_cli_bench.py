"""`edgekv bench` is a thin adapter: its flags land in cli.benchrun.BenchArgs by name, one field per flag."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

from edgekv.cli import main as M
from edgekv.cli.benchrun import BenchArgs
from edgekv.orchestration.sweepspec import QualityAsk


def test_bench_args_has_one_field_per_flag():
    params = set(inspect.signature(M.bench).parameters) - {"model_opt", "as_json"}
    assert {f.name for f in dataclasses.fields(BenchArgs)} == params


def _flags_not_passed(src: str) -> set[str]:
    """The flags of ``bench`` that its BenchArgs(...) call does not pass on as ``name=name``."""
    tree = ast.parse(textwrap.dedent(src))
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "BenchArgs")
    passed = {k.arg for k in call.keywords if isinstance(k.value, ast.Name) and k.value.id == k.arg}
    return set(inspect.signature(M.bench).parameters) - {"model", "model_opt", "as_json"} - passed


def test_the_bench_command_passes_every_flag_by_name():
    """The typer function builds BenchArgs by name (no dict(locals())): a flag it forgets would take the field's
    default silently, so every one is checked; a call that forgets one is caught."""
    src = inspect.getsource(M.bench)
    assert _flags_not_passed(src) == set()
    assert _flags_not_passed(src.replace("no_retry=no_retry,", "")) == {"no_retry"}


def test_model_given_twice_is_refused_before_anything_runs(capsys):
    assert M.main(["bench", "smollm2-135m", "-m", "gemma3-270m"]) == 2
    assert "two models given ('smollm2-135m' and -m 'gemma3-270m'); pass one" in capsys.readouterr().err


def _args(**kw) -> BenchArgs:
    """BenchArgs as typer fills them when only ``kw`` is given (the other values are the command's defaults)."""
    defaults = {name: p.default.default for name, p in inspect.signature(M.bench).parameters.items()
                if name not in ("model", "model_opt", "as_json")}
    return BenchArgs(model=None, **{**defaults, **kw})


def test_bench_spec_passes_the_flags_on_exactly(monkeypatch):
    from edgekv.cli import benchrun
    from edgekv.cli.benchrun import bench_spec

    # a quiet machine: no other work takes a core (tests/test_busy_threads.py covers a busy one)
    monkeypatch.setattr(benchrun, "threads_left", lambda n: (n, 0.0))

    spec, ctxs, hint = bench_spec(_args(ctx_size="512,1k", cache_type_k="f16,q8_0", cache_type_v="q8_0,q4_0",
                                        flash_attn="on,off", n_prompt=16, n_gen=4, threads=1, no_mmap=True,
                                        quality=True, chunks=2))
    assert ctxs == spec.contexts == [512, 1024]
    assert spec.pairs == [("f16", "q8_0"), ("q8_0", "q4_0")]
    assert (spec.flash_attn, spec.n_prompt, spec.n_gen, spec.repetitions) == (["on", "off"], 16, 4, 5)
    assert (spec.n_threads, spec.n_batch, spec.n_ubatch, spec.warmup, spec.use_mmap) == (1, 2048, 512, True, False)
    assert spec.quality == QualityAsk(corpus=None, chunks=2)
    assert spec.engine == "llama-cpp-python" and spec.llama_bench is None and hint is None
    spec, ctxs, hint = bench_spec(_args())        # the quick default names the full sweep
    assert (spec.n_prompt, spec.n_gen, spec.repetitions) == (128, 32, 5)
    assert hint == "The full sweep (2048, 4096, 8192; -p 512 -n 128 -r 5) is 'edgekv bench --full'."
