"""The small children's protocols: what edgekv asks the dry-run session and the probes
(``python -m edgekv.child.worker engine|env|preflight|device_runtime|extra_buffers``) and what the dry-run session
and ``env`` reply.

Shared by the parent sides (edgekv.runtime.engine's EngineSession, edgekv.machine.environment,
edgekv.calibration.preflight and .baseline, edgekv.prediction.crosscheck) and the child (edgekv.child.dryrun_child,
edgekv.child.workload), as edgekv.core.benchwire is for the measured run.  A request crosses as JSON on the child's
stdin (the dry-run session: one per line, told apart by its ``op``) and is decoded strictly on arrival
(msgspec.ValidationError when it is not one).
"""

from __future__ import annotations

import msgspec

from edgekv.core.llamalog import LlamaMemoryLog
from edgekv.core.predict import ContextParams
from edgekv.core.wire import decoder
from edgekv.core.wire import to_wire as to_wire


class _Op(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="op"):
    """A request of the dry-run session; its ``op`` says which."""


class EngineLoad(_Op, tag="load"):
    """Load the model for dry runs (no weights allocated)."""

    model_path: str
    n_gpu_layers: int = -1
    use_extra_bufts: bool = True
    graph_listing: bool = True       # the scheduler's node listing (speed and op placement); off: memory only


class EngineContexts(_Op, tag="contexts"):
    """llama.cpp's figures for each context; ``n_outputs_max`` > 0 reserves the graph for that many outputs."""

    configs: list[ContextParams]
    keep_log: bool = False
    n_outputs_max: int = 0


class EngineQuit(_Op, tag="quit"):
    """End the session."""


EngineRequest = EngineLoad | EngineContexts | EngineQuit


def engine_request_from(payload: object) -> EngineRequest:
    """A dry-run session's request, told by its ``op`` (msgspec.ValidationError when it is not one)."""
    req: EngineRequest = msgspec.convert(payload, EngineRequest)
    return req


class EngineLoaded(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The dry-run session's reply to EngineLoad: llama.cpp's model size, parameters, model buffers (MiB by buffer)
    and offloaded layers, and what the process grew by while it loaded; ``ok`` False: why, and llama.cpp's error
    lines."""

    ok: bool
    error: str | None = None
    errors: list[str] = []
    model_size_bytes: int | None = None
    n_params: int | None = None
    model_buffers_mib: dict[str, float] = {}
    gpu_layers: tuple[int, int] | None = None
    host_growth_load_bytes: int | None = None


class EngineContext(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """llama.cpp's answer for one context of EngineContexts: its memory lines parsed, the sizes it chose, the
    first context's host growth less its output buffer (the session's figure), why it failed, its raw lines
    (``keep_log``)."""

    ok: bool
    log: LlamaMemoryLog
    n_outputs_max: int = 0
    host_growth_context_less_output_bytes: int | None = None
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_seq_max: int | None = None
    error: str | None = None
    raw_log: list[str] | None = None


class EngineContextsReply(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The dry-run session's reply to EngineContexts: one EngineContext per configuration, in order."""

    results: list[EngineContext]


class PreflightRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The extra-buffer preflight's probe model, and its threads (0: llama.cpp's default)."""

    model_path: str
    n_threads: int = 0


class DeviceRuntimeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The GPU runtime probe: a model with every layer offloaded, a context, a prompt batch of ``n_ubatch``
    tokens, then ``n_decode`` single-token decodes (``type_v`` None: ``type_k``'s)."""

    model_path: str
    n_ubatch: int = 512
    n_ctx: int = 1024
    type_k: str = "f16"
    type_v: str | None = None
    flash_attn: str = "auto"
    n_decode: int = 16


class ExtraBuffersRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A real load of a model, to read llama.cpp's sizes of its extra buffers (``repack``: with them on)."""

    model_path: str
    repack: bool = True


class GgmlDevice(msgspec.Struct, kw_only=True):
    """A ggml device: its name, description, type (cpu, gpu, igpu, accel, meta, ?) and memory."""

    name: str
    description: str
    type: str
    memory_total: int
    memory_free: int


class EnvInfo(msgspec.Struct, kw_only=True):
    """The llama.cpp build's side of the environment (``env``): its backends and devices (None where ggml's
    library was not found), its system-info line and whether it can offload to a GPU."""

    backends: list[str] | None = None
    devices: list[GgmlDevice] | None = None
    system_info: str | None = None
    supports_gpu_offload: bool | None = None


engine_loaded_from = decoder(EngineLoaded)
engine_contexts_from = decoder(EngineContextsReply)
preflight_request_from = decoder(PreflightRequest)
device_runtime_request_from = decoder(DeviceRuntimeRequest)
extra_buffers_request_from = decoder(ExtraBuffersRequest)
env_info_from = decoder(EnvInfo)
