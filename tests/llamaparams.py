"""Model parameters for tests that call llama-cpp-python directly (an independent reference)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def preflight_model_params():
    """llama_cpp.Llama() has no use_extra_bufts argument: while this block runs, the model parameters it starts from
    carry the extra-buffer preflight's setting (off where llama.cpp's AMX kernels crash: issue 25), so a test's
    independent reference runs on such a machine too."""
    import llama_cpp.llama_cpp as C

    from edgekv.calibration.preflight import preflight

    repack = preflight().repack
    orig = C.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = repack
        return p

    C.llama_model_default_params = params
    try:
        yield
    finally:
        C.llama_model_default_params = orig
