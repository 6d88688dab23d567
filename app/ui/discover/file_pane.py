"""The lower half of Discover: the selected file, and the splitter that shares the panel's height
between it and the lists above.

The file pane holds "As a draft for: [main model]", the file's facts (the only part that scrolls),
Download and "Find a draft for it" with a note, a token prompt and the download's progress. The
panel once scrolled as a whole, and on a 1280x720 or 1440x900 screen the facts, Download and the
progress bar were below the fold (issue 60 item 9). Now the lists give up height first, down to
LIST_ROWS rows each, so everything but the tail of long facts stays in sight.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTreeWidget,
    QVBoxLayout,
    QWidget,
)

from app.ui.common.style import small_muted_label
from app.ui.discover.judge import MainChooser
from app.ui.discover.widgets import DownloadStrip, TokenPrompt

FACT_LINES = 4  # the facts keep at least these lines in sight
LIST_ROWS = 2  # each list keeps its header and these rows


class FilePane(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.chooser = MainChooser()
        self.details = QLabel()
        self.details.setWordWrap(True)
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.details_box = QScrollArea()
        self.details_box.setWidgetResizable(True)
        self.details_box.setFrameShape(QFrame.Shape.NoFrame)
        self.details_box.setWidget(self.details)
        self.details_box.setMinimumHeight(FACT_LINES * self.fontMetrics().lineSpacing())
        self.download_button = QPushButton("Download")
        self.draft_button = QPushButton("Find a draft for it")
        self.draft_button.setToolTip("Judge drafts against this model and search the hub for smaller models of "
                                     "its family that can draft for it, same vocabulary first")
        self.download_note = small_muted_label(selectable=False)
        self.token = TokenPrompt()
        self.strip = DownloadStrip()

        buttons = QHBoxLayout()
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.draft_button)
        buttons.addWidget(self.download_note, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.addWidget(self.chooser)
        layout.addWidget(self.details_box, 1)
        layout.addLayout(buttons)
        layout.addWidget(self.token)
        layout.addWidget(self.strip)

    def wanted_height(self) -> int:
        """The height that shows the facts whole, and everything else."""
        width = max(self.details_box.viewport().width(), 100)
        fixed = self.minimumSizeHint().height() - self.details_box.minimumHeight()
        # A line to spare: the facts' scroll bar, once it shows, narrows them by a line's worth.
        return fixed + self.details.heightForWidth(width) + self.fontMetrics().lineSpacing()


class ListsAndFile(QSplitter):
    """The lists (`lists`: repositories and files) above the file pane. Each content change asks
    `fit()`: the pane gets the height it wants, the lists what is left but never less than their
    few rows. A height the user dragged the handle to is kept."""

    def __init__(self, lists: QSplitter, trees: tuple[QTreeWidget, ...], pane: FilePane) -> None:
        super().__init__(Qt.Orientation.Vertical)
        self.lists, self.trees, self.pane = lists, trees, pane
        self.setChildrenCollapsible(False)
        self.addWidget(lists)
        self.addWidget(pane)
        self.setStretchFactor(0, 1)  # a taller window gives the lists more rows
        self.setStretchFactor(1, 0)
        self.dragged = False
        self.splitterMoved.connect(self._on_dragged)
        for tree in trees:
            rows = tree.header().sizeHint().height() + LIST_ROWS * (tree.fontMetrics().height() + 4)
            tree.setMinimumHeight(rows + 2 * tree.frameWidth())

    def fit(self) -> None:
        total = sum(self.sizes())
        if self.dragged or not self.isVisible() or total <= 0:
            return
        pane_min = self.pane.minimumSizeHint().height()
        pane = max(min(self.pane.wanted_height(), total - self._lists_minimum()), pane_min)
        self.setSizes([total - pane, pane])

    def _lists_minimum(self) -> int:
        heights = [tree.minimumHeight() for tree in self.trees]
        if self.lists.orientation() == Qt.Orientation.Horizontal:
            return max(heights)
        return sum(heights) + self.lists.handleWidth()

    def _on_dragged(self, _pos: int, _index: int) -> None:
        self.dragged = True
