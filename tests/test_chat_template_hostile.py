"""A model's chat template is code from the file: whatever it does (raise, fail to parse, trip
the sandbox, build a huge range) `specula run --chat` says so in one line and the server answers
400, never a traceback or a 500 (issue 42, item 10); and a seeded, time-bounded fuzz of the
template path."""

from __future__ import annotations

import random
import time

import pytest

from app.engine.errors import ChatTemplateError
from tests.tiny_gguf import CHATML, TinySpec, write_tiny_gguf

HOSTILE = {
    "raises": "{{ raise_exception('this template takes no system role') }}",
    "syntax": "{% for m in messages %}{{ m.content }",
    "sandbox": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "huge-range": "{% for i in range(10 ** 9) %}x{% endfor %}",
    "divides-by-zero": "{{ messages | length / 0 }}",
    "adds-a-number": "{{ messages[0].content + 1 }}",
    "huge-string": "{{ 'ab' * 10 ** 9 }}",
    "huge-power": "{{ 10 ** 1000000000 }}",
    "doubling": "{% set ns = namespace(x='ab') %}{% for i in range(64) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x }}",
}


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile-templates")
    return {name: write_tiny_gguf(folder / f"{name}.gguf", TinySpec(chat_template=template))
            for name, template in HOSTILE.items()}


@pytest.fixture
def specula(capsys):
    from app.cli import main

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))  # an exception here is the traceback a user would see
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.mark.parametrize("name", list(HOSTILE))
def test_run_chat_with_a_hostile_template_is_one_line(specula, hostile_files, name):
    code, out, err = specula("run", "-m", str(hostile_files[name]), "--chat", "-p", "hi", "-n", "2",
                             "--device", "cpu", "--dtype", "float32")
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("specula: error: ") and "chat template" in lines[0], lines[0]


@pytest.mark.parametrize("name", ["huge-range", "divides-by-zero", "sandbox"])
def test_the_server_answers_400_for_a_hostile_template(hostile_files, name):
    from app.engine.loader import load_model
    from app.server.errors import ApiError
    from app.server.model import ServedModel
    from app.server.params import parse_chat

    served = ServedModel.create(load_model(hostile_files[name], device="cpu", dtype="float32"))
    with pytest.raises(ApiError) as caught:
        served.prompt_ids(parse_chat({"messages": [{"role": "user", "content": "hi"}]}))
    assert caught.value.status == 400 and "chat template" in caught.value.message


PIECES = ["{{ m.content }}", "{% for m in messages %}", "{% endfor %}", "{% if add_generation_prompt %}",
          "{% endif %}", "{{ messages[0]['role'] }}", "{{ range(%d) | list | length }}", "{{ 1 / %d }}",
          "{{ raise_exception('x') }}", "{{ messages[%d].content }}", "{{ m.content | upper }}", "<|im_start|>",
          "{% set x = %d %}", "{{ x * 'ab' }}", "{{ ''.__class__ }}", "{{ bos_token }}", "{{", "}}", "{%", "%}",
          "{{ m.content[%d:] }}", "{{ messages | map(attribute='content') | join(',') }}", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"]


def test_fuzzed_templates_render_or_fail_in_one_line(tiny_paths):
    from app.engine.loop.chat import render_prompt
    from app.engine.loader import load_model

    tokenizer = load_model(tiny_paths["llama-f32"], device="cpu", dtype="float32").tokenizer  # a copy of our own
    rng = random.Random(7)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi <|im_start|>"}]
    deadline = time.monotonic() + 3.0
    rendered = failed = 0
    while time.monotonic() < deadline:
        parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 8))]
        tokenizer.chat_template = "".join(p.replace("%d", str(rng.choice([0, 1, -1, 10**9]))) for p in parts)
        try:
            ids = render_prompt(tokenizer, messages)
        except ChatTemplateError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 400
            failed += 1
        else:
            assert all(isinstance(t, int) for t in ids)
            rendered += 1
    tokenizer.chat_template = CHATML
    assert rendered and failed
