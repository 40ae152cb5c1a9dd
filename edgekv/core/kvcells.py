"""Where llama.cpp puts a sequence's tokens in a sliding-window cache, and what a decoded token's attention reads
there (pure: no I/O, no llama_cpp).

A sliding-window cache of ``size`` cells (llama_kv_cache_iswa's size_swa: the window plus a ubatch, padded to 256)
is a ring: llama_kv_cache::find_slot (src/llama-kv-cache.cpp:898-1058) takes, from the cache's head, every cell
that is empty or holds a position the window has already left (``is_masked_swa`` against the sequence's largest
position so far); apply_ubatch (:1097-1185) writes the ubatch there, purges the sequence's positions below the
largest it overwrote, and moves the head past the last cell it wrote.  The attention of a decoded token then runs
over a view of the whole used extent (get_n_kv, :1260: the highest used cell + 1, padded to 256), skipping the
cells the mask hides.  The CPU backend's split-KV path (F16/F32 caches, a view of 512 cells or more:
ggml-cpu/ops.cpp:9490) hands each thread one contiguous chunk of that view, so a token lasts as long as the thread
whose chunk holds the most cells inside the window; after a fill that wrapped, the window's cells sit at one end of
the ring and one thread reads nearly all of them (Gemma 3 at depth 2048: one thread 511 of the 512 cells, where
an even split would give each 256).
"""

from __future__ import annotations

from functools import lru_cache

from edgekv.core.predict import pad


class _Ring:
    """One sequence's cells of a sliding-window cache (standard window: a key at p0 is hidden from p1 once
    p1 - p0 >= n_swa, llama_hparams::is_masked_swa)."""

    def __init__(self, size: int, n_swa: int):
        self.pos = [-1] * size
        self.size, self.n_swa = size, n_swa
        self.head = 0
        self.used = 0
        self.max_pos = -1

    def place(self, p0: int, n: int) -> None:
        """A ubatch of positions p0 .. p0 + n - 1 (find_slot without contiguity, then apply_ubatch)."""
        size, pos = self.size, self.pos
        head = 0 if self.head > self.used + 2 * n else self.head
        idxs: list[int] = []
        tested = 0
        while len(idxs) < n:
            if head >= size:
                tested += size - head
                head = 0
                continue
            q = pos[head]
            if q < 0 or self.max_pos + 1 - q >= self.n_swa:
                idxs.append(head)
            head += 1
            tested += 1
            if len(idxs) < n and tested >= size:
                raise ValueError(f"no room for {n} tokens in a sliding-window cache of {size} cells")
        max_rm = -1
        for i, idx in enumerate(idxs):
            if pos[idx] >= 0:
                max_rm = max(max_rm, pos[idx])
                self.used -= 1
            pos[idx] = p0 + i
            self.used += 1
        self.max_pos = max(self.max_pos, p0 + n - 1)
        if max_rm >= 0:       # the sequence keeps no position below one it overwrote
            lo = min(q for q in pos if q >= 0)
            if lo <= max_rm:
                for i, q in enumerate(pos):
                    if lo <= q <= max_rm:
                        pos[i] = -1
                        self.used -= 1
        self.head = idxs[-1] + 1

    def restore(self) -> None:
        """The sequence saved and loaded back (llama_state_seq_get_data / set_data, as llama-bench and edgekv bench
        bring the cache back to its depth before each timed run): state_write (src/llama-kv-cache.cpp:2065-2110)
        writes the occupied cells in index order, less those the window has left as seen from the sequence's
        largest position; state_read_meta places them by find_slot in an emptied cache, from cell 0 on, and the
        head ends past them."""
        kept = [q for q in self.pos if q >= 0 and self.max_pos - q < self.n_swa]
        self.pos = kept + [-1] * (self.size - len(kept))
        self.head = self.used = len(kept)

    def view(self) -> int:
        """Cells the attention runs over (get_n_kv: the used extent padded to 256, at most the cache)."""
        top = max((i for i, q in enumerate(self.pos) if q >= 0), default=-1) + 1
        return min(self.size, max(256, pad(top)))

    def read(self, p: int, n_threads: int, split: bool, dense: bool = False) -> int:
        """Cells inside the window of a query at ``p`` that the slowest thread reads, times the threads (split-KV),
        or all of them (one query head per task, each over the whole view); ``dense`` (no flash attention: a
        matrix product and a softmax over the whole view, the masked cells too) the view."""
        n_kv = self.view()
        if dense:
            return n_kv
        inside = [q >= 0 and p - q < self.n_swa for q in self.pos]
        if not split or n_kv < 512:
            return sum(inside[:n_kv])
        nth = max(1, n_threads)
        chunk = -(-n_kv // nth)
        return nth * max(sum(inside[t * chunk:min(n_kv, (t + 1) * chunk)]) for t in range(nth))


@lru_cache(maxsize=256)
def swa_decode_cells(size: int, n_swa: int, fill: tuple[int, ...], n_gen: int, n_threads: int, split: bool,
                     restored: bool = True, dense: bool = False) -> float:
    """The mean over ``n_gen`` decoded tokens of the cells one sliding-window layer's attention reads (as
    :func:`edgekv.core.speed.decode_cells` counts them: the slowest thread's, times the threads, on the split-KV
    path), after a prompt filled the cache in ubatches of ``fill`` tokens from position 0 and (``restored``, as
    llama-bench's tg at depth) the sequence was saved and loaded back (``dense``: no flash attention, whose products
    run over the whole view)."""
    ring = _Ring(size, n_swa)
    p = 0
    for n in fill:
        ring.place(p, n)
        p += n
    if restored:
        ring.restore()
    total = 0
    for j in range(max(1, n_gen)):
        ring.place(p + j, 1)
        total += ring.read(p + j, n_threads, split, dense)
    return total / max(1, n_gen)
