"""Accuracy of edgekv's speed model (edgekv/core/speed.py) against measured tokens/s.

Runs ``edgekv bench`` (one fresh process per configuration) on both real models -- SmolLM2-135M and Gemma 3 270M --
over f16/q8_0/q5_0/q4_0 at several depths, then variants (``-t 1``, ``-ub 256``, ``--llama-bench``, and f16 with
``-fa off``, whose attention runs over the whole padded view).  Every record
carries the speed prediction made *before* the run (``prediction.speed``, with this machine's calibration) and the
residual (``speed_residual``: measured - predicted, % of predicted).  The raw records go to
bench/.build/speed_model/<machine-class>/<commit>/ (resumed for the same code, ignored by git); one row a configuration goes to
bench/results/speed_model/<machine-class>.jsonl (bench/harness.py), from which tools/render_tables.py renders the
docs' ``speed-model`` table.

Targets (issue 26): decode within ±10 %, prefill within ±15 %, on every configuration.

    python -m bench.speed_model                     # measure what is missing (resumes), write the results
    python -m bench.speed_model --depths 512,1920   # the depths to measure (default 512,2048,4096,8192)
    python -m bench.speed_model --table-only        # no measuring: the results from the stored records
    python -m bench.speed_model --out DIR --previous DIR2
                                                # a second round's records into DIR, beside an earlier round's
    python -m bench.speed_model --fresh-pages ...    # drop each model's pages first: every run reads it afresh
    python -m bench.speed_model --off-table          # settings outside the table: other cache types, a
                                                # K/V pair of two types, -ub 128 (the second depth only)
    python -m bench.speed_model --rounds DIR,DIR,DIR  # no measuring: each configuration over several rounds'
                                                # records of the same code (bias or noise), printed
    python -m bench.speed_model --table-only --out DIR   # rows from records made elsewhere (a lent GPU machine)

Run it on a quiet machine: the records say when other work used the CPUs (``load.busy``), and the table marks them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench import harness as H
from edgekv.sources.resolve import resolve_model

ROOT = H.ROOT
NAME = "speed_model"
OUT = H.BUILD / NAME
KEY = ("model", "variant", "depth", "type", "test")
TYPES = "f16,q8_0,q5_0,q4_0"
MODELS = ("smollm2-135m", "gemma3-270m")
COMMON = ["-p", "128", "-n", "32", "-r", "3"]
VARIANTS = {"base": [], "t1": ["-t", "1"], "ub256": ["-ub", "256", "-p", "512"], "llamabench": ["--llama-bench"],
            "faoff": ["-fa", "off"]}
VARIANT_TYPES = "f16,q4_0"
# llama.cpp refuses a quantized V cache without flash attention
TYPES_OF = {"faoff": "f16"}
TG_TARGET, PP_TARGET = 10.0, 15.0
# settings outside the table (--off-table), the second depth only: the other cache types llama.cpp takes,
# a K/V pair of two types, a smaller ubatch (records in OFF_OUT, rows in the same results file)
OFF_TABLE = {"types": [], "mixed": ["-ctv", "q4_0"], "ub128": ["-ub", "128", "-p", "512"]}
TYPES_OF.update({"types": "bf16,q4_1,q5_1,iq4_nl", "mixed": "q8_0", "ub128": "f16,q8_0"})
OFF_OUT = H.BUILD / "speed_offtable"
# the variants as the tables name them
SETTINGS = {"base": "defaults", "t1": "-t 1", "ub256": "-ub 256 -p 512", "llamabench": "--llama-bench",
            "faoff": "-fa off", "types": "defaults", "mixed": "-ctv q4_0", "ub128": "-ub 128 -p 512"}


def edgekv() -> list[str]:
    return H.edgekv_argv()


def drop_pages(model: str) -> None:
    """Drop the model file's pages from the page cache (posix_fadvise DONTNEED), so the next edgekv bench reads it
    afresh: a file the page cache has held for hours decoded 8-10 % slower than a fresh copy of the same bytes on
    the 2-vCPU VM, and as fast once dropped (docs/speed-experiments.md, the weights' values)."""
    fd = os.open(os.path.realpath(resolve_model(model).path), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(model: str, variant: str, depths: str, outdir: Path = OUT, fresh_pages: bool = False) -> Path:
    out = outdir / f"{model}-{variant}.jsonl"
    types = TYPES if variant == "base" else TYPES_OF.get(variant, VARIANT_TYPES)
    ds = depths.split(",") if variant == "base" else [depths.split(",")[min(1, len(depths.split(",")) - 1)]]
    extra = list({**VARIANTS, **OFF_TABLE}[variant])
    if variant == "llamabench":
        from tools.llama_tools import tool

        extra.append(str(tool("llama-bench")))
    for d in ds:      # bench sweeps -c x -d: one call per depth, each with a context just above it
        argv = edgekv() + ["bench", model, "-c", str(int(d) + 512), "-d", d, "-ctk", types, *COMMON, *extra,
                           "-o", str(out), "--json"]
        print("+", " ".join(argv[2:]), flush=True)
        if fresh_pages:
            drop_pages(model)
        subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def rows(outdir: Path = OUT, machine: str | None = None) -> list[dict]:
    out = []
    for f in sorted(outdir.glob("*.jsonl")):
        model, variant = f.stem.rsplit("-", 1)
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("status") != "ok":
                continue
            s, sp, pred = r["settings"], r.get("speed") or {}, (r.get("prediction") or {}).get("speed") or {}
            for test in ("pp", "tg"):
                m = (sp.get(test) or {}).get("mean_ts")
                p = (pred.get(test) or {}).get("tokens_per_s")
                if not m or not p:
                    continue
                kv = s["type_k"] if s.get("type_v", s["type_k"]) == s["type_k"] else f"{s['type_k']}/{s['type_v']}"
                out.append({"machine": machine or H.machine_class(r.get("environment") or {}), "time_utc": r.get("time_utc"),
                            **H.record_identity(r),
                            "model": model, "variant": variant, "depth": s["n_depth"], "type": kv,
                            "test": test, "t": s["n_threads"], "ub": s["n_ubatch"], "measured": m, "predicted": p,
                            "pct": 100.0 * (m - p) / p, "busy": bool((r.get("load") or {}).get("busy")),
                            "cal": str((pred.get(test) or {}).get("calibration_id") or "").split("-")[0],
                            "explain": pred.get("explain") if test == "tg" else None})
    return out


def _key(r: dict) -> tuple:
    return r["model"], r["variant"], r["depth"], r["type"], r["test"]


def table(rs: list[dict], previous: list[dict] | None = None) -> str:
    """The Markdown table; with ``previous`` (an earlier round's rows) a column of that round's measurement of the
    same configuration and a line on how far the two rounds' measurements are apart (this VM's own noise)."""
    prev = {_key(r): r for r in previous or []}
    lines = ["| model | settings | depth | K/V | test | measured t/s | predicted t/s | measured − predicted | within |"
             + (" earlier round t/s |" if previous else ""),
             "|---|---|---:|---|---|---:|---:|---:|:-:|" + ("---:|" if previous else "")]
    for r in rs:
        target = TG_TARGET if r["test"] == "tg" else PP_TARGET
        ok = abs(r["pct"]) <= target
        p = prev.get(_key(r))
        lines.append(f"| {r['model']} | {SETTINGS[r['variant']]} | {r['depth']} | {r['type']} | {r['test']} | "
                     f"{r['measured']:.1f} | {r['predicted']:.1f} | {r['pct']:+.1f} % | {'✓' if ok else '✗'}"
                     f"{' busy' if r['busy'] else ''} |" + ((f" {p['measured']:.1f} |" if p else " |") if previous else ""))
    if rs:
        for test, target in (("tg", TG_TARGET), ("pp", PP_TARGET)):
            sub = [r for r in rs if r["test"] == test]
            if not sub:
                continue
            n_ok = sum(1 for r in sub if abs(r["pct"]) <= target)
            worst = max(sub, key=lambda r: abs(r["pct"]))
            lines += ["", f"{test}: {n_ok} of {len(sub)} within ±{target:g} %; worst {worst['pct']:+.1f} % "
                          f"({worst['model']}, {SETTINGS[worst['variant']]}, depth {worst['depth']}, {worst['type']})."]
            both = [(r, prev[_key(r)]) for r in sub if _key(r) in prev]
            if both:
                apart = sorted(abs(r["measured"] - p["measured"]) / p["measured"] * 100 for r, p in both)
                lines += ["", f"{test}, the two rounds' measurements of the same {len(both)} configurations: "
                              f"median {apart[len(apart) // 2]:.1f} % apart, at most {apart[-1]:.1f} %; "
                              f"{sum(1 for x in apart if x > target)} more than ±{target:g} % apart."]
    return "\n".join(lines)


def _spread(xs: list[float]) -> float:
    """(largest - smallest) as % of the median."""
    return 100.0 * (max(xs) - min(xs)) / statistics.median(xs)


def rounds_table(rounds: list[tuple[str, list[dict]]]) -> str:
    """Each configuration over several rounds (``rounds``: (name, rows) each, rows as :func:`rows` gives): its
    residual in every round, their median, and how far the rounds' measured and predicted figures were apart.  A
    configuration whose median residual is outside its target is a miss of the model (the same sign round after
    round); one within at the median but outside in some round missed by this machine's noise (the measurement's
    or the calibration's, read from the two spreads).  Meaningful over rounds of the same code only: the
    calibration keys (environment, threads, calibration version) of each round are listed."""
    by: dict[tuple, list[dict | None]] = {}
    for i, (_, rs) in enumerate(rounds):
        for r in rs:
            by.setdefault(_key(r), [None] * len(rounds))[i] = r
    names = [n for n, _ in rounds]
    lines = ["| model | settings | depth | K/V | test | " + " | ".join(names) + " | median | measured spread "
             "| predicted spread | verdict |",
             "|---|---|---:|---|---|" + "---:|" * len(names) + "---:|---:|---:|---|"]
    verdicts: dict[str, dict[str, list[tuple]]] = {"tg": {}, "pp": {}}
    mspreads: list[float] = []
    pspreads: list[float] = []
    def order(k: tuple) -> tuple:
        def at(seq: list, x: str) -> int:
            return seq.index(x) if x in seq else len(seq)

        return at(list(MODELS), k[0]), at(list(VARIANTS), k[1]), k[2], at(TYPES.split(","), k[3]), k[4]

    for k in sorted(by, key=order):
        got = [r for r in by[k] if r is not None]
        if len(got) < 2:
            continue
        target = TG_TARGET if k[4] == "tg" else PP_TARGET
        pcts = [r["pct"] for r in got]
        med = statistics.median(pcts)
        ms, ps = _spread([r["measured"] for r in got]), _spread([r["predicted"] for r in got])
        mspreads.append(ms)
        pspreads.append(ps)
        if all(abs(x) <= target for x in pcts):
            v = "within in every round"
        elif abs(med) <= target:
            v = "within at the median"
        else:
            v = "**outside at the median**"
        verdicts[k[4]].setdefault(v, []).append(k + (med,))
        cells = " | ".join(f"{r['pct']:+.1f}" + ("" if abs(r["pct"]) <= target else " ✗") if r else "–" for r in by[k])
        lines.append(f"| {k[0]} | {SETTINGS.get(k[1], k[1])} | {k[2]} | {k[3]} | {k[4]} | {cells} | {med:+.1f} % | "
                     f"{ms:.1f} % | {ps:.1f} % | {v} |")
    for test, target in (("tg", TG_TARGET), ("pp", PP_TARGET)):
        vs = verdicts[test]
        n = sum(len(x) for x in vs.values())
        if not n:
            continue
        out = vs.get("**outside at the median**", [])
        lines += ["", f"{test} (±{target:g} %), {n} configurations over {len(rounds)} rounds: "
                      f"{len(vs.get('within in every round', []))} within in every round, "
                      f"{len(vs.get('within at the median', []))} within at the median only, {len(out)} outside at the "
                      "median" + (": " + "; ".join(f"{m}, {SETTINGS.get(v, v)}, depth {d}, {t} {x:+.1f} %"
                                                   for m, v, d, t, _, x in out) if out else "") + "."]
    if mspreads:
        med_m, med_p = statistics.median(mspreads), statistics.median(pspreads)
        lines += ["", f"Spread between the rounds (largest − smallest, % of the median), median over the "
                      f"configurations: measured {med_m:.1f} %, predicted {med_p:.1f} %."]
    keys = [", ".join(sorted({r["cal"] for r in rs if r.get("cal")})) for _, rs in rounds]
    lines += ["", "Calibration keys: " + "; ".join(f"{n}: {k or '?'}" for n, k in zip(names, keys)) + "."]
    return "\n".join(lines)


def save(rs: list[dict], results: Path = H.RESULTS, machine: str | None = None) -> list[Path]:
    """The rows into bench/results/speed_model/<class>.jsonl, one file per machine class the records came from."""
    by: dict[str, list[dict]] = {}
    for r in rs:
        by.setdefault(machine or r["machine"], []).append({k: v for k, v in r.items() if k != "explain"})
    return [H.save(NAME, m, x, KEY, results) for m, x in sorted(by.items())]


def render(by_machine: dict[str, list[dict]]) -> str:
    """The docs' speed-model table: per machine class and test, how many configurations are within the target, the
    median and the worst residual."""
    out = []
    for m, rs in by_machine.items():
        for test, target in (("tg", TG_TARGET), ("pp", PP_TARGET)):
            sub = [r for r in rs if r["test"] == test]
            if not sub:
                continue
            pcts = sorted(r["pct"] for r in sub)
            worst = max(sub, key=lambda r: abs(r["pct"]))
            n_ok = sum(1 for r in sub if abs(r["pct"]) <= target)
            med = statistics.median(abs(x) for x in pcts)
            out.append([f"`{m}`", f"{'decode' if test == 'tg' else 'prefill'} (±{target:g} %)", f"{n_ok} of {len(sub)}",
                        f"{med:.1f} %", f"{worst['pct']:+.1f} % ({worst['model']}, "
                        f"{SETTINGS.get(worst['variant'], worst['variant'])}, depth {worst['depth']}, {worst['type']})",
                        H.identity_note(sub)])
    return H.md_table(["machine class", "test (target)", "within target", "median abs. residual", "worst residual",
                       "code"], out, "llrrll")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table-only", action="store_true", help="no measuring: the rows from the records in --out")
    ap.add_argument("--depths", default="512,2048,4096,8192")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, help="the records' folder (resumed; default bench/.build/speed_model/<class>/"
                                             "<commit>: a run resumes its own code's records only)")
    ap.add_argument("--previous", type=Path, help="an earlier round's records folder, shown beside this round's")
    ap.add_argument("--fresh-pages", action="store_true", help="drop the model file's pages from the page cache before "
                    "each edgekv bench, so every run reads it afresh (as the calibration's models are)")
    ap.add_argument("--off-table", action="store_true", help="the settings outside the issue's table instead ("
                    f"{', '.join(SETTINGS[v] + (' ' + TYPES_OF[v]) for v in OFF_TABLE)}; records in "
                    "bench/.build/speed_offtable/<class> unless --out)")
    ap.add_argument("--rounds", help="comma-separated records folders of rounds of the same code: no measuring, "
                    "each configuration's residual over them, printed")
    H.add_common(ap)
    a = ap.parse_args()
    if a.rounds:
        dirs = [Path(d) for d in a.rounds.split(",")]
        missing = [str(d) for d in dirs if not d.is_dir()]
        if missing or len(dirs) < 2:
            ap.error(f"--rounds needs two or more records folders ({', '.join(missing) or 'one given'})")
        print(rounds_table([(d.name.replace("speed_model_", ""), rows(d, "unfiled")) for d in dirs]))  # not saved
        return 0
    variants = a.variants.split(",")
    if a.off_table:
        variants = list(OFF_TABLE)
    if a.out is None:
        a.out = H.records_dir(OFF_OUT if a.off_table else OUT, a.machine or H.this_machine())
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.table_only:
        for model in a.models.split(","):
            for variant in variants:
                run(model, variant, a.depths, a.out, a.fresh_pages)
    rs = rows(a.out, a.machine)
    print(table(rs, rows(a.previous, "unfiled") if a.previous else None))
    for path in save(rs, a.results, a.machine):
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
