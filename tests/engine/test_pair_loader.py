"""The one pair loader (app.engine.pair_loader): checked on headers first, each header read once,
the draft's check carried to the drafter, the vocabulary size read from the loaded model."""

from __future__ import annotations

import pytest

from app.engine.drafting.drafters import ModelDrafter
from app.engine.drafting.ngram_drafters import CombinedDrafter
from app.engine.drafting.factory import make_drafter
from app.engine.drafting.text_drafter import TextDrafter
from app.engine.errors import IncompatibleDraftError
from app.engine.pair_loader import PairSpec, load_pair


def test_a_text_level_pair_loads_with_its_check_and_progress(tiny_paths):
    stages: list[tuple[str, float]] = []
    spec = PairSpec(tiny_paths["llama-f32"], tiny_paths["llama-b"], ngram="lookup", device="cpu", dtype="float32")
    pair = load_pair(spec, lambda stage, fraction: stages.append((stage, fraction)))
    assert pair.check is not None and pair.check.text_level
    assert isinstance(pair.drafter, CombinedDrafter) and isinstance(pair.drafter.fallback, TextDrafter)
    roles = [stage.split(":")[0] for stage, _ in stages]
    assert roles == sorted(roles, key=["main model", "draft model"].index) and roles[-1] == "draft model"
    fractions = [fraction for _, fraction in stages]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert isinstance(pair.new_drafter().fallback, TextDrafter) and pair.new_drafter() is not pair.drafter


def test_each_header_is_read_once(tiny_paths, monkeypatch):
    import app.engine.loader as loader
    import app.engine.pair_loader as pair_loader

    read: list[str] = []
    real = pair_loader.read_gguf_info

    def counted(path):
        read.append(str(path))
        return real(path)

    monkeypatch.setattr(pair_loader, "read_gguf_info", counted)
    monkeypatch.setattr(loader, "read_gguf_info", counted)
    main, draft = tiny_paths["llama-f32"], tiny_paths["llama-other"]
    pair = load_pair(PairSpec(main, draft, device="cpu", dtype="float32"))
    assert isinstance(pair.drafter, ModelDrafter) and not pair.check.text_level
    assert sorted(read) == sorted([str(main), str(draft)])


def test_an_incompatible_draft_is_refused_before_the_main_model_loads(tiny_paths, tmp_path, monkeypatch):
    import app.engine.loader as loader
    from tests.header_gguf import make_tokens, write_gguf
    from tests.tiny_gguf import VOCAB_SIZE

    def no_load(*args, **kwargs):
        raise AssertionError("loaded before the pair was checked")

    monkeypatch.setattr(loader, "load_model", no_load)
    wordpiece = write_gguf(tmp_path / "wordpiece.gguf", tokens=make_tokens(VOCAB_SIZE, "wp"), vocab_type="bert")
    with pytest.raises(IncompatibleDraftError) as info:
        load_pair(PairSpec(tiny_paths["llama-f32"], wordpiece))
    assert str(info.value).startswith("wordpiece.gguf cannot draft for llama-f32.gguf: ")
    assert getattr(info.value, "exit_code", None) == 3


def test_a_model_drafter_builds_no_throwaway_context_of_the_main_model(tiny_loaded, monkeypatch):
    """The vocabulary size is the loaded model's: make_drafter used to open a one-token KV
    context of the main model only to read it."""
    main, draft = tiny_loaded("llama-f32"), tiny_loaded("llama-other")
    contexts: list[int | None] = []
    real = main.kv_model
    monkeypatch.setattr(main, "kv_model", lambda n_ctx=None: contexts.append(n_ctx) or real(n_ctx))
    drafter = make_drafter(main, draft=draft)
    assert contexts == []
    assert drafter.main_vocab_size == main.vocab_size == real(8).vocab_size


def test_the_run_flags_are_parsed_once_into_a_pair_spec(tiny_paths):
    from app.cli import build_parser
    from app.cli.request import pair_spec

    main, draft = str(tiny_paths["llama-f32"]), str(tiny_paths["llama-b"])
    args = build_parser().parse_args(["run", "-m", main, "-md", draft, "--spec-type", "ngram-simple,draft-simple",
                                      "-cd", "64", "-ngld", "0", "-p", "x"])
    spec = pair_spec(args)
    assert (str(spec.main_path), str(spec.draft_path), spec.ngram, spec.draft_ctx, spec.n_gpu_layers_draft) == (
        main, draft, "lookup", 64, 0)
    pair = load_pair(spec)
    assert pair.check.text_level and isinstance(pair.drafter.fallback, TextDrafter)
