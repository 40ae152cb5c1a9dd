"""The heavy third-party modules, each imported on first use through its one accessor here.

Every other import sits at its module's top (tests/checks/test_layers.py).  These wait because loading them would cost
every command its start-up (tests/checks/test_startup.py checks by name that ``import edgekv.cli.main`` loads none of
them), and llama_cpp for one more reason: a measured child loads it before numpy (edgekv.runtime.process), and a
parent never loads it at all.  numpy is not here: gguf, which reads every model's header, imports it anyway.
"""

from __future__ import annotations

from types import ModuleType


def llama_cpp() -> ModuleType:
    """llama-cpp-python: llama.cpp in this process (the children that run it, edgekv.child and edgekv.runtime.engine).
    An ImportError here is the child's to report: a missing or broken llama-cpp-python."""
    import llama_cpp

    return llama_cpp


def huggingface_hub() -> ModuleType:
    """huggingface_hub with the submodules edgekv uses (``errors``, ``utils``, ``constants``): downloads, the
    Hugging Face cache and its settings."""
    import huggingface_hub
    import huggingface_hub.constants
    import huggingface_hub.errors
    import huggingface_hub.utils

    return huggingface_hub


def httpx2() -> ModuleType:
    """httpx2: HTTP to a llama-server and to remote files."""
    import httpx2

    return httpx2


def scipy_stats() -> ModuleType:
    """scipy.stats: the Student t intervals and Welch's test of a sweep's samples."""
    from scipy import stats

    return stats


def pandas() -> ModuleType:
    """pandas: ``edgekv.results_frame`` for notebooks."""
    import pandas

    return pandas


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (files only, no display): the report's plots."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot

    return matplotlib.pyplot
