"""The speed calibration: this machine's coefficients for :mod:`edgekv.core.speed`, measured through the llama.cpp
edgekv drives (llama-cpp-python in one child process, or the user's own llama-bench: edgekv.calibration.lbprobe),
cached under ``EDGEKV_HOME/calibration/`` keyed by the environment fingerprint (for llama-bench: that binary), the
thread count and the ``--repack`` setting, re-measured when any of them changes.

What it measures, each on models edgekv writes itself (:func:`edgekv.sources.tinymodel.plan_model`; nothing
of the user's model is needed), whose weights are values like a trained model's, not zeros (llama.cpp's x86 kernels
convert every block's fp16 scales through a lookup table, and a model of zeros decodes measurably faster):

* the fixed cost of a graph node: decode and a 512-token prompt on two narrow models (n_embd 64) of 2 and 34
  layers; the time difference over llama.cpp's own node-count difference (its ``graph: nodes = ...`` line);
* per K/V cache type pair and flash-attention setting, the attention cost per head x head dim x cell: decode at
  two depths and prompts at two depths, shallow-deep-shallow (:func:`plans.attn_plan`), on a 12-layer model with 8
  query and 2 KV heads, and on a few layers of each model's own head geometry (:func:`plans.attn_steps`);
* per weight type (as the CPU backend holds it: repacked or not, the rules of core/memmodel), the mat-vec cost
  per byte (decode) and the mat-mat cost per byte streamed and per FLOP (prompts of 256 and 32 tokens) on a
  model of 24-64 MB of matrices of that type; on the CPU also the mat-vec's cost per row and the mat-mat's per dot
  product, from a second model of about the same bytes in rows half as long, and the rate llama.cpp streams the type
  from memory, from the decodes of models far larger than the caches;
* the machine's read bandwidth, independently (:func:`edgekv.machine.bandwidth.read_bandwidth`), for the roofline.

Types a model needs and the calibration lacks are measured on demand (a few seconds each), never guessed.  A
calibration taken while other work used the CPUs is refused (not cached), and says so.

The modules: :mod:`.plans` (what is timed), :mod:`.run` (the runner seam and its probes), :mod:`.solve` (timings
to coefficients), :mod:`.store` (the cache and the drift sentinel), :mod:`.bundle` (export and import for CI),
:mod:`.orchestrate` (:func:`calibrate`).  The probe protocol is :mod:`edgekv.core.probe`.
"""

from __future__ import annotations

from edgekv.calibration.speedcal.bundle import export_calibrations, import_calibrations
from edgekv.calibration.speedcal.errors import (
           SPEED_CALIBRATE_ENV,
           CalibrationError,
           CalibrationTimeout,
           Disturbed,
           PartlyMeasured,
           auto_measure,
)
from edgekv.calibration.speedcal.orchestrate import SpeedCalibration, calibrate
from edgekv.calibration.speedcal.plans import (
           attn_plan,
           base_plan,
           body_plan,
           context,
           deep_plan,
           step,
           weight_plan,
           weight_shape,
)
from edgekv.calibration.speedcal.run import Runner, child_runner, llama_bench_runner
from edgekv.calibration.speedcal.solve import solve_attn, solve_bodies, solve_nodes, solve_vocab, solve_weights
from edgekv.calibration.speedcal.store import CAL_VERSION, DRIFT_LIMIT, DRIFT_RECHECK_S, cached, runtime_name

__all__ = ["CAL_VERSION", "DRIFT_LIMIT", "DRIFT_RECHECK_S", "SPEED_CALIBRATE_ENV", "CalibrationError",
           "CalibrationTimeout", "Disturbed", "PartlyMeasured", "Runner", "SpeedCalibration", "attn_plan",
           "auto_measure", "base_plan", "body_plan", "cached", "calibrate", "child_runner", "context", "deep_plan",
           "export_calibrations", "import_calibrations", "llama_bench_runner", "runtime_name", "solve_attn",
           "solve_bodies", "solve_nodes", "solve_vocab", "solve_weights", "step", "weight_plan", "weight_shape"]
