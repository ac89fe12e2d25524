"""Width-aware tables: a column that names something (a run id, a workload id) is never cut; when the terminal is too
narrow, whole columns go first, least useful first, and only then may the remaining free text wrap."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

Cell = Union[str, Text]
GAP = 3  # between two columns of a SIMPLE_HEAD table without an edge: padding 1 either side and the rule's space


@dataclass
class Column:
    header: str
    cells: list[Cell] = field(default_factory=list)
    whole: bool = False       # an id or a number: shown whole (no wrap, no cut), never dropped
    drop: int = 0             # the order in which columns go when the width is short (1 goes first); 0: never
    justify: str = "left"

    def width(self) -> int:
        return max([cell_len(self.header), *(_cell_width(cell) for cell in self.cells)])


def _cell_width(cell: Cell) -> int:
    plain = cell.plain if isinstance(cell, Text) else str(cell)
    return max((cell_len(line) for line in plain.splitlines()), default=0)


def fit_columns(columns: list[Column], width: int) -> list[Column]:
    """The columns that fit in width: droppable ones leave, in their drop order, until the rest fits (or none is
    left to drop)."""
    shown = list(columns)
    while _needed(shown) > width:
        droppable = [c for c in shown if c.drop]
        if not droppable:
            break
        shown.remove(min(droppable, key=lambda c: c.drop))
    return shown


def _needed(columns: list[Column]) -> int:
    return sum(c.width() for c in columns) + GAP * max(0, len(columns) - 1)


def fitted_table(columns: list[Column], width: int, title: Optional[str] = None) -> Table:
    """A compact table (header rule, no borders) of the columns that fit in width; ids and numbers kept whole."""
    shown = fit_columns(columns, width)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title=title, title_justify="left",
                  title_style="bold", expand=False)
    for column in shown:
        if column.whole:
            table.add_column(column.header, no_wrap=True, min_width=column.width(), justify=column.justify)
        else:
            table.add_column(column.header, overflow="fold", justify=column.justify)
    rows = max((len(c.cells) for c in shown), default=0)
    for index in range(rows):
        table.add_row(*(c.cells[index] if index < len(c.cells) else "" for c in shown))
    return table
