"""Draft/main compatibility on headers: each of llama.cpp's rules passing and failing on its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from app.engine.drafting.compat import CompatResult, check_compatibility
from app.engine.gguf.info import GGUFInfo, read_gguf_info
from tests.header_gguf import make_tokens, write_gguf

N = 256


@pytest.fixture
def make(tmp_path: Path):
    counter = iter(range(1000))

    def _make(**kwargs: Any) -> GGUFInfo:
        kwargs.setdefault("tokens", make_tokens(N))
        return read_gguf_info(write_gguf(tmp_path / f"m{next(counter)}.gguf", **kwargs))

    return _make


def _tokens_with(i: int, text: str, n: int = N) -> list[str]:
    toks = make_tokens(n)
    toks[i] = text
    return toks


def _fails(result: CompatResult, rule: str, *words: str) -> None:
    assert not result.compatible and not result
    assert result.rule == rule
    assert result.reason is not None and "\n" not in result.reason
    for w in words:
        assert w in result.reason, result.reason


def test_same_model_is_compatible(make) -> None:
    info = make()
    result = check_compatibility(info, info)
    assert result == CompatResult(True, None, None) and result


def test_vocab_type(make) -> None:
    assert check_compatibility(make(vocab_type="gpt2"), make(vocab_type="gpt2"))
    _fails(check_compatibility(make(vocab_type="gpt2"), make(vocab_type="llama")),
           "vocab_type", "'gpt2'", "'llama'")


def test_bos(make) -> None:
    # Neither adds BOS: the ids do not matter.
    assert check_compatibility(make(add_bos=False, bos=1), make(add_bos=False, bos=7))
    assert check_compatibility(make(add_bos=True, bos=1), make(add_bos=True, bos=1))
    _fails(check_compatibility(make(add_bos=True, bos=1), make(add_bos=False, bos=1)), "bos", "BOS")
    _fails(check_compatibility(make(add_bos=True, bos=1), make(add_bos=True, bos=7)),
           "bos", "BOS", "1", "7")


def test_eos(make) -> None:
    assert check_compatibility(make(add_eos=False, eos=2), make(add_eos=False, eos=9))
    assert check_compatibility(make(add_eos=True, eos=2), make(add_eos=True, eos=2))
    _fails(check_compatibility(make(add_eos=False, eos=2), make(add_eos=True, eos=2)), "eos", "EOS")
    _fails(check_compatibility(make(add_eos=True, eos=2), make(add_eos=True, eos=9)),
           "eos", "EOS", "2", "9")


def test_unset_add_bos_uses_llama_cpp_default(make) -> None:
    # An SPM ("llama") vocabulary adds BOS by default: explicit True and unset are the same thing.
    assert check_compatibility(make(vocab_type="llama", add_bos=True), make(vocab_type="llama"))
    _fails(check_compatibility(make(vocab_type="llama", add_bos=False), make(vocab_type="llama")),
           "bos")
    # gpt2 does not add BOS by default.
    assert check_compatibility(make(vocab_type="gpt2", add_bos=False), make(vocab_type="gpt2"))


def test_vocab_size_difference(make) -> None:
    main = make()
    assert check_compatibility(main, make(tokens=make_tokens(N + 128)))
    assert check_compatibility(make(tokens=make_tokens(N + 128)), main)
    _fails(check_compatibility(main, make(tokens=make_tokens(N + 129))), "vocab_size", "129")


@pytest.mark.parametrize("i", [5, 100, N - 1])
@pytest.mark.parametrize("text", ["tokX", "a much longer replacement token", "", "é"])
def test_token_text_differs(make, i: int, text: str) -> None:
    main, draft = make(), make(tokens=_tokens_with(i, text))
    result = check_compatibility(main, draft)
    _fails(result, "token_text", f"id {i}", repr(f"tok{i}"), repr(text))
    assert result.reason == f"token text differs at id {i}: main {f'tok{i}'!r} vs draft {text!r}"


@pytest.mark.parametrize("changes", [
    {40: "x", 41: "a longer one", 200: "y"},  # length differs first
    {40: "tok4X", 41: "a longer one"},  # same length, bytes differ, then a length change
    {40: "a longer one", 41: "tok4X"},  # length change, then a same-length change
    {40: "tok4X", 200: "tok2XX"},  # two same-length changes
])
def test_first_difference_is_reported(make, changes: dict[int, str]) -> None:
    toks = make_tokens(N)
    for i, text in changes.items():
        toks[i] = text
    _fails(check_compatibility(make(), make(tokens=toks)), "token_text", "id 40:",
           repr(changes[40]))


@pytest.mark.parametrize("i", [0, 3, 4])
def test_token_text_below_5_is_ignored(make, i: int) -> None:
    assert check_compatibility(make(), make(tokens=_tokens_with(i, "<special>")))


def test_plain_sequences_give_the_same_answer(make) -> None:
    # The vectorised byte comparison and the per-token fallback must agree.
    main, draft = make(), make(tokens=_tokens_with(77, "tok77!"))

    def as_list(info: GGUFInfo) -> GGUFInfo:
        md = dict(info.metadata, **{"tokenizer.ggml.tokens": list(info.tokens())})
        return dataclasses.replace(info, metadata=md)

    assert check_compatibility(as_list(main), as_list(draft)) == check_compatibility(main, draft)
    assert check_compatibility(as_list(main), as_list(main))


@pytest.mark.demo
def test_real_demo_models(demo_path) -> None:
    smol = read_gguf_info(demo_path("smollm2-135m"))
    assert check_compatibility(smol, smol)
    gemma = read_gguf_info(demo_path("gemma3-270m"))
    assert check_compatibility(gemma, gemma)
    result = check_compatibility(gemma, smol)
    assert not result.compatible and result.rule == "vocab_type"
    assert not check_compatibility(smol, gemma).compatible
