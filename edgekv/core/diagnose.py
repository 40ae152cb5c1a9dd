"""Why a measuring process died, and what a run's exit status is: pure decisions, no I/O.

A child that dies leaves what the parent saw: the last phase it announced, the signal or exit code, whether the
parent's deadline ran out, the last llama.cpp log lines it forwarded, and whether the kernel's OOM-kill counter
rose meanwhile.  :func:`diagnose` turns that into the phase in the user's words and a known cause where one is
recognised:

* ``amx-crash``: SIGSEGV while running a batch of 2 or more tokens with an AMX weight buffer in the load log --
  llama.cpp's AMX matrix kernels crash on some AMX CPUs (llama.cpp #20824, open; docs/hardware.md);
* ``oom-kill``: SIGKILL and the kernel's ``oom_kill`` counter rose while the child ran (never claimed without it);
* ``timeout``: the parent stopped it at its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the child's phase names (edgekv.child.workload) -> what the user reads
PHASE_WORDS = {
    "start": "start-up", "import": "load", "load": "load", "context": "context", "warmup": "warm-up",
    "fill": "prompt at depth", "pp": "prompt", "tg": "generate", "snapshot": "depth state save",
    "restore": "depth state restore", "quality": "quality pass", "llama-bench pp": "prompt (llama-bench)",
    "llama-bench tg": "generate (llama-bench)",
}
# phases whose llama_decode calls carry batches of more than one token (given a prompt of 2+ tokens)
MULTI_TOKEN_PHASES = {"warmup", "fill", "pp", "llama-bench pp", "quality"}
AMX_BUFFER_MARK = "AMX model buffer size"
AMX_ISSUE = "llama.cpp #20824"


@dataclass
class Diagnosis:
    phase: str | None                 # in the user's words (PHASE_WORDS), None when unknown
    signal: str | None                # e.g. "SIGSEGV"
    exit_code: int | None
    timed_out: bool
    cause: str | None                 # amx-crash | oom-kill | timeout | None
    cause_text: str | None
    log_tail: list[str] = field(default_factory=list)
    last_error: str | None = None     # the process's own last error line on stderr (an assert, an exception)

    def line(self) -> str:
        """One line: where, how, and the known cause (or the last llama.cpp line)."""
        how = ("timed out" if self.timed_out else f"died with {self.signal}" if self.signal else
               f"exited with code {self.exit_code}")
        out = f"{how} in {self.phase}" if self.phase else how
        if self.cause_text:
            return f"{out}: {self.cause_text}"
        if self.last_error:
            return f"{out}: {self.last_error[:300]}"
        last = next((x for x in reversed(self.log_tail) if x.strip()), None)
        return f"{out}; last llama.cpp line: {last.strip()[:200]}" if last else out


def diagnose(phase: str | None, sig: str | None, exit_code: int | None, timed_out: bool, log_tail: list[str],
             n_prompt: int | None = None, oom_kills_rose: bool = False, load_log: list[str] | None = None,
             last_error: str | None = None, multi_token: bool | None = None) -> Diagnosis:
    """The diagnosis of one dead child (see the module docstring).  ``load_log``: lines that may hold the AMX
    buffer line when the tail no longer does (llama-bench's whole stderr).  ``sig``: the signal's name (SIGSEGV).
    ``multi_token``: whether the phase ran batches of 2+ tokens, when the phase name cannot say (llama-bench fills
    its depth with prompt batches in its generation test too)."""
    name = sig
    words = PHASE_WORDS.get(phase or "", phase) if phase else None
    cause = text = None
    amx = any(AMX_BUFFER_MARK in x for x in list(log_tail) + list(load_log or []))
    multi = multi_token if multi_token is not None else (
        phase in MULTI_TOKEN_PHASES and (n_prompt is None or n_prompt >= 2))
    if timed_out:
        cause, text = "timeout", "stopped at the --timeout deadline"
    elif sig == "SIGSEGV" and amx and multi:
        cause, text = "amx-crash", f"llama.cpp's AMX kernels crash on this CPU ({AMX_ISSUE}): rerun with --repack 0"
    elif sig == "SIGKILL" and oom_kills_rose:
        cause, text = "oom-kill", "killed by the kernel's OOM killer (out of memory)"
    return Diagnosis(words, name, exit_code, timed_out, cause, text, [x for x in log_tail if x.strip()][-8:],
                     last_error or None)


def exit_status(new_statuses: list[str], n_ok_total: int) -> tuple[int, str | None]:
    """``edgekv bench``/``quality`` exit status: 0 only when every configuration this run started produced a
    measurement; 1 when any of them failed, or when nothing at all was measured (``n_ok_total`` counts the results
    file's earlier ok records too); configurations skipped on purpose fail the run only in that last case.  The
    second value is the closing line's reason (None for 0)."""
    failed = sum(1 for s in new_statuses if s not in ("ok", "skipped"))
    started = sum(1 for s in new_statuses if s != "skipped")
    if failed:
        return 1, f"{failed} of {started} configuration{'s' if started != 1 else ''} failed"
    if n_ok_total == 0:
        skipped = sum(1 for s in new_statuses if s == "skipped")
        return 1, ("nothing was measured" + (f" ({skipped} configuration{'s' if skipped != 1 else ''} skipped)"
                                             if skipped else ""))
    return 0, None
