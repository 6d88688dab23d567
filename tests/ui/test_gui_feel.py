"""The window behaves as the chat apps people already use (issue 43): Enter sends, the mouse
wheel never changes a setting it only passes over, Regenerate keeps earlier versions, the local
server answers under any model name.

Set SPECULA_SHOTS=/some/folder to save screenshots of the states these tests reach.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QApplication, QComboBox, QScrollBar, QWidget

from app.ui.chat.panel import ChatPanel
from tests.gui_support import open_window, shot  # noqa: F401


# --- Enter sends, Shift+Enter is a new line ---------------------------------------------------

def test_enter_sends_and_shift_enter_is_a_new_line(qtbot):
    panel = ChatPanel()
    qtbot.addWidget(panel)
    sent: list[str] = []
    panel.sendRequested.connect(sent.append)
    panel.input.setFocus()
    qtbot.keyClicks(panel.input, "first line")
    qtbot.keyClick(panel.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(panel.input, "second line")
    assert sent == [], "Shift+Enter sent the message"
    assert panel.input.toPlainText() == "first line\nsecond line"

    qtbot.keyClick(panel.input, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond line"], "Enter did not send"
    qtbot.keyClick(panel.input, Qt.Key.Key_Enter, Qt.KeyboardModifier.KeypadModifier)
    qtbot.keyClick(panel.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert len(sent) == 3, "keypad Enter and Ctrl+Enter must send too"
    assert "\n" not in panel.input.toPlainText().replace("first line\nsecond line", ""), \
        "Enter added a newline to the box"


def test_enter_on_an_empty_box_sends_nothing(qtbot):
    panel = ChatPanel()
    qtbot.addWidget(panel)
    sent: list[str] = []
    panel.sendRequested.connect(sent.append)
    qtbot.keyClick(panel.input, Qt.Key.Key_Return)
    assert sent == [] and panel.input.toPlainText() == ""


# --- the wheel scrolls panels, never a setting it passes over ---------------------------------

def _value(widget: QWidget):
    return widget.currentIndex() if isinstance(widget, QComboBox) else widget.value()


def _wheel(widget: QWidget, steps: int = -1) -> None:
    """Turn the wheel over the middle of `widget` (steps < 0: towards the user)."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(QPoint(int(centre.x()), int(centre.y())))),
                        QPoint(0, 0), QPoint(0, 120 * steps), Qt.MouseButton.NoButton,
                        Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def _settings_controls(root: QWidget) -> list[QWidget]:
    kinds = (QAbstractSpinBox, QAbstractSlider, QComboBox)
    return [w for w in root.findChildren(QWidget)
            if isinstance(w, kinds) and not isinstance(w, QScrollBar) and w.isEnabled()]


def test_the_wheel_changes_no_setting_it_only_passes_over(qtbot, data_dir):
    window = open_window(qtbot)
    window.open_compare()
    controls = _settings_controls(window)
    assert len(controls) >= 10, [type(w).__name__ for w in controls]
    window.panel.input.setFocus()
    for widget in controls:
        before = _value(widget)
        _wheel(widget, -1)
        _wheel(widget, +1)
        _wheel(widget, -1)
        assert _value(widget) == before, f"the wheel changed an unfocused {type(widget).__name__} " \
                                         f"{widget.objectName() or widget.toolTip()[:40]!r}"
        assert widget.focusPolicy() == Qt.FocusPolicy.StrongFocus, "the wheel would give it focus"

    # Once the user has clicked into it (focus), the wheel changes it as usual.
    draft_max = window.gen_form.fields["draft_max"]
    window.activateWindow()
    draft_max.setFocus()
    qtbot.waitUntil(draft_max.hasFocus)
    before = draft_max.value()
    _wheel(draft_max, -1)
    assert draft_max.value() == before - draft_max.singleStep()


# --- Regenerate keeps earlier versions ----------------------------------------------------------

def test_regenerate_keeps_earlier_versions_to_switch_between(qtbot, data_dir, tiny_paths):
    from PySide6.QtCore import QUrl

    from tests.gui_support import WAIT_MS, add_models, load_pair, reopen_store, send, visible_text
    from app.worker.requests import LOOKUP, GenSettings

    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], LOOKUP)
    send(qtbot, window, "Tell me a story", GenSettings(temperature=0.9, max_tokens=24, seed=1))
    chat_id = window.controller.chat_id
    question, first = window.store.messages(chat_id)

    texts = [first.content]
    for seed in (2, 3):
        window.gen_form.set_settings(GenSettings(temperature=0.9, max_tokens=24, seed=seed))
        with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS):
            qtbot.mouseClick(window.panel.regenerate_button, Qt.MouseButton.LeftButton)
        texts.append(window.store.messages(chat_id)[-1].content)
    assert len(set(texts)) == 3, "the seeds must give three different replies for this test to tell them apart"
    rows = window.store.messages(chat_id)
    assert [m.role for m in rows] == ["user", "assistant"], "a version is not a new message"
    assert (rows[1].id, rows[1].version, rows[1].n_versions, rows[1].content) == (first.id, 3, 3, texts[2])
    assert "‹ 3/3 ›" in visible_text(window)
    shot(window, "14-reply-versions")

    # The arrows switch between the versions; the one shown is what the next turn builds on.
    window.panel.view.anchorClicked.emit(QUrl(f"action:older:{first.id}"))
    window.panel.view.anchorClicked.emit(QUrl(f"action:older:{first.id}"))
    assert "‹ 1/3 ›" in visible_text(window) and window.store.messages(chat_id)[1].content == texts[0]
    assert texts[0].split()[0] in visible_text(window)
    window.panel.view.anchorClicked.emit(QUrl(f"action:older:{first.id}"))  # nothing older: stays
    window.panel.view.anchorClicked.emit(QUrl(f"action:newer:{first.id}"))
    assert window.store.messages(chat_id)[1].content == texts[1]
    assert window.controller._history() == [("user", "Tell me a story"), ("assistant", texts[1])]
    shot(window, "14-reply-version-2")

    # Kept in the history: a restart shows the same version and still has all three.
    window.close()
    with reopen_store(data_dir) as store:
        reply = store.messages(chat_id)[1]
        assert (reply.content, reply.version, reply.n_versions) == (texts[1], 2, 3)
        assert [store.show_version(reply.id, n) and store.messages(chat_id)[1].content for n in (1, 2, 3)] == texts


# --- the local server: any model name, and it stays on ----------------------------------------

def test_the_server_takes_any_model_name_and_stays_on_across_loads_and_restarts(qtbot, data_dir, tiny_paths):
    from tests.gui_support import WAIT_MS, add_models, load_pair
    from tests.ui.test_gui_serve import free_port, post
    from app.worker.requests import LOOKUP, NONE

    main, other = tiny_paths["llama-f32"], tiny_paths["qwen2-f32"]
    window = open_window(qtbot)
    add_models(qtbot, window, [main, other])
    load_pair(qtbot, window, main, LOOKUP)
    port = free_port()
    window.serve_panel.port.setValue(port)
    with qtbot.waitSignal(window.server.started, timeout=WAIT_MS):
        window.serve_panel.toggle.setChecked(True)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    hello = [{"role": "user", "content": "hi"}]
    for name in ("gpt-4o", main.name, "anything/at-all:latest"):
        reply = post(url, {"model": name, "messages": hello, "max_tokens": 2})
        assert reply["model"] == main.stem and reply["choices"][0]["message"]["content"] is not None, name

    # Loading another model stops the server that served the old one, and serves the new one.
    with qtbot.waitSignal(window.server.started, timeout=WAIT_MS):
        load_pair(qtbot, window, other, NONE)
    assert window.serve_panel.toggle.isChecked() and "Serving at" in window.serve_panel.status.text()
    assert post(url, {"model": "gpt-4o", "messages": hello, "max_tokens": 2})["model"] == other.stem
    shot(window.serve_panel, "15-server-on")
    window.close()

    # A restart remembers it was on: it starts with the first model loaded, on the same port.
    window = open_window(qtbot)
    assert "starts with it" in window.serve_panel.status.text()
    with qtbot.waitSignal(window.server.started, timeout=WAIT_MS):
        load_pair(qtbot, window, main, LOOKUP)
    assert window.serve_panel.port.value() == port
    assert post(url, {"model": "x", "messages": hello, "max_tokens": 2})["model"] == main.stem
    with qtbot.waitSignal(window.server.stopped, timeout=WAIT_MS):
        window.serve_panel.toggle.setChecked(False)
    window.close()

    # Turned off, it stays off.
    window = open_window(qtbot)
    load_pair(qtbot, window, main, LOOKUP)
    qtbot.wait(300)
    assert not window.serve_panel.toggle.isChecked() and not window.server.running and not window.server.busy


# --- the n-gram cache learns from every chat with its main model ------------------------------

def test_the_ngram_cache_learns_from_chats_drafted_otherwise(qtbot, data_dir, tiny_paths):
    from tests.gui_support import GREEDY_FIXED, add_models, load_pair, send
    from app.worker.requests import LOOKUP, NGRAM_CACHE, NONE

    main = tiny_paths["llama-f32"]
    window = open_window(qtbot)
    add_models(qtbot, window, [main])
    load_pair(qtbot, window, main, LOOKUP)
    send(qtbot, window, "Tell me about foxes.")
    load_pair(qtbot, window, main, NONE)
    send(qtbot, window, "And about owls?")
    qtbot.waitUntil(lambda: any((data_dir / "ngram-cache").glob("*.ngc")), timeout=60_000)  # saved after a reply

    facts = load_pair(qtbot, window, main, NGRAM_CACHE)
    assert facts.ngram_entries > 0, "the chats drafted by prompt lookup and by nothing taught it nothing"
    assert "word sequences learned" in window.picker.state_label.text()
    shot(window.picker, "09-ngram-cache-warm")
    window.controller.new_chat()
    summary = send(qtbot, window, "Tell me about foxes.", GREEDY_FIXED)
    assert summary["n_accepted"] > 0, "the cache drafted nothing of a reply it has seen"


# --- Load in sight, steady panels, no stale status --------------------------------------------

def test_load_is_in_sight_and_the_panel_keeps_its_height(qtbot, data_dir, tiny_paths):
    from tests.gui_support import add_models

    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    window.picker.select_main(str(tiny_paths["llama-f32"]))
    qtbot.wait(50)
    load = window.picker.load_button
    assert load.isVisible() and not load.visibleRegion().isEmpty(), "Load is scrolled out of sight"
    assert load.visibleRegion().boundingRect().size() == load.size(), "Load is partly hidden"
    top_left = load.mapTo(window, load.rect().topLeft())
    assert 0 <= top_left.y() and top_left.y() + load.height() <= window.height()
    shot(window, "13-model-tab")

    heights = set()
    for index in range(window.models_tabs.count()):
        window.models_tabs.setCurrentIndex(index)
        QApplication.processEvents()
        heights.add(window.models_tabs.height())
    assert len(heights) == 1, f"the panel's height jumps between tabs: {heights}"

    # No GPU here (a CPU-only torch in tests): the slider is disabled and drawn faded.
    slider = window.picker.main_offload.slider
    if not window.picker.main_offload.has_gpu():
        assert not slider.isEnabled() and slider.graphicsEffect().opacity() < 0.5


def test_stopping_does_not_outlive_the_stop(qtbot, data_dir, tiny_paths):
    from tests.gui_support import LONG, WAIT_MS, add_models, load_pair, start_reply

    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"])
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS):
        start_reply(qtbot, window, "Tell me a long story", LONG)
        qtbot.waitUntil(lambda: window.controller.stream is not None and window.controller.stream.n_steps > 2,
                        timeout=WAIT_MS)
        window.on_escape()
        assert window.statusBar().currentMessage() == "stopping…"
    assert window.statusBar().currentMessage() != "stopping…"
