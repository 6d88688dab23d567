"""GPU offload of one model as llama.cpp's -ngl: a layers slider whose top is "all", with the device
and a memory estimate from the GGUF header; disabled, with the reason, where there is no GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGraphicsOpacityEffect, QHBoxLayout, QLabel, QSlider, QVBoxLayout, QWidget

from app.engine.backends import TORCH
from app.engine.gguf.info import GGUFInfo
from app.hub.fit import memory_need
from app.ui.common.format import format_bytes
from app.ui.common.style import small_muted_label


if TYPE_CHECKING:
    from app.engine.session import Weights

class OffloadControl(QWidget):
    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._info: GGUFInfo | None = None
        self._devices: dict[str, Any] | None = None
        self._backend = "auto"  # the pair picker's backend choice: torch estimates its own dtypes
        # How the loaded model holds its weights (app.engine.session.Weights) and the
        # backend it was loaded on: its estimate is then the engine's own count.
        self._loaded: tuple[dict[str, Any], str] | None = None
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self._fade = QGraphicsOpacityEffect(self.slider)
        self.slider.setGraphicsEffect(self._fade)
        self.slider.setToolTip(
            "Layers computed on the GPU (llama.cpp's -ngl). At the right end all layers are on "
            "the GPU; at the left end the model runs on the CPU only."
        )
        self.slider.valueChanged.connect(self._update)
        self.value_label = QLabel()
        self.value_label.setMinimumWidth(90)
        self.detail = small_muted_label()
        # Set by the pair picker while the slider is not what runs (a reload applies it).
        self.note = small_muted_label()
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: #b45309")
        self.note.setVisible(False)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("GPU layers"))
        row.addWidget(self.slider, 1)
        row.addWidget(self.value_label)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(row)
        layout.addWidget(self.detail)
        layout.addWidget(self.note)
        self._update()

    def set_model(self, info: GGUFInfo | None) -> None:
        keep_all = self._info is None or self.slider.value() >= self.slider.maximum()
        self._info = info
        n_layers = info.n_layers if info is not None else 0
        self.slider.blockSignals(True)
        self.slider.setRange(0, n_layers)
        self.slider.setValue(n_layers if keep_all and self.has_gpu() else self.slider.value())
        self.slider.blockSignals(False)
        self._update()

    def set_devices(self, facts: dict[str, Any]) -> None:
        self._devices = facts
        self.slider.blockSignals(True)
        # All layers on the GPU when there is one (llama.cpp's default in recent versions);
        # without one the disabled slider rests at 0, where the model really runs.
        self.slider.setValue(self.slider.maximum() if self.has_gpu() else 0)
        self.slider.blockSignals(False)
        self._update()

    def has_gpu(self) -> bool:
        return bool(self._devices and self._devices.get("gpu"))

    def gpu_layers(self) -> int:
        """What the loader gets as n_gpu_layers: 0 without a GPU, else the slider's value."""
        return self.slider.value() if self.has_gpu() else 0

    def set_backend(self, backend: str) -> None:
        """One of app.engine.backends.BACKEND_CHOICES (auto, llama.cpp, torch): what the estimate
        before a load is made for."""
        self._backend = backend
        self._update()

    def set_loaded(self, weights: Weights | None) -> None:
        """The loaded model's weights (None: nothing loaded): while this control shows that model
        with the backend it was loaded on, the estimate is the engine's count, not a guess."""
        self._loaded = (weights, self._backend) if weights is not None else None
        self._update()

    def set_note(self, text: str) -> None:
        """A change of this slider that needs a reload, said beside it ("" hides it)."""
        self.note.setText(text)
        self.note.setVisible(bool(text))

    def set_gpu_layers(self, value: int | None) -> None:
        if value is not None:
            self.slider.setValue(max(0, min(int(value), self.slider.maximum())))

    def _update(self) -> None:
        info, devices = self._info, self._devices
        gpu = self.has_gpu()
        self.slider.setEnabled(gpu and info is not None)
        # Some styles draw a disabled slider like an enabled one: fade it, so "no GPU" shows.
        self._fade.setOpacity(1.0 if self.slider.isEnabled() else 0.35)
        n, total = self.slider.value(), self.slider.maximum()
        if not gpu:
            self.value_label.setText("CPU only")
        elif n >= total:
            self.value_label.setText(f"all ({total})")
        else:
            self.value_label.setText(f"{n} / {total}")
        if devices is None:
            where = "checking for a GPU…"
        elif not gpu:
            where = devices.get("reason") or "no GPU"
        else:
            where = f"GPU: {devices.get('name') or devices['gpu']}"
            if devices.get("total_bytes"):
                where += f", {format_bytes(devices['total_bytes'])}"
        self.slider.setToolTip(self.slider.toolTip().split("\n\n")[0] + ("" if gpu else f"\n\nDisabled: {where}"))
        self.detail.setText(where if info is None else f"{where}\n{self.estimate(info, n if gpu else 0)}")
        self.changed.emit()

    def estimate(self, info: GGUFInfo, gpu_layers: int) -> str:
        """The need in Discover's words (app.hub.fit.memory_need): one model, one estimate."""
        loaded = self._loaded_weights(info, gpu_layers)
        if loaded is not None:  # the engine's own count
            need = memory_need(info, dtype=loaded.dtype, weights_bytes=loaded.bytes,
                               kind=loaded.dtype)
        else:
            need = memory_need(info, dtype=self._estimate_dtype(gpu_layers))
        weights = need.weights
        text = f"needs {need.text()}"
        if gpu_layers and info.n_layers:
            on_gpu = weights * min(gpu_layers, info.n_layers) // info.n_layers
            text += f"; ≈ {format_bytes(on_gpu)} on the GPU"
        return text

    def _loaded_weights(self, info: GGUFInfo, gpu_layers: int) -> Weights | None:
        """The loaded model's weights when this control shows it as it was loaded, else None."""
        if self._loaded is None:
            return None
        weights, backend = self._loaded
        same = weights.path == str(info.path) and weights.gpu_layers == gpu_layers and backend == self._backend
        return weights if same else None

    def _estimate_dtype(self, gpu_layers: int) -> str:
        """The form a load would hold the weights in: llama.cpp's "gguf" (the file's own types)
        where it runs, else torch's dtype for the device (float32 on the CPU)."""
        devices = self._devices or {}
        if gpu_layers:
            return devices.get("gpu_dtype") or "bfloat16"
        cpu = devices.get("cpu_dtype") or "gguf"
        return "float32" if self._backend == TORCH else cpu
