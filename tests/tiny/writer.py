"""The tiny-GGUF writer lives in tools/gguf_writer.py (tools/ uses it too); the tests import it from here."""

from tools.gguf_writer import TENSOR_TYPES, add_kv, tensor_nbytes, write_gguf, write_spec  # noqa: F401
