"""Base models in the chat: where the main model is picked, a model without a chat template is
called a base model in plain words, and the chat sends it plain completion (the conversation's
own text for it to continue) instead of a made-up "User:/Assistant:" dialogue.

Real tiny GGUF models through the real loader; offscreen Qt. SPECULA_SHOTS saves screenshots.
"""

from __future__ import annotations

from app.engine.local_session import LocalSession
from app.engine.loop.chat import plain_text, render_prompt
from app.engine.session import Prompt
from app.ui.models.pair_picker import BASE_MODEL_NOTE
from app.worker.requests import GenSettings
from tests.gui_support import add_models, load_pair, open_window, send, shot  # noqa: F401

SHORT = GenSettings(temperature=0.0, max_tokens=8)
TEXT = "Once upon a time"


def test_plain_text_is_the_conversation_without_roles(tiny_loaded):
    messages = [{"role": "system", "content": "A story."}, {"role": "user", "content": TEXT},
                {"role": "assistant", "content": " there was a fox."}, {"role": "user", "content": "The end"}]
    assert plain_text(messages) == "A story.\nOnce upon a time there was a fox.\nThe end"
    model = tiny_loaded("llama-notemplate")
    session, chat = LocalSession.around(model), [{"role": "user", "content": TEXT}]
    plain, _ = session.prompt_ids(Prompt.chat(chat, plain=True, fit=True))
    assert plain == model.tokenizer.encode(TEXT)
    dialogue, stops = session.prompt_ids(Prompt.chat(chat, fit=True))
    assert dialogue == render_prompt(model.tokenizer, chat) and stops  # "User: ...\nAssistant:"
    assert len(dialogue) > len(plain)


def test_a_base_model_is_named_so_and_chats_in_plain_completion(qtbot, data_dir, tiny_paths):
    base, chat = tiny_paths["llama-notemplate"], tiny_paths["llama-f32"]
    window = open_window(qtbot)
    add_models(qtbot, window, [base, chat])
    picker = window.picker
    assert picker.select_main(str(base))
    assert picker.main_combo.currentText().endswith("— base model (continues text)")
    assert BASE_MODEL_NOTE in picker.main_facts.text()
    shot(picker, "base-model-picked")

    load_pair(qtbot, window, base)
    toggle = window.panel.plain_toggle
    assert toggle.isVisible() and toggle.isChecked() and "base model" in toggle.text()
    assert window.panel.input.placeholderText().startswith("Text for the model to continue")
    plain = send(qtbot, window, TEXT, SHORT)
    shot(window, "base-model-plain-completion")

    window.controller.new_chat()
    toggle.setChecked(False)  # the made-up dialogue, for comparison: a longer prompt
    dialogue = send(qtbot, window, TEXT, SHORT)
    assert plain["n_prompt"] < dialogue["n_prompt"]

    load_pair(qtbot, window, chat)  # a chat model answers: plain completion is off again
    assert not toggle.isChecked() and toggle.text() == "Plain completion"
    assert not picker.main_combo.currentText().endswith("(continues text)")
    assert BASE_MODEL_NOTE not in picker.main_facts.text()
