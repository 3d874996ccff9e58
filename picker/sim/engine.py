"""A vLLM engine as a discrete-event step function: continuous batching, chunked prefill, prefix cache, LoRA.

The engine never reads a clock and never sleeps: every call takes ``now`` (seconds on any monotonic timeline),
so the same object runs in virtual time (``virtual.py``, the policy lab) and behind the HTTP server
(``driver.py`` paces it with asyncio). One step is two calls:

    end_s = engine.begin_step(now)    # schedule a batch, allocate KV slots; None when idle
    updates = engine.finish_step()    # at end_s: advance the batch, sample tokens, finish requests

Scheduling follows vLLM v1 (FCFS):

1. Running requests first, in admission order. Each asks for its remaining tokens (1 when decoding, a chunk
   when prefilling) within the step's token budget ``max_num_batched_tokens``. When the KV pool cannot give a
   request its slots, the most recently admitted running request is *preempted* (recompute mode: blocks freed,
   back to the front of the waiting queue, its tokens recomputed later, possibly from the prefix cache).
2. Then, if nothing was preempted, waiting requests while ``running < max_num_seqs`` and budget remains. A
   request for a LoRA adapter that is not among the running adapters waits while ``max_loras`` adapters run
   (it is skipped, later requests may pass it). A new request first reuses its longest cached prefix (never its
   last token: at least one token is computed so the step can emit one), then prefills the rest in chunks.
3. A request whose tokens are all computed samples one token per step until its target length.

Answers are deterministic: the tokens and the natural (EOS) length come from a hash of the prompt, the adapter
and ``EngineConfig.seed``.

KV-cache events (``record_kv_events = True``): as vLLM's prefix cache reports them, from the block pool itself —
a block that becomes findable by its hash is *stored* (consecutive blocks of one request in one step form one
``KVStored`` with the parent hash, the blocks' tokens and the adapter), a findable block reused for other
content is *removed*, and ``clear_cache`` (vLLM's ``reset_prefix_cache``) is *all cleared*. ``drain_kv_events``
hands them over in order; ``picker.sim.kvevents`` publishes them on vLLM's wire.

Prefill/decode disaggregation, as vLLM's NIXL connector does it: a prefill server serves the prompt with
``max_tokens`` 1 like any request (its blocks stay in the prefix cache). A decode server gets the request again
with ``remote_prefill``: when it is admitted, its blocks are allocated and the prompt tokens it does not cache
locally are pulled over the link (``EngineConfig.kv_transfer_s_per_token`` each, one transfer after another; the
request waits, counted as waiting, and no step runs for it); once they landed, the request runs like any other
whose prompt is cached: one step computes the last prompt token and emits the first output token, then it
decodes. ``next_wakeup_s`` tells a driver when an idle engine has a transfer landing.
"""

from __future__ import annotations

import enum
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import xxhash

from picker.sim.config import EngineConfig
from picker.sim.kvcache import BlockPool, chain_hashes, root_hash
from picker.sim.tokenizer import Tokenizer, default_tokenizer

__all__ = [
    "Engine",
    "EngineStats",
    "FinishReason",
    "KVCleared",
    "KVEvent",
    "KVRemoved",
    "KVStored",
    "RejectKind",
    "RequestRejected",
    "RequestState",
    "SimRequest",
]

FinishReason = Literal["stop", "length", "abort"]
RejectKind = Literal["queue_full", "too_long", "unknown_model", "bad_request"]


class RequestRejected(Exception):
    """The engine refuses a request at submission (the server maps ``kind`` to an HTTP status)."""

    def __init__(self, kind: RejectKind, message: str) -> None:
        super().__init__(message)
        self.kind: RejectKind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class KVStored:
    """Blocks that became findable: their hashes, the hash before the first (None: a sequence start), their
    tokens (``block_size`` per hash) and the adapter (None: the base model)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    lora: str | None


@dataclass(frozen=True, slots=True)
class KVRemoved:
    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class KVCleared:
    pass


KVEvent = KVStored | KVRemoved | KVCleared


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int | None = None  # None: up to max_model_len
    min_tokens: int = 0
    ignore_eos: bool = False
    lora: str | None = None  # adapter name; None = base model
    remote_prefill: bool = False  # prefilled elsewhere: pull the prompt's KV instead of computing it


class Status(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"  # pulling a remotely prefilled prompt's KV (vLLM's WAITING_FOR_REMOTE_KVS)
    RUNNING = "running"
    FINISHED = "finished"


class RequestState:
    """One request inside the engine. Read-only outside ``Engine``; times are on the caller's timeline."""

    __slots__ = (
        "arrival_s",
        "blocks",
        "cached_tokens",
        "finish_reason",
        "finished_s",
        "first_token_s",
        "hashes",
        "last_itl_s",
        "last_token_s",
        "lora",
        "max_tokens",
        "num_cached_blocks",
        "num_computed",
        "num_preemptions",
        "output_ids",
        "prompt_tokens",
        "ready_s",
        "remote_prefill",
        "request_id",
        "scheduled_s",
        "seed",
        "status",
        "target_output",
        "target_reason",
        "tokens",
        "transfer_tokens",
    )

    def __init__(
        self, req: SimRequest, arrival_s: float, max_tokens: int, target_output: int, target_reason: FinishReason
    ) -> None:
        self.request_id = req.request_id
        self.lora = req.lora
        self.remote_prefill = req.remote_prefill
        self.ready_s: float | None = None  # when its pulled KV lands (remote prefill)
        self.transfer_tokens = 0  # prompt tokens pulled over the link
        self.max_tokens = max_tokens  # the request's, or what max_model_len leaves
        self.tokens = array("I", req.prompt_ids)
        self.prompt_tokens = len(self.tokens)
        self.seed = 0
        self.output_ids: list[int] = []
        self.target_output = target_output
        self.target_reason: FinishReason = target_reason
        self.status = Status.WAITING
        self.num_computed = 0
        self.blocks: list[int] = []
        self.hashes: list[int] = []  # chained hashes of the full blocks of ``tokens`` computed so far
        self.num_cached_blocks = 0  # leading blocks already registered in the pool's hash map
        self.cached_tokens = 0  # prefix-cache hit at first scheduling (usage.prompt_tokens_details.cached_tokens)
        self.num_preemptions = 0
        self.arrival_s = arrival_s
        self.scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.last_itl_s: float | None = None  # gap before the most recent token
        self.finished_s: float | None = None
        self.finish_reason: FinishReason | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    def __repr__(self) -> str:
        out = f"{len(self.output_ids)}/{self.target_output}"
        return f"RequestState({self.request_id!r}, {self.status.value}, out={out})"


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What a scrape of the engine sees (the vLLM gauges and counters)."""

    waiting: int
    running: int
    kv_usage: float
    num_gpu_blocks: int
    block_size: int
    running_loras: tuple[str, ...]
    waiting_loras: tuple[str, ...]
    max_loras: int
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    preemptions: int
    steps: int
    busy_s: float
    prefill_tokens: int = 0  # prompt tokens computed here (prefill passes)
    pulled_tokens: int = 0  # prompt tokens whose KV was pulled from a prefill server (remote prefill)
    max_step_s: float = 0.0  # the longest step: a long prefill stalls every sequence in its batch this long
    generated_tokens: int = 0  # tokens emitted since start (vllm:generation_tokens_total)
    lookup_queries_tokens: int = 0  # vllm:prefix_cache_queries_total: every admission attempt's lookup
    lookup_hits_tokens: int = 0  # vllm:prefix_cache_hits_total: the same lookups' hits
    prompt_tokens: int = 0  # prompt tokens of the requests that got a first token (vllm:prompt_tokens_total)


@dataclass(slots=True)
class _Step:
    start_s: float
    end_s: float
    scheduled: list[tuple[RequestState, int]]


class Engine:
    """One simulated vLLM engine (see the module docstring for the step protocol)."""

    def __init__(self, config: EngineConfig, tokenizer: Tokenizer | None = None) -> None:
        if config.lora_adapters and config.max_loras < 1:
            raise ValueError("LoRA adapters configured with max_loras < 1")
        self.config = config
        self._word_ids = (tokenizer or default_tokenizer()).word_ids
        self._roots = {name: root_hash(name, config.hash_seed) for name in config.served_models}
        self.record_kv_events = False
        self._kv_events: list[KVEvent] = []
        self.pool = self._new_pool()
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        self._loading: list[RequestState] = []  # pulling KV over the link (remote prefill)
        self._link_free_s = float("-inf")  # when the link finishes the transfers already started
        self._live: dict[str, RequestState] = {}
        self._step: _Step | None = None
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.preemptions = 0
        self.steps = 0
        self.busy_s = 0.0
        self.prefill_tokens = 0
        self.generated_tokens = 0  # tokens emitted (vllm:generation_tokens_total)
        # prompt tokens looked up in the prefix cache and found, at every admission attempt (vllm:prefix_cache_*)
        self.lookup_queries_tokens = 0
        self.lookup_hits_tokens = 0
        self.prompt_tokens = 0  # prompts whose prefill ended, counted at their first token (vllm:prompt_tokens_total)
        self.pulled_tokens = 0
        self.max_step_s = 0.0

    # -- requests ---------------------------------------------------------------------------------------------

    def submit(self, req: SimRequest, now: float) -> RequestState:
        """Queue a request arriving at ``now``; raises ``RequestRejected``."""
        cfg = self.config
        if req.request_id in self._live:
            raise RequestRejected("bad_request", f"duplicate request id {req.request_id!r}")
        if req.lora is not None and req.lora not in cfg.lora_adapters:
            raise RequestRejected("unknown_model", f"The model `{req.lora}` does not exist.")
        n_prompt = len(req.prompt_ids)
        if n_prompt < 1:
            raise RequestRejected("bad_request", "the prompt is empty")
        room = cfg.max_model_len - n_prompt
        if req.max_tokens is not None and req.max_tokens < 1:
            raise RequestRejected("bad_request", "max_tokens must be at least 1")
        if room < 1 or (req.max_tokens is not None and req.max_tokens > room):
            raise RequestRejected(
                "too_long",
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                f"{n_prompt + (req.max_tokens or 1)} tokens ({n_prompt} in the messages, "
                f"{req.max_tokens or 1} in the completion).",
            )
        max_out = room if req.max_tokens is None else req.max_tokens
        if not 0 <= req.min_tokens <= max_out:
            raise RequestRejected("bad_request", f"min_tokens must be in [0, max_tokens={max_out}]")
        if not cfg.enable_chunked_prefill and n_prompt > cfg.max_num_batched_tokens:
            raise RequestRejected("too_long", "prompt longer than max_num_batched_tokens without chunked prefill")
        if len(self._waiting) >= cfg.max_waiting:
            raise RequestRejected("queue_full", f"waiting queue full ({cfg.max_waiting})")

        prompt = array("I", req.prompt_ids)
        seed = xxhash.xxh3_64_intdigest(prompt.tobytes() + (req.lora or "").encode(), seed=cfg.seed)
        target, reason = self._target_length(req, max_out, seed)
        if -(-(n_prompt + target) // cfg.block_size) > cfg.num_gpu_blocks:
            raise RequestRejected("too_long", f"request needs more than the {cfg.num_gpu_blocks} KV blocks")
        state = RequestState(req, now, max_out, target, reason)
        state.seed = seed
        self._live[req.request_id] = state
        self._waiting.append(state)
        return state

    def _target_length(self, req: SimRequest, max_out: int, seed: int) -> tuple[int, FinishReason]:
        if req.ignore_eos:
            return max_out, "length"
        natural = 1 + (seed >> 16) % (2 * self.config.natural_output_tokens - 1)  # uniform, mean = natural_...
        target = max(req.min_tokens, min(natural, max_out))
        return target, ("length" if target >= max_out else "stop")

    def abort(self, request_id: str, now: float) -> RequestState | None:
        """Drop a live request (client gone); its KV blocks are released at once."""
        state = self._live.get(request_id)
        if state is None:
            return None
        if state.status is Status.WAITING:
            self._waiting.remove(state)
        elif state.status is Status.LOADING:
            self._loading.remove(state)
        else:
            self._running.remove(state)
        self._finish(state, now, "abort")
        return state

    def get(self, request_id: str) -> RequestState | None:
        return self._live.get(request_id)

    # -- steps ------------------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._loading)

    @property
    def next_wakeup_s(self) -> float | None:
        """When the first KV transfer in flight lands (an idle engine starts a step then); None: none."""
        return min((r.ready_s for r in self._loading if r.ready_s is not None), default=None)

    @property
    def step_end_s(self) -> float | None:
        """End of the step in progress, or None between steps."""
        return None if self._step is None else self._step.end_s

    def begin_step(self, now: float, *, stall_s: float = 0.0) -> float | None:
        """Schedule one batch starting at ``now``; returns when it ends (None: nothing to do).

        ``stall_s`` lengthens this step (an injected latency spike: a GPU hiccup delays the whole batch).
        """
        if self._step is not None:
            raise RuntimeError("begin_step while a step is in progress")
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[RequestState, int]] = []
        preempted = False
        if self._loading:
            self._land_transfers(now)

        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            while not self._allocate(req, n, ()):
                victim = self._running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                scheduled.append((req, n))
                budget -= n
                i += 1
                continue
            break

        if not preempted:
            budget = self._admit(now, budget, scheduled)

        if not scheduled:
            return None
        prefill = decode = context = 0
        lora = False
        for req, n in scheduled:
            if n == 1 and (req.output_ids or req.remote_prefill) and req.num_computed == req.num_tokens - 1:
                decode += 1  # a decode-shaped token (a pulled prompt's last token too: no prefill pass)
            else:
                prefill += n
            context += req.num_computed + n
            lora = lora or req.lora is not None
        self.prefill_tokens += prefill
        duration = cfg.timing.step_s(prefill_tokens=prefill, decode_seqs=decode, context_tokens=context, lora=lora)
        duration = duration * cfg.slowdown + stall_s
        self._step = _Step(now, now + duration, scheduled)
        return now + duration

    def _admit(self, now: float, budget: int, scheduled: list[tuple[RequestState, int]]) -> int:
        cfg = self.config
        bs = cfg.block_size
        active = {r.lora for r in self._running if r.lora is not None}
        skipped: list[RequestState] = []
        while self._waiting and budget > 0 and len(self._running) < cfg.max_num_seqs:
            req = self._waiting[0]
            if req.lora is not None and req.lora not in active and len(active) >= cfg.max_loras:
                skipped.append(self._waiting.popleft())
                continue
            n_tokens = req.num_tokens
            if req.remote_prefill and req.ready_s is None:
                if not self._start_transfer(req, now):
                    break
                self._waiting.popleft()
                continue
            if req.remote_prefill:  # its KV landed: only the last prompt token is computed
                hits: Sequence[int] = ()
                n_cached = req.num_computed
            else:
                self._extend_hashes(req, n_tokens // bs)
                hits = self.pool.lookup(req.hashes[: (n_tokens - 1) // bs])
                n_cached = len(hits) * bs
                # vLLM counts every lookup of a waiting request on its page, also one that finds no room yet
                self.lookup_queries_tokens += n_tokens
                self.lookup_hits_tokens += n_cached
            n = n_tokens - n_cached
            if not cfg.enable_chunked_prefill and n > budget:
                break
            n = min(n, budget)
            if not self._allocate(req, n, hits):
                break
            self._waiting.popleft()
            req.status = Status.RUNNING
            self._running.append(req)
            if not req.remote_prefill:  # a pulled prompt was counted when its transfer started
                self.prefix_queries_tokens += n_tokens
                self.prefix_hits_tokens += n_cached
            if req.scheduled_s is None:
                req.scheduled_s = max(now, req.arrival_s)
                req.cached_tokens = n_cached
            scheduled.append((req, n))
            budget -= n
            if req.lora is not None:
                active.add(req.lora)
        self._waiting.extendleft(reversed(skipped))
        return budget

    def finish_step(self) -> list[RequestState]:
        """Complete the step in progress (at its end time): the requests that got a token or finished."""
        step = self._step
        if step is None:
            raise RuntimeError("finish_step without a step in progress")
        self._step = None
        self.steps += 1
        self.busy_s += step.end_s - step.start_s
        self.max_step_s = max(self.max_step_s, step.end_s - step.start_s)
        end = step.end_s
        updated: list[RequestState] = []
        any_finished = False
        for req, n in step.scheduled:
            if req.status is not Status.RUNNING:  # aborted during the step
                continue
            req.num_computed += n
            if req.num_computed < req.num_tokens:  # a prefill chunk; more to come
                continue
            token = self._word_ids[
                xxhash.xxh3_64_intdigest(len(req.output_ids).to_bytes(4, "little"), seed=req.seed) % len(self._word_ids)
            ]
            req.tokens.append(token)
            req.output_ids.append(token)
            req.last_itl_s = None if req.last_token_s is None else end - req.last_token_s
            req.last_token_s = end
            if req.first_token_s is None:
                req.first_token_s = end
                self.prompt_tokens += req.prompt_tokens
            if len(req.output_ids) >= req.target_output:
                self._finish(req, end, req.target_reason)
                any_finished = True
            updated.append(req)
        self.generated_tokens += len(updated)
        if any_finished:
            self._running = [r for r in self._running if r.status is Status.RUNNING]
        return updated

    # -- KV transfers (remote prefill) ---------------------------------------------------------------------

    def _start_transfer(self, req: RequestState, now: float) -> bool:
        """Allocate the whole prompt's blocks and start pulling what is not cached here; False if the pool is
        short. The pulled blocks enter the prefix cache when they land, not before."""
        bs = self.config.block_size
        n_tokens = req.num_tokens
        self._extend_hashes(req, n_tokens // bs)
        hits = self.pool.lookup(req.hashes[: (n_tokens - 1) // bs])
        n_cached = len(hits) * bs
        pulled = n_tokens - n_cached
        if not self._allocate(req, pulled, hits, cache=False):
            return False
        req.status = Status.LOADING
        req.transfer_tokens = pulled
        self.pulled_tokens += pulled
        start = max(now, self._link_free_s)
        req.ready_s = self._link_free_s = start + pulled * self.config.kv_transfer_s_per_token
        req.scheduled_s = max(now, req.arrival_s)
        req.cached_tokens = n_cached
        self.prefix_queries_tokens += n_tokens
        self.prefix_hits_tokens += n_cached
        self.lookup_queries_tokens += n_tokens
        self.lookup_hits_tokens += n_cached
        self._loading.append(req)
        return True

    def _land_transfers(self, now: float) -> None:
        """Requests whose KV landed by ``now`` wait at the front of the queue, their prompt computed but the
        last token (as vLLM recomputes it), in the order their transfers started."""
        landed = [r for r in self._loading if r.ready_s is not None and r.ready_s <= now]
        if not landed:
            return
        self._loading = [r for r in self._loading if not (r.ready_s is not None and r.ready_s <= now)]
        for req in reversed(landed):
            req.num_computed = req.num_tokens - 1
            self._cache_blocks(req, req.num_computed // self.config.block_size)
            req.status = Status.WAITING
            self._waiting.appendleft(req)

    # -- KV bookkeeping ---------------------------------------------------------------------------------------

    def _extend_hashes(self, req: RequestState, n_blocks: int) -> None:
        have = len(req.hashes)
        if n_blocks > have:
            parent = req.hashes[-1] if req.hashes else self._roots[req.lora or self.config.model]
            req.hashes.extend(chain_hashes(req.tokens, self.config.block_size, parent, have, n_blocks))

    def _allocate(self, req: RequestState, n: int, hits: Sequence[int], *, cache: bool = True) -> bool:
        """Give ``req`` KV slots for ``n`` more tokens after its cached ``hits``; False if the pool is short.

        ``cache``: register the full blocks this step computes in the prefix cache now (False: a pull does it
        when the KV lands)."""
        bs = self.config.block_size
        computed = req.num_computed + len(hits) * bs
        need = -(-(computed + n) // bs) - len(req.blocks) - len(hits)
        if need + self.pool.evictable(hits) > self.pool.num_free:
            return False
        if hits:
            self.pool.touch(hits)
            req.blocks.extend(hits)
            req.num_computed = computed
            req.num_cached_blocks = len(hits)
        if need > 0:
            fresh = self.pool.allocate(need)
            assert fresh is not None
            req.blocks.extend(fresh)
        if cache:
            self._cache_blocks(req, (computed + n) // bs)
        return True

    def _cache_blocks(self, req: RequestState, full: int) -> None:
        """Register ``req``'s first ``full`` blocks in the prefix cache (those not registered yet)."""
        if full > req.num_cached_blocks:
            self._extend_hashes(req, full)
            new: list[int] = []  # indexes of blocks that became findable, for the KV events
            for j in range(req.num_cached_blocks, full):
                if self.pool.cache(req.blocks[j], req.hashes[j]):
                    new.append(j)
            if new and self.record_kv_events:
                self._stored(req, new)
            req.num_cached_blocks = full

    def _stored(self, req: RequestState, indexes: list[int]) -> None:
        """One ``KVStored`` per run of consecutive new blocks of ``req``."""
        bs = self.config.block_size
        run: list[int] = []
        for j in indexes:
            if run and j != run[-1] + 1:
                self._emit_stored(req, run, bs)
                run = []
            run.append(j)
        self._emit_stored(req, run, bs)

    def _emit_stored(self, req: RequestState, run: list[int], bs: int) -> None:
        first, last = run[0], run[-1]
        parent = req.hashes[first - 1] if first > 0 else None
        tokens = req.tokens[first * bs : (last + 1) * bs].tolist()
        self._kv_events.append(KVStored([req.hashes[j] for j in run], parent, tokens, req.lora))

    def _removed(self, block_hash: int) -> None:
        if self.record_kv_events:
            events = self._kv_events
            last = events[-1] if events else None
            if type(last) is KVRemoved:
                last.block_hashes.append(block_hash)
            else:
                events.append(KVRemoved([block_hash]))

    def drain_kv_events(self) -> list[KVEvent]:
        """The KV events since the last call, in order."""
        events, self._kv_events = self._kv_events, []
        return events

    def clear_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: forget every cached block; refused (False) while requests hold blocks."""
        if self._running or self._loading or any(r.blocks for r in self._waiting):
            return False
        self.pool.reset()
        if self.record_kv_events:
            self._kv_events.append(KVCleared())
        return True

    def _new_pool(self) -> BlockPool:
        cfg = self.config
        return BlockPool(cfg.num_gpu_blocks, enable_caching=cfg.enable_prefix_caching, on_evict=self._removed)

    def _preempt(self, req: RequestState) -> None:
        req.remote_prefill = False  # recompute mode: a preempted request prefills here, from its prefix cache
        self.pool.release(req.blocks[::-1])
        req.blocks = []
        req.num_computed = 0
        req.num_cached_blocks = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self._waiting.appendleft(req)
        self.preemptions += 1

    def _finish(self, req: RequestState, now: float, reason: FinishReason) -> None:
        self.pool.release(req.blocks[::-1])
        req.blocks = []
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.finished_s = now
        del self._live[req.request_id]

    # -- observation ------------------------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        return EngineStats(
            waiting=len(self._waiting) + len(self._loading),
            running=len(self._running),
            kv_usage=self.pool.usage,
            num_gpu_blocks=self.config.num_gpu_blocks,
            block_size=self.config.block_size,
            running_loras=tuple(sorted({r.lora for r in self._running if r.lora is not None})),
            waiting_loras=tuple(sorted({r.lora for r in self._waiting if r.lora is not None})),
            max_loras=self.config.max_loras,
            prefix_queries_tokens=self.prefix_queries_tokens,
            prefix_hits_tokens=self.prefix_hits_tokens,
            preemptions=self.preemptions,
            steps=self.steps,
            busy_s=self.busy_s,
            prefill_tokens=self.prefill_tokens,
            pulled_tokens=self.pulled_tokens,
            max_step_s=self.max_step_s,
            generated_tokens=self.generated_tokens,
            lookup_queries_tokens=self.lookup_queries_tokens,
            lookup_hits_tokens=self.lookup_hits_tokens,
            prompt_tokens=self.prompt_tokens,
        )

    def reset(self, now: float) -> list[RequestState]:
        """Drop everything (a crash): live requests end with ``abort``; the cache starts empty."""
        dropped = list(self._live.values())
        for req in dropped:
            req.blocks = []
            req.status = Status.FINISHED
            req.finish_reason = "abort"
            req.finished_s = now
        self._live.clear()
        self._waiting.clear()
        self._running.clear()
        self._loading.clear()
        self._link_free_s = float("-inf")
        self._step = None
        self._kv_events = []  # a crashed server publishes nothing more; its restart starts a new stream
        self.pool = self._new_pool()
        return dropped
