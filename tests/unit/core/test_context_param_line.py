"""llama.cpp's context-parameter line (``llama_context: n_ctx = 4096``) has one reader, edgekv.core.llamalog's
context_param: the memory log and the explain configuration read it the same way, for every prefix llama.cpp has
printed it with."""

from __future__ import annotations

import pytest

from edgekv.core.llamalog import context_param, parse_memory_log
from edgekv.core.logconfig import parse_config

LINES = [
    ("llama_context: n_ctx         = 4096", ("n_ctx", "4096")),
    ("llama_context: n_ctx_seq     = 2048", ("n_ctx_seq", "2048")),
    ("0.00.040.639 I llama_init_from_model: n_ctx_per_seq = 512", ("n_ctx_per_seq", "512")),
    ("llama_new_context_with_model: flash_attn = 0", ("flash_attn", "0")),
    ("llama_context: flash_attn    = auto", ("flash_attn", "auto")),
    ("llama_context: n_rs_seq      = 0", ("n_rs_seq", "0")),
    ("llama_context: offload_kqv   = 1", ("offload_kqv", "1")),
]


@pytest.mark.parametrize(("line", "want"), LINES)
def test_each_prefix_and_parameter_is_read(line, want):
    assert context_param(line) == want


@pytest.mark.parametrize("line", ["llama_context: n_ctx_train = 8192", "llama_context:        CPU  output buffer "
                                  "size =     0.49 MiB", "print_info: n_ctx_train = 8192", ""])
def test_other_lines_are_not_a_context_parameter(line):
    assert context_param(line) is None


def test_the_memory_log_and_the_explain_configuration_agree():
    once = [(line, kv) for line, kv in LINES if "flash_attn = 0" not in line]     # one line per parameter
    lines = [line for line, _ in once]
    want = dict(kv for _, kv in once)
    assert len(want) == len(once)
    assert parse_memory_log(lines).context == want
    assert parse_config(lines).context == want
