"""Engine test helpers: a small ASCII byte-level tokenizer and FakeExecutor-backed engines."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from cadence.core.config import CacheConfig, SchedulerConfig
from cadence.core.scheduler import Scheduler
from cadence.engine.llm_engine import LLMEngine
from cadence.executor.fake_executor import FakeExecutor
from cadence.model.tokenizer import Tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_char(b: int) -> str:
    """GPT-2 byte-to-unicode for the bytes used here (printable ASCII, space, newline)."""
    if 33 <= b <= 126:
        return chr(b)
    return chr(256 + b)  # 0..32 map to U+0100.. in order: "\n" -> "Ċ", " " -> "Ġ"


def ascii_tokenizer() -> Tokenizer:
    """One token per character of printable ASCII + space + newline (96 ids), then the special
    tokens <|im_end|> (EOS, id 96) and <|im_start|> (id 97). Any sampled id decodes cleanly."""
    chars = [_byte_char(b) for b in [10, 32, *range(33, 127)]]
    vocab = {c: i for i, c in enumerate(chars)}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken("<|im_end|>", special=True), AddedToken("<|im_start|>", special=True)]
    )
    eos = backend.token_to_id("<|im_end|>")
    return Tokenizer(backend, eos_token_id=eos, chat_template=CHATML)


@pytest.fixture
def tokenizer() -> Tokenizer:
    return ascii_tokenizer()


def make_engine(
    tokenizer: Tokenizer | None = None,
    *,
    policy: str = "chunked",
    max_num_batched_tokens: int = 64,
    max_num_seqs: int = 8,
    num_blocks: int = 256,
    block_size: int = 4,
    enable_prefix_caching: bool = True,
    eos_one_in: int | None = None,
    vocab_size: int | None = None,
    telemetry=None,
) -> tuple[LLMEngine, FakeExecutor]:
    """An engine over the real scheduler and a FakeExecutor. By default the fake never
    produces EOS, so max_tokens decides lengths; set eos_one_in to see EOS."""
    sched = Scheduler(
        SchedulerConfig(
            policy=policy,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=4096,
        ),
        CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
        ),
    )
    if tokenizer is None:
        fake = FakeExecutor(vocab_size=vocab_size or 500)
    elif eos_one_in is None:
        # Only the 96 characters: EOS never comes, max_tokens decides the length.
        fake = FakeExecutor(vocab_size=vocab_size or tokenizer.eos_token_id)
    else:
        # The characters and EOS, which comes about once in eos_one_in tokens.
        fake = FakeExecutor(tokenizer.eos_token_id + 1, tokenizer.eos_token_id, eos_one_in)
    return LLMEngine.from_parts(sched, fake, tokenizer, telemetry=telemetry), fake


def run_to_completion(engine: LLMEngine, max_steps: int = 10_000) -> dict[str, list]:
    """Step until idle; returns every RequestOutput per request, in order."""
    outputs: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return outputs
        for out in engine.step():
            outputs.setdefault(out.req_id, []).append(out)
        engine.scheduler.check_integrity()
    raise AssertionError("engine did not finish")


def fix_step_costs(engine: LLMEngine) -> LLMEngine:
    """Keep a step-time policy (slo) on its prior cost model: no learning from measured steps.

    The slo policy sizes chunks from the step times it measures, so on a loaded host its plans
    (and whether two prompts' decodes ever collide in a tight pool) vary from run to run: a CI
    run once saw no swap at all. Tests that assert a preemption happened fix the model (build
    the engine with startup_profile=False too) so every machine makes the same plans.
    """
    if hasattr(engine.scheduler.policy, "observe_step"):
        engine.scheduler.policy.observe_step = lambda plan, duration_s: None
    return engine
