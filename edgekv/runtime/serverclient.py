"""The HTTP client that drives a ready ``llama-server``: its ``/props`` and timed, streamed ``/completion`` requests.

The client sends ``/completion`` requests whose prompts are random token ids, at most ``concurrency`` at a time,
streams each answer (server-sent events) and times every token as it arrives.  Only 127.0.0.1 is ever contacted,
and never through a proxy (``trust_env=False``).  :mod:`edgekv.runtime.server` starts the server.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from edgekv import heavy
from edgekv.errors import EngineError, RunFailed, UsageError

LOCALHOST = "127.0.0.1"


def check_local(base_url: str) -> str:
    """``base_url`` without a trailing slash, refused unless it is plain http on 127.0.0.1."""
    u = urlsplit(base_url)
    if u.scheme != "http" or u.hostname != LOCALHOST or u.port is None:
        raise UsageError(f"only http://{LOCALHOST}:PORT is contacted (got '{base_url}')")
    return base_url.rstrip("/")


def one_line(e: BaseException) -> str:
    """An exception's message on one line, at most 300 characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


# -- what the server says about itself -----------------------------------------------------------------------

@dataclass
class ServerProps:
    n_ctx_slot: int | None         # each slot's context (GET /props default_generation_settings.n_ctx)
    total_slots: int | None        # -np
    n_vocab: int | None            # GET /v1/models meta.n_vocab (None when this server does not say)
    n_ctx_train: int | None
    model_path: str | None
    build_info: str | None
    props: dict[str, Any] = field(default_factory=dict, repr=False)   # /props as the server sent it


def fetch_props(base_url: str, timeout_s: float = 10.0) -> ServerProps:
    """``GET /props`` and ``GET /v1/models`` of a ready server."""
    httpx2 = heavy.httpx2()

    url = check_local(base_url)
    try:
        with httpx2.Client(trust_env=False, timeout=httpx2.Timeout(timeout_s)) as client:
            props = client.get(f"{url}/props").raise_for_status().json()
            models = client.get(f"{url}/v1/models").raise_for_status().json()
    except (httpx2.HTTPError, ValueError) as e:
        raise EngineError(f"llama-server at {url} did not answer /props: {one_line(e)}") from None
    meta = next((m.get("meta") or {} for m in models.get("data") or [] if isinstance(m, dict)), {})
    gen = props.get("default_generation_settings") or {}
    return ServerProps(n_ctx_slot=gen.get("n_ctx"), total_slots=props.get("total_slots"), n_vocab=meta.get("n_vocab"),
                       n_ctx_train=meta.get("n_ctx_train"), model_path=props.get("model_path"),
                       build_info=props.get("build_info"), props=props)


# -- the client ------------------------------------------------------------------------------------------------

@dataclass
class RequestResult:
    """One timed ``/completion`` request.  Times are seconds from the level's first send."""

    index: int
    ok: bool
    reason: str | None             # why it failed, one line
    n_prompt: int                  # prompt tokens sent
    n_tokens: int                  # generated tokens (the server's count, tokens_predicted)
    n_chunks: int                  # stream events that carried a generated token
    t_send_s: float
    t_end_s: float
    ttft_s: float | None           # send -> the first event carrying a generated token
    decode_tps: float | None       # (tokens after the first) / (last token's time - first token's time)
    timings: dict[str, Any] | None = None   # the server's own "timings" of its final event, as sent
    stop_type: str | None = None
    truncated: bool | None = None
    arrivals: list[tuple[float, int]] = field(default_factory=list)   # (s from the level's first send, tokens so far)


@dataclass
class LevelResult:
    """All requests of one concurrency level."""

    concurrency: int
    requests: list[RequestResult]
    wall_s: float                  # first send -> last completion

    @property
    def n_failed(self) -> int:
        return sum(not r.ok for r in self.requests)

    @property
    def generated_tokens(self) -> int:
        return sum(r.n_tokens for r in self.requests if r.ok)

    @property
    def tokens_per_s(self) -> float | None:
        """Aggregate generation speed: generated tokens of the requests that succeeded / the level's wall time."""
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else None


class AllRequestsFailed(RunFailed):
    """Every request of a level failed; ``level`` holds them with their reasons."""

    def __init__(self, message: str, level: LevelResult):
        super().__init__(message)
        self.level = level


class _RequestError(Exception):
    pass


@dataclass
class _Stream:
    """What one streamed answer said so far."""

    t_send: float
    n_chunks: int = 0
    n_tokens: int = 0
    t_first: float | None = None
    n_first: int = 0
    t_last: float | None = None
    final: dict[str, Any] | None = None
    arrivals: list[tuple[float, int]] = field(default_factory=list)   # (time, tokens received by then)

    def on_event(self, chunk: dict[str, Any], now: float) -> None:
        if chunk.get("tokens"):       # an incomplete UTF-8 character is held back and sent with the next token
            self.n_chunks += 1
            self.n_tokens = int(chunk.get("tokens_predicted") or self.n_tokens + len(chunk["tokens"]))
            if self.t_first is None:
                self.t_first, self.n_first = now, self.n_tokens
            self.t_last = now
            self.arrivals.append((now, self.n_tokens))
        if chunk.get("stop"):
            self.final = chunk
            self.n_tokens = int(chunk.get("tokens_predicted") or self.n_tokens)

    def result(self, index: int, n_prompt: int, t0: float, t_end: float, reason: str | None) -> RequestResult:
        tps = None
        if self.t_first is not None and self.t_last is not None and self.t_last > self.t_first:
            tps = (self.n_tokens - self.n_first) / (self.t_last - self.t_first)
        fin = self.final or {}
        return RequestResult(
            index=index, ok=reason is None, reason=reason, n_prompt=n_prompt, n_tokens=self.n_tokens,
            n_chunks=self.n_chunks, t_send_s=self.t_send - t0, t_end_s=t_end - t0,
            ttft_s=None if self.t_first is None else self.t_first - self.t_send, decode_tps=tps,
            timings=fin.get("timings"), stop_type=fin.get("stop_type"), truncated=fin.get("truncated"),
            arrivals=[(t - t0, n) for t, n in self.arrivals])


def completion_payload(prompt: list[int], n_gen: int, seed: int) -> dict[str, Any]:
    """The ``/completion`` request: token ids in, exactly ``n_gen`` tokens out, the cheapest sampling."""
    return {"prompt": prompt, "n_predict": n_gen, "ignore_eos": True, "cache_prompt": False, "stream": True,
            "samplers": ["top_k"], "top_k": 1, "temperature": 0.0, "seed": seed}


async def _stream_completion(client, payload: dict[str, Any], rec: _Stream) -> None:
    async with client.sse("/completion", method="POST", json=payload) as es:
        if es.response.status_code != 200:
            body = (await es.response.aread()).decode("utf-8", "replace")
            raise _RequestError(f"HTTP {es.response.status_code}: {_error_message(body)}")
        async for ev in es:
            if ev.data.strip() == "[DONE]":
                break
            chunk = json.loads(ev.data)
            now = time.perf_counter()
            if isinstance(chunk, dict) and "error" in chunk:
                raise _RequestError(_error_message(ev.data))
            rec.on_event(chunk, now)
            if rec.final is not None:
                return
    raise _RequestError(f"the stream ended without a final event ({rec.n_tokens} tokens received)")


def _error_message(body: str) -> str:
    try:
        err = json.loads(body).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        msg = None
    return " ".join(str(msg or body).split())[:300] or "no body"


async def _timed_request(client, index: int, prompt: list[int], n_gen: int, seed: int, timeout_s: float,
                         t0: float) -> RequestResult:
    httpx2 = heavy.httpx2()

    rec = _Stream(t_send=time.perf_counter())
    reason = None
    try:
        await asyncio.wait_for(_stream_completion(client, completion_payload(prompt, n_gen, seed), rec), timeout_s)
    except asyncio.TimeoutError:
        reason = f"no complete answer within {timeout_s:g} s ({rec.n_tokens} of {n_gen} tokens received)"
    except _RequestError as e:
        reason = str(e)
    except (httpx2.HTTPError, ValueError) as e:
        reason = f"{type(e).__name__}: {one_line(e)}"
    return rec.result(index, len(prompt), t0, time.perf_counter(), reason)


def random_prompts(n_requests: int, n_prompt: int, n_vocab: int, seed: int) -> list[list[int]]:
    """``n_requests`` prompts of ``n_prompt`` token ids in [0, n_vocab), the same for the same seed."""
    rng = random.Random(seed)
    return [[rng.randrange(n_vocab) for _ in range(n_prompt)] for _ in range(n_requests)]


async def adrive(base_url: str, concurrency: int, n_requests: int, n_prompt: int, n_gen: int, n_vocab: int,
                 seed: int = 0, request_timeout_s: float = 300.0, warmup: bool = False) -> LevelResult:
    """Send ``n_requests`` streamed completions, at most ``concurrency`` in flight; see :func:`drive`."""
    httpx2 = heavy.httpx2()

    url = check_local(base_url)
    if min(concurrency, n_requests, n_prompt, n_gen, n_vocab) < 1 or request_timeout_s <= 0:
        raise UsageError("concurrency, n_requests, n_prompt, n_gen, n_vocab and the request timeout must be positive")
    prompts = random_prompts(n_requests, n_prompt, n_vocab, seed)
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx2.AsyncClient(base_url=url, trust_env=False, limits=limits,
                                  timeout=httpx2.Timeout(request_timeout_s)) as client:
        if warmup:                         # one short request, outside the timing (its failure shows in the level)
            warm = random_prompts(1, min(n_prompt, 8), n_vocab, seed + 1)[0]
            await _timed_request(client, -1, warm, min(n_gen, 2), seed, request_timeout_s, time.perf_counter())
        results: list[RequestResult] = []
        todo = iter(range(n_requests))     # shared by the workers; one event loop, so no lock is needed
        t0 = time.perf_counter()

        async def worker() -> None:
            for i in todo:
                results.append(await _timed_request(client, i, prompts[i], n_gen, seed, request_timeout_s, t0))

        await asyncio.gather(*(worker() for _ in range(min(concurrency, n_requests))))
    results.sort(key=lambda r: r.index)
    level = LevelResult(concurrency=concurrency, requests=results, wall_s=max(r.t_end_s for r in results))
    if level.n_failed == len(results):
        raise AllRequestsFailed(f"all {len(results)} requests to llama-server at {url} failed: {results[0].reason}",
                                level)
    return level


def drive(base_url: str, concurrency: int, n_requests: int, n_prompt: int, n_gen: int, n_vocab: int,
          seed: int = 0, request_timeout_s: float = 300.0, warmup: bool = False) -> LevelResult:
    """One concurrency level against a ready server: ``n_requests`` requests of ``n_prompt`` random token ids
    (``random.Random(seed)``) and ``n_gen`` generated tokens each, at most ``concurrency`` in flight, each with its
    own deadline.  A request that fails is recorded with its reason; :class:`AllRequestsFailed` (a
    :class:`RunFailed`, holding the level) only when every one failed."""
    return asyncio.run(adrive(base_url, concurrency, n_requests, n_prompt, n_gen, n_vocab, seed, request_timeout_s,
                              warmup))
