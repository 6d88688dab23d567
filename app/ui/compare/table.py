"""The comparison's table: a QAbstractTableModel over app.compare.summary's rows, sortable by
any column (numbers sort as numbers: SORT_ROLE holds them), with the change from an earlier run
in extra columns when one is chosen."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView, QWidget

from app.compare.results import CompareRun
from app.compare.summary import Delta, Row, deltas, table_rows

SORT_ROLE = Qt.ItemDataRole.UserRole + 1
MiB = 1 << 20
COLUMNS = ("Config", "Category", "Tokens", "tok/s", "Speedup", "Accept", "Acc/step", "TTFT", "Peak RSS", "Identical",
           "Why")
DELTA_COLUMNS = ("Earlier tok/s", "Δ tok/s", "Earlier speedup")
# What the header shows: plain words; the exact term is in its tooltip (issue 52 items 8 and 10).
HEADERS = {"Tokens": "Tokens, all runs", "Accept": "Accepted", "Acc/step": "Accepted per step",
           "TTFT": "First token", "Peak RSS": "Peak memory"}
TOOLTIPS = {
    "Tokens": "Tokens written over every prompt of this category and every repeat (Tokens per reply x prompts x repeats)",
    "tok/s": "Decoding speed after the first token (the first comes from the prompt pass)",
    "Speedup": "tok/s over none's on the same prompts",
    "Accept": "Acceptance rate: drafted tokens the main model accepted",
    "Acc/step": "Mean accepted length: draft tokens accepted per verify step",
    "TTFT": "TTFT, time to first token (the prompt pass), mean over the prompts",
    "Peak RSS": "Peak RSS: the process's resident memory sampled during the prompts (main model included)",
    "Identical": "Same tokens as none (a batch of drafts can round a near-tie between two tokens otherwise)",
    "Δ tok/s": "Change of tok/s since the earlier run",
    "Why": "The acceptance a draft needs to pay on this machine, at the draft length that needs least, from the "
           "schedule's own prices (a drafted token and a verify of k tokens against one plain step); the row's "
           "acceptance in brackets. Hover a row for the whole sentence",
}
_NUMERIC = {"Tokens", "tok/s", "Speedup", "Accept", "Acc/step", "TTFT", "Peak RSS", "Earlier tok/s", "Δ tok/s",
            "Earlier speedup"}


class CompareTableModel(QAbstractTableModel):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._rows: list[Row] = []
        self._deltas: dict[tuple[str, str], Delta] = {}
        self._columns: tuple[str, ...] = COLUMNS

    def set_run(self, run: CompareRun | None, earlier: CompareRun | None = None) -> None:
        self.beginResetModel()
        self._rows = table_rows(run) if run is not None else []
        self._deltas = deltas(run, earlier) if run is not None and earlier is not None else {}
        self._columns = COLUMNS + (DELTA_COLUMNS if earlier is not None else ())
        self.endResetModel()

    def rows(self) -> list[Row]:
        return list(self._rows)

    def columns(self) -> tuple[str, ...]:
        return self._columns

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802 (Qt's name)
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self._columns)

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole) -> Any:  # noqa: N802
        if orientation != Qt.Orientation.Horizontal or not 0 <= section < len(self._columns):
            return None
        name = self._columns[section]
        if role == Qt.ItemDataRole.DisplayRole:
            return HEADERS.get(name, name)
        if role == Qt.ItemDataRole.ToolTipRole:
            return TOOLTIPS.get(name)
        return None

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row, column = self._rows[index.row()], self._columns[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(row, column)
        if role == SORT_ROLE:
            return self._number(row, column)
        if role == Qt.ItemDataRole.TextAlignmentRole and column in _NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole:
            return self._colour(row, column)
        if role == Qt.ItemDataRole.ToolTipRole and column == "Accept" and row.nothing_drafted is not None:
            return row.nothing_drafted[0].upper() + row.nothing_drafted[1:] + "."
        if role == Qt.ItemDataRole.ToolTipRole and row.why is not None:
            return row.why.sentence()[0].upper() + row.why.sentence()[1:] + "."
        return None

    def _number(self, row: Row, column: str) -> Any:
        delta = self._deltas.get((row.config, row.category))
        values = {
            "Config": row.config, "Category": row.category, "Tokens": row.n_tokens, "tok/s": row.tps,
            "Speedup": row.speedup, "Accept": row.accept_rate, "Acc/step": row.mean_accepted, "TTFT": row.ttft_s,
            "Peak RSS": row.peak_rss_bytes, "Identical": row.identical_text, "Why": row.why_text,
            "Earlier tok/s": delta.tps_before if delta else None,
            "Δ tok/s": delta.tps_change if delta else None,
            "Earlier speedup": delta.speedup_before if delta else None,
        }
        value = values[column]
        return -1.0 if value is None and column in _NUMERIC else value

    def _text(self, row: Row, column: str) -> str:
        if column == "Accept" and row.nothing_drafted is not None:
            return row.accept_text  # "declined": its tooltip says why
        value = self._number(row, column)
        if column in _NUMERIC and value == -1.0:
            return "-"
        formats = {
            "tok/s": "{:.1f}", "Speedup": "{:.2f}×", "Accept": "{:.0%}", "Acc/step": "{:.2f}",
            "Earlier tok/s": "{:.1f}", "Δ tok/s": "{:+.0%}", "Earlier speedup": "{:.2f}×",
        }
        if column == "TTFT":
            return f"{value * 1000:.0f} ms"
        if column == "Peak RSS":
            return f"{value / MiB:.0f} MiB"
        return formats[column].format(value) if column in formats else str(value)

    def _colour(self, row: Row, column: str) -> QColor | None:
        if column == "Speedup" and row.speedup is not None and row.config != "none":
            # Green only for a lead past one run's noise from a drafter that drafted right: a
            # 1.1x with nothing accepted is the machine's noise, not good news.
            if row.speedup >= NOISE_BAND[1] and row.accept_rate:
                return QColor("#1f9d55")
            return QColor("#c0392b") if row.speedup < NOISE_BAND[0] else None
        if column == "Identical" and row.n_identical is not None and row.n_identical < row.n_prompts:
            return QColor("#c0392b")
        return None


NOISE_BAND = (0.95, 1.05)  # speedups within it are not coloured (app.compare.fastest.MARGIN)


class CompareTable(QTableView):
    """The sortable view: click a header to sort (numbers as numbers)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.table_model = CompareTableModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.table_model)
        self.proxy.setSortRole(SORT_ROLE)
        self.setModel(self.proxy)
        self.setSortingEnabled(True)
        self.sortByColumn(-1, Qt.SortOrder.AscendingOrder)  # run order until the user sorts
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setAlternatingRowColors(True)
        self.verticalHeader().setVisible(False)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.horizontalHeader().setStretchLastSection(True)

    def set_run(self, run: CompareRun | None, earlier: CompareRun | None = None) -> None:
        self.table_model.set_run(run, earlier)

    def cell_text(self, row: int, column: str) -> str:
        """The text shown at a (sorted) row and a column name (tests)."""
        col = self.table_model.columns().index(column)
        return str(self.proxy.index(row, col).data())
