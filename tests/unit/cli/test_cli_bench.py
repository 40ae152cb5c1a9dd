"""`edgekv bench` is a thin adapter: its flags become, by name, the Settings every configuration shares
(sweep.spec.bench_settings) and cli.benchrun.BenchArgs (the grid's lists and how to run)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
from msgspec import UNSET

from edgekv.cli import benchrun
from edgekv.cli.commands import bench as bench_command
from edgekv.cli.commands.bench import bench
from edgekv.cli.main import main
from edgekv.sweep.spec import SweepSpec, quality_settings, sweep_spec

FLAGS = set(inspect.signature(bench).parameters) - {"model", "model_opt", "as_json"}


def _flags_not_passed(src: str) -> set[str]:
    """The flags of ``bench`` that no keyword of its BenchArgs(...) and bench_settings(...) calls reads."""
    tree = ast.parse(textwrap.dedent(src))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in
             ("BenchArgs", "bench_settings")]
    read = {x.id for c in calls for k in c.keywords for x in ast.walk(k.value) if isinstance(x, ast.Name)}
    return FLAGS - read


def test_the_bench_command_passes_every_flag_by_name():
    """The typer function builds the settings and BenchArgs by name (no dict(locals())): a flag it forgets would take
    a default silently, so every one is checked; a call that forgets one is caught."""
    src = inspect.getsource(bench)
    assert _flags_not_passed(src) == set()
    assert _flags_not_passed(src.replace("no_retry=no_retry,", "")) == {"no_retry"}
    assert _flags_not_passed(src.replace("n_gen=n_gen,", "")) == {"n_gen"}


def test_model_given_twice_is_refused_before_anything_runs(capsys):
    assert main(["bench", "smollm2-135m", "-m", "gemma3-270m"]) == 2
    assert "two models given ('smollm2-135m' and -m 'gemma3-270m'); pass one" in capsys.readouterr().err


def _args(monkeypatch, *argv: str) -> benchrun.BenchArgs:
    """The BenchArgs ``edgekv bench ARGV`` hands to cli.benchrun (nothing measured)."""
    got = []
    monkeypatch.setattr(bench_command, "bench_command", lambda a, *rest: got.append(a) or 0)
    assert main(["bench", *argv]) == 0
    return got[0]


def test_bench_spec_passes_the_flags_on_exactly(monkeypatch):
    # a quiet machine: no other work takes a core (tests/unit/cli/test_busy_threads.py covers a busy one)
    monkeypatch.setattr(benchrun, "threads_left", lambda n: (n, 0.0))
    spec, ctxs, hint = benchrun.bench_spec(_args(monkeypatch, "-c", "512,1k", "-ctk", "f16,q8_0", "-ctv", "q8_0,q4_0",
                                                 "-fa", "on,off", "-p", "16", "-n", "4", "-t", "1", "--no-mmap",
                                                 "--quality", "--chunks", "2"))
    st = spec.settings
    assert ctxs == spec.contexts == [512, 1024]
    assert spec.pairs == [("f16", "q8_0"), ("q8_0", "q4_0")]
    assert (spec.flash_attn, st.n_prompt, st.n_gen, st.repetitions) == (["on", "off"], 16, 4, 5)
    assert (st.n_threads, st.n_batch, st.n_ubatch, st.warmup, spec.use_mmap) == (1, 2048, 512, True, False)
    assert st.quality == quality_settings("pydoc", 2)
    assert spec.engine == "llama-cpp-python" and spec.llama_bench is None and hint is None
    spec, ctxs, hint = benchrun.bench_spec(_args(monkeypatch))        # the quick default names the full sweep
    assert (spec.settings.n_prompt, spec.settings.n_gen, spec.settings.repetitions) == (128, 32, 5)
    assert spec.settings.no_mmap is UNSET and spec.settings.quality is None
    assert hint == "The full sweep (2048, 4096, 8192; -p 512 -n 128 -r 5) is 'edgekv bench --full'."
    # the default -r may stop at 3 agreeing repetitions (core.benchwire.tight); a -r given runs in full, and the
    # bench child's request carries which
    assert spec.min_repetitions == 3
    assert benchrun.bench_spec(_args(monkeypatch, "-r", "5"))[0].min_repetitions == 0


@pytest.mark.parametrize(("argv", "line"), [
    (["--corpus", "pydoc"], "--corpus and --chunks choose the quality pass: add --quality"),
    (["--quality", "--chunks", "0"], "--chunks must be at least 1"),
])
def test_quality_flags_are_checked_before_they_take_defaults(capsys, argv, line):
    assert main(["bench", *argv]) == 2
    assert line in capsys.readouterr().err


def test_a_spec_holds_settings_and_restates_none():
    """SweepSpec's own fields are the model, the grid and how to run; every setting of a case is its Settings'."""
    from edgekv.records.schema import Settings

    own = set(SweepSpec.__dataclass_fields__) - {"settings", "model", "contexts", "pairs"}
    grid = {"flash_attn", "depths", "repack", "n_parallel"}          # lists: each case takes one value
    assert not (own - grid) & set(Settings.__struct_fields__)
    spec = sweep_spec(model=None, contexts=[512], pairs=[("f16", "f16")], n_prompt=16, depths=[64], timeout_s=9.0)
    assert (spec.settings.n_prompt, spec.depths, spec.timeout_s, spec.settings.n_gen) == (16, [64], 9.0, 128)
