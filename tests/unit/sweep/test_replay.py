"""The sweep's main loop on replayed bench runs (edgekv.sweep.runners.ReplayRunner): record building,
failure classification, strict decoding of the child's reply, resume and retry, all without llama.cpp.

The replies under tests/data/replies/tiny-llama/ are real runs of a tiny model, recorded by tools/record_replies.py;
the slow test at the end records them again and checks that the stored ones still have the shape a fresh run gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from edgekv.calibration.preflight import RepackChoice
from edgekv.errors import UsageError
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.sweep.listener import QuietListener
from edgekv.sweep.run import expand, model_block, run_sweep
from edgekv.sweep.runners import CaseContext, ReplayRunner, replay_key
from tools.record_replies import DEFAULT_FOLDER, record, tiny_specs, write_tiny_model

DATA = Path(__file__).parents[2] / "data"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("replay") / "tiny.gguf")


@pytest.fixture(scope="module")
def env() -> S.Environment:
    return R.load_records(DATA / "smollm2-sweep.jsonl")[0].environment


def _cases(tiny_model: Path):
    """(spec, case) of every recorded case: two ok ones at -c 256, one that crashed at -c 512."""
    return [(spec, c) for spec, _crash in tiny_specs(tiny_model) for c in expand(spec, None)]


def _replayed(tiny_model: Path, env: S.Environment, folder: Path = DEFAULT_FOLDER) -> list[S.BenchRecord]:
    out = []
    for spec, case in _cases(tiny_model):
        cx = CaseContext(spec, env, model_block(spec.model, None), None,
                         QuietListener())
        out.append(ReplayRunner(folder).run(cx, case, None))
    return out


def test_replayed_runs_become_the_records_a_live_run_writes(tiny_model, env):
    """Each block comes from its named field of the reply: the checkpoints by name, the samples per test, llama.cpp's
    log; the records read back strictly, and llama.cpp's cache lines in the run equal the formula's."""
    recs = _replayed(tiny_model, env)
    assert [r.status for r in recs] == ["ok", "ok", "failed"]
    for rec in recs[:2]:
        back = msgspec.convert(S.encode(rec), S.BenchRecord, strict=True)
        assert S.encode(back) == S.encode(rec)
        mem = rec.memory
        for name in ("start", "after_load", "after_context", "after_fill", "end"):
            assert isinstance(getattr(mem, f"rss_{name}_bytes"), int), name
        assert mem.file_after_fill_bytes == mem.rss_after_fill_bytes - mem.anon_after_fill_bytes
        assert rec.speed.pp.n_tokens == 16 and rec.speed.tg.n_tokens == 4 and len(rec.speed.tg.samples_ns) == 2
        assert rec.effective.n_ctx == 256 and rec.timing.load_s > 0 and rec.timing.wall_s > 0
        assert rec.differences.llama_kv_matches_formula is True, rec.differences


def test_a_replayed_crash_is_classified(tiny_model, env):
    """The crashed child (SIGSEGV in the warm-up, a CPU whose extra-buffer kernels crash): failed, with the phase
    and the signal, and the memory the parent sampled before it died."""
    crash = _replayed(tiny_model, env)[2]
    assert crash.status == "failed" and "SIGSEGV" in crash.reason
    assert crash.failure.phase == "warm-up" and crash.failure.signal == "SIGSEGV"
    assert crash.memory.peak_rss_bytes > 0 and crash.speed is msgspec.UNSET


def _edited(tmp_path: Path, edit) -> Path:
    """A copy of the recordings with ``edit`` applied to every ok reply."""
    for f in DEFAULT_FOLDER.glob("*.json"):
        run = json.loads(f.read_text())
        if run["child"]["result"]:
            edit(run["child"]["result"])
        (tmp_path / f.name).write_text(json.dumps(run))
    return tmp_path


@pytest.mark.parametrize("edit", [
    lambda r: r.update(bogus=1),                                          # a key this edgekv does not know
    lambda r: r["checkpoints"].update(after_loading=r["checkpoints"].pop("after_load")),   # a renamed checkpoint
    lambda r: r["samples"]["pp"].pop("samples_ns"),                       # a missing field
])
def test_a_reply_that_does_not_read_is_one_failed_reason(tiny_model, env, tmp_path, edit):
    """A renamed key is an error of the case, said in one line, not a record field that goes missing."""
    recs = _replayed(tiny_model, env, _edited(tmp_path, edit))
    for rec in recs[:2]:
        assert rec.status == "failed"
        assert rec.reason.startswith("the bench child's reply is not one this edgekv reads")
        assert "\n" not in rec.reason


def test_unedited_copies_replay_ok(tiny_model, env, tmp_path):
    """The check above fails for the edit, not for the copy."""
    assert [r.status for r in _replayed(tiny_model, env, _edited(tmp_path, lambda r: None))] == ["ok", "ok", "failed"]


def test_a_case_without_a_recording_names_what_to_record(tiny_model, env, tmp_path):
    spec, case = _cases(tiny_model)[0]
    with pytest.raises(UsageError, match="no recorded run of this configuration; record it with "
                                         "EDGEKV_RECORD_REPLIES="):
        ReplayRunner(tmp_path).load(case)
    assert replay_key(case) == R.config_key(None, S.encode_block(case.settings))


# -- the sweep loop on replays: resume, retry, --no-retry, interruption -------------------------------------------

class Seen(QuietListener):
    def __init__(self, stop_after: int | None = None) -> None:
        self.cases: list[str] = []
        self.notes: list[str] = []
        self.plans = []
        self.stop_after = stop_after

    def on_note(self, message):
        self.notes.append(message)

    def on_plan(self, plan):
        self.plans.append(plan)

    def on_case(self, i, n, case):
        self.cases.append(case.key)

    def on_done(self, i, n, record):
        if self.stop_after is not None and len(self.cases) >= self.stop_after:
            raise KeyboardInterrupt


@pytest.fixture
def offline(monkeypatch):
    """The sweep's llama.cpp probes answered without llama.cpp: the extra-buffer preflight (none cached, nothing
    probed), the dry runs and the whole-process predictions (none)."""
    import edgekv.sweep.run as SW

    monkeypatch.setattr(SW, "repack_choice", lambda asked, binary=None, probe=True: RepackChoice(asked or [True],
                                                                                                 bool(asked), None))
    monkeypatch.setattr(SW, "dry_runs", lambda spec, todo: {})
    monkeypatch.setattr(SW, "process_predictions", lambda spec, todo: {})


def _sweep(spec, out, env, listener, **kw):
    import dataclasses

    return run_sweep(dataclasses.replace(spec, **kw), output=out, env=env, listener=listener,
                     runner=ReplayRunner(DEFAULT_FOLDER))


def test_sweep_resumes_retries_and_keeps_on_replays(tiny_model, env, tmp_path, offline):
    ok_spec, crash_spec = [s for s, _ in tiny_specs(tiny_model)]
    out = tmp_path / "r.jsonl"
    first = Seen()
    res = _sweep(ok_spec, out, env, first)
    assert len(first.cases) == 2 and [r.status for r in res.records] == ["ok", "ok"] and res.new == 2
    assert first.plans[0].repack == [True] and first.plans[0].existing == 0
    _sweep(crash_spec, out, env, Seen())
    assert [r.status for r in R.load_records(out)] == ["ok", "ok", "failed"]
    again = Seen()                       # the ok ones are done; the failed one is measured again
    res = _sweep(crash_spec, out, env, again)
    assert len(again.cases) == 1 and again.plans[0].retry == 1 and res.new == 1
    kept = Seen()                        # --no-retry: nothing to do
    res = _sweep(crash_spec, out, env, kept, retry_failed=False)
    assert kept.cases == [] and res.new == 0 and len(R.load_records(out)) == 4
    done = Seen()
    assert _sweep(ok_spec, out, env, done).new == 0 and done.cases == []


def test_an_interrupted_sweep_keeps_its_records_and_resumes(tiny_model, env, tmp_path, offline):
    ok_spec = next(s for s, _ in tiny_specs(tiny_model))
    out = tmp_path / "i.jsonl"
    res = _sweep(ok_spec, out, env, Seen(stop_after=1))
    assert res.interrupted and res.new == 1 and len(R.load_records(out)) == 1
    rest = Seen()
    res = _sweep(ok_spec, out, env, rest)
    assert len(rest.cases) == 1 and not res.interrupted and len(R.load_records(out)) == 2
    assert rest.plans[0].existing == 1


def test_on_event_callers_hear_the_same_events(tiny_model, env, tmp_path, offline):
    """run_sweep(on_event=...) keeps its (kind, data) events and their keys."""
    ok_spec = next(s for s, _ in tiny_specs(tiny_model))
    kinds: list[tuple[str, tuple[str, ...]]] = []
    import dataclasses

    run_sweep(dataclasses.replace(ok_spec), output=tmp_path / "e.jsonl", env=env,
              on_event=lambda k, d: kinds.append((k, tuple(sorted(d)))), runner=ReplayRunner(DEFAULT_FOLDER))
    got = [k for k, _ in kinds]
    assert got == ["start", "case", "record", "done", "case", "record", "done"]
    assert dict(kinds)["start"] == tuple(sorted(["total", "todo", "todo_cases", "output", "existing", "env",
                                                 "model_sha256", "retry", "unfit", "speeds", "tracker"]))
    assert dict(kinds)["record"] == ("case", "elapsed_s", "i", "record", "remaining_s", "wall_s")


# -- the proof that the recordings are true -----------------------------------------------------------------------

def _shape(x):
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_shape(x[0])] if x else []
    return "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x).__name__


@pytest.mark.slow
def test_fresh_runs_have_the_recorded_shape(tiny_model, tmp_path):
    """The recorded cases run again for real (llama.cpp, the tiny model): the same statuses, and every reply and
    parent view with the keys and kinds of value the stored recordings hold (the figures differ run to run)."""
    assert record(tiny_model, tmp_path) == ["ok", "ok", "failed"]
    stored = sorted(p.name for p in DEFAULT_FOLDER.glob("*.json"))
    assert sorted(p.name for p in tmp_path.glob("*.json")) == stored
    for name in stored:
        fresh, old = (json.loads((d / name).read_text()) for d in (tmp_path, DEFAULT_FOLDER))
        assert fresh["settings"] == old["settings"]
        assert _shape(fresh["child"]["result"]) == _shape(old["child"]["result"]), name   # which phases the parent
        # sampled (phase_peaks) depends on timing, not on the protocol
        assert set(fresh["child"]) == set(old["child"])
