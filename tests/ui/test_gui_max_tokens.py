"""Issue 60 item 12: a new window replies until the model ends (llama.cpp's -n -1), not 256
tokens (code replies stopped mid-sentence); a length the user set is kept across restarts."""

from __future__ import annotations

from dataclasses import replace

from app.worker.requests import UNTIL_CONTEXT
from tests.gui_support import open_window


def test_a_new_window_replies_until_the_end_and_keeps_a_length_the_user_set(qtbot, data_dir):
    window = open_window(qtbot)
    box = window.gen_form.fields["max_tokens"]
    assert window.gen_form.settings().max_tokens == UNTIL_CONTEXT and box.text() == "until the end"
    window.gen_form.set_settings(replace(window.gen_form.settings(), max_tokens=300))
    window.close()

    again = open_window(qtbot)
    assert again.gen_form.settings().max_tokens == 300
    reset = next(b for b in again.gen_form.findChildren(type(again.picker.load_button)) if b.text() == "Reset to defaults")
    reset.click()
    assert again.gen_form.settings().max_tokens == UNTIL_CONTEXT
