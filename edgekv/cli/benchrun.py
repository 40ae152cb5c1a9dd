"""What ``edgekv bench`` says while it runs: the plan first, then one plain line per finished configuration
(key figures, elapsed and remaining time, a busy-machine mark), with rich's progress bar on a terminal.

It listens to :func:`edgekv.orchestration.sweep.run_sweep`'s events and adds two blocks to each record before it is written:
``load`` (other processes' CPU share before and during the configuration, edgekv.edges.load) and ``plan`` (the estimate
made for this configuration, the remaining-time estimate after it, the sweep's elapsed time), so the ETA's accuracy
can be checked afterwards from the results file alone (bench/eta_accuracy.py).
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from edgekv.core.predict import MIB
from edgekv.edges.load import BUSY_SHARE, LoadMonitor, Window, busy_note
from edgekv.orchestration.plan import Planner, fmt_duration, kv_f16_per_token, plan_lines, same_machine_history
from edgekv.output.benchview import Progress, case_label


def _rate(speed: dict[str, Any], test: str) -> str | None:
    v = (speed or {}).get(test) or {}
    if v.get("mean_ts") is None:
        return None
    ci = v.get("ci95_ts")
    half = f"±{(ci[1] - ci[0]) / 2:.1f}" if ci else ""
    return f"{test} {v['mean_ts']:.1f}{half} t/s" + (" (unstable)" if v.get("unstable") else "")


def case_line(i: int, n: int, rec: dict[str, Any], wall_s: float, elapsed_s: float, remaining_s: float | None) -> str:
    parts = []
    sp = rec.get("speed") or {}
    for t in ("pp", "tg"):
        r = _rate(sp, t)
        if r:
            parts.append(r)
    mem = rec.get("memory") or {}
    if mem.get("peak_rss_bytes"):
        parts.append(f"peak RSS {mem['peak_rss_bytes'] / MIB:.1f} MiB")
    f = ((rec.get("prediction") or {}).get("formula") or {}).get("total_bytes")
    same = (rec.get("differences") or {}).get("llama_kv_matches_formula")
    if f is not None:
        parts.append(f"KV {f / MIB:.2f} MiB" + {True: " (= llama.cpp)", False: " (llama.cpp differs!)"}.get(same, ""))
    if rec.get("status") != "ok":
        parts = [f"{rec.get('status')}: {rec.get('reason')}"]
    tail = f"{fmt_duration(wall_s)}; elapsed {fmt_duration(elapsed_s)}"
    if remaining_s is not None and i < n:
        tail += f", about {fmt_duration(remaining_s)} left"
    busy = busy_note(rec.get("load"))
    return f"[{i}/{n}] {case_label(rec['settings'])}: " + ", ".join(parts) + f" | {tail}" + (f"  [{busy}]" if busy else "")


class BenchMonitor:
    def __init__(self, spec, out_con, bar_con, contexts: list[int], full_hint: str | None) -> None:
        self.spec = spec
        self.out = out_con                      # the plan and the per-configuration lines
        self.prog = Progress(bar_con)           # rich bar, only on a terminal
        self.contexts = contexts
        self.full_hint = full_hint
        self.planner: Planner | None = None
        self.todo: list[dict[str, Any]] = []
        self.monitor: LoadMonitor | None = None
        self.case_estimate: float | None = None

    def __enter__(self) -> BenchMonitor:
        self.prog.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        self.prog.__exit__(*exc)

    def _print(self, line: str) -> None:
        if self.prog.enabled and self.out is self.prog.p.console:
            self.prog.p.console.print(line, highlight=False, markup=False)
        else:
            self.out.print(line, highlight=False, markup=False, soft_wrap=True)

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "note":      # one line each, e.g. the repair of a results file's last line
            self.prog.p.console.print(f"edgekv: {data['message']}", markup=False, highlight=False)
            return
        if kind == "start":
            self._start(data)
        elif kind == "case":
            self.case_estimate = self.planner.estimate(data["case"].settings) if self.planner else None
            self.monitor = LoadMonitor()
            self.monitor.start()
        elif kind == "record":
            self._record(data)
        if kind in ("start", "case", "child", "done"):
            self.prog.on_event(kind, data)
            if kind == "start":
                from edgekv.output.benchview import case_work

                self.prog.on_event("plan", {"work": sum(case_work(c.settings) for c in data["todo_cases"]) or 1})

    def _start(self, data: dict[str, Any]) -> None:
        from edgekv.edges.home import edgekv_home

        cases = data["todo_cases"]
        if data["existing"]:
            self.prog.p.console.print(f"Resuming {data['output']}: {data['existing']} of {data['total']} "
                                      "configurations already done.", highlight=False, markup=False)
        m = self.spec.model
        kvpt = kv_f16_per_token(m, cases[0].params) if cases else 0
        self.planner = Planner(m.weights_bytes, kvpt)
        from pathlib import Path

        hist = same_machine_history(Path(data["output"]), edgekv_home() / "runs", data.get("model_sha256"),
                                    data.get("env") or {})
        for r in hist:
            self.planner.learn(r["settings"], r["timing"]["wall_s"])
        basis = (f"calibrated on {len(hist)} earlier configurations of this model on this machine" if hist else
                 "cost model of each configuration's prefill and decode at its depth, from a reference 2-core "
                 "machine scaled to this model; recalibrated after each configuration")
        self.planner.basis = basis
        self.todo = [c.settings for c in cases]
        total = self.planner.remaining(self.todo)
        self.planner.initial_total_s = total
        types = list(dict.fromkeys(s["type_k"] if s["type_k"] == s["type_v"] else f"{s['type_k']}/{s['type_v']}"
                                   for s in self.todo)) or [f"{k}" for k, _v in self.spec.pairs]
        s0 = self.todo[0] if self.todo else {"n_prompt": self.spec.n_prompt, "n_gen": self.spec.n_gen,
                                             "repetitions": self.spec.repetitions}
        for line in plan_lines(data["total"], self.contexts, types, s0, total, basis, data["output"],
                               data["existing"], self.full_hint):
            self._print(line)
        w = Window()
        time.sleep(0.3)
        now = w.close()
        if now["others_share"] >= BUSY_SHARE:
            self._print(f"Note: other work is using {100 * now['others_share']:.0f} % of the {psutil.cpu_count()} CPUs "
                        "right now: the configurations will take longer than estimated, and each one measured while "
                        "the machine is busy is marked so.")

    def _record(self, data: dict[str, Any]) -> None:
        rec, i = data["record"], data["i"]
        load = self.monitor.stop() if self.monitor is not None else None
        self.monitor = None
        if load is not None:
            rec["load"] = load
        wall = (rec.get("timing") or {}).get("wall_s") or (load or {}).get("during", {}).get("wall_s") or 0.0
        p = self.planner
        assert p is not None
        if rec.get("status") == "ok":
            p.learn(rec["settings"], wall)
        rest = self.todo[i + 1:]
        remaining = p.remaining(rest)
        elapsed = p.elapsed()
        rec["plan"] = {"estimate_s": round(self.case_estimate, 1) if self.case_estimate is not None else None,
                       "wall_s": round(wall, 1), "sweep_elapsed_s": round(elapsed, 1),
                       "remaining_eta_s": round(remaining, 1), "remaining_configs": len(rest),
                       "sweep_estimate_s": round(p.initial_total_s or 0.0, 1), "basis": p.basis}
        self._print(case_line(i + 1, len(self.todo), rec, wall, elapsed, remaining))
