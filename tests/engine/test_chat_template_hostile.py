"""A model's chat template is code from the file: whatever it does (raise, fail to parse, trip
the sandbox, build a huge range) `specula run --chat` says so in one line and the server answers
400, never a traceback or a 500 (issue 42, item 10); and a seeded, time-bounded fuzz of the
template path."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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
# The shapes of issue 51 item 4: each reached gigabytes or ran for minutes in the sandbox alone.
BOMBS = {
    "tilde-doubling": "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}",
    "center": "{{ 'x' | center(2 * 10 ** 9) }}",
    "indent": "{{ 'a\nb' | indent(2 * 10 ** 9) }}",
    "indent-by-text": "{% set w = 'x' * 4000000 %}{{ ('\n' * 1000000) | indent(w) }}",
    "percent-format-filter": "{{ '%02000000000d' | format(1) }}",
    "percent-operator": "{{ '%02000000000d' % 1 }}",
    "str-format": "{{ '{:>2000000000}'.format(1) }}",
    "ljust": "{{ 'x'.ljust(2 * 10 ** 9) }}",
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
    "loops-of-loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested-lists": "{% set ns = namespace(x=['ab']) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x | tojson }}",
    "join": "{% set s = 'x' * 4000000 %}{{ ([s] * 1000) | join }}",
    "replace": "{% set s = 'a' * 1000000 %}{{ s.replace('a', s) }}",
    "long-output": "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{{ s }}{% endfor %}",
    "long-static-output": "{% for i in range(100000) %}" + "y" * 1000 + "{% endfor %}",
}
HOSTILE.update({name: BOMBS[name] for name in ("tilde-doubling", "center", "loops-of-loops", "nested-lists")})


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
    from app.engine.local_session import LocalSession
    from app.server.model import ServedModel
    from app.server.params import parse_chat

    served = ServedModel.create(LocalSession.around(load_model(hostile_files[name], device="cpu", dtype="float32")))
    with pytest.raises(ApiError) as caught:
        served.prompt_ids(parse_chat({"messages": [{"role": "user", "content": "hi"}]}))
    assert caught.value.status == 400 and "chat template" in caught.value.message


PIECES = ["{{ m.content }}", "{% for m in messages %}", "{% endfor %}", "{% if add_generation_prompt %}",
          "{% endif %}", "{{ messages[0]['role'] }}", "{{ range(%d) | list | length }}", "{{ 1 / %d }}",
          "{{ raise_exception('x') }}", "{{ messages[%d].content }}", "{{ m.content | upper }}", "<|im_start|>",
          "{% set x = %d %}", "{{ x * 'ab' }}", "{{ ''.__class__ }}", "{{ bos_token }}", "{{", "}}", "{%", "%}",
          "{{ m.content[%d:] }}", "{{ m.content | center(%d) }}", "{{ ('%0' ~ %d ~ 'd') | format(1) }}",
          "{{ m.content.ljust(%d) }}", "{% for i in range(%d) %}{% for j in range(%d) %}{% endfor %}{% endfor %}",
          "{% set ns = namespace(x=m.content) %}{% for i in range(%d) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}", "{{ messages | map(attribute='content') | join(',') }}", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"]


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
        tokenizer.chat_template = "".join(p.replace("%d", str(rng.choice([0, 1, -1, 40, 99999, 10**9]))) for p in parts)
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


def test_template_bombs_stay_small_and_short():
    """Every bomb of issue 51 item 4 is refused in one line, in a child that renders them all
    through transformers' template path (as both backends do): its peak memory grows by less than
    256 MB and no render runs on (before the bounds, one bomb took gigabytes or minutes)."""
    script = textwrap.dedent(f"""
        import json, resource, sys, time
        from app.engine.loop.template_guard import install
        from transformers.utils.chat_template_utils import _compile_jinja_template
        install()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        results = {{}}
        for name, source in {BOMBS!r}.items():
            start = time.monotonic()
            try:
                _compile_jinja_template(source).render(messages=[{{"role": "user", "content": "hi"}}])
                results[name] = "rendered"
            except Exception as exc:
                results[name] = type(exc).__name__ + ": " + str(exc)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
        print(json.dumps({{"grown_mb": grown_mb, "results": results}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name, result in report["results"].items():
        assert result.startswith("SecurityError: the template "), (name, result)
    assert report["grown_mb"] < 256, report


def test_a_template_that_runs_on_is_stopped_in_one_line(tiny_paths):
    from app.engine.loader import load_model
    from app.engine.loop.chat import render_prompt

    tokenizer = load_model(tiny_paths["llama-f32"], device="cpu", dtype="float32").tokenizer
    tokenizer.chat_template = BOMBS["loops-of-loops"]
    try:
        with pytest.raises(ChatTemplateError) as caught:
            render_prompt(tokenizer, [{"role": "user", "content": "hi"}])
    finally:
        tokenizer.chat_template = CHATML
    assert "ran for over" in str(caught.value) and "\n" not in str(caught.value)
