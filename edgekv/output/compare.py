"""Compare two sets of results: pair configurations, test every metric, give verdicts.

Pairing
    Two records describe the same configuration when they agree on the model (sha256, else the file
    name and size), every key setting (:data:`edgekv.records.results.KEY_SETTINGS` -- cache types, n_ctx, depth,
    flash attention, threads, batch sizes, GPU layers, test sizes, warm-up, quality settings -- except
    the number of repetitions) and the place they ran (machine, backends, devices).  Records of the same
    configuration on one side (a file with repeated runs, a merged file) are pooled: every sample is used.
    llama-bench files pair on what llama-bench records (model file, type_k/v, flash_attn, threads,
    batch sizes, n_gpu_layers, n_prompt/n_gen/n_depth, CPU/GPU info and backends).

Commits
    The output names the edgekv commits that wrote each side's records (``unknown`` for records older than
    schema 4).  ``--baseline A --compare B`` keeps only the records those commits wrote, so one results file
    that several commits appended to compares two of them (:mod:`edgekv.output.commits`).

Refusal
    Paired records must come from the same environment (:data:`edgekv.records.results.CHECKED_ENVIRONMENT`:
    machine, CPU, OS, llama-cpp-python, llama.cpp commit, backends, devices).  Otherwise compare stops
    with exit 2 and names the first difference, unless ``--force``; then the differences head the output.

Significance, per metric
    * ``pp``, ``tg`` (tokens/s, higher is better): Welch's t-test on every sample of both sides; the
      change is mean(CAND)/mean(BASE) - 1 with a 95% interval.
    * ``rss`` (peak RSS of the run, lower is better): one value per run.  With at least two runs on each
      side, Welch's test as above; with one, no test is possible and the relative change is judged
      against the threshold alone (the run-to-run spread of a fresh process's peak RSS on the same
      machine is well under the default 3%).
    * ``kv`` (llama.cpp's own KV-cache MiB in the run): deterministic; any change is real.
    * ``kld``, ``ppl`` (quality, lower is better): a two-sided z-test on the difference of the two
      estimates with their standard errors.
    A change is *better* or *worse* when it is significant at ``alpha`` (default 0.05), else *not
    significant*.  A *regression* -- exit 1 -- is a worse change whose size is also beyond the metric's
    threshold (default ``tg=5%,pp=5%,rss=3%,kv=0%,kld=0.001,ppl=1%``; ``N%`` is relative, a bare number is
    absolute in the metric's unit: t/s, MiB, nats, PPL).  A configuration that ran in BASE but failed or
    was skipped in CAND is a regression too.

    The samples of one run are not independent of the machine's state during that run, so the test
    cannot see run-to-run drift (another CI runner, a busy neighbour): the threshold is what keeps such
    drift from failing a build.  Each test is at ``alpha`` on its own (no multiple-comparison
    correction); the threshold, not the p-value, is what limits false alarms across many metrics.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import msgspec

from edgekv.core.stats import summarize, welch, z_test
from edgekv.core.units import MIB, kv_label
from edgekv.errors import EnvironmentMismatch, UsageError
from edgekv.machine.load import record_busy
from edgekv.output.commits import commits_in, newest_other, select
from edgekv.output.export import sort_key
from edgekv.output.inputs import load_any, speed_of
from edgekv.records import results as R
from edgekv.records import schema as S
from edgekv.records.frame import device_label, machine_label, repack_of, unset_none

ALPHA = 0.05


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    higher_is_better: bool
    kind: str                  # samples | per_run | deterministic | estimate


METRICS: dict[str, Metric] = {
    "pp": Metric("pp", "prefill t/s", "t/s", True, "samples"),
    "tg": Metric("tg", "decode t/s", "t/s", True, "samples"),
    "rss": Metric("rss", "peak RSS MiB", "MiB", False, "per_run"),
    "kv": Metric("kv", "KV MiB (llama.cpp)", "MiB", False, "deterministic"),
    "kld": Metric("kld", "mean KLD", "nats", False, "estimate"),
    "ppl": Metric("ppl", "PPL", "PPL", False, "estimate"),
}


@dataclass(frozen=True)
class Threshold:
    relative: bool
    value: float

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"

    def exceeded(self, base: float | None, cand: float | None) -> bool:
        if base is None or cand is None:
            return False
        if self.relative:
            if base == 0:
                return cand != 0          # any change from zero is an unbounded relative change
            return abs(cand / base - 1) > self.value + 1e-12
        return abs(cand - base) > self.value + 1e-15


DEFAULT_THRESHOLDS = "tg=5%,pp=5%,rss=3%,kv=0%,kld=0.001,ppl=1%"


def parse_thresholds(text: str | None) -> dict[str, Threshold]:
    """'tg=5%,rss=3%,kld=0.001' on top of the defaults; N% is relative, a bare number absolute."""
    out: dict[str, Threshold] = {}
    for src in (DEFAULT_THRESHOLDS, text or ""):
        for part in filter(None, (p.strip() for p in src.split(","))):
            name, sep, val = part.partition("=")
            name = name.strip().lower()
            if not sep or name not in METRICS:
                raise UsageError(f"--threshold: '{part}' is not METRIC=VALUE with METRIC one of {', '.join(METRICS)} "
                                 "(example: tg=5%,rss=3%,kld=0.001)")
            val = val.strip()
            rel = val.endswith("%")
            try:
                x = float(val[:-1] if rel else val)
            except ValueError:
                raise UsageError(f"--threshold: '{val}' for {name} is not a number (5% relative, 0.001 absolute)") from None
            if x < 0 or not math.isfinite(x):
                raise UsageError(f"--threshold: {name}={val} must be a finite number ≥ 0")
            out[name] = Threshold(rel, x / 100 if rel else x)
    return out


# -- pairing ----------------------------------------------------------------------------------------------

PAIR_SETTINGS = tuple(k for k in R.KEY_SETTINGS if k != "repetitions") + ("test", "repack", "n_parallel")


def _setting(rec: S.Record, key: str) -> Any:
    """One setting of a record as plain JSON: None where the record does not hold it, a block as its dict."""
    if key == "repack":                 # absent in older records: llama.cpp's default, on
        return repack_of(rec.settings)
    v = unset_none(getattr(rec.settings, key))
    return S.encode_block(v) if isinstance(v, msgspec.Struct) else v


def _model_id(rec: S.Record) -> str:
    m = rec.model
    if m.sha256:
        return str(m.sha256)
    return f"{os.path.basename(str(m.path or ''))}:{unset_none(m.size_bytes)}"


def _config_part(rec: S.Record) -> str:
    return json.dumps([_model_id(rec), [_setting(rec, k) for k in PAIR_SETTINGS]], default=str)


def _place(rec: S.Record) -> str:
    env = rec.environment
    return json.dumps([machine_label(rec), unset_none(env.backends), unset_none(env.devices)], default=str)


def _group(records: list[S.Record]) -> dict[tuple[str, str], list[S.Record]]:
    g: dict[tuple[str, str], list[S.Record]] = {}
    for r in records:
        g.setdefault((_config_part(r), _place(r)), []).append(r)
    return g


def pair(base: list[S.Record | dict[str, Any]], cand: list[S.Record | dict[str, Any]]):
    """(pairs [(base records, cand records)], only in base, only in cand); records or plain record dicts."""
    bg = _group([R.as_record(r, f"BASE record {i}") for i, r in enumerate(base, 1)])
    cg = _group([R.as_record(r, f"CAND record {i}") for i, r in enumerate(cand, 1)])
    b_places, c_places = {p for _, p in bg}, {p for _, p in cg}
    remap: dict[str, str] = {}
    if len(b_places) == 1 and len(c_places) == 1 and b_places != c_places:
        # one machine on each side, named differently (another host name, another runner):
        # pair them; the environment check then decides whether that is allowed
        remap = {next(iter(c_places)): next(iter(b_places))}
    cg2: dict[tuple[str, str], list[S.Record]] = {}
    for (c, p), rs in cg.items():
        cg2.setdefault((c, remap.get(p, p)), []).extend(rs)
    pairs = [(bg[k], cg2[k]) for k in bg if k in cg2]
    only_b = [rs for k, rs in bg.items() if k not in cg2]
    only_c = [rs for k, rs in cg2.items() if k not in bg]
    return pairs, only_b, only_c


def environment_differences(pairs) -> list[str]:
    seen: list[str] = []
    for bs, cs in pairs:
        for d in R.env_differences(bs[0].environment, cs[0].environment):
            if d not in seen:
                seen.append(d)
    return seen


# -- metrics ----------------------------------------------------------------------------------------------

def _values(recs: list[S.Record], metric: str) -> tuple[list[float], float | None]:
    """(samples, standard error of an estimate) of one metric over the pooled records of one side."""
    xs: list[float] = []
    errs: list[float] = []
    for r in recs:
        if metric in ("pp", "tg"):
            v = speed_of(r, metric)
            xs += [float(x) for x in (v.samples_ts if v is not None else []) if x is not None]
        elif metric == "rss":
            mem = unset_none(r.memory)
            if mem is not None and mem.peak_rss_bytes:
                xs.append(mem.peak_rss_bytes / MIB)
        elif metric == "kv":
            log = unset_none(r.llama_log)
            if log is not None:
                xs.append(float(log.kv_mib or 0) + float(unset_none(log.recurrent_mib) or 0))
        else:
            q = unset_none(r.quality)
            stats = q.quality if q is not None and q.status == "ok" else None
            value = getattr(stats, f"{metric}_mean" if metric == "kld" else metric, None)
            if value is not None:
                xs.append(float(value))
                e = getattr(stats, f"{metric}_mean_err" if metric == "kld" else f"{metric}_err")
                if e is not None:
                    errs.append(float(e))
    se = None
    if errs and len(errs) == len(xs):
        # several estimates pooled: the mean's standard error
        se = math.sqrt(sum(e * e for e in errs)) / len(errs)
    return xs, se


def compare_metric(metric: Metric, bx: list[float], be: float | None, cx: list[float], ce: float | None,
                   thr: Threshold, alpha: float) -> dict[str, Any] | None:
    if not bx or not cx:
        return None
    mb, mc = sum(bx) / len(bx), sum(cx) / len(cx)
    change = mc / mb - 1 if mb else None
    ci = None
    p = None
    if metric.kind == "deterministic":
        test = "exact (deterministic)"
        significant = mc != mb
    elif metric.kind == "estimate":
        if be is not None and ce is not None and len(bx) == len(cx) == 1:
            p, dci = z_test(mb, be, mc, ce)
            ci = [dci[0] / mb, dci[1] / mb] if mb else None
            test = "z-test (standard errors)"
            significant = p < alpha
        else:
            test = "threshold only (no standard error)"
            significant = thr.exceeded(mb, mc)
    elif len(bx) >= 2 and len(cx) >= 2:
        w = welch(bx, cx)
        p, ci = w["p_value"], w["change_ci95"]
        test = "welch"
        significant = p is not None and p < alpha
    else:
        test = "threshold only (one value per side)"
        significant = thr.exceeded(mb, mc)
    worse_dir = (mc < mb) if metric.higher_is_better else (mc > mb)
    verdict = "not significant"
    if significant and mc != mb:
        verdict = "worse" if worse_dir else "better"
    regression = verdict == "worse" and thr.exceeded(mb, mc)
    sb, sc = summarize(bx), summarize(cx)
    return {
        "metric": metric.name, "label": metric.label, "unit": metric.unit, "higher_is_better": metric.higher_is_better,
        "base": mb, "cand": mc, "base_ci95": sb["ci95"], "cand_ci95": sc["ci95"], "base_se": be, "cand_se": ce,
        "n_base": len(bx), "n_cand": len(cx), "change": change, "change_ci95": ci, "p_value": p, "test": test,
        "alpha": alpha, "threshold": str(thr), "verdict": verdict, "regression": regression,
    }


def _label(rec: S.Record, varying: list[str]) -> str:
    s = rec.settings
    kv = kv_label(s.type_k, s.type_v)
    parts = [f"{kv} @ {s.n_ctx if s.n_ctx is not None else '-'}"]
    if s.n_depth is not None:
        parts.append(f"d{s.n_depth}")
    test = unset_none(s.test)
    if test:
        parts.append(f"{test}{s.n_prompt if test == 'pp' else s.n_gen}")
    flags = {"flash_attn": "fa", "n_threads": "t", "n_gpu_layers": "ngl", "n_batch": "b", "n_ubatch": "ub",
             "n_prompt": "p", "n_gen": "n", "warmup": "warmup", "swa_full": "swa_full", "n_seq_max": "np",
             "kv_unified": "kvu", "engine": "engine", "quality": "quality", "n_parallel": "npl"}
    for k in varying:
        if k in flags:
            parts.append(f"{flags[k]}={_setting(rec, k)}")
    return " ".join(parts)


def _varying(recs: list[S.Record]) -> list[str]:
    out = []
    for k in PAIR_SETTINGS:
        if k in ("type_k", "type_v", "n_ctx", "n_depth", "test"):
            continue
        if len({json.dumps(_setting(r, k), default=str) for r in recs}) > 1:
            out.append(k)
    return out


def compare(base_path: str | os.PathLike, cand_path: str | os.PathLike | None, thresholds: str | None = None,
            force: bool = False, alpha: float = ALPHA, baseline: str | None = None,
            candidate: str | None = None) -> dict[str, Any]:
    """Compare two results files, or two edgekv commits' records: ``baseline`` / ``candidate`` (``--baseline`` /
    ``--compare``, commit prefixes) keep only the records of BASE / CAND that commit wrote; with no CAND file both
    come from BASE, and ``candidate`` defaults to the newest other commit there (:mod:`edgekv.output.commits`)."""
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1 (got {alpha})")
    thr = parse_thresholds(thresholds)
    base_name, cand_name = str(base_path), str(cand_path if cand_path is not None else base_path)
    if baseline is None and candidate is None:
        if cand_path is None:
            raise UsageError("compare: give two results files (BASE CAND), or one with --baseline COMMIT "
                             "[--compare COMMIT] to compare two edgekv commits' records in it")
        return compare_records(load_any(base_path), load_any(cand_path), thr, force=force, alpha=alpha,
                               base_name=base_name, cand_name=cand_name)
    if baseline is None:
        raise UsageError("--compare COMMIT needs --baseline COMMIT (the commit to compare against)")
    # every line of the files (several commits' records of one configuration), the newest of each per commit
    base_recs = load_any(base_path, history=True)
    cand_recs = base_recs if cand_path is None else load_any(cand_path, history=True)
    base_sel, base_code = select(base_recs, baseline, "--baseline", base_name)
    if candidate is not None:
        cand_sel, cand_code = select(cand_recs, candidate, "--compare", cand_name)
    else:
        cand_sel, cand_code = newest_other(cand_recs, base_code, "--compare", cand_name)
    if cand_path is None and base_code == cand_code:
        raise UsageError(f"--baseline {baseline} and --compare {candidate} name the same code ({base_code}); "
                         "give two different commits")
    base_sel, cand_sel = R.latest(base_sel), R.latest(cand_sel)
    return compare_records(base_sel, cand_sel, thr, force=force, alpha=alpha, base_name=f"{base_name}@{base_code}",
                           cand_name=f"{cand_name}@{cand_code}")


# -- busy machines (issue 19) -------------------------------------------------------------------------------------

SPEED_METRICS = frozenset({"pp", "tg"})


def _busy_sides(bs: list[S.Record], cs: list[S.Record]) -> list[str]:
    """Which sides had a configuration measured while other work took a significant share of the CPUs."""

    return [side for side, rs in (("BASE", bs), ("CAND", cs)) if any(record_busy(r) for r in rs)]


def _busy_verdict(res: dict[str, Any], busy: list[str], force: bool) -> None:
    """A speed measured on a busy machine is not evidence of a change: no verdict unless --force."""
    if not busy or res["metric"] not in SPEED_METRICS:
        return
    res["busy"] = busy
    if not force:
        res["verdict"] = "not significant"
        res["regression"] = False
        res["refused"] = "busy machine"


def _compared_pairs(pairs, varying: list[str], thr: dict[str, Threshold], alpha: float,
                    force: bool) -> list[dict[str, Any]]:
    """Every metric of every paired configuration, tested (in the report's sort order)."""

    multi_device = len({device_label(bs[0]) for bs, _ in pairs}) > 1
    out_pairs = []
    for bs, cs in sorted(pairs, key=lambda p: sort_key(p[0][0])):
        metrics = []
        busy = _busy_sides(bs, cs)
        for name, m in METRICS.items():
            bx, be = _values(bs, name)
            cx, ce = _values(cs, name)
            res = compare_metric(m, bx, be, cx, ce, thr[name], alpha)
            if res is not None:
                _busy_verdict(res, busy, force)
                metrics.append(res)
        b0 = bs[0]
        out_pairs.append({
            "model": b0.model.name, "device": device_label(b0),
            "config": (f"{device_label(b0).split(':')[0]}: " if multi_device else "") + _label(b0, varying),
            "settings": S.encode_block(b0.settings), "n_base_records": len(bs), "n_cand_records": len(cs),
            "metrics": metrics, "busy": busy,
        })
    return out_pairs


def compare_records(base_all: list[S.Record | dict[str, Any]], cand_all: list[S.Record | dict[str, Any]],
                    thr: dict[str, Threshold], force: bool = False, alpha: float = ALPHA, base_name: str = "BASE",
                    cand_name: str = "CAND") -> dict[str, Any]:
    """Compare two sets of records (Records, or plain record dicts: each decoded strictly once here)."""

    base_all = [R.as_record(r, f"{base_name}: record {i}") for i, r in enumerate(base_all, 1)]
    cand_all = [R.as_record(r, f"{cand_name}: record {i}") for i, r in enumerate(cand_all, 1)]
    base = [r for r in base_all if r.status == "ok"]
    cand = [r for r in cand_all if r.status == "ok"]
    pairs, only_b, only_c = pair(base, cand)
    # configurations BASE measured that CAND attempted and could not run
    c_failed = [r for r in cand_all if r.status != "ok"]
    failed_pairs, _, _ = pair(base, c_failed) if c_failed else ([], [], [])
    if not pairs and not failed_pairs:
        what = "no configuration of " + cand_name + " matches one of " + base_name
        raise UsageError(f"{what} on model, key settings and machine ({len(base)} and {len(cand)} measured "
                         "configurations); compare results of the same sweep")
    env_diffs = environment_differences(pairs + failed_pairs)
    if env_diffs and not force:
        more = f" (and {len(env_diffs) - 1} more)" if len(env_diffs) > 1 else ""
        raise EnvironmentMismatch(f"{base_name} and {cand_name} ran in different environments: {env_diffs[0]}{more}; "
                                  "their figures are not comparable. Pass --force to compare anyway")
    all_recs = [r for bs, cs in pairs for r in bs + cs]
    varying = _varying(all_recs)
    out_pairs = _compared_pairs(pairs, varying, thr, alpha, force)
    failures = []
    for bs, cs in sorted(failed_pairs, key=lambda p: sort_key(p[0][0])):
        failures.append({"model": bs[0].model.name, "config": _label(bs[0], varying),
                         "status": cs[0].status, "reason": cs[0].reason, "regression": True})
    failed_keys = {_config_part(cs[0]) for _, cs in failed_pairs}
    only_b = [rs for rs in only_b if _config_part(rs[0]) not in failed_keys]
    n_reg = sum(1 for p in out_pairs for m in p["metrics"] if m["regression"]) + len(failures)
    counts = {"better": 0, "worse": 0, "not significant": 0}
    for p in out_pairs:
        for m in p["metrics"]:
            counts[m["verdict"]] += 1
    return {
        "base": base_name, "cand": cand_name, "alpha": alpha, "thresholds": {k: str(v) for k, v in thr.items()},
        "forced": bool(force and env_diffs), "environment_differences": env_diffs,
        "base_code": commits_in(base_all), "cand_code": commits_in(cand_all),
        "n_base": len(base_all), "n_cand": len(cand_all), "pairs": out_pairs, "failed_in_cand": failures,
        "only_in_base": sorted(_label(rs[0], varying) for rs in only_b),
        "only_in_cand": sorted(_label(rs[0], varying) for rs in only_c),
        "not_ok_in_base": sum(1 for r in base_all if r.status != "ok"),
        "verdicts": counts, "regressions": n_reg, "exit_code": 1 if n_reg else 0,
    }


# -- Markdown ---------------------------------------------------------------------------------------------

def _num(x: float | None, unit: str) -> str:
    if x is None:
        return "–"
    if unit == "nats":
        return f"{x:.6f}"
    if unit == "PPL":
        return f"{x:.4f}"
    return f"{x:,.2f}" if unit == "MiB" else f"{x:,.1f}"


def _side(m: dict[str, Any], side: str) -> str:
    v = _num(m[side], m["unit"])
    ci = m[f"{side}_ci95"]
    se = m[f"{side}_se"]
    n = m[f"n_{side}"]
    if se is not None:
        return f"{v} ± {_num(se, m['unit'])}"
    if ci and m["metric"] in ("pp", "tg", "rss") and n > 1:
        half = (ci[1] - ci[0]) / 2
        return f"{v} ± {_num(half, m['unit'])} (n={n})"
    return f"{v}" + (f" (n={n})" if m["metric"] in ("pp", "tg") else "")


def _change(m: dict[str, Any]) -> str:
    if m["change"] is None:
        if m["base"] is not None and m["cand"] is not None:
            return f"{m['cand'] - m['base']:+.6g} {m['unit']}"
        return "–"
    s = f"{100 * m['change']:+.1f}%"
    ci = m["change_ci95"]
    if ci:
        s += f" [{100 * ci[0]:+.1f}%, {100 * ci[1]:+.1f}%]"
    return s


def _codes(labels: list[str]) -> str:
    return ", ".join(f"`{c}`" for c in labels) or "–"


_VERDICT = {"better": "🟢 better", "worse": "🟠 worse", "not significant": "⚪ not significant"}


def _summary(res: dict[str, Any]) -> list[str]:
    """The lines above the table: what was compared, with which code, and the outcome."""
    v = res["verdicts"]
    out = ["## edgekv compare", "",
           f"**BASE** `{res['base']}` ({res['n_base']} configurations) → **CAND** `{res['cand']}` "
           f"({res['n_cand']}): {len(res['pairs'])} paired; {v['better']} better, {v['worse']} worse, "
           f"{v['not significant']} not significant.", ""]
    if res.get("base_code") is not None:
        out += [f"Code: BASE {_codes(res['base_code'])} → CAND {_codes(res['cand_code'])} (the edgekv commits that "
                "wrote the records).", ""]
    if res["regressions"]:
        out.append(f"**🔴 {res['regressions']} regression{'s' if res['regressions'] != 1 else ''}** "
                   f"(significantly worse and beyond the threshold).")
    else:
        out.append("**No regression** beyond the thresholds.")
    out.append("")
    if res["environment_differences"]:
        out.append("> ⚠️ **Compared with --force although the environments differ:** "
                   + "; ".join(f"`{d}`" for d in res["environment_differences"]))
        out.append("")
    return out


def render_markdown(res: dict[str, Any]) -> str:
    out = _summary(res)
    models = {p["model"] for p in res["pairs"]} | {f["model"] for f in res["failed_in_cand"]}
    multi = len(models) > 1
    if not multi and models:
        out += [f"Model: **{next(iter(models))}**.", ""]
    mh, ma = ("model | ", ":---|") if multi else ("", "")
    out += [f"| {mh}configuration | metric | BASE | CAND | change [95% CI] | p | test | verdict |",
            f"|{ma}:---|:---|---:|---:|---:|---:|:---|:---|"]
    for p in res["pairs"]:
        for m in p["metrics"]:
            verdict = _VERDICT[m["verdict"]]
            if m["regression"]:
                verdict = f"🔴 **regression** (beyond {m['threshold']})"
            if m.get("refused"):
                verdict = f"⚠️ busy machine ({' and '.join(m['busy'])}): not judged (--force to judge)"
            elif m.get("busy"):
                verdict += f" ⚠️ busy machine ({' and '.join(m['busy'])})"
            pv = "–" if m["p_value"] is None else (f"{m['p_value']:.2g}" if m["p_value"] >= 1e-4 else "<1e-4")
            mc = f"{p['model']} | " if multi else ""
            out.append(f"| {mc}{p['config']} | {m['label']} | {_side(m, 'base')} | {_side(m, 'cand')} | "
                       f"{_change(m)} | {pv} | {m['test']} | {verdict} |")
    for f in res["failed_in_cand"]:
        mc = f"{f['model']} | " if multi else ""
        out.append(f"| {mc}{f['config']} | status | ok | {f['status']} | – | – | – | 🔴 **regression**: "
                   f"{str(f['reason'] or '').replace('|', '/')} |")
    out.append("")
    if res["only_in_base"] or res["only_in_cand"]:
        if res["only_in_base"]:
            out.append(f"Only in BASE (not compared): {', '.join(res['only_in_base'])}.")
        if res["only_in_cand"]:
            out.append(f"Only in CAND (not compared): {', '.join(res['only_in_cand'])}.")
        out.append("")
    if any(m.get("busy") for p in res["pairs"] for m in p["metrics"]):
        out.append("⚠️ busy machine: other processes used at least 10% of the CPUs before or during that "
                   "configuration (recorded by edgekv bench); its speeds are not called significantly different "
                   "unless --force.")
        out.append("")
    thr = ", ".join(f"{k}={v}" for k, v in res["thresholds"].items())
    out.append(f"Tests at α={res['alpha']:g}: Welch's t-test on every speed sample; peak RSS by threshold when each "
               f"side has one run; llama.cpp's KV MiB exactly; KLD/PPL by a z-test on their standard errors. "
               f"Regression = significantly worse and beyond the threshold ({thr}).")
    return "\n".join(out) + "\n"
