"""Record the bench child's runs that the fast tests replay (tests/data/replies/tiny-llama/).

A tiny llama-architecture model (edgekv.sources.tinymodel.write_llama: zero weights, a few hundred KiB) is measured
for real, one fresh ``python -m edgekv.child.worker bench`` per case, with ``EDGEKV_RECORD_REPLIES`` naming the
folder: each case's run (the parent's view of the child and the child's reply) lands in ``<config key>.json``.
One case runs on a CPU whose extra-buffer kernels crash (edgekv.child.emulate), so that a real failure is
recorded too.  tests/unit/sweep/test_replay.py replays them, and its slow test records a fresh run and compares its shape
with the stored one.

    .venv/bin/python tools/record_replies.py [FOLDER]        # default: tests/data/replies/tiny-llama
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FOLDER = ROOT / "tests" / "data" / "replies" / "tiny-llama"

TINY_SHAPE = {"n_embd": 64, "n_ff": 128, "n_layer": 2, "n_head": 2, "n_head_kv": 1, "mat_type": "F16"}
# (contexts, cache type pairs, repack, crash): the cases recorded; the crash case runs with the extra buffers on, on a
# CPU that emulates their crash (a real SIGSEGV of the child)
CASES = (([256], [("f16", "f16"), ("q8_0", "q8_0")], False), ([512], [("f16", "f16")], True))
WORKLOAD = {"depths": [32], "n_prompt": 16, "n_gen": 4, "repetitions": 2, "n_threads": 1, "predict_speed": False,
            "timeout_s": 120.0}


def write_tiny_model(path: Path) -> Path:
    """The tiny model the recordings were made with."""
    from edgekv.sources.tinymodel import write_llama

    write_llama(path, **TINY_SHAPE, name="edgekv replay model")
    return path


def tiny_specs(model_path: Path) -> Iterator[tuple[object, bool]]:
    """The recorded sweeps' specs, each with whether it runs on the emulated crashing CPU."""
    from edgekv.prediction.api import load_model
    from edgekv.sweep.spec import sweep_spec

    m = load_model(str(model_path))
    for contexts, pairs, crash in CASES:
        yield sweep_spec(model=m, contexts=contexts, pairs=pairs, repack=[True], **WORKLOAD), crash


@contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def record(model_path: Path, folder: Path) -> list[str]:
    """Every recorded case run for real with its run written to ``folder``; the records' statuses."""
    from edgekv.machine.environment import collect
    from edgekv.records.schema import environment
    from edgekv.runtime.childside import EMULATE_CRASH_ENV
    from edgekv.sweep.listener import QuietListener
    from edgekv.sweep.run import expand, model_block
    from edgekv.sweep.runners import RECORD_ENV, CaseContext, PythonRunner

    env = environment(collect())
    statuses = []
    for spec, crash in tiny_specs(model_path):
        sha = None      # the replay files are named by the settings alone (edgekv.sweep.runners.replay_key)
        cx = CaseContext(spec, env, model_block(spec.model, sha), None,
                         QuietListener())
        with _env(RECORD_ENV, str(folder)), _env(EMULATE_CRASH_ENV, "1" if crash else None):
            for case in expand(spec, sha):
                statuses.append(PythonRunner().run(cx, case, None).status)
    return statuses


def main(argv: list[str]) -> int:
    import tempfile

    folder = Path(argv[0]) if argv else DEFAULT_FOLDER
    with tempfile.TemporaryDirectory() as tmp:
        print(record(write_tiny_model(Path(tmp) / "tiny.gguf"), folder))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
