"""DisaggEngineCore: the engine of a prefill, decode or colocated ("both") worker.

It wraps the LLMEngine adapter (cadence.engine.llm_engine_adapter) behind the same EngineCore
protocol, so the engine process, its loop and the HTTP server stay as they are. Requests carry
vLLM-style `kv_transfer_params`:

    prefill worker  {"do_remote_decode": true}: runs the prompt with max_tokens=1; when the
                    request would go on, its blocks stay leased and the final output's
                    kv_transfer_params is the handoff: {"do_remote_prefill": true,
                    "remote_engine_id", "remote_address", "remote_block_ids",
                    "remote_request_id", "first_token_id", "prompt_token_ids", "block_size"}
    decode worker   that handoff: the request enters the scheduler prefilled (its first token
                    streams at once), waits for its KV (WAITING_FOR_REMOTE_KV), the transfer
                    thread pulls only the blocks its prefix cache lacks, the engine thread
                    scatters them into the cache, releases the prefill's lease, and it decodes
    no params       a whole request, colocated

The engine loop calls `service()` each turn (finished pulls, acknowledgements, expired leases),
blocks on `wakeup_socket` while every request only waits for KV (`waits_only_on_transfers`), and
wakes for the next lease expiry (`idle_timeout_ms`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import zmq

from cadence.core.request import RequestStatus
from cadence.core.sampling_params import SamplingParams
from cadence.disagg.config import DisaggConfig
from cadence.disagg.kv_blocks import KVLayout, import_frames
from cadence.disagg.kv_events import KVEventPublisher
from cadence.disagg.kv_puller import KVPuller, PullJob
from cadence.disagg.leases import LeaseTable
from cadence.disagg.transport import ZmqKVServer, ZmqKVTransport

logger = logging.getLogger(__name__)

# Test only: seconds to sleep before each step while this engine prefills for a remote decode,
# so a fault test can kill a prefill worker deterministically in the middle of a prefill (the
# worker reports the request running after its first chunk, and the rest takes this long per
# chunk). Unset (0) in any real deployment.
TEST_PREFILL_STEP_DELAY_ENV = "CADENCE_DISAGG_TEST_PREFILL_STEP_DELAY_S"

_wake_ids = itertools.count()


@dataclass
class _PrefillSide:
    prompt_token_ids: tuple[int, ...]
    wanted_max_tokens: int


@dataclass
class _DecodeSide:
    """A prefilled request on this decode engine, and its transfer's record."""

    engine_id: str
    address: str
    remote_req_id: str
    remote_block_ids: tuple[int, ...]
    local_block_ids: tuple[int, ...] = ()
    released: bool = False
    num_bytes: int = 0
    seconds: float = 0.0
    num_blocks: int = 0
    num_hit_tokens: int = 0

    def record(self) -> dict[str, Any]:
        return {"remote_engine_id": self.engine_id, "transfer_bytes": self.num_bytes,
                "transfer_s": round(self.seconds, 6), "transfer_blocks": self.num_blocks,
                "local_prefix_hit_tokens": self.num_hit_tokens}


class DisaggEngineCore:
    """An EngineCore with a disaggregation role (see the module docstring)."""

    def __init__(self, inner: Any, cfg: DisaggConfig) -> None:
        self.inner = inner
        self.engine = inner.engine  # the LLMEngine
        self.cfg = cfg
        self.engine_id = cfg.engine_id or uuid.uuid4().hex[:12]
        self.model_name = inner.model_name
        self.max_model_len = inner.max_model_len
        self.vocab_size = inner.vocab_size
        self.scheduler = self.engine.scheduler
        self.storage = self.engine.executor.kv_cache.storage
        self.layout = KVLayout.of(self.storage)
        self.block_size = self.scheduler.cache.block_size
        # The loop polls this socket; the transfer threads ping it when something finished.
        self._context = zmq.Context.instance()
        self._wake_addr = f"inproc://cadence-disagg-wake-{os.getpid()}-{next(_wake_ids)}"
        self.wakeup_socket = self._context.socket(zmq.PULL)
        self.wakeup_socket.setsockopt(zmq.LINGER, 0)
        self.wakeup_socket.bind(self._wake_addr)
        self._wake_local = threading.local()
        self._prefill: dict[str, _PrefillSide] = {}
        self._decode: dict[str, _DecodeSide] = {}
        self.counters = {"kv_transfers_total": 0, "kv_transfer_bytes_total": 0,
                         "kv_transfer_seconds_total": 0.0, "kv_transfer_failures_total": 0}
        self.leases: LeaseTable | None = None
        self.server: ZmqKVServer | None = None
        if cfg.serves_prefill:
            self.leases = LeaseTable(self.storage, cfg.kv_lease_timeout_s, self._wake)
            address = cfg.kv_transfer_address or (
                f"ipc://{tempfile.gettempdir()}/cadence-kv-{self.engine_id}")
            self.server = ZmqKVServer(address, self.leases, self._context)
        self.puller = (KVPuller(lambda: ZmqKVTransport(self._context),
                                cfg.kv_transfer_timeout_s, self._wake)
                       if cfg.serves_decode else None)
        self.kv_events = (KVEventPublisher(cfg.kv_events_address, self.engine_id,
                                           self.block_size, self.scheduler.kv.pool,
                                           self._context)
                          if cfg.kv_events_address else None)
        self._test_prefill_step_delay_s = float(os.environ.get(TEST_PREFILL_STEP_DELAY_ENV) or 0)

    def __getattr__(self, name: str) -> Any:
        # Anything else the engine loop or front end asks of an EngineCore: the inner one's.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def kv_address(self) -> str | None:
        return self.server.address if self.server is not None else None

    def _wake(self) -> None:
        # Called from transfer threads: each thread gets its own PUSH socket.
        sock = getattr(self._wake_local, "socket", None)
        if sock is None:
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._wake_addr)
            self._wake_local.socket = sock
        try:
            sock.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass  # the loop has wake-ups queued already

    # ---- EngineCore: tokenizer side, passed through
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.inner.tokenize(text, add_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.inner.render_chat(messages, add_generation_prompt)

    def token_text(self, token_id: int) -> str:
        return self.inner.token_text(token_id)

    def default_eos_token_ids(self) -> tuple[int, ...]:
        return self.inner.default_eos_token_ids()

    def take_telemetry(self) -> Any:
        return self.inner.take_telemetry()

    # ---- requests
    def add_request(self, req_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    priority: int, arrival_time: float | None,
                    kv_transfer_params: dict[str, Any] | None = None,
                    cache_salt: str | None = None) -> None:
        kv = kv_transfer_params or {}
        if kv.get("do_remote_decode"):
            self._add_prefill(req_id, prompt_token_ids, params, priority, arrival_time,
                              cache_salt)
        elif kv.get("do_remote_prefill"):
            self._add_decode(req_id, prompt_token_ids, params, priority, arrival_time, kv,
                             cache_salt)
        else:
            self.inner.add_request(req_id, prompt_token_ids, params, priority, arrival_time,
                                   cache_salt=cache_salt)

    def _add_prefill(self, req_id, ids, params, priority, arrival, cache_salt=None) -> None:
        if not self.cfg.serves_prefill:
            raise ValueError(f"this worker's role is {self.cfg.role}: it does not prefill for "
                             "remote decode (kv_transfer_params.do_remote_decode)")
        one = dataclasses.replace(params, max_tokens=1, min_tokens=min(params.min_tokens, 1))
        self.engine.add_request(req_id, ids, one, priority, arrival, hold_kv=True,
                                cache_salt=cache_salt)
        self._prefill[req_id] = _PrefillSide(tuple(ids), params.max_tokens)

    def _add_decode(self, req_id, ids, params, priority, arrival, kv: dict[str, Any],
                    cache_salt=None) -> None:
        if not self.cfg.serves_decode:
            raise ValueError(f"this worker's role is {self.cfg.role}: it does not decode "
                             "remotely prefilled requests (kv_transfer_params.do_remote_prefill)")
        try:
            first = int(kv["first_token_id"])
            address = str(kv["remote_address"])
            remote_req_id = str(kv["remote_request_id"])
            remote_blocks = tuple(int(b) for b in kv["remote_block_ids"])
            engine_id = str(kv.get("remote_engine_id", "?"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"kv_transfer_params lacks a valid {exc} for a remote prefill") from exc
        if int(kv.get("block_size", self.block_size)) != self.block_size:
            raise ValueError(f"the prefill worker's block size {kv.get('block_size')} differs "
                             f"from this worker's {self.block_size}")
        remote_prompt = kv.get("prompt_token_ids")
        if remote_prompt is not None and list(remote_prompt) != list(ids):
            raise ValueError("the prompt differs from the one the prefill worker computed")
        if len(remote_blocks) != -(-len(ids) // self.block_size):
            raise ValueError(f"{len(remote_blocks)} remote blocks cannot hold a prompt of "
                             f"{len(ids)} tokens")
        self._decode[req_id] = _DecodeSide(engine_id, address, remote_req_id, remote_blocks)
        try:
            self.engine.add_request(req_id, ids, params, priority, arrival, prefilled_token=first,
                                    cache_salt=cache_salt)
        except ValueError:
            del self._decode[req_id]
            raise

    def abort_request(self, req_id: str) -> None:
        self.inner.abort_request(req_id)
        self._prefill.pop(req_id, None)
        side = self._decode.pop(req_id, None)
        if side is not None:
            self._release_remote(side)  # a decode-side abort before (or after) the pull

    def _release_remote(self, side: _DecodeSide) -> None:
        if not side.released and self.puller is not None:
            side.released = True
            self.puller.release(side.address, side.remote_req_id)

    # ---- the loop
    def has_unfinished(self) -> bool:
        return self.inner.has_unfinished()

    def waits_only_on_transfers(self) -> bool:
        return (not self.engine.has_pending_outputs
                and self.scheduler.waits_only_on_remote_kv())

    def idle_timeout_ms(self) -> float:
        wait = self.leases.seconds_to_next_expiry() if self.leases is not None else None
        return 1000.0 if wait is None else min(1000.0, wait * 1000.0 + 1.0)

    def service(self) -> None:
        """Work outside the step, on the engine thread: finished pulls, leases to free."""
        if self.puller is not None:
            for result in self.puller.take_results():
                self._finish_pull(result)
        if self.leases is not None:
            acked, expired = self.leases.take_releasable()
            for req_id in acked + expired:
                self.scheduler.release_kv_lease(req_id)
            if expired:
                logger.warning("KV leases expired unacknowledged: %s", expired)
        if self.kv_events is not None:
            self.kv_events.publish()

    def _finish_pull(self, result: Any) -> None:
        side = self._decode.get(result.req_id)
        req = self.scheduler.get_request(result.req_id)
        if side is None or req is None or req.status is not RequestStatus.WAITING_FOR_REMOTE_KV:
            return  # aborted meanwhile: the frames are dropped, its blocks are already free
        if result.error is None:
            try:
                layout = result.payload.header.get("layout")
                if layout != self.layout.to_dict():
                    raise ValueError(f"KV layout {layout} differs from this cache's "
                                     f"{self.layout.to_dict()}")
                import_frames(self.storage, side.local_block_ids,
                              result.payload.header["runs"], result.payload.buffers)
            except (ValueError, KeyError, RuntimeError) as exc:
                result.error = f"bad KV payload: {exc}"
        if result.error is not None:
            self.counters["kv_transfer_failures_total"] += 1
            self.engine.fail_request(
                result.req_id, f"KV transfer from prefill engine {side.engine_id} at "
                f"{side.address} failed: {result.error}")
            self._release_remote(side)  # best effort; the lease expires otherwise
            return
        side.num_bytes = result.payload.num_bytes
        side.seconds = result.payload.seconds
        self._loaded(result.req_id, side)

    def _loaded(self, req_id: str, side: _DecodeSide) -> None:
        self.scheduler.finish_remote_kv(req_id)
        self._release_remote(side)
        self.counters["kv_transfers_total"] += 1
        self.counters["kv_transfer_bytes_total"] += side.num_bytes
        self.counters["kv_transfer_seconds_total"] += side.seconds
        self.engine.telemetry.record_event(
            {"type": "kv_transfer", "req_id": req_id, "t": time.monotonic(), **side.record()})

    def _start_loads(self) -> None:
        for load in self.scheduler.take_kv_loads():
            side = self._decode.get(load.req_id)
            if side is None:
                continue
            first, count = load.first_remote_block, len(load.local_block_ids)
            side.local_block_ids = load.local_block_ids
            side.num_blocks = count
            side.num_hit_tokens = load.num_local_hit_tokens
            if count == 0:  # the whole prompt was in this worker's prefix cache
                self._loaded(load.req_id, side)
                continue
            self.puller.pull(PullJob(load.req_id, side.address, side.remote_req_id,
                                     side.remote_block_ids[first:first + count]))

    def step(self) -> list[Any]:
        self.service()
        if self._test_prefill_step_delay_s and self._prefill:
            time.sleep(self._test_prefill_step_delay_s)
        outputs = self._finished_here(list(self.inner.step()))
        if self.puller is not None:
            self._start_loads()
        if self.kv_events is not None:
            # Now, not at the next turn: the loop may block for a while once idle, and a
            # conversation's next turn should find this answer's blocks already announced.
            self.kv_events.publish()
        return outputs

    def set_interjection_hooks(self, poll: Any, emit: Any) -> None:
        """The inner engine's hooks, with the interjected steps' outputs passed through this
        role's handling first: a short prompt prefilled inside a long step is leased and
        answered with its handoff like any other (not left holding its blocks)."""
        wrapped = None if emit is None else (lambda outputs: emit(self._finished_here(
            list(outputs))))
        self.inner.set_interjection_hooks(poll, wrapped)

    def _finished_here(self, outputs: list[Any]) -> list[Any]:
        """Finished requests of either role: a prefill's lease and handoff, a decode's release
        of the remote lease and its transfer record."""
        for i, out in enumerate(outputs):
            if not out.finished:
                continue
            if out.req_id in self._prefill:
                outputs[i] = self._prefill_done(out, self._prefill.pop(out.req_id))
            elif out.req_id in self._decode:
                side = self._decode.pop(out.req_id)
                self._release_remote(side)
                outputs[i] = dataclasses.replace(out, kv_transfer_params=side.record())
        return outputs

    def _prefill_done(self, out: Any, side: _PrefillSide) -> Any:
        """Lease the blocks and answer with the handoff, or free them when it is all done."""
        blocks = self.scheduler.kv.leased_blocks(out.req_id)
        goes_on = (out.finish_reason == "length" and side.wanted_max_tokens > 1
                   and blocks is not None and len(out.new_token_ids) == 1)
        if not goes_on:
            self.scheduler.release_kv_lease(out.req_id)
            return out
        self.leases.add(out.req_id, blocks)
        return dataclasses.replace(out, kv_transfer_params={
            "do_remote_prefill": True,
            "remote_engine_id": self.engine_id,
            "remote_address": self.kv_address,
            "remote_request_id": out.req_id,
            "remote_block_ids": list(blocks),
            "first_token_id": int(out.new_token_ids[0]),
            "prompt_token_ids": list(side.prompt_token_ids),
            "block_size": self.block_size,
        })

    # ---- stats, shutdown
    def stats(self) -> dict[str, Any]:
        stats = dict(self.inner.stats())
        stats.update(self.counters)
        if self.leases is not None:
            stats["kv_leases_expired_total"] = self.leases.num_expired_total
            stats["kv_bytes_served_total"] = self.leases.bytes_served_total
            stats["num_leases"] = len(self.leases)
        stats["kv_bytes_per_token"] = self.layout.bytes_per_block / self.block_size
        stats["disagg_role"] = self.cfg.role
        stats["kv_transfer_address"] = self.kv_address
        stats["kv_events_port"] = self.kv_events.port if self.kv_events is not None else 0
        return stats

    def close(self) -> None:
        if self.kv_events is not None:
            self.kv_events.close()
        if self.server is not None:
            self.server.close()
        if self.puller is not None:
            self.puller.close()
        self.wakeup_socket.close()
        self.inner.close()


def build_disagg_engine(engine_config: dict[str, Any], served_model_name: str | None) -> Any:
    """Engine factory ("cadence.disagg.worker:build_disagg_engine"): the EngineConfig dict
    with a "disagg" entry (DisaggConfig fields)."""
    from cadence.engine.llm_engine_adapter import build_llm_engine

    config = dict(engine_config)
    disagg = DisaggConfig(**(config.pop("disagg", None) or {}))
    return DisaggEngineCore(build_llm_engine(config, served_model_name), disagg)
