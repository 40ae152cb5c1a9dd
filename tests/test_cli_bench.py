"""`edgekv bench` is a thin adapter: its flags land in cli.benchrun.BenchArgs by name, one field per flag."""

from __future__ import annotations

import dataclasses
import inspect

from edgekv.cli import main as M
from edgekv.cli.benchrun import BenchArgs


def test_bench_args_has_one_field_per_flag():
    params = set(inspect.signature(M.bench).parameters) - {"model_opt", "as_json"}
    assert {f.name for f in dataclasses.fields(BenchArgs)} == params


def test_model_given_twice_is_refused_before_anything_runs(capsys):
    assert M.main(["bench", "smollm2-135m", "-m", "gemma3-270m"]) == 2
    assert "two models given ('smollm2-135m' and -m 'gemma3-270m'); pass one" in capsys.readouterr().err
