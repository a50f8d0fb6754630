"""LLMEngine: the step loop that ties scheduler, executor, detokenizer and telemetry together.

One step:  plan = scheduler.schedule()          # pure decision
           out = executor.execute(plan)         # tensors live only here
           updates = scheduler.update(plan, out)
           text per request (incremental detokenize, stop strings; a stop-string hit finishes
           the request through scheduler.finish_request)
           telemetry.record_step(...)
The engine never sleeps: when nothing can run, step() returns [] at once and the caller
decides how to wait (the offline LLM loop only steps while work is unfinished; the engine
process waits on its socket).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from cadence.core.plan import SampledToken, StepOutput, StepPlan
from cadence.core.prompt_truncation import truncate_prompt
from cadence.core.request import Request
from cadence.core.sampling_params import SamplingParams
from cadence.core.step_profile import profile_rows
from cadence.engine.config import EngineConfig, resolve_num_blocks
from cadence.engine.outputs import RequestOutput
from cadence.engine.request_text import RequestText
from cadence.telemetry.recorder import TelemetryRecorder
from cadence.telemetry.trace_writer import TraceWriter

__all__ = ["LLMEngine", "RequestOutput"]

# Seconds a prepared setup waits for its add_request (a request refused after its setup never
# comes).
PREPARED_TTL_S = 120.0

logger = logging.getLogger(__name__)


def uniform_sliding_window(config: Any) -> int | None:
    """The attention window when every layer of the model has one (Mistral): then the blocks
    that fall out of it can be given back. None when some layer sees the whole sequence (a
    Gemma 3 sequence keeps its full KV for the global layers)."""
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if not window or not types or any(t != "sliding_attention" for t in types):
        return None
    return int(window)


class LLMEngine:
    """Continuous-batching engine over one model. Not thread-safe: one caller drives step()."""

    def __init__(self, cfg: EngineConfig | None = None) -> None:
        """Load the model named by cfg (default model when None) and build everything."""
        from cadence.model.loader import load_model

        from cadence.engine.model_overrides import apply_model_overrides

        from cadence.engine.startup_progress import load_kernels_with_progress

        cfg = cfg or EngineConfig()
        from cadence.model.loader import resolve_device

        if resolve_device(cfg.device).type == "cpu":
            load_kernels_with_progress()  # the silent 1-2 min of a first run, announced
        loaded = load_model(cfg.model, dtype=cfg.model_dtype, device=cfg.device,
                            quantization=cfg.quantization)
        self._build(apply_model_overrides(loaded, cfg), cfg)
        # This engine owns its model: an int8/int4 model whose every CPU path runs on the
        # packed integer weights gives back its float32 copies (from_loaded engines share
        # theirs with callers that may still use them).
        release = getattr(loaded.model, "release_float_weights", None)
        if release is not None and release():
            logger.info("float32 GEMM weights released: the %s packed weights serve every path",
                        loaded.model.decode_weight_format)

    @classmethod
    def from_loaded(cls, loaded: Any, cfg: EngineConfig | None = None) -> LLMEngine:
        """An engine over an already loaded model (cfg.model, dtype and device are then
        ignored): benchmarks and tests run many configs without reloading the weights."""
        cfg = cfg or EngineConfig()
        if cfg.deterministic and str(loaded.dtype) != "torch.float32":
            raise ValueError("deterministic needs a model loaded in float32")
        if cfg.deterministic and getattr(loaded.model, "decode_weight_format", "float32") in ("int8", "int4"):
            raise ValueError("deterministic needs float32 or bf16 weights, not int8 or int4 "
                             "(load with quantization='none')")
        engine = cls.__new__(cls)
        engine._build(loaded, cfg)
        return engine

    def _build(self, loaded: Any, cfg: EngineConfig) -> None:
        # Imported here so that from_parts (fake executor tests) never needs the model stack.
        from cadence.core.scheduler import Scheduler
        from cadence.executor.model_runner import ModelExecutor
        from cadence.engine.memory_bound import check_memory_bound, kv_bytes_from_fraction
        from cadence.model.kv_cache import kv_bytes_per_block, loaded_kv_cache_dtype

        if cfg.deterministic:
            # Float32 / bf16 weights too on the packed kernels at every row count (integer
            # weights, the default, already are): batch-invariant by construction.
            pin = getattr(loaded.model, "pin_invariant_gemms", None)
            if pin is not None:
                pin()
        # The KV cache's storage dtype (auto: float16 for a GGUF under float32 compute, as
        # llama.cpp; an HF checkpoint's own 16-bit dtype, as vLLM): blocks per byte of pool and
        # the bound follow it.
        kv_dtype = loaded_kv_cache_dtype(cfg.kv_cache_dtype, loaded)
        sched_cfg = cfg.scheduler
        model_len = loaded.config.max_position_embeddings
        if sched_cfg.max_model_len > model_len:
            sched_cfg = dataclasses.replace(sched_cfg, max_model_len=model_len)
        cache_cfg = cfg.cache
        if (cache_cfg.kv_cache_memory_fraction is not None and cache_cfg.num_blocks is None
                and cache_cfg.kv_cache_memory_bytes is None):
            # vLLM's gpu_memory_utilization: a share of the RAM free now (weights loaded).
            pool = kv_bytes_from_fraction(loaded, cache_cfg.kv_cache_memory_fraction,
                                          sched_cfg.max_num_batched_tokens, sched_cfg.max_num_seqs)
            cache_cfg = dataclasses.replace(cache_cfg, kv_cache_memory_bytes=pool)
        cache_cfg = resolve_num_blocks(
            cache_cfg,
            kv_bytes_per_block(loaded.config, cfg.cache.block_size, kv_dtype),
            sched_cfg.max_num_seqs,
            sched_cfg.max_model_len,
        )
        # Fail now, not under load, when the pool and one full step cannot fit.
        self.memory_bound = check_memory_bound(
            loaded,
            cache_cfg.num_blocks * kv_bytes_per_block(loaded.config, cache_cfg.block_size, kv_dtype),
            sched_cfg.max_num_batched_tokens, sched_cfg.max_num_seqs)
        if loaded.device.type == "cpu":
            # Build/load the compiled CPU kernels before the first request, not inside it.
            from cadence.model.kernels import cpu_ops
            from cadence.model.kernels.cpu_ops import load_cpu_kernels

            # The first run compiles them (minutes on 2 cores): say so rather than sit silent.
            cache = getattr(cpu_ops, "kernel_cache_dir", lambda: "the kernel cache")()
            logger.info("loading the CPU kernels (compiled on first use, cached in %s)", cache)
            t0 = time.perf_counter()
            load_cpu_kernels()
            logger.info("CPU kernels ready in %.1f s", time.perf_counter() - t0)
        executor = ModelExecutor(loaded, cache_cfg.num_blocks, cache_cfg.block_size, seed=cfg.seed,
                                 kv_dtype=kv_dtype,
                                 num_swap_blocks=cache_cfg.num_swap_blocks,
                                 kv_offload_dir=cache_cfg.kv_offload_dir,
                                 kv_offload_disk_blocks=cache_cfg.kv_offload_disk_blocks)
        scheduler = Scheduler(sched_cfg, cache_cfg, sliding_window=uniform_sliding_window(loaded.config))
        if cache_cfg.num_swap_blocks:
            scheduler.swap_block_copy_s = executor.measure_swap_block_copy_s()
        if cache_cfg.kv_offload_dir is not None:
            write_s, read_s = executor.measure_disk_block_io_s()
            scheduler.disk_block_write_s, scheduler.disk_block_read_s = write_s, read_s
            logger.info("KV disk tier in %s: %d blocks, %.2f ms to write and %.2f ms to read "
                        "a block", executor.disk.dir, cache_cfg.kv_offload_disk_blocks,
                        write_s * 1e3, read_s * 1e3)
        from cadence.model.fast_path_info import describe_fast_path

        self.fast_path, slow_warning = describe_fast_path(loaded, cache_cfg.num_blocks * cache_cfg.block_size)
        logger.info("cadence: %s: %s", loaded.name, self.fast_path)
        if slow_warning:
            logger.warning("cadence: slow path: %s", slow_warning)
        if cfg.startup_profile and hasattr(scheduler.policy, "calibrate"):
            from cadence.core.step_profile import profile_steps

            from cadence.engine.startup_progress import phase

            with phase("startup profile: timing model steps to calibrate the scheduler "
                       "(10-30 s, sized by the model; --no-startup-profile skips it)", "startup profile done"):
                samples = profile_steps(executor.execute, cache_cfg.block_size,
                                        cache_cfg.num_blocks, sched_cfg.max_model_len)
            scheduler.calibrate(samples)
            self.profile_samples = samples
        else:
            self.profile_samples = []
        self._setup(
            scheduler,
            executor,
            loaded.tokenizer,
            TelemetryRecorder(cfg.telemetry_max_steps, cfg.telemetry_max_finished),
            time.monotonic,
        )
        self.config = dataclasses.replace(cfg, scheduler=sched_cfg, cache=cache_cfg)
        self.split_contention = None
        if sched_cfg.core_split != "off" and loaded.device.type == "cpu":
            self.enable_core_split()
            if cfg.startup_profile and sched_cfg.core_split in ("auto", "disjoint"):
                # Two teams compute at once only there (interleave time-slices one team).
                self.split_contention = self._split_contention(loaded, executor, cache_cfg)
        self.model_name = loaded.name
        self.model_config = loaded.config
        if cfg.trace_path:
            # Stalls over the ITL target are attributed as they happen and written too. The
            # startup profile is what the slo policy plans prompt chunks from (its prior), so a
            # replay of this trace can plan them as this engine did (`cadence sim --compare`).
            self.telemetry.add_listener(TraceWriter(
                cfg.trace_path, stall_target_s=sched_cfg.target_itl_ms / 1000.0,
                meta={"model": loaded.name, "scheduler": dataclasses.asdict(sched_cfg),
                      "num_cores": _engine_cores(),
                      "cache": dataclasses.asdict(cache_cfg),
                      "startup_profile": profile_rows(self.profile_samples)}))

    @classmethod
    def from_parts(
        cls,
        scheduler: Any,
        executor: Any,
        tokenizer: Any = None,
        telemetry: TelemetryRecorder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> LLMEngine:
        """An engine over ready-made parts (tests: a FakeExecutor and a small tokenizer).

        tokenizer may be None for token-ids-only use; then texts are empty, text prompts and
        stop strings are refused.
        """
        engine = cls.__new__(cls)
        engine._setup(scheduler, executor, tokenizer, telemetry or TelemetryRecorder(), clock)
        engine.profile_samples = []
        engine.config = None
        engine.model_name = getattr(tokenizer, "name", None) or "parts"
        engine.model_config = None
        return engine

    def _setup(self, scheduler, executor, tokenizer, telemetry, clock) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.tokenizer = tokenizer
        self.telemetry = telemetry
        self._clock = clock
        # Text state of every request not yet reported finished, by id.
        self._texts: dict[str, RequestText] = {}
        # Prompt logprobs gathered chunk by chunk, by request (prompt_logprobs set), until
        # its first output carries them.
        self._prompt_scores: dict[str, list[SampledToken]] = {}
        # Setups made by prepare_request (admission threads), by id, with when they were made.
        self._prepared_texts: dict[str, tuple[RequestText, float]] = {}
        # Final outputs decided outside step() (aborts), handed out by the next step().
        self._pending: list[RequestOutput] = []
        # Interjection (set_interjection_hooks): the caller's poll for arrivals, where the
        # interjected steps' outputs go (None: into the step's own outputs), those outputs,
        # and the executor seconds interjected into the current step.
        self._poll_arrivals: Callable[[], None] | None = None
        self._emit: Callable[[list[RequestOutput]], None] | None = None
        self._interjected_outputs: list[RequestOutput] = []
        self._interjected_s = 0.0
        # This step's plan and executor seconds, (None, 0.0) where it ran none (the split
        # stepper learns the colocated decode step time from it; benchmarks read it).
        self.last_executed: tuple[StepPlan | None, float] = (None, 0.0)
        self._split_enabled = False
        self._split = None

    def set_interjection_hooks(self, poll: Callable[[], None] | None,
                               emit: Callable[[list[RequestOutput]], None] | None = None) -> None:
        """Let short prompts that arrive during a long step run inside it
        (SchedulerConfig.interject_short_prompts). `poll` is called between two layers of
        such a step and may call add_request (the engine loop admits what reached its
        socket); a short prompt it added runs there, whole, and `emit` gets its outputs at
        once (its first token), before the long step ends. Without `emit` they are returned
        by the step() in progress. poll=None turns interjection off."""
        self._poll_arrivals = poll
        self._emit = emit

    # ---------------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """What this engine serves, for the startup log line: model, dtype, device, KV cache,
        kernels, policy."""
        cfg = self.config
        out: dict[str, Any] = {"model": self.model_name}
        executor = self.executor
        loaded = getattr(executor, "loaded", None)
        if loaded is not None:
            out["dtype"] = str(loaded.dtype).removeprefix("torch.")
            out["device"] = str(loaded.device)
            kv = executor.kv_cache
            out["kv_cache"] = (f"{executor.num_blocks} blocks x {executor.block_size} tokens"
                               f" = {executor.num_blocks * executor.block_size} tokens")
            kv_bytes = kv.storage.numel() * kv.storage.element_size()
            out["kv_cache_mib"] = round(kv_bytes / 2**20, 1)
            out["kv_cache_dtype"] = str(kv.dtype).removeprefix("torch.")
            out["kernels"] = (getattr(self, "fast_path", None)
                              or _kernel_description(loaded.device))
        if cfg is not None:
            s = cfg.scheduler
            out["policy"] = s.policy
            out["max_num_batched_tokens"] = s.max_num_batched_tokens
            out["max_num_seqs"] = s.max_num_seqs
            out["max_model_len"] = s.max_model_len
            out["prefix_caching"] = cfg.cache.enable_prefix_caching
            if cfg.quantization:
                out["quantization"] = cfg.quantization
        return out

    @property
    def max_model_len(self) -> int:
        """Longest sequence a request may reach (the scheduler's limit)."""
        return self.scheduler.sched.max_model_len

    def prepare_request(self, req_id: str, params: SamplingParams) -> SamplingParams:
        """The per-request setup that grows with the request, done before add_request in the
        caller's thread (the server's admission threads: never on the step loop): bad words
        tokenized, the stop-string matcher built, the executor's grammar and token-edit
        tensors. Returns the params with bad_words_token_ids filled; ValueError on bad input.
        add_request takes what was prepared for the same id; unclaimed setups expire."""
        if self.tokenizer is not None and not params.eos_token_ids:
            params = dataclasses.replace(params, eos_token_ids=tuple(self.tokenizer.stop_token_ids))
        if params.bad_words and not (params.bad_words_token_ids or params.bad_words_sequences):
            single, sequences = self._bad_word_ids(params)
            params = dataclasses.replace(params, bad_words_token_ids=single,
                                         bad_words_sequences=sequences)
        text = RequestText(self.tokenizer, params)
        prepare = getattr(self.executor, "prepare_request", None)
        if prepare is not None:
            prepare(req_id, params)
        now = time.monotonic()
        for old_id, (_, built) in list(self._prepared_texts.items()):
            if now - built > PREPARED_TTL_S:  # refused after admission (queue limits)
                self._prepared_texts.pop(old_id, None)
        self._prepared_texts[req_id] = (text, now)
        return params

    def add_request(
        self,
        req_id: str,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        *,
        hold_kv: bool = False,
        prefilled_token: int | None = None,
        cache_salt: str | None = None,
        truncation_side: str = "left",
    ) -> tuple[int, ...]:
        """Queue a request; returns its prompt token ids. Raises ValueError on bad input.

        Disaggregation (cadence.disagg): `hold_kv` leases the request's blocks when it finishes
        (a prefill worker's request, read by a decode worker); `prefilled_token` is the first
        output token another engine sampled after prefilling this prompt: the request then
        waits for its KV (scheduler.take_kv_loads / finish_remote_kv) and that token is
        returned by the next step() at once. `cache_salt` (vLLM's) keeps the request's
        prefix-cache blocks apart from those of requests with another salt or none.
        `truncation_side` is the end `params.truncate_prompt_tokens` cuts from ("left" keeps
        the prompt's last tokens, "right" its first)."""
        if not isinstance(req_id, str) or not req_id:
            raise ValueError(f"req_id must be a non-empty str, got {req_id!r}")
        if req_id in self._texts:
            raise ValueError(f"request {req_id!r} is already running")
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        prompt_ids = self._prompt_ids(req_id, prompt)
        limit = self.max_model_len
        # vLLM's truncate_prompt_tokens: the last k tokens, or the first k with side "right"
        # (the server's admission applied it already and cleared the field).
        prompt_ids = truncate_prompt(prompt_ids, params.truncate_prompt_tokens, limit,
                                     params.max_tokens, truncation_side)
        if len(prompt_ids) >= limit:
            raise ValueError(
                f"request {req_id!r}: prompt has {len(prompt_ids)} tokens, but max_model_len is "
                f"{limit} (the prompt must leave room for at least one output token)"
            )
        if self.tokenizer is not None and not params.eos_token_ids:
            params = dataclasses.replace(params, eos_token_ids=tuple(self.tokenizer.stop_token_ids))
        vocab = getattr(self.tokenizer, "vocab_size", None)
        if params.allowed_token_ids is not None and vocab is not None and \
                max(params.allowed_token_ids) >= vocab:
            raise ValueError(f"allowed_token_ids holds {max(params.allowed_token_ids)}, outside "
                             f"the vocabulary [0, {vocab})")
        if params.max_tokens is None:  # vLLM's: up to the context length
            params = dataclasses.replace(params, max_tokens=limit - len(prompt_ids))
        if params.bad_words and not (params.bad_words_token_ids or params.bad_words_sequences):
            single, sequences = self._bad_word_ids(params)
            params = dataclasses.replace(params, bad_words_token_ids=single,
                                         bad_words_sequences=sequences)
        if params.prompt_logprobs is not None:
            if not getattr(self.executor, "supports_prompt_logprobs", False):
                raise ValueError("prompt_logprobs: this engine's executor does not compute "
                                 "prompt logits")
            if prefilled_token is not None:
                raise ValueError("prompt_logprobs cannot be served for a prompt prefilled by "
                                 "another engine (its logits stayed there)")
        check = getattr(self.executor, "check_request", None)
        if check is not None:
            check(params)
        elif params.structured_outputs is not None:
            raise ValueError("this engine's executor does not support structured outputs")
        prepared = self._prepared_texts.pop(req_id, None)
        text = prepared[0] if prepared is not None else RequestText(self.tokenizer, params)
        arrival = self._clock() if arrival_time is None else float(arrival_time)
        request = Request(req_id, prompt_ids, params, arrival, priority, cache_salt=cache_salt)
        request.hold_kv_on_finish = hold_kv
        if prefilled_token is None:
            self.scheduler.add_request(request)
        else:
            request.append_output_token(int(prefilled_token))
            self.scheduler.add_remote_request(request)
        self._texts[req_id] = text
        if params.prompt_logprobs is not None:
            # Entry i scores prompt token i; nothing predicts the first one.
            self._prompt_scores[req_id] = [SampledToken(token_id=prompt_ids[0])]
        self.telemetry.request_arrived(req_id, arrival, len(prompt_ids))
        if prefilled_token is not None:
            self._emit_prefilled_token(request, text)
        return prompt_ids

    def _bad_word_ids(self, params: SamplingParams
                      ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """(one-token words' ids, longer words' id sequences) of vLLM's bad_words, each word
        tokenized as vLLM does: without a leading space, and with one where that gives as
        many tokens starting with another one (a new word token, not the same one)."""
        if self.tokenizer is None:
            raise ValueError("bad_words need a tokenizer; this engine has none")
        words: list[tuple[int, ...]] = []
        for word in params.bad_words:
            plain = tuple(self.tokenizer.encode(word.lstrip(), add_special_tokens=False))
            spaced = tuple(self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
            if not plain:
                raise ValueError(f"bad_words: {word!r} has no tokens")
            words.append(plain)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                words.append(spaced)
        single = tuple(dict.fromkeys(w[0] for w in words if len(w) == 1))
        longer = tuple(dict.fromkeys(w for w in words if len(w) > 1))
        return single, longer

    def _emit_prefilled_token(self, request: Request, text: RequestText) -> None:
        """The first token came with the request: stream it now, before its KV arrives."""
        new_text = text.push((request.output_token_ids[0],), finished=False)
        finished = text.stopped
        if finished:  # a stop string ends it on its first token: nothing to load
            self.scheduler.finish_request(request.req_id, reason="stop")
            del self._texts[request.req_id]
            self.telemetry.finish_request(request.req_id, "stop", self._clock())
        self._pending.append(RequestOutput(
            req_id=request.req_id, new_token_ids=(request.output_token_ids[0],),
            new_text=new_text, finished=finished, finish_reason="stop" if finished else None,
            num_prompt_tokens=request.num_prompt_tokens, num_output_tokens=1,
            num_cached_tokens=0))

    def _release(self, req_id: str) -> None:
        self._prompt_scores.pop(req_id, None)
        release = getattr(self.executor, "release_request", None)
        if release is not None:
            release(req_id)

    def abort_request(self, req_id: str) -> bool:
        """Stop a request at once (its blocks are freed now). The next step() returns its final
        RequestOutput with finish_reason "abort". False when the id is unknown or finished."""
        if req_id not in self._texts:
            return False
        req = self.scheduler.get_request(req_id)
        self.scheduler.abort_request(req_id, reason="abort")
        del self._texts[req_id]
        self._release(req_id)
        self.telemetry.finish_request(req_id, "abort", self._clock())
        self._pending.append(_final_output(req_id, req, "abort"))
        return True

    def fail_request(self, req_id: str, message: str) -> bool:
        """End a request with finish_reason "error" and `message` (blocks freed now); the next
        step() returns its final output. False when the id is unknown or finished."""
        if req_id not in self._texts:
            return False
        self._pending.append(self._fail_request(req_id, message))
        return True

    @property
    def has_pending_outputs(self) -> bool:
        return bool(self._pending)

    def has_unfinished(self) -> bool:
        return bool(self._pending) or bool(self._texts) or self.scheduler.has_unfinished()

    def _split_contention(self, loaded: Any, executor: Any, cache_cfg: Any) -> Any:
        """This machine's split-core contention (core/contention.py): cached per CPU, core
        count, kernel tier and model, else measured now (a few seconds) and cached; the
        CoreSplit's prior until the engine's own contended steps are measured."""
        from cadence.core.contention import load_cached, machine_key, save_cached

        cores = _engine_cores()
        if cores < 2:
            return None
        from cadence.model.kernels.isa import selected_tier

        key = machine_key(cores, selected_tier().name, loaded.name)
        cached = load_cached(key)
        if cached is not None:
            logger.info("cadence: split-core contention %s: decode x%.2f, prefill x%.2f",
                        cached.source, cached.decode, cached.prefill)
            return cached
        from cadence.executor.contention_probe import measure_contention

        from cadence.engine.startup_progress import phase

        with phase("contention probe: a decode step beside a prefill on split cores",
                   "contention probe done"):
            measured = measure_contention(executor.execute, cache_cfg.block_size,
                                          cache_cfg.num_blocks, cores)
        if measured is not None:
            save_cached(key, measured)
            logger.info("cadence: split-core contention measured: decode x%.2f, prefill x%.2f",
                        measured.decode, measured.prefill)
        return measured

    def enable_core_split(self, num_cores: int | None = None, pin: bool | None = None) -> None:
        """Run prefill and decode side by side on split cores (--core-split auto; see
        engine/split_stepper.py). `num_cores`: the cores to split (default: the calling
        thread's torch thread count at the first step, so a later torch.set_num_threads of
        the engine process counts). With one core every step stays colocated."""
        self._split_cores = num_cores
        self._split_pin = pin
        self._split = None
        self._split_enabled = True

    @property
    def split_stepper(self) -> Any:
        """The SplitStepper once split steps started (None otherwise)."""
        return getattr(self, "_split", None)

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns the outputs of requests that progressed or ended."""
        if getattr(self, "_split_enabled", False):
            if self._split is None:
                from cadence.engine.split_stepper import SplitStepper

                cores = self._split_cores or _engine_cores()
                contention = getattr(self, "split_contention", None)
                self._split = SplitStepper(self, cores, self._split_pin,
                                           contention.decode if contention else None)
                self._split.on_change.append(self._record_split_change)
            return self._split.step()
        return self._step_colocated()

    def _record_split_change(self, decision: Any, t: float) -> None:
        """Trace files and listeners get each change of the core split."""
        self.telemetry.record_event({"type": "core_split", "time": t,
                                     "decode_threads": decision.decode_threads,
                                     "prefill_threads": decision.prefill_threads})

    def _step_colocated(self) -> list[RequestOutput]:
        """One step of the policy over every request, on the calling thread's cores."""
        self.last_executed = (None, 0.0)
        outputs, self._pending = self._pending, []
        t_start = self._clock()
        plan: StepPlan = self.scheduler.schedule()
        if plan.is_empty and _moves_blocks(plan):
            # Nothing to compute, but copies to make (a request preempted itself to a tier)
            # or files to delete (a swapped request was aborted).
            out = self.executor.execute(plan)
        elif plan.is_empty:
            out = StepOutput(step_id=plan.step_id)
        else:
            self._interjected_s = 0.0
            t_exec = time.perf_counter()
            try:
                out = self._execute(plan)
            except Exception as exc:  # one bad batch fails its requests, not the engine
                logger.exception("executor failed on step %d", plan.step_id)
                return outputs + self._take_interjected() + self._fail_plan(plan, exc)
            # The executor's own time (not the engine clock, which tests may fake) feeds
            # policies that model step time (slo); the time of prompts interjected into it
            # is not the step's own.
            seconds = max(0.0, time.perf_counter() - t_exec - self._interjected_s)
            self.scheduler.observe_step(plan, seconds)
            self.last_executed = (plan, seconds)
            outputs += self._take_interjected()
        return outputs + self._finish_step(plan, out, t_start)

    # -- interjection ------------------------------------------------------------------------
    def _execute(self, plan: StepPlan) -> StepOutput:
        """executor.execute(plan), pausable between layers for interjected short prompts
        when the caller polls for arrivals and the scheduler allows it for this plan. Every
        step with prompt tokens polls, also those too small to interject into: the caller
        answers /tokenize calls there (a cache-aware router waits on one to route each
        request; at the step's end it waited up to a prefill step, 0.23 s on average in
        docs/performance.md's replica run)."""
        if (self._poll_arrivals is None or not getattr(self.executor, "can_pause", False)
                or not plan.num_prefill_tokens):
            return self.executor.execute(plan)
        interjecting = self.scheduler.may_interject(plan)

        def between_layers() -> None:
            self._poll_arrivals()
            if interjecting and self.scheduler.interjection_wanted(plan):
                self._interject(plan)

        return self.executor.execute(plan, between_layers=between_layers)

    def _interject(self, paused: StepPlan) -> None:
        """Run the short prompts that arrived during `paused` as a step of their own, now,
        between two of its layers; their outputs (first tokens) go out at once."""
        t_start = self._clock()
        plan = self.scheduler.schedule_interjection(paused)
        if plan is None:
            return
        t_exec = time.perf_counter()
        try:
            out = self.executor.execute(plan)
        except Exception as exc:  # fails the interjected requests, not the paused step
            logger.exception("executor failed on interjected step %d", plan.step_id)
            outputs = self._fail_plan(plan, exc)
        else:
            elapsed = time.perf_counter() - t_exec
            self.scheduler.observe_step(plan, elapsed)
            outputs = self._finish_step(plan, out, t_start)
        self._interjected_s += time.perf_counter() - t_exec
        if self._emit is not None:
            self._emit(outputs)
        else:
            self._interjected_outputs.extend(outputs)

    def _take_interjected(self) -> list[RequestOutput]:
        outputs, self._interjected_outputs = self._interjected_outputs, []
        return outputs

    def _finish_step(self, plan: StepPlan, out: StepOutput, t_start: float) -> list[RequestOutput]:
        """Update the scheduler with a computed (or empty) plan; its outputs, telemetry."""
        outputs: list[RequestOutput] = []
        updates = self.scheduler.update(plan, out)
        self._collect_prompt_scores(out)
        stop_hits: list[str] = []
        for u in updates:
            text = self._texts.get(u.req_id)
            if text is None:
                continue  # finished earlier (abort) and already reported
            try:
                output = self._output_for(u, text, out)
            except ValueError as exc:  # e.g. a sampled id the tokenizer cannot decode
                logger.exception("detokenizing request %s failed", u.req_id)
                output = self._fail_request(u.req_id, f"detokenizing failed: {exc}")
                outputs.append(output)
                continue
            if output.finished:
                del self._texts[u.req_id]
                self._release(u.req_id)
                if not u.finished:
                    stop_hits.append(u.req_id)
            outputs.append(output)
        for req_id in stop_hits:
            self.scheduler.finish_request(req_id, reason="stop")
        if not plan.is_empty:
            t_end = self._clock()
            self.telemetry.record_step(plan, out, updates, t_start, t_end, self.scheduler.stats())
            for req_id in stop_hits:
                self.telemetry.finish_request(req_id, "stop", t_end)
        else:
            # No step ran, but the scheduler may have ended requests (e.g. rejected as too
            # large for the KV cache): their timelines end now.
            t_end = self._clock()
            for u in updates:
                if u.finished:
                    self.telemetry.finish_request(u.req_id, u.finish_reason or "error", t_end)
        return outputs

    def close(self) -> None:
        """Flush telemetry listeners (trace files); remove the disk tier's files."""
        if self.split_stepper is not None:
            self._split.close()
        self.telemetry.close()
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()

    # ---------------------------------------------------------------------------------------
    def _prompt_ids(self, req_id: str, prompt: str | Sequence[int]) -> tuple[int, ...]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer; pass token ids")
            ids = tuple(self.tokenizer.encode(prompt))
        else:
            try:
                ids = tuple(prompt)
            except TypeError:
                raise ValueError(
                    f"request {req_id!r}: prompt must be str or a sequence of token ids"
                ) from None
            vocab = getattr(self.tokenizer, "vocab_size", None)
            for tok in ids:
                if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
                    raise ValueError(f"request {req_id!r}: token ids must be ints >= 0, got {tok!r}")
                if vocab is not None and tok >= vocab:
                    raise ValueError(
                        f"request {req_id!r}: token id {tok} outside the vocabulary [0, {vocab})"
                    )
        if not ids:
            raise ValueError(f"request {req_id!r}: the prompt is empty")
        return ids

    def _output_for(self, u: Any, text: RequestText, out: StepOutput) -> RequestOutput:
        ended_by_stop_token = bool(u.finished and u.finish_reason == "stop" and u.new_token_ids
                                   and u.new_token_ids[-1] in text.stop_token_ids)
        new_text = text.push(u.new_token_ids, finished=u.finished, stop_token=ended_by_stop_token)
        finished, reason = u.finished, u.finish_reason
        stop_reason = None
        if text.stopped:
            finished, reason = True, "stop"
            stop_reason = text.matched_stop
        elif finished and reason == "stop" and u.new_token_ids:
            last = u.new_token_ids[-1]
            if last in text.stop_token_ids:
                stop_reason = last
            # Ended by a token (EOS or a stop_token_ids entry; both finish as "stop" in the
            # scheduler): under a grammar, that is a "stop" only when the grammar is complete.
            # Otherwise the mask forced the EOS (its matcher failed, or it could not finish
            # within the tokens left): the output does not match the grammar.
            unfinished = getattr(self.executor, "grammar_unfinished", None)
            if (last in text.stop_token_ids or last in text.eos_token_ids) and \
                    unfinished is not None and unfinished(u.req_id):
                reason, stop_reason = "length", None
        logprobs = None
        sampled = out.sampled.get(u.req_id)
        if u.new_token_ids and sampled is not None and sampled.logprob is not None:
            logprobs = (sampled,)
        prompt_scores = None
        scores = self._prompt_scores.get(u.req_id)
        if scores is not None and len(scores) == u.num_prompt_tokens and u.new_token_ids:
            # Complete: sent once, with the first token (vLLM's first output carries them).
            prompt_scores = tuple(self._prompt_scores.pop(u.req_id))
        return RequestOutput(
            req_id=u.req_id,
            new_token_ids=tuple(u.new_token_ids),
            new_text=new_text,
            finished=finished,
            finish_reason=reason,
            num_prompt_tokens=u.num_prompt_tokens,
            num_output_tokens=u.num_output_tokens,
            num_cached_tokens=max(0, u.num_cached_tokens),
            logprobs=logprobs,
            error=getattr(u, "error_message", None),
            stop_reason=stop_reason,
            prompt_logprobs=prompt_scores,
        )

    def _collect_prompt_scores(self, out: StepOutput) -> None:
        """Append a step's prompt logprobs to their requests' lists. A chunk recomputed after
        a preemption scores prompt tokens already listed: only the next ones are taken, so no
        entry is doubled or lost."""
        for req_id, (first, entries) in out.prompt_logprobs.items():
            scores = self._prompt_scores.get(req_id)
            if scores is None:
                continue  # finished (aborted) meanwhile
            skip = len(scores) - first
            if skip < 0:
                raise RuntimeError(f"request {req_id}: prompt logprobs from token {first} "
                                   f"arrived before token {len(scores)}'s")
            scores.extend(entries[skip:])

    def _fail_plan(self, plan: StepPlan, exc: Exception) -> list[RequestOutput]:
        message = f"executor failed: {type(exc).__name__}: {exc}"
        # Requests it swapped out are recomputed: their copies may not have been made.
        discard = getattr(self.scheduler, "discard_plan_copies", None)
        if discard is not None:
            discard(plan)
        return [
            self._fail_request(c.req_id, message) for c in plan.chunks if c.req_id in self._texts
        ]

    def _fail_request(self, req_id: str, message: str) -> RequestOutput:
        """End a request with finish_reason "error" now (blocks freed); its final output."""
        req = self.scheduler.get_request(req_id)
        self.scheduler.abort_request(req_id, reason="error")
        self._texts.pop(req_id, None)
        self._release(req_id)
        self.telemetry.finish_request(req_id, "error", self._clock())
        return _final_output(req_id, req, "error", message)


def _final_output(
    req_id: str, req: Request | None, reason: str, error: str | None = None
) -> RequestOutput:
    return RequestOutput(
        req_id=req_id,
        new_token_ids=(),
        new_text="",
        finished=True,
        finish_reason=reason,
        num_prompt_tokens=req.num_prompt_tokens if req is not None else 0,
        num_output_tokens=req.num_output_tokens if req is not None else 0,
        num_cached_tokens=max(0, req.num_cached_tokens) if req is not None else 0,
        error=error,
    )


def _kernel_description(device: Any) -> str:
    """Which compute path runs: the compiled CPU kernels (and their tier) or plain torch."""
    if device.type != "cpu":
        return f"torch ({device.type})"
    from cadence.model.kernels import cpu_ops

    module = cpu_ops.load_cpu_kernels()
    if module is None:
        return "torch reference (CPU kernels off or unavailable)"
    tier = getattr(module, "TIER", None) or getattr(cpu_ops, "active_tier", lambda: None)()
    return f"cadence CPU kernels{f' ({tier})' if tier else ''}"


def _moves_blocks(plan: StepPlan) -> bool:
    return bool(plan.block_copies or plan.swap_out or plan.swap_in or plan.disk_out
                or plan.disk_in or plan.disk_discard)


def _engine_cores() -> int:
    """The cores the engine computes on: the calling thread's torch thread count, and under
    taskset no more than the process may use."""
    import torch

    cores = torch.get_num_threads()
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)))
    return cores
