"""ModelExecutor: runs StepPlans on the torch model and owns its paged KV cache."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch

from cadence.core.plan import StepOutput, StepPlan
from cadence.executor.inputs import ModelInputs
from cadence.executor.logits_processors import has_token_edits, token_edits
from cadence.executor.prompt_logprobs import prompt_logprobs
from cadence.executor.sampler import sample
from cadence.executor.structured_output import PREPARED_TTL_S, StructuredOutputs
from cadence.model.kv_cache import KVCache
from cadence.model.loader import LoadedModel

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DiskIO:
    """What the disk tier's I/O of one step left undone: failed slots, the device blocks that
    were not read back (their chunks are left out of the forward), and why."""

    failed_slots: list[int] = dataclasses.field(default_factory=list)
    unread_blocks: set[int] = dataclasses.field(default_factory=set)
    error: str = ""


class ModelExecutor:
    """StepPlan -> tensors -> forward -> logits of the sampling rows -> sampled tokens.

    The cache holds `num_blocks` blocks of `block_size` positions, on the model's device, in
    `kv_dtype` (default: the model's compute dtype; the engine passes --kv-cache-dtype's
    resolution, kv_cache.loaded_kv_cache_dtype; float16 / bf16 under a float32 model halve it). `seed` seeds the RNG used by unseeded random sampling (seeded requests use their
    own generator, see sampler.py).
    """

    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int,
                 seed: int | None = None, num_swap_blocks: int = 0,
                 kv_offload_dir: str | None = None, kv_offload_disk_blocks: int = 8,
                 kv_dtype: torch.dtype | None = None):
        self.loaded = loaded
        self.model = loaded.model
        self.config = loaded.config
        self.device = loaded.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        kv_dtype = kv_dtype or loaded.dtype
        self.kv_cache = KVCache(loaded.config, num_blocks, block_size, kv_dtype, self.device)
        # The host tier of swap preemption (core/swap.py): [num_layers, 2, num_swap_blocks,
        # block_size, num_kv_heads, head_dim] in host memory (pinned when the cache is on CUDA).
        self.host_kv: torch.Tensor | None = None
        if num_swap_blocks:
            shape = list(self.kv_cache.storage.shape)
            shape[2] = num_swap_blocks
            self.host_kv = torch.zeros(shape, dtype=kv_dtype, device="cpu",
                                       pin_memory=self.device.type == "cuda")
        # The disk tier (core/disk_tier.py): block files under a directory of its own.
        self.disk = None
        if kv_offload_dir is not None:
            from cadence.executor.disk_kv import DiskKVStore

            shape = list(self.kv_cache.storage.shape)
            del shape[2]  # one block: [num_layers, 2, block_size, num_kv_heads, head_dim]
            self.disk = DiskKVStore(kv_offload_dir, tuple(shape), kv_dtype)
        self.disk_slots_for_probe = kv_offload_disk_blocks
        self.model.prepare_fast_path()  # pack fast-path weights now, not in the first request
        self.structured = StructuredOutputs(loaded.tokenizer, loaded.config.vocab_size)
        # Seconds the last step spent computing grammar masks (the structured-output cost).
        self.last_mask_time_s = 0.0
        self._masks_thread = None  # started on the first constrained request
        # Token-id edits (logit_bias, allowed_token_ids, bad words) as tensors, by request:
        # built at admission (prepare_request), dropped at release; with the time each was
        # built, so those of requests refused after admission do not pile up.
        self.token_edits: dict[str, Any] = {}
        self._edits_built_at: dict[str, float] = {}
        self.generator = torch.Generator(device=self.device)
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()

    def _mask_pool(self):
        if self._masks_thread is None:
            from concurrent.futures import ThreadPoolExecutor

            self._masks_thread = ThreadPoolExecutor(1, thread_name_prefix="cadence-grammar")
        return self._masks_thread

    def _timed_masks(self, chunks) -> dict:
        t0 = time.perf_counter()
        masks = self.structured.masks(chunks)
        self.last_mask_time_s = time.perf_counter() - t0
        return masks

    def check_request(self, params) -> None:
        """ValueError when the request's structured-output spec does not compile."""
        if params.structured_outputs is not None:
            self.structured.check(params.structured_outputs)

    def prepare_request(self, req_id: str, params) -> None:
        """Per-request setup before the request joins the loop (admission threads): its
        grammar compiled (structured_output.StructuredOutputs.prepare; ValueError when it
        does not compile) and its token-id edits as tensors."""
        if params.structured_outputs is not None:
            self.structured.prepare(req_id, params.structured_outputs)
        if has_token_edits(params):
            now = time.monotonic()
            for old_id, built in list(self._edits_built_at.items()):
                if now - built > PREPARED_TTL_S:  # a live request rebuilds its own if needed
                    self.token_edits.pop(old_id, None)
                    self._edits_built_at.pop(old_id, None)
            self.token_edits[req_id] = token_edits(params, self.config.vocab_size)
            self._edits_built_at[req_id] = now

    def grammar_unfinished(self, req_id: str) -> bool:
        """Whether the request's grammar is incomplete: an EOS now was forced, not allowed."""
        return self.structured.unfinished(req_id)

    def release_request(self, req_id: str) -> None:
        """The request finished: drop its per-request state (grammar matcher, token edits)."""
        self.structured.release(req_id)
        self.token_edits.pop(req_id, None)
        self._edits_built_at.pop(req_id, None)

    def _check_plan(self, plan: StepPlan) -> None:
        if plan.block_size != self.block_size:
            raise ValueError(f"plan block_size {plan.block_size} != executor block_size {self.block_size}")
        limit = self.config.max_position_embeddings
        for chunk in plan.chunks:
            if chunk.end_pos > limit:
                raise ValueError(
                    f"request {chunk.req_id!r}: position {chunk.end_pos} exceeds the model's "
                    f"context of {limit}"
                )

    @torch.inference_mode()
    def _forward(self, plan: StepPlan, between_layers=None
                 ) -> tuple[torch.Tensor, torch.Tensor | None, ModelInputs, dict]:
        """Run the forward; returns logits [S_sample, V] float32, when the LM head computed
        it their argmax [S_sample] int64, the inputs, and the prompt logprobs of the chunks
        that carry prompt_targets (req_id -> (first prompt index, entries))."""
        self._check_plan(plan)
        inputs = ModelInputs.from_plan(plan, self.config.vocab_size, self.num_blocks, self.device)
        if not any(c.prompt_targets for c in plan.chunks):
            # A decode step on the GGUF stack: its LM head and argmax in the same kernel call.
            fused = self.model.forward_logits(inputs.input_ids, inputs.positions, inputs.meta, self.kv_cache,
                                              inputs.sample_rows)
            if fused is not None:
                return *fused, inputs, {}
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta, self.kv_cache,
                            between_layers=between_layers)  # [T, H]
        # Sample rows are the chunks' last rows in order: as many as the rows (a decode step)
        # are every row, and the gather (a copy) is left out.
        every_row = inputs.sample_rows.shape[0] == hidden.shape[0]
        sampled = hidden if every_row else hidden[inputs.sample_rows]  # [S_sample, H]
        logits, argmax = self.model.compute_logits_and_argmax(sampled)  # [S_sample, V]
        scored = {}
        if any(c.prompt_targets for c in plan.chunks):
            scored = prompt_logprobs(hidden, plan.chunks, inputs.meta.query_start_loc_host[:-1],
                                     self.model.compute_logits)
        return logits, argmax, inputs, scored

    @torch.inference_mode()
    def move_blocks(self, plan: StepPlan) -> DiskIO:
        """Everything a plan copies before its forward: copy-on-write blocks, then the tiers'
        copies, every copy out (disk, then host) before any copy in, so device blocks freed
        by a swap-out or an eviction may be reused in the same step."""
        self.kv_cache.copy_blocks(plan.block_copies)
        io = DiskIO()
        if plan.disk_out or plan.disk_in or plan.disk_discard:
            if self.disk is None:
                raise ValueError("the plan moves KV blocks to disk but the executor has no "
                                 "disk tier")
            self._write_disk(plan, io)
        self.swap_blocks(plan)
        if plan.disk_in:
            self._read_disk(plan, io)
        for slot in plan.disk_discard:
            self.disk.discard(slot)
        return io

    def _write_disk(self, plan: StepPlan, io: DiskIO) -> None:
        if not plan.disk_out:
            return
        storage = self.kv_cache.storage  # [layers, 2, num_blocks, block_size, H_kv, D]
        dev = torch.tensor([d for d, _ in plan.disk_out], device=self.device)
        blocks = storage[:, :, dev].to("cpu")  # [layers, 2, n, block_size, H_kv, D]
        for i, (_, slot) in enumerate(plan.disk_out):
            try:
                self.disk.write(slot, blocks[:, :, i])
            except OSError as exc:
                io.failed_slots.append(slot)
                io.error = io.error or f"writing KV to {self.disk.dir}: {exc}"

    def _read_disk(self, plan: StepPlan, io: DiskIO) -> None:
        storage = self.kv_cache.storage
        devs, blocks = [], []
        for slot, dev in plan.disk_in:
            try:
                blocks.append(self.disk.read(slot))
                devs.append(dev)
            except OSError as exc:
                io.failed_slots.append(slot)
                io.unread_blocks.add(dev)
                io.error = io.error or f"reading KV from {self.disk.dir}: {exc}"
        if devs:
            index = torch.tensor(devs, device=self.device)
            storage[:, :, index] = torch.stack(blocks, dim=2).to(self.device)

    def swap_blocks(self, plan: StepPlan) -> None:
        """The plan's host-tier copies: out first (the freed device blocks may be reused in
        this step), then back in."""
        if not plan.swap_out and not plan.swap_in:
            return
        if self.host_kv is None:
            raise ValueError("the plan swaps KV blocks but the executor has no host tier")
        storage = self.kv_cache.storage  # [layers, 2, num_blocks, ...]
        if plan.swap_out:
            dev = torch.tensor([d for d, _ in plan.swap_out], device=self.device)
            host = torch.tensor([h for _, h in plan.swap_out])
            self.host_kv[:, :, host] = storage[:, :, dev].to("cpu")
        if plan.swap_in:
            host = torch.tensor([h for h, _ in plan.swap_in])
            dev = torch.tensor([d for _, d in plan.swap_in], device=self.device)
            storage[:, :, dev] = self.host_kv[:, :, host].to(self.device, non_blocking=True)

    def measure_swap_block_copy_s(self, num_blocks: int = 8) -> float:
        """Seconds to copy one block one way between the tiers (measured, for the scheduler's
        swap-or-recompute choice)."""
        if self.host_kv is None:
            return 0.0
        n = min(num_blocks, self.num_blocks, self.host_kv.shape[2])
        pairs = tuple((i, i) for i in range(n))
        plan = StepPlan(step_id=-1, chunks=(), block_size=self.block_size, swap_out=pairs)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            self.swap_blocks(plan)
            best = min(best, time.perf_counter() - t0)
        return best / n

    def measure_disk_block_io_s(self, num_blocks: int = 8) -> tuple[float, float]:
        """Seconds to write and to read back one block of the disk tier, through the same
        path a swap takes (gather from the cache, files, scatter back; best of 3 rounds, after
        one warm-up), for the cost choice; (0, 0) without a disk tier. Run at start, before
        any request: it writes device blocks 0..n-1 back with their own contents."""
        if self.disk is None:
            return 0.0, 0.0
        n = min(num_blocks, self.num_blocks, self.disk_slots_for_probe)
        pairs = tuple((i, i) for i in range(n))
        out = StepPlan(step_id=-1, chunks=(), block_size=self.block_size, disk_out=pairs)
        back = StepPlan(step_id=-1, chunks=(), block_size=self.block_size, disk_in=pairs,
                        disk_discard=tuple(range(n)))
        best_w = best_r = float("inf")
        for i in range(4):
            t0 = time.perf_counter()
            io = self.move_blocks(out)
            t1 = time.perf_counter()
            io_back = self.move_blocks(back)
            t2 = time.perf_counter()
            if io.failed_slots or io_back.failed_slots:
                raise OSError(f"the KV disk tier does not work: {io.error or io_back.error}")
            if i:
                best_w, best_r = min(best_w, t1 - t0), min(best_r, t2 - t1)
        return best_w / n, best_r / n

    def close(self) -> None:
        """Remove the disk tier's files."""
        if self.disk is not None:
            self.disk.close()

    def forward_logits(self, plan: StepPlan) -> torch.Tensor:
        """Logits [S_sample, V] float32 for the plan's sampling chunks (writes the KV cache)."""
        if plan.is_empty:
            return torch.empty(0, self.config.vocab_size)
        self.move_blocks(plan)
        return self._forward(plan)[0]

    # The forward scores prompt tokens for chunks with prompt_targets (prompt_logprobs.py).
    supports_prompt_logprobs = True

    # execute() takes `between_layers` (the engine interjects short prompts there).
    can_pause = True

    def execute(self, plan: StepPlan, between_layers=None) -> StepOutput:
        """Run one step; one SampledToken per chunk with sample=True, keyed by req_id.

        between_layers: called between the forward's layers (LlamaForCausalLM.forward); it may
        call execute() with another plan whose requests and blocks are disjoint from this one's
        (the engine's interjection), so nothing of this step lives outside its locals."""
        if plan.is_empty:
            io = self.move_blocks(plan)
            return StepOutput(step_id=plan.step_id, failed_disk_slots=tuple(io.failed_slots),
                              io_error=io.error)
        start = time.perf_counter()
        io = self.move_blocks(plan)
        skipped: tuple[str, ...] = ()
        if io.unread_blocks:
            # Chunks whose KV did not come back are left out; the scheduler recomputes them.
            skipped = tuple(c.req_id for c in plan.chunks
                            if io.unread_blocks.intersection(c.block_table))
            plan = dataclasses.replace(
                plan, chunks=tuple(c for c in plan.chunks if c.req_id not in skipped))
        if io.failed_slots:
            logger.warning("step %d: disk tier I/O failed for %d blocks (%s)", plan.step_id,
                           len(io.failed_slots), io.error)
        if plan.is_empty:
            return StepOutput(step_id=plan.step_id, failed_disk_slots=tuple(io.failed_slots),
                              skipped_req_ids=skipped, io_error=io.error)
        # Grammar masks depend only on tokens already known, so they are computed on a side
        # thread while the forward runs (llguidance and the forward's kernels release the GIL);
        # the step waits for them only if they take longer than the forward.
        pending = None
        sample_chunks = [c for c in plan.chunks if c.sample]  # the order of inputs.sample_chunks
        if any(c.sampling.structured_outputs is not None for c in sample_chunks):
            pending = self._mask_pool().submit(self._timed_masks, sample_chunks)
        logits, argmax, inputs, scored = self._forward(plan, between_layers)
        sampled = []
        if inputs.sample_chunks:
            masks = pending.result() if pending is not None else None
            sampled = sample(logits, inputs.sample_chunks, self.generator, greedy=argmax,
                             masks=masks, edits=self.token_edits)
        elapsed = time.perf_counter() - start  # sample() reads ids back to the host: synced
        return StepOutput(
            step_id=plan.step_id,
            sampled={c.req_id: tok for c, tok in zip(inputs.sample_chunks, sampled)},
            forward_time_s=elapsed,
            failed_disk_slots=tuple(io.failed_slots),
            skipped_req_ids=skipped,
            io_error=io.error,
            prompt_logprobs=scored,
        )
