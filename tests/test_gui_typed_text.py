"""What a person types is shown as typed (issue 52 items 2 and 6): the lines of a message sent
with Shift+Enter stay lines in the "You" bubble, and the message box's hint follows the plain
completion toggle at once."""

from __future__ import annotations

from tests.test_gui import GREEDY, add_models, data_dir, load_pair, open_window, send, shot, visible_text  # noqa: F401


def test_the_lines_of_a_message_stay_lines(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"])
    send(qtbot, window, "first line\nsecond line\n\n* not a list", GREEDY)
    assert "first line\nsecond line\n\n* not a list" in visible_text(window)
    shot(window, "52-2-typed-lines")
