"""One memory estimate: Discover (a hub file's header, before downloading) and the Model tab (the
same file in the library) show the same need in the same words, from app.hub.fit.memory_need.

Real tiny GGUF files served by the fake hub of tests/hf_server.py; offscreen Qt.
"""

from __future__ import annotations

import html

from app.engine.gguf.info import read_gguf_info
from app.hub.fit import machine_memory, memory_need
from app.hub.library_entries import FILE, entry_for_file
from tests.hf_server import REPO_SMALL, fake_hub, hub, hub_files  # noqa: F401 (fixtures)
from tests.gui_support import shot  # noqa: F401
from tests.ui.test_gui_discover import browse, panel  # noqa: F401 (panel: a fixture)

SMALL_FILE = "Tiny-Llama-1L-F32.gguf"


def test_discover_and_the_model_tab_show_one_need(qtbot, data_dir, panel, hub_files):
    from app.ui.models.pair_picker import PairPicker

    details = browse(qtbot, panel, REPO_SMALL, SMALL_FILE)
    info = read_gguf_info(hub_files["small"])
    on_cpu = machine_memory().gpu is None
    need = memory_need(info)  # llama.cpp's: the file's own types, mapped
    assert html.escape(need.text()) in details, details  # Discover: the header read over HTTP (as HTML)

    picker = PairPicker()
    qtbot.addWidget(picker)
    picker.resize(520, 520)
    picker.set_devices({"gpu": None, "reason": "no GPU", "cpu_dtype": "gguf"} if on_cpu else
                       {"gpu": "cuda", "name": "GPU", "cpu_dtype": "gguf", "gpu_dtype": "bfloat16"})
    picker.set_entries([entry_for_file(hub_files["small"], FILE)])
    if on_cpu:
        assert f"needs {need.text()}" in picker.main_offload.detail.text()  # the Model tab: the same words
    assert need.total == need.weights + need.kv and "(the file's own types)" in need.text()
    picker.show()
    shot(panel, "one-estimate-discover")
    shot(picker, "one-estimate-model-tab")
