"""Chat templates are untrusted (they ship inside model files): every budget of the sandbox
stops a hostile template quickly with a ValueError instead of exhausting memory or time."""

from __future__ import annotations

import time

import pytest

from cadence.model.chat_template import ChatTemplate

MESSAGES = [{"role": "user", "content": "hi"}]

HOSTILE = [
    "{{ 'a' * 10**10 }}",
    "{{ 10**10 * 'a' }}",
    "{{ ['a'] * 10**10 }}",
    "{{ 'a'.ljust(10**10) }}",
    "{{ 'a' | center(10**10) }}",
    "{{ '%10000000000s' % 'a' }}",
    "{{ '{:10000000000}'.format('a') }}",
    "{{ '%10000000000s' | format('a') }}",
    "{{ 10 ** 100000000 }}",
    "{{ (9 ** 999) ** 999 }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",  # 10M characters of output
    "{% set s = namespace(v='ab') %}{% for i in range(40) %}{% set s.v = s.v + s.v %}"
    "{% endfor %}{{ s.v | length }}",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_template_fails_fast(source):
    template = ChatTemplate(source, "<s>", "</s>")
    t0 = time.monotonic()
    with pytest.raises(ValueError):
        template.render(MESSAGES)
    assert time.monotonic() - t0 < 10


def test_ordinary_template_still_renders():
    source = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}\n"
              "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
              "{{ 'x' * 3 }}{% for i in range(3) %}{{ i }}{% endfor %}{{ '%5s' % 'a' }}")
    out = ChatTemplate(source, "<s>", "</s>").render(MESSAGES)
    assert out == "<|user|>hi\n<|assistant|>xxx012    a"
