"""Draft and sampling settings, each with a tooltip saying what it does (llama.cpp's knobs)."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.worker.requests import UNTIL_CONTEXT, GenSettings

# field -> (label, tooltip, minimum, maximum, step, decimals or None for an integer)
FIELDS = {
    "draft_max": ("Draft max", "Most tokens drafted per step (llama.cpp --draft-max). More pays off "
                  "when drafts are usually right, and wastes verify work when they are not.", 1, 64, 1, None),
    "draft_min": ("Draft min", "Draft nothing in a step that would draft fewer tokens than this "
                  "(--draft-min). 0 drafts whatever is available.", 0, 64, 1, None),
    "draft_p_min": ("Draft p-min", "A draft model stops drafting when its top probability falls "
                    "below this (--draft-p-min): unsure guesses are rarely accepted.", 0.0, 1.0, 0.05, 2),
    "temperature": ("Temperature", "Randomness of sampling (--temp). 0 = greedy: always the most "
                    "likely token, and the reply is exactly the main model's own.", 0.0, 5.0, 0.05, 2),
    "top_k": ("Top-k", "Sample only among the k most likely tokens (--top-k). 0 = off.", 0, 1000, 1, None),
    "top_p": ("Top-p", "Sample only among the most likely tokens whose probabilities add up to p "
              "(--top-p, nucleus sampling). 1 = off.", 0.0, 1.0, 0.01, 2),
    "min_p": ("Min-p", "Drop tokens less likely than this fraction of the most likely one "
              "(--min-p). 0 = off.", 0.0, 1.0, 0.01, 2),
    "seed": ("Seed", "Random seed for sampling (--seed). The same seed and settings give the same "
             "reply; -1 = a new random seed for every reply.", -1, 2**31 - 1, 1, None),
    "max_tokens": ("Max tokens", "Most tokens in one reply (-n); the reply stops there if the "
                   "model has not finished. Lowest: until the model ends or the context is full "
                   "(llama.cpp's -n -1).", UNTIL_CONTEXT, 1 << 20, 16, None),
}
# What a new window starts with and "Reset to defaults" gives: the command line's, but a reply
# runs until the model ends it (a coding answer cut at 256 tokens stopped mid-sentence).
WINDOW_DEFAULTS = replace(GenSettings(), max_tokens=UNTIL_CONTEXT)
DRAFT_FIELDS = ("draft_max", "draft_min", "draft_p_min")
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens")


class GenSettingsForm(QWidget):
    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.fields: dict[str, QSpinBox | QDoubleSpinBox] = {}
        self.adaptive = QCheckBox("Adapt the draft length")
        self.adaptive.setToolTip(
            "Draft as many tokens per step as pay off, from the measured acceptance and step cost, "
            "with Draft max as the ceiling. Off: always draft up to Draft max, as llama.cpp does "
            "(the command line's --draft-fixed)."
        )
        self.adaptive.toggled.connect(self.changed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        drafting = self._group("Drafting", DRAFT_FIELDS)
        drafting.layout().addRow(self.adaptive)
        layout.addWidget(drafting)
        layout.addWidget(self._group("Sampling", SAMPLING_FIELDS))
        reset = QPushButton("Reset to defaults")
        reset.setToolTip("The command line's defaults (temperature 0.8 for chat), replies until the model ends them")
        reset.clicked.connect(lambda: self.set_settings(WINDOW_DEFAULTS))
        layout.addWidget(reset)
        self.set_settings(WINDOW_DEFAULTS)

    def _group(self, title: str, names: tuple[str, ...]) -> QGroupBox:
        box = QGroupBox(title)
        form = QFormLayout(box)
        for name in names:
            label_text, tip, low, high, step, decimals = FIELDS[name]
            box_widget: QSpinBox | QDoubleSpinBox
            if decimals is None:
                box_widget = QSpinBox()
            else:
                box_widget = QDoubleSpinBox()
                box_widget.setDecimals(decimals)
            box_widget.setRange(low, high)
            box_widget.setSingleStep(step)
            box_widget.setToolTip(tip)
            box_widget.setObjectName(name)
            if name == "seed":
                box_widget.setSpecialValueText("random")  # shown at -1
            if name == "max_tokens":
                box_widget.setSpecialValueText("until the end")  # shown at UNTIL_CONTEXT
            box_widget.valueChanged.connect(self.changed)
            label = QLabel(label_text)
            label.setToolTip(tip)
            form.addRow(label, box_widget)
            self.fields[name] = box_widget
        return box

    def settings(self) -> GenSettings:
        values = {name: widget.value() for name, widget in self.fields.items()}
        return GenSettings(**values, adaptive_draft=self.adaptive.isChecked())

    def set_settings(self, settings: GenSettings) -> None:
        values = settings.to_dict()
        for name, widget in self.fields.items():
            widget.blockSignals(True)
            widget.setValue(values[name])
            widget.blockSignals(False)
        self.adaptive.blockSignals(True)
        self.adaptive.setChecked(settings.adaptive_draft)
        self.adaptive.blockSignals(False)
        self.changed.emit()
