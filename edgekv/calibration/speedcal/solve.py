"""Solving a speed calibration's timings into coefficients (edgekv.core.speed.Calibration): each solver takes the
probe's results (edgekv.core.probe.ProbeResult, or rows of a cached calibration's JSON) and the plan they came from.

A difference that comes out at or below zero where there must be a cost is other work on the machine hiding it:
Disturbed, never a zero coefficient."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekv.calibration.speedcal.errors import CalibrationError, Disturbed
from edgekv.calibration.speedcal.plans import (
    BODY_PP_N,
    DEEP_PP_N,
    MM_COLS,
    MM_N,
    NODE_SHAPES,
    PP_N,
    PP_ROWS_N,
    PP_SHORT_N,
    PT_N,
    TG_N,
    VOCAB_SHAPE,
    attn_steps,
    attn_units,
    deep_shape,
    geometry_shape,
    q8_bytes,
)
from edgekv.core.arch import shape_from_metadata
from edgekv.core.probe import ProbeModel, ProbeResult, Results, by_step, median_s
from edgekv.core.speed import (
    TILED_DEEP_DEPTHS,
    AttnLayer,
    Calibration,
    SpeedShape,
    attn_units_tg,
    dense_view,
    kv_key,
    prompt_attn_coef,
    prompt_node_s,
    row_loop_path,
    run_nodes,
    speed_shape,
    split_kv_path,
    tile_factor,
    tile_ratio,
    tiled_prompt_path,
)
from edgekv.machine.bandwidth import read_bandwidth
from edgekv.sources.gguf_header import read_header_file


def solve_nodes(results: Results, attn_tg: float = 0.0, attn_pp: float = 0.0,
                attn_short: float = 0.0) -> tuple[float, float, float, float, float]:
    """(seconds per node of a one-token graph, seconds per node of a PP_N-token prompt ubatch, seconds per token and
    per ubatch outside the nodes, seconds per node of a PP_SHORT_N-token ubatch) from the two narrow models, less
    their own attention (``attn_tg``/``attn_pp``/``attn_short``: the f16 coefficients, over the cells each token
    reads; the short prompt's is llama.cpp's per-row loop).  The short ubatch's node cost is 0.0 where the results
    do not hold it (a plan before CAL_VERSION 15).  The per-token and per-ubatch costs are the narrow 2-layer
    model's time less its nodes' (on a GPU about 90 us a token: llama_decode's own work; on two CPU cores a few
    us): at least zero, since a machine's noise can hide a small constant, never make it negative."""
    a, b = by_step(results, "nodes_a"), by_step(results, "nodes_b")
    ga, gb = _ops(a["tg"].graph), _ops(b["tg"].graph)
    sa, sb = NODE_SHAPES["nodes_a"], NODE_SHAPES["nodes_b"]
    per_layer = sa["n_head"] * 2 * (sa["n_embd"] // sa["n_head"])
    dl = sb["n_layer"] - sa["n_layer"]
    tg = ((median_s(b["tg"].ns) - median_s(a["tg"].ns)) / 32 - dl * per_layer * 16 * attn_tg) \
        / max(1, gb["nodes_tg"] - ga["nodes_tg"])
    pp = (median_s(b["pp"].ns) - median_s(a["pp"].ns) - dl * per_layer * PP_N * (PP_N / 2) * attn_pp) \
        / max(1, gb["nodes_pp"] - ga["nodes_pp"])
    short = 0.0
    if "ps" in a and "ps" in b:
        short = (median_s(b["ps"].ns) - median_s(a["ps"].ns)
                 - dl * per_layer * PP_SHORT_N * (PP_SHORT_N / 2) * attn_short) / max(1, gb["nodes_pp"] - ga["nodes_pp"])
        if short <= 0:
            raise Disturbed("measured no cost for a deeper graph under a short prompt")
    if tg <= 0 or pp <= 0:
        # 32 more layers cannot be free: other work hid their cost; a zero would predict graphs as costing nothing
        raise Disturbed("measured no cost for a deeper graph")
    own_tg = sa["n_layer"] * per_layer * 16 * attn_tg                # the 2-layer model's attention at mean depth 16
    own_pp = sa["n_layer"] * per_layer * PP_N * (PP_N / 2) * attn_pp
    tg0 = max(0.0, median_s(a["tg"].ns) / 32 - ga["nodes_tg"] * tg - own_tg)
    pp0 = max(0.0, median_s(a["pp"].ns) - ga["nodes_pp"] * pp - own_pp)
    return tg, pp, tg0, pp0, short


def _ops(graph: dict[str, int] | None) -> dict[str, int]:
    """A calibration model's graph sizes as the speed model counts them: ``nodes_tg``/``nodes_pp`` are the nodes a
    backend runs (core.speed.run_nodes), from llama.cpp's scheduler listing (GGML_SCHED_DEBUG=2 at the probe's
    count context)."""
    tg, pp = run_nodes(graph)
    if tg is None or pp is None:
        raise CalibrationError("llama.cpp did not list its graph's nodes (the scheduler's GGML_SCHED_DEBUG=2 listing "
                               "after 'graph: nodes = ...')")
    return {"nodes_tg": tg, "nodes_pp": pp}


def solve_vocab(results: Results, cal: Calibration) -> float:
    """Seconds per logit a decoded token returns to the host (a GPU's copy of the logits): the wide-vocabulary
    narrow model less nodes_a, less its larger output matrix (read at the Q8_0 mat-vec cost); at least zero."""
    a, v = by_step(results, "nodes_a"), by_step(results, "nodes_v")
    if "tg" not in v:
        return 0.0
    e, dv = VOCAB_SHAPE["n_embd"], VOCAB_SHAPE["n_vocab"] - 256
    out_bytes = q8_bytes(e * dv)
    dt = (median_s(v["tg"].ns) - median_s(a["tg"].ns)) / TG_N \
        - (_ops(v["tg"].graph)["nodes_tg"] - _ops(a["tg"].graph)["nodes_tg"]) * cal.node_tg_s
    return max(0.0, (dt - out_bytes * cal.matvec_s_per_byte["q8_0"]) / dv)


def probe_shape(model_path: str, graph: dict[str, int] | None, cpu_features: list[str], repack: bool):
    """The speed shape of one of the calibration's own models (its header as edgekv wrote it)."""
    _ops(graph)            # the nodes that run must have been listed: a shape without them would price no nodes
    header = read_header_file(model_path)
    shape = shape_from_metadata(header.metadata, model_path, header.value_types)
    return speed_shape(shape, list(header.tensors), cpu_features, repack, graph)


def solve_bodies(results: Results, plan: list[ProbeModel], cal: Calibration) -> None:
    """Fill cal's node costs at each body probe's widths: its decode and prompt time less what the rest of the model
    predicts (the token or ubatch cost, its logits, its Q8_0 weights and output, its attention at depth 0), over its
    graph's nodes."""
    f16 = kv_key("f16", "f16", "auto")
    for m in plan:
        r = by_step(results, m.key)
        sh = probe_shape(m.model_path, r["tg"].graph, [], False)
        w_bytes = sum(x.bytes for x in sh.groups)
        # the prompt's last-layer feed-forward runs for its last token only (WeightGroup.tail_*): a mat-vec
        tail_bytes = sum(x.tail_bytes for x in sh.groups if not x.output)
        body_params = sum(x.params - x.tail_params for x in sh.groups if not x.output)
        o_bytes = sum(x.bytes for x in sh.groups if x.output) + tail_bytes
        units = sum(lay.n_head * (lay.head_k + lay.head_v) for lay in sh.attn)
        t_tg = median_s(r["tg"].ns) / TG_N - cal.token_tg_s - sh.n_vocab * cal.vocab_tg_s \
            - w_bytes * cal.matvec_s_per_byte["q8_0"] - attn_units_tg(sh, TG_N / 2, cal.n_threads, False) * cal.attn_tg_s[f16]
        t_pp = median_s(r["pp"].ns) - cal.ubatch_pp_s - (w_bytes - o_bytes) * cal.matmul_s_per_byte["q8_0"] \
            - 2.0 * body_params * BODY_PP_N * cal.matmul_s_per_flop["q8_0"] - o_bytes * cal.matvec_s_per_byte["q8_0"] \
            - units * BODY_PP_N * (BODY_PP_N / 2) * cal.attn_pp_s[f16]
        if t_tg <= 0 or t_pp <= 0:
            raise Disturbed(f"of the model widths {m.body} measured no cost for the graph's nodes")
        cal.node_tg_body_s[m.body] = t_tg / sh.nodes_tg
        cal.node_pp_body_s[m.body] = t_pp / sh.nodes_pp


def attn_speed_shape(shape: dict[str, Any]):
    hd = shape.get("head_dim") or shape["n_embd"] // shape["n_head"]
    return SpeedShape((), tuple(AttnLayer(shape["n_head"], hd, hd, None, shape["n_head_kv"])
                                for _ in range(shape["n_layer"])), None, None)


def shallow_s(r: dict[str, ProbeResult], key: str) -> float:
    """The shallow step's time: the mean of its runs before and after the deep step (when both were taken)."""
    both = [median_s(r[k].ns) for k in (key, key + "b") if k in r]
    return sum(both) / len(both)


def difference_s(r: dict[str, ProbeResult], deep: str, shallow: str) -> float:
    """How much longer a run of step ``deep`` takes than one of step ``shallow`` (seconds).  Runs taken in turn (the
    in-process probe's two sequences, "in_turn") are paired, each deep run with the shallow run just before it, and
    the median of those differences kept: a stretch in which the machine runs slower or faster lengthens both runs of
    a pair and falls out (docs/calibration-history.md: it halved the spread of the noisiest pairs).  Runs taken in
    sequence (llama-bench: all of one depth, then the other, then the first again) cannot be paired: the difference
    of the medians, the shallow one the mean of before and after."""
    a, b = r[shallow], r[deep]
    if a.in_turn and b.in_turn and len(a.ns) == len(b.ns) and shallow + "b" not in r:
        return median_s([y - x for x, y in zip(a.ns, b.ns)])
    return median_s(b.ns) - shallow_s(r, shallow)


def _attn_results(results: Results, key: str) -> tuple[str | None, dict[str, Any], dict[str, ProbeResult]]:
    """(geometry, its calibration model's shape, that model's steps by name) of one K/V pair's attention key."""
    geometry = key.split("@")[1] if "@" in key else None
    if geometry is None:
        return None, geometry_shape(None), by_step(results, "attn", key)
    # the decode steps from the evicting model where the plan had one (attn_plan), the rest from the geometry's own
    return geometry, geometry_shape(geometry), {**by_step(results, f"attn_{geometry}", key),
                                                **by_step(results, f"attnv_{geometry}", key)}


def _prompt_cell_cost(r: dict[str, ProbeResult], step: str, depths: tuple[int, int], n: int, units: int) -> float:
    """Seconds per head x (head_k + head_v) x cell of an n-token prompt step timed at two depths (``step`` + depth;
    _difference_s: paired where the runs were taken in turn), over ``units`` of its model."""
    d0, d1 = depths
    return difference_s(r, f"{step}{d1}", f"{step}{d0}") / n / units / (d1 - d0)


def solve_attn(results: Results, key: str, n_threads: int = 1, device: str = "") -> tuple[float, float]:
    """(decode, prompt) seconds per head x (head_k + head_v) x cell for one K/V pair and geometry (``key``: its
    kv_key; decode: the cells the slowest thread reads, edgekv.core.speed.decode_cells)."""
    geometry, shape, r = _attn_results(results, key)
    tk, tv, fa = key.split("/")[0], key.split("/")[1], key.split("fa=")[1].split("@")[0]
    a = attn_steps(geometry, split_kv_path(tk, tv, fa, device), device, row_loop_path(tk, tv, fa, device))
    tg = solve_attn_tg(results, key, n_threads, device)
    pp = _prompt_cell_cost(r, "pp", a.pp_depths, int(r[f"pp{a.pp_depths[1]}"].n), attn_units(shape))
    if pp <= 0:
        raise Disturbed(f"of {key} measured no cost for a deeper cache")
    return tg, pp


def solve_attn_tg(results: Results, key: str, n_threads: int = 1, device: str = "") -> float:
    """Decode seconds per head x (head_k + head_v) x cell the slowest thread reads for one K/V pair and geometry
    (solve_attn's first half: the plan's "tg" steps alone)."""
    geometry, shape, r = _attn_results(results, key)
    tk, tv, fa = key.split("/")[0], key.split("/")[1], key.split("fa=")[1].split("@")[0]
    sh, split = attn_speed_shape(shape), split_kv_path(tk, tv, fa, device)
    d0, d1 = attn_steps(geometry, split, device, row_loop_path(tk, tv, fa, device)).tg_depths
    dense = dense_view(fa)
    n = int(r[f"tg{d1}"].n)      # the step's own tokens a run (EVICT_TG_N on an evicting model)
    du = (attn_units_tg(sh, d1 + n / 2, n_threads, split, dense=dense)
          - attn_units_tg(sh, d0 + n / 2, n_threads, split, dense=dense))
    tg = difference_s(r, f"tg{d1}", f"tg{d0}") / n / du
    if tg <= 0:
        # deeper attention cannot be free: other work on the machine hid its cost; never cache a zero
        raise Disturbed(f"of {key} measured no cost for a deeper cache")
    return tg


def solve_attn_rows(results: Results, key: str, device: str = "") -> float:
    """Seconds per head x (head_k + head_v) x cell of a prompt under FA_TILE_Q tokens for one K/V pair and
    geometry whose longer prompts run the tiled kernel (the plan's "ps" steps: llama.cpp's per-query-row loop)."""
    geometry, shape, r = _attn_results(results, key)
    rows = _prompt_cell_cost(r, "ps", attn_steps(geometry, True, device).pp_depths, PP_ROWS_N, attn_units(shape))
    if rows <= 0:
        raise Disturbed(f"of {key} measured no cost for a deeper cache under a short prompt")
    return rows


def solve_tile_share(results: Results, key: str, n_threads: int, deep: bool = False) -> float:
    """The share of one F16/F32 pair's tiled prompt attention that a query tile pays whatever rows it holds
    (edgekv.core.speed.tile_factor) at a geometry: the plan's PT_N-token prompt ("pt" steps: short tiles) beside its
    longer one over the same depths.  Between 0 (the kernel's cost follows the rows) and 1 (the tiles): a prompt of
    short tiles costs more a row and cell than one of full tiles.  ``deep``: the deep model's steps at
    TILED_DEEP_DEPTHS ("td" beside
    "pd")."""
    geometry, shape, r = _attn_results(results, key)
    a = attn_steps(geometry, True)
    long_n, depths, steps = a.pp_n, a.pp_depths, ("pp", "pt")
    if deep:
        shape, r = deep_shape(geometry), by_step(results, f"attnd_{geometry}", key)
        long_n, depths, steps = DEEP_PP_N, TILED_DEEP_DEPTHS, ("pd", "td")
    units, h = attn_units(shape), shape["n_head"]
    y_long = _prompt_cell_cost(r, steps[0], depths, long_n, units)
    y_short = _prompt_cell_cost(r, steps[1], depths, PT_N, units)
    r_long, r_short = tile_ratio(long_n, h, n_threads), tile_ratio(PT_N, h, n_threads)
    if y_long <= 0 or y_short <= 0:
        raise Disturbed(f"of {key} measured no cost for a deeper cache under a prompt of short tiles")
    q = y_short / y_long
    den = (r_short - 1) - q * (r_long - 1)
    if den <= 1e-9:
        return 0.0
    return min(1.0, max(0.0, (q - 1) / den))


def solve_attn_deep(results: Results, key: str) -> float:
    """Seconds per head x (head_k + head_v) x cell of the tiled kernel between TILED_DEEP_DEPTHS, for one F16/F32
    pair and geometry (the deep_plan's "pd" steps)."""
    geometry = key.split("@")[1]
    r = by_step(results, f"attnd_{geometry}", key)
    deep = _prompt_cell_cost(r, "pd", TILED_DEEP_DEPTHS, DEEP_PP_N, attn_units(deep_shape(geometry)))
    if deep <= 0:
        raise Disturbed(f"of {key} measured no cost for a deeper cache in the tiled kernel")
    return deep


def _prompt_attn_f16(cal: Calibration, units: int, n: int) -> float:
    """The generic f16 attention of a weight model's ``n``-token prompt from depth 0 (``units``: its heads x
    head dims over its layers): the tiled kernel's coefficient, or the per-row loop's under FA_TILE_Q tokens."""
    coef = prompt_attn_coef(cal, n, tiled_prompt_path("f16", "f16", "auto", cal.device))
    return n * units * (n / 2) * coef.get(kv_key("f16", "f16", "auto"), 0.0)


def solve_weights(results: Results, plan: list[ProbeModel], cal: Calibration, cpu_features: list[str],
                  repack: bool) -> None:
    """Fill cal's mat-vec and mat-mat coefficients for each weight model of ``plan`` (the node and attention costs
    already in ``cal`` are taken out first; on the CPU the narrow model's decode beside the wide one's gives the
    cost per row)."""
    feats, rp = ([], False) if cal.device else (cpu_features, repack)     # a GPU: no CPU extra buffer applies
    for m in (x for x in plan if x.key.startswith("w_")):
        r = by_step(results, m.key)
        sh = probe_shape(m.model_path, r["tg"].graph, feats, rp)
        mats = [g for g in sh.groups if not g.output]
        outs = [g for g in sh.groups if g.output]
        key = mats[0].key
        # a prompt computes the last layer's feed-forward for its last token only (WeightGroup.tail_*): the
        # coefficients are those of the rest, the body (a 5-layer wide model's last FFN is 15 % of its matrices)
        body = [g.split()[0] for g in mats]
        w_bytes, w_params = sum(g.bytes for g in body), sum(g.params for g in body)
        narrow = next((x for x in plan if x.key == "wn_" + m.key[2:]), None)
        nd = _decode_of(results, narrow, feats, rp, cal, {g.key for g in sh.groups},
                        again="wnb_" + m.key[2:]) if narrow else None
        mv, row = _solve_matvec(key, (sh, _decode_rest(r, sh, cal)), nd)
        cal.matvec_s_per_byte[key] = mv
        if outs and outs[0].key not in cal.matvec_s_per_byte:
            cal.matvec_s_per_byte[outs[0].key] = mv
        if narrow:
            cal.matvec_s_per_row[key] = row
            if outs:
                cal.matvec_s_per_row.setdefault(outs[0].key, row)
        stream = [next((x for x in plan if x.key == f"{p}_{m.key[2:]}"), None) for p in ("ws", "wsn", "wsb")]
        if stream[0]:
            st, st_row = _stream_coefficients(results, stream[0], stream[1:], feats, rp, cal, {g.key for g in sh.groups})
            cal.matvec_stream_s_per_byte[key] = st
            cal.matvec_stream_s_per_row[key] = st_row
            if outs:
                cal.matvec_stream_s_per_byte.setdefault(outs[0].key, st)
                cal.matvec_stream_s_per_row.setdefault(outs[0].key, st_row)
        # the output head and the last layer's feed-forward: one mat-vec per prompt
        o_mv = _once_mv(sh, mv, row)
        (n1, t1), (n2, t2) = _prompt_rest(r, sh, cal, o_mv, key)
        slope = (t1 - t2) / (n1 - n2)
        per_flop, per_dot = _solve_matmul(key, (w_params, sum(g.rows for g in body), slope),
                                          _narrow_slope(results, narrow, nd[0], cal, mv, row) if narrow and nd else None)
        per_byte = max((t1 - n1 * slope) / w_bytes, 0.0)
        cal.matmul_s_per_flop[key] = per_flop
        cal.matmul_s_per_byte[key] = per_byte
        if narrow:
            cal.matmul_s_per_dot[key] = per_dot
            if outs:
                cal.matmul_s_per_dot.setdefault(outs[0].key, per_dot)
        n_cols = _cols_rest(results, narrow, nd[0], cal, mv, row, again="wnb_" + m.key[2:]) if narrow and nd else {}
        cols, cols_row = {}, {}
        for n, w in _cols_rest(results, m, sh, cal, mv, row).items():
            cols[n], cols_row[n] = _solve_bytes_rows(f"{key} ({n} columns)", w, n_cols.get(n))
        cal.matcols_s_per_byte[key] = cols
        if outs and outs[0].key not in cal.matcols_s_per_byte:
            cal.matcols_s_per_byte[outs[0].key] = dict(cols)
        if n_cols:
            cal.matcols_s_per_row[key] = cols_row
            if outs:
                cal.matcols_s_per_row.setdefault(outs[0].key, dict(cols_row))


def _prompt_rest(r: dict[str, ProbeResult], sh, cal: Calibration, o_mv: float, key: str) -> list[tuple[int, float]]:
    """A weight model's MM_N prompts as (tokens, seconds of its matrices): each less the graph's nodes, the
    ubatch's own cost, the output head's one mat-vec (``o_mv``) and the f16 attention over the prompt."""
    units = sum(lay.n_head * (lay.head_k + lay.head_v) for lay in sh.attn)
    rest = [(n, median_s(r[f"pp{n}"].ns) - sh.nodes_pp * prompt_node_s(cal, n) - cal.ubatch_pp_s - o_mv
             - _prompt_attn_f16(cal, units, n)) for n in MM_N]
    (n1, t1), (n2, t2) = rest
    if t1 <= t2:
        raise Disturbed(f"of {key} weights measured a {n1}-token prompt no slower than a {n2}-token one")
    return rest


def _narrow_slope(results: Results, m: ProbeModel, sh, cal: Calibration, mv: float,
                  row: float) -> tuple[int, int, float] | None:
    """(multiply-adds per column, rows, seconds per column) of the narrow weight model's prompts (``sh``: its speed
    shape, as _decode_of read it), or None where it was not prompted (a calibration cached before CAL_VERSION 9)."""
    r = by_step(results, m.key)
    if any(f"pp{n}" not in r for n in MM_N):
        return None
    mats = [g for g in sh.groups if not g.output]
    o_mv = _once_mv(sh, mv, row)
    (n1, t1), (n2, t2) = _prompt_rest(r, sh, cal, o_mv, m.key)
    body = [g.split()[0] for g in mats]
    return sum(g.params for g in body), sum(g.rows for g in body), (t1 - t2) / (n1 - n2)


def _cols_rest(results: Results, m: ProbeModel, sh, cal: Calibration, mv: float,
               row: float, again: str = "") -> dict[str, tuple[int, int, float]]:
    """A weight model's MM_COLS prompts (str(n) -> (bytes, rows, seconds) of its matrices less the last layer's
    feed-forward): each less the graph's nodes at a decode step's cost, the token's own cost, the output head's and
    that feed-forward's one mat-vec and the f16 attention over the prompt; ``again``: the key under which the same
    model was prompted a second time (the narrow one after the wide one: the mean of both is taken, as for its
    decode); {} where the model was not prompted so (a narrow model of a plan before CAL_VERSION 14)."""
    runs = [x for x in (by_step(results, m.key), by_step(results, again) if again else {})
            if all(f"pp{n}" in x for n in MM_COLS)]
    if not runs:
        return {}
    mats = [g for g in sh.groups if not g.output]
    body = [g.split()[0] for g in mats]
    o_mv = _once_mv(sh, mv, row)
    units = sum(lay.n_head * (lay.head_k + lay.head_v) for lay in sh.attn)
    out = {}
    for n in MM_COLS:     # one graph of n tokens: a decode step's nodes, the output head once
        t = sum(median_s(r[f"pp{n}"].ns) for r in runs) / len(runs) - sh.nodes_pp * cal.node_tg_s \
            - cal.token_tg_s - o_mv - _prompt_attn_f16(cal, units, n)
        if t <= 0:
            raise Disturbed(f"of {m.type} weights measured no cost for a {n}-column mat-mul ({m.key})")
        out[str(n)] = (sum(g.bytes for g in body), sum(g.rows for g in body), t)
    return out


def _once_mv(sh, mv: float, row: float) -> float:
    """What a calibration model's prompt computes for its last token only, as one mat-vec: the output head and the
    last layer's feed-forward matrices (WeightGroup.tail_*)."""
    return sum(g.bytes * mv + g.rows * row if g.output else g.tail_bytes * mv + g.tail_rows * row for g in sh.groups)


def _solve_matmul(key: str, wide: tuple[int, int, float], narrow: tuple[int, int, float] | None) -> tuple[float, float]:
    """(seconds per FLOP, seconds per dot product) of a type's mat-mat, from the seconds each prompt column costs on
    the wide and the narrow model (params, rows, seconds per column): slope = 2 x params x c_flop + rows x c_dot.
    ggml-cpu's mat-mat for a type llamafile's sgemm does not take (q4_1, the K-quants unrepacked) is the mat-vec's
    dot product once per row and column (ggml-cpu.c, ggml_compute_forward_mul_mat_one_chunk, 16 x 16 blocks), so a
    narrow model's short rows cost more per FLOP than the wide model's.  As for the mat-vec,
    a dot cost that noise makes negative is zero (the wide model then prices its FLOPs alone)."""
    pw, rw, sw = wide
    if narrow is None:
        return sw / (2.0 * pw), 0.0
    pn, rn, sn = narrow
    det = 2.0 * pw * rn - 2.0 * pn * rw
    dot = (2.0 * pw * sn - 2.0 * pn * sw) / det if det else 0.0
    if dot <= 0:
        return sw / (2.0 * pw), 0.0
    flop = (sw - rw * dot) / (2.0 * pw)
    if flop <= 0:
        raise Disturbed(f"of {key} weights measured dot products that cost more than the wide model's whole prompt")
    return flop, dot


def _decode_rest(r: dict[str, ProbeResult], sh, cal: Calibration) -> float:
    """A weight model's decode time per token (of the tokens its step timed) less what is not its matrices: the
    graph's nodes, the token's own cost and the f16 attention at the decode's mean depth."""
    f16 = kv_key("f16", "f16", "auto")
    n_tokens = int(r["tg"].n)
    return median_s(r["tg"].ns) / n_tokens - sh.nodes_tg * cal.node_tg_s - cal.token_tg_s \
        - attn_units_tg(sh, n_tokens / 2, cal.n_threads, not cal.device) * cal.attn_tg_s.get(f16, 0.0)


def _decode_of(results: Results, m: ProbeModel, feats: list[str], repack: bool, cal: Calibration,
               wide_keys: set[str], again: str = "") -> tuple[Any, float]:
    """(speed shape, decode time of its matrices) of a type's narrow or large weight model, whose matrices the CPU
    backend must hold as it holds the wide model's (``wide_keys``), or the two do not measure the same kernel;
    ``again``: the key under which the same model was timed a second time (the mean of both is taken)."""
    r = by_step(results, m.key)
    sh = probe_shape(m.model_path, r["tg"].graph, feats, repack)
    keys = {g.key for g in sh.groups}
    if keys != wide_keys:
        raise CalibrationError(f"the {m.key} weight model is held as {', '.join(sorted(keys))}, not as "
                               f"{', '.join(sorted(wide_keys))}: it does not time the same kernel")
    ts = [_decode_rest(x, sh, cal) for x in (r, by_step(results, again) if again else {}) if "tg" in x]
    return sh, sum(ts) / len(ts)


def _stream_coefficients(results: Results, m: ProbeModel, more: list[ProbeModel | None], feats: list[str],
                         repack: bool, cal: Calibration, wide_keys: set[str]) -> tuple[float, float]:
    """(seconds per byte, seconds per row) of a type's large weight models' decodes (less their nodes, token and
    attention): the rate llama.cpp streams that type's matrices from memory, or computes them where that is
    slower.  With the narrow and the big large model (``more``; None where a plan lacks one) bytes + rows fitted
    by least squares over all of them (STREAM_BIG_WIDTHS; two models: the exact solve); with none (a plan before
    CAL_VERSION 10) the bytes alone."""
    pts = []
    for x in [m, *(x for x in more if x)]:
        sh, t = _decode_of(results, x, feats, repack, cal, wide_keys)
        if t <= 0:
            raise Disturbed(f"of {m.type} weights' large model {x.key} measured no cost for reading them")
        pts.append((sum(g.bytes for g in sh.groups), sum(g.rows for g in sh.groups), t))
    if len(pts) == 1:
        return pts[0][2] / pts[0][0], 0.0
    return _fit_bytes_rows(f"{m.type} (from memory)", pts)


def _fit_bytes_rows(key: str, pts: list[tuple[int, int, float]]) -> tuple[float, float]:
    """(seconds per byte, seconds per row) fitted by least squares to models' (bytes, rows, seconds), each weighed
    by its own time (relative residuals); a row cost the noise makes negative is zero (the first model's time
    over its bytes, as _solve_bytes_rows)."""

    a = np.array([[b / t, r / t] for b, r, t in pts], dtype=np.float64)
    (per_byte, row), *_ = np.linalg.lstsq(a, np.ones(len(pts)), rcond=None)
    if row <= 0:
        per_byte, row = pts[0][2] / pts[0][0], 0.0
    if per_byte <= 0:
        raise Disturbed(f"of {key} weights measured rows that cost more than a large model's whole decode")
    return float(per_byte), float(row)


def _solve_matvec(key: str, wide: tuple[Any, float], narrow: tuple[Any, float] | None) -> tuple[float, float]:
    """(seconds per byte, seconds per row) of a type's mat-vec: from the wide model alone (no row term: a GPU) or
    from the wide and the narrow model's decodes, t = bytes x c_byte + rows x c_row.  A row cost the machine's noise
    makes negative is zero (the wide model then prices its bytes alone); a byte cost at or below zero is refused."""
    (sw, tw), (sn, tn) = wide, narrow or (None, 0.0)
    return _solve_bytes_rows(key, (sum(g.bytes for g in sw.groups), sum(g.rows for g in sw.groups), tw),
                             (sum(g.bytes for g in sn.groups), sum(g.rows for g in sn.groups), tn) if narrow else None)


def _solve_bytes_rows(key: str, wide: tuple[int, int, float],
                      narrow: tuple[int, int, float] | None) -> tuple[float, float]:
    """(seconds per byte, seconds per row) from a wide and a narrow model's (bytes, rows, seconds): t = bytes x
    c_byte + rows x c_row (:func:`_solve_matvec`)."""
    bw, rw, tw = wide
    if tw <= 0:
        raise Disturbed(f"of {key} weights measured no cost for reading them")
    if narrow is None:
        return tw / bw, 0.0
    bn, rn, tn = narrow
    if tn <= 0:
        raise Disturbed(f"of {key} weights' narrow model measured no cost for reading them")
    det = bw * rn - bn * rw
    row = (bw * tn - bn * tw) / det
    if row <= 0:
        return tw / bw, 0.0
    per_byte = (tw - rw * row) / bw
    if per_byte <= 0:
        raise Disturbed(f"of {key} weights measured rows that cost more than the wide model's whole decode")
    return per_byte, row


def solve_pairs(results: Results, attn: dict[str | None, list[tuple[str, str, str]]], cal: Calibration,
                n_threads: int) -> None:
    """Fill cal's attention coefficients for each geometry's K/V pairs in ``attn`` (on the CPU, a tiled pair's
    coefficients per row of full tiles, each step's own tiles taken out)."""
    dev = cal.device
    for g, ps in attn.items():
        for p in ps:
            k = kv_key(*p, g)
            cal.attn_tg_s[k], cal.attn_pp_s[k] = solve_attn(results, k, n_threads, dev)
            if not tiled_prompt_path(*p, dev):
                continue
            cal.attn_pp_rows_s[k] = solve_attn_rows(results, k, dev)
            if g is not None:
                cal.attn_pp_deep_s[k] = solve_attn_deep(results, k)
            if dev:
                continue
            share = cal.attn_pp_tile_share[k] = solve_tile_share(results, k, n_threads)
            h = geometry_shape(g)["n_head"]
            cal.attn_pp_s[k] /= tile_factor(share, attn_steps(g, True).pp_n, h, n_threads)
            if k in cal.attn_pp_deep_s:
                deep = cal.attn_pp_tile_share_deep[k] = solve_tile_share(results, k, n_threads, deep=True)
                cal.attn_pp_deep_s[k] /= tile_factor(deep, DEEP_PP_N, h, n_threads)


def solve_base(results: Results, cal: Calibration, n_threads: int) -> None:
    """Fill cal's graph-node, token and ubatch costs (less the f16 attention already in ``cal``) and, on the CPU,
    the machine's read bandwidth (measured now, edgekv.machine.bandwidth)."""
    f16, dev = kv_key("f16", "f16", "auto"), cal.device
    (cal.node_tg_s, cal.node_pp_s, cal.token_tg_s, cal.ubatch_pp_s,
     short) = solve_nodes(results, cal.attn_tg_s.get(f16, 0.0), cal.attn_pp_s.get(f16, 0.0),
                          cal.attn_pp_rows_s.get(f16, 0.0))
    cal.node_pp_short_s = 0.0 if dev else short     # a GPU prices nodes at the model's own widths
    if dev:     # the host's bandwidth is not the GPU's, and edgekv has no GPU copy of its own to time
        cal.notes.append(f"roofline: {dev}'s read bandwidth is not measured (no decode bound on a GPU)")
    else:
        cal.bandwidth_bytes_s = read_bandwidth(n_threads)
