"""Feeding tokens to a llama.cpp context inside a child: the prompt and generation loops that the measured run
(edgekv.child.bench_child) and the speed probe (edgekv.child.speedprobe) share."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from typing import Any


class TokenRunner:
    """Random tokens from a seeded generator fed to a llama.cpp context as llama-bench feeds them: prompts in
    ``n_batch`` chunks (BOS first where the vocabulary adds it), generation one token at a time, each synchronised;
    ``threads``: (the timed thread count, the untimed fills')."""

    def __init__(self, L, ctx, n_batch: int, n_vocab: int, add_bos: bool, bos: int, rng: random.Random,
                 threads: tuple[int, int] | None = None):
        self.L, self.ctx, self.n_batch, self.n_vocab = L, ctx, n_batch, n_vocab
        self.add_bos, self.bos, self.rng = add_bos, bos, rng
        self.gen_batch = L.llama_batch_init(1, 0, 1)
        # (the timed thread count, the untimed fills'): a calibration fills its caches on every core it may use
        self.threads = threads
        self.filled_on: int | None = None     # the thread count llama.cpp held during the last fill at fill threads

    @contextlib.contextmanager
    def filling(self) -> Iterator[None]:
        """Untimed work (a calibration's cache fill) at the fill thread count, then back to the timed one."""
        t = self.threads
        if not t or t[1] == t[0]:
            yield
            return
        self.L.llama_set_n_threads(self.ctx, t[1], t[1])
        self.filled_on = int(self.L.llama_n_threads_batch(self.ctx))
        try:
            yield
        finally:
            self.L.llama_set_n_threads(self.ctx, t[0], t[0])

    def prompt_chunks(self, n: int) -> list[tuple[Any, int]]:
        """Random tokens for a prompt of n tokens in n_batch chunks; BOS first like llama-bench."""
        chunks, done = [], 0
        while done < n:
            k = min(n - done, self.n_batch)
            arr = (self.L.llama_token * k)(*[self.rng.randrange(self.n_vocab) for _ in range(k)])
            if done == 0 and self.add_bos:
                arr[0] = self.bos
            chunks.append((arr, k))
            done += k
        return chunks

    def run_prompt(self, chunks) -> None:
        L = self.L
        for arr, k in chunks:
            rc = L.llama_decode(self.ctx, L.llama_batch_get_one(arr, k))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} while processing a prompt batch"
                                   + (" (the KV cache is full)" if rc == 1 else ""))
        L.llama_synchronize(self.ctx)

    def gen_tokens(self, n: int) -> list[int]:
        toks = [self.rng.randrange(self.n_vocab) for _ in range(n)]
        if n and self.add_bos:
            toks[0] = self.bos
        return toks

    def run_gen(self, toks: list[int], pos0: int) -> None:
        L, b, ctx = self.L, self.gen_batch, self.ctx
        b.n_tokens = 1
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = 0
        b.logits[0] = 1
        pos = pos0
        for t in toks:
            b.token[0] = t
            b.pos[0] = pos
            pos += 1
            rc = L.llama_decode(ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} while generating"
                                   + (" (the KV cache is full)" if rc == 1 else ""))
            L.llama_synchronize(ctx)

    def close(self) -> None:
        self.L.llama_batch_free(self.gen_batch)


class SeqBatch:
    """A llama_batch of tokens spread over sequences, filled before the clock starts (llama-batched-bench's
    ``common_batch``): ``add`` appends one token of one sequence, ``decode`` runs it."""

    def __init__(self, L, ctx, capacity: int, n_seq: int):
        self.L, self.ctx = L, ctx
        self.b = L.llama_batch_init(capacity, 0, n_seq)
        self.b.n_tokens = 0

    def clear(self) -> None:
        self.b.n_tokens = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> None:
        b, i = self.b, self.b.n_tokens
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, int(logits)
        b.seq_id[i][0] = seq
        b.n_tokens = i + 1

    def decode(self, what: str) -> None:
        rc = self.L.llama_decode(self.ctx, self.b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} while {what}" + (" (the KV cache is full)" if rc == 1 else ""))

    def free(self) -> None:
        self.L.llama_batch_free(self.b)


def seq_tokens(L, runner: TokenRunner, seq: int, pos0: int, n: int, one_by_one: bool) -> list[SeqBatch]:
    """``n`` random tokens of sequence ``seq`` from position ``pos0``: batches of at most n_batch tokens (a prompt,
    logits for its last token) or (``one_by_one``) one token each (generation, logits for each)."""
    out: list[SeqBatch] = []
    for i in range(n):
        if one_by_one or not out or out[-1].b.n_tokens == runner.n_batch:
            out.append(SeqBatch(L, runner.ctx, 1 if one_by_one else min(runner.n_batch, n - i), 1))
        out[-1].add(runner.rng.randrange(runner.n_vocab), pos0 + i, seq, one_by_one or i == n - 1)
    return out


def decode_timed(L, ctx, batches: list[SeqBatch], what: str) -> int:
    """The batches decoded, each synchronised (a generated token waits for the one before), in nanoseconds; then
    freed."""
    t0 = time.perf_counter_ns()
    for b in batches:
        b.decode(what)
        L.llama_synchronize(ctx)
    dt = time.perf_counter_ns() - t0
    for b in batches:
        b.free()
    return dt
