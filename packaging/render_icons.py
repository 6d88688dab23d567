"""Render the app icon's PNG sizes from its SVG with QtSvg (the renderer the app itself ships).

    .venv/bin/python packaging/render_icons.py

Reads resources/icons/hicolor/scalable/apps/io.github.specula.Specula.svg and writes
resources/icons/hicolor/<n>x<n>/apps/io.github.specula.Specula.png for every size the desktop
entry installs. The PNGs are committed: run this again after changing the SVG.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.desktop_entry import ICON_SIZES, icon_png, icon_svg  # noqa: E402


def render(svg: Path, size: int, out: Path) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"render_icons: {svg} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    out.parent.mkdir(parents=True, exist_ok=True)
    # ARGB32 (not premultiplied) is what a PNG stores: no rounding surprises at the edges.
    if not image.convertToFormat(QImage.Format.Format_ARGB32).save(str(out), "PNG"):
        raise SystemExit(f"render_icons: cannot write {out}")


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication([sys.argv[0]])  # noqa: F841 (fonts, image IO)
    svg = icon_svg()
    for size in ICON_SIZES:
        out = icon_png(size)
        render(svg, size, out)
        print(f"{out.relative_to(ROOT)}  {size}x{size}  {out.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
