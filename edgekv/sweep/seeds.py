"""Depth states handed between the configurations of one sweep: a deeper configuration's fill starts from the state
a shallower one of the same cache left, instead of from an empty cache.

Filling the cache to its depth is most of a default ``edgekv bench`` on a CPU (a quantized cache's prompt is slow
deep in the cache), and the 2K configurations fill, token for token, what the 1K ones of the same cache type
filled before them.  The cache's contents do not change what a decode or a prompt at that depth costs: only how
many cells there are, of which type.  So the 1K configuration of a cache saves its state at its depth (llama.cpp's
own ``llama_state_seq_save_file``), and the 2K one restores it (``llama_state_seq_load_file``) before it fills the
rest.  Every configuration still runs in its own process; the file passes between them, in a folder the sweep
makes under edgekv's home and removes at its end.  The record's ``timing.fill_from`` says how many tokens came
from the state.

Only plain caches (one llama_kv_cache, one sequence) take part, on edgekv's own engine; a state larger than
MAX_STATE_BYTES is not saved (a large model's deep cache would cost more to write than to fill).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from edgekv.core.benchwire import DepthSeed
from edgekv.core.shape import MEMORY_KV
from edgekv.sources.home import edgekv_home
from edgekv.sweep.spec import ENGINE_PYTHON, Case, SweepSpec

MAX_STATE_BYTES = 1 << 30


def seed_key(spec: SweepSpec, case: Case) -> str | None:
    """What a depth state must share to seed ``case``: its cache's types and layout; None when the case takes no
    part (another engine, a cache that is not one plain KV cache, several sequences, no depth)."""
    s = case.settings
    if (spec.engine != ENGINE_PYTHON or spec.model.shape.memory != MEMORY_KV or s.n_parallel
            or s.n_seq_max != 1 or not s.n_depth):
        return None
    return f"{s.type_k}/{s.type_v}/{s.flash_attn}/{s.swa_full}/{s.kv_unified}/{s.n_gpu_layers}"


@dataclass(frozen=True)
class SeedPlan:
    """One case's part: the case whose state it starts from (and that state's tokens), and whether it saves its
    own for a later one."""

    donor: str | None = None
    tokens: int = 0
    save: bool = False


def plan_seeds(spec: SweepSpec, todo: list[Case]) -> dict[str, SeedPlan]:
    """Each case's part, by case key: a case starts from the deepest earlier case of the same cache whose depth is
    below its own (and whose state is not too large to save)."""
    donors: dict[str, tuple[str, int]] = {}
    keys = [seed_key(spec, c) for c in todo]
    for i, case in enumerate(todo):
        if keys[i] is None:
            continue
        per_token = case.prediction.kv_bytes / max(1, case.settings.n_ctx)
        earlier = [c for c, k in zip(todo[:i], keys) if k == keys[i] and c.settings.n_depth < case.settings.n_depth
                   and per_token * c.settings.n_depth <= MAX_STATE_BYTES]
        if earlier:
            best = max(earlier, key=lambda c: c.settings.n_depth)
            donors[case.key] = (best.key, best.settings.n_depth)
    givers = {k for k, _ in donors.values()}
    return {k: SeedPlan(donor=donors[k][0] if k in donors else None, tokens=donors[k][1] if k in donors else 0,
                        save=k in givers) for k in set(donors) | givers}


def seeded_depths(plans: dict[str, SeedPlan]) -> dict[str, int]:
    """The tokens each case's fill starts from, by case key (what the time plan leaves out of its fill)."""
    return {k: p.tokens for k, p in plans.items() if p.tokens}


@dataclass
class DepthSeeds:
    """The sweep's depth states: the file each case saves to, the one it loads, and the folder removed at the end."""

    plans: dict[str, SeedPlan]
    folder: Path | None = None
    saved: dict[str, str] = field(default_factory=dict)      # case key -> its state file, once its run was ok

    def request(self, case: Case) -> DepthSeed | None:
        """The seed for ``case``'s request (None: it fills from an empty cache and keeps nothing)."""
        plan = self.plans.get(case.key)
        if plan is None:
            return None
        load = self.saved.get(plan.donor) if plan.donor else None
        save = str(self._folder() / f"{case.index}.state") if plan.save else None
        if load is None and save is None:
            return None
        return DepthSeed(load=load, tokens=plan.tokens if load else 0, save=save)

    def done(self, case: Case, ok: bool) -> None:
        """After ``case``'s run: its state is kept for the cases it seeds when the run was ok and wrote it."""
        plan = self.plans.get(case.key)
        if plan is None or not plan.save or self.folder is None:
            return
        path = self.folder / f"{case.index}.state"
        if ok and path.is_file():
            self.saved[case.key] = str(path)
        else:
            path.unlink(missing_ok=True)

    def _folder(self) -> Path:
        if self.folder is None:
            root = edgekv_home() / "tmp"
            root.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix=f"seeds-{os.getpid()}-", dir=root))
        return self.folder

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        self.saved.clear()
