"""TemplatePool (issue 31): chat templates rendered in worker processes under OS limits; a
render past a budget is a TemplateBudgetError naming it, and the pool keeps serving."""

from __future__ import annotations

import time

import pytest

from cadence.engine.template_pool import TemplateBudget, TemplateBudgetError, TemplatePool

CHAT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MESSAGES = [{"role": "user", "content": "hi \U0001f600 \u00e9"}]


@pytest.fixture(scope="module")
def pool():
    pool = TemplatePool(TemplateBudget(cpu_seconds=1, wall_seconds=2, memory_bytes=64 * 2**20),
                        max_workers=3)
    yield pool
    pool.close()


def test_renders_like_the_in_process_template(pool):
    from cadence.model.chat_template import ChatTemplate

    expected = ChatTemplate(CHAT, "<s>", "</s>").render(MESSAGES, True)
    assert pool.render(CHAT, "<s>", "</s>", MESSAGES, True) == expected
    assert pool.render(CHAT, "<s>", "</s>", MESSAGES, False) == expected[:-len("<|assistant|>")]


def test_template_errors_are_value_errors(pool):
    with pytest.raises(ValueError, match="rejected the messages: nope") as info:
        pool.render("{{ raise_exception('nope') }}", None, None, MESSAGES, True)
    assert not isinstance(info.value, TemplateBudgetError)


def test_budgets_are_named_and_the_pool_recovers(pool):
    memory = ("{% set s0 = 'a' * 1000 %}"
              + "".join(f"{{% set s{i + 1} = s{i} ~ s{i} %}}" for i in range(30)) + "{{ s30 }}")
    # Only the memory budget can stop this one: its doublings take well under a second of
    # CPU, but the worker runs at nice 10, and beside a busy process on one core that became
    # more than the 2 s wall budget (named instead). The same 64 MiB, no reachable time limit.
    roomy = TemplatePool(TemplateBudget(cpu_seconds=60, wall_seconds=120,
                                        memory_bytes=64 * 2**20), min_workers=1, max_workers=1)
    try:
        with pytest.raises(TemplateBudgetError, match="memory budget"):
            roomy.render(memory, None, None, MESSAGES, True)
        assert roomy.render(CHAT, "", "", MESSAGES, True).startswith("<|user|>")
    finally:
        roomy.close()
    with pytest.raises(TemplateBudgetError, match="budget"):
        pool.render(memory, None, None, MESSAGES, True)  # whichever comes first here
    endless = "{% set s = 'ab' * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"
    start = time.monotonic()
    with pytest.raises(TemplateBudgetError, match="time budget"):
        pool.render(endless, None, None, MESSAGES, True)
    assert time.monotonic() - start < 2.5  # killed at the wall deadline (or its CPU limit)
    assert pool.render(CHAT, "", "", MESSAGES, True).startswith("<|user|>")


def test_a_dead_idle_worker_is_replaced(pool):
    pool.render(CHAT, "", "", MESSAGES, True)
    with pool._lock:
        for worker in pool._idle:
            worker.proc.kill()
            worker.proc.wait()
    assert pool.render(CHAT, "", "", MESSAGES, True).startswith("<|user|>")


def test_a_slow_worker_start_is_not_charged_to_the_render(monkeypatch):
    """A worker started on demand on a loaded host can take seconds to import; the render's
    wall budget starts once it is ready (it was charged the start, and a benign template got
    the time-budget 400)."""
    from cadence.engine import template_pool

    ready = template_pool._Worker.wait_ready

    def slow_start(worker, *args, **kwargs):
        time.sleep(1.5)  # past the whole 1 s budget below
        ready(worker, *args, **kwargs)

    monkeypatch.setattr(template_pool._Worker, "wait_ready", slow_start)
    slow = TemplatePool(TemplateBudget(cpu_seconds=1, wall_seconds=1, memory_bytes=64 * 2**20),
                        min_workers=0, max_workers=1)
    try:
        assert slow.render(CHAT, "", "", MESSAGES, True).startswith("<|user|>")
    finally:
        slow.close()
