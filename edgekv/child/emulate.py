"""A testing aid: this child behaves like a CPU whose extra-buffer kernels crash (llama.cpp #20824: on some Intel
AMX machines every decode of 2 or more tokens with the AMX buffer ends in SIGSEGV).

With ``EDGEKV_EMULATE_EXTRA_BUFT_CRASH=1`` in the environment, a child that loaded its model with the extra buffer
types on (``use_extra_bufts``, llama-bench's ``--repack 1``) kills itself with SIGSEGV on its first decode of two or
more tokens, as such a machine does; with them off it runs as usual.  So the suite runs every path a crash machine
takes (the preflight's verdict, the fallback to ``--repack 0``, the child's death) on any CPU.  Nothing else reads
the variable.
"""

from __future__ import annotations

import os
import signal

from edgekv import heavy
from edgekv.runtime.childside import EMULATE_CRASH_ENV


def install() -> None:
    """Wrap llama.cpp's model load and decode in this process when the variable asks for it."""
    if os.environ.get(EMULATE_CRASH_ENV) != "1":
        return
    llama_cpp = heavy.llama_cpp()
    C = llama_cpp.llama_cpp

    extra = [False]
    load, decode = C.llama_model_load_from_file, C.llama_decode

    def load_model(path, params):
        extra[0] = bool(getattr(params, "use_extra_bufts", True))
        return load(path, params)

    def decode_batch(ctx, batch):
        if extra[0] and batch.n_tokens >= 2:
            os.kill(os.getpid(), signal.SIGSEGV)
        return decode(ctx, batch)

    for mod in (C, llama_cpp):
        vars(mod).update(llama_model_load_from_file=load_model, llama_decode=decode_batch)
