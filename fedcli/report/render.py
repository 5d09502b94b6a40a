"""A `ReportTable` as Markdown, booktabs LaTeX, CSV (numbers, not strings) and a rich table."""

from __future__ import annotations

import math

import pandas as pd
from rich.markup import escape
from rich.table import Table

from fedcli.report.collect import Stat
from fedcli.report.table import ReportTable

LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def best_cells(table: ReportTable) -> set[tuple[int, str]]:
    """(row number, column) of the best mean of each Stat column (the highest, or the lowest where lower is
    better), when the table marks them."""
    if not table.mark_best or len(table.frame) < 2:
        return set()
    best = set()
    for column in table.frame.columns:
        values = [(cell.mean, i) for i, cell in enumerate(table.frame[column])
                  if isinstance(cell, Stat) and not math.isnan(cell.mean)]
        if values:
            top = (min if table.lower_is_better else max)(v for v, _ in values)
            best |= {(i, column) for v, i in values if v == top}
    return best


def cell_text(cell) -> str:
    return str(cell) if isinstance(cell, Stat) else "" if cell is None else str(cell)


def rows(table: ReportTable):
    """(row label, [(column, text, is_best)]) for every row."""
    best = best_cells(table)
    for i, (label, row) in enumerate(table.frame.iterrows()):
        yield str(label), [(column, cell_text(row[column]), (i, column) in best) for column in table.frame.columns]


def header(table: ReportTable) -> list[str]:
    return [str(table.frame.index.name or ""), *map(str, table.frame.columns)]


def markdown(table: ReportTable) -> str:
    head = header(table)
    lines = [f"**{table.title}**", "", "| " + " | ".join(head) + " |",
             "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |"]
    for label, cells in rows(table):
        texts = [f"**{text}**" if bold else text for _, text, bold in cells]
        lines.append("| " + " | ".join([label, *texts]).replace("\n", " ") + " |")
    if table.note:
        lines += ["", f"*{table.note}*"]
    return "\n".join(lines) + "\n"


def latex_escape(text: str) -> str:
    text = "".join(LATEX_SPECIAL.get(ch, ch) for ch in text)
    return text.replace("±", r"$\pm$")


def latex(table: ReportTable) -> str:
    head = header(table)
    lines = [f"% {table.title}", "\\begin{tabular}{l" + "r" * (len(head) - 1) + "}", "\\toprule",
             " & ".join(latex_escape(h) for h in head) + " \\\\", "\\midrule"]
    for label, cells in rows(table):
        texts = [f"\\textbf{{{latex_escape(text)}}}" if bold else latex_escape(text) for _, text, bold in cells]
        lines.append(" & ".join([latex_escape(label), *texts]) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def numeric(table: ReportTable) -> pd.DataFrame:
    """The table with each Stat column split into mean, std and n columns, for the CSV."""
    out = {}
    for column in table.frame.columns:
        cells = list(table.frame[column])
        if any(isinstance(c, Stat) for c in cells):
            out[str(column)] = [c.mean if isinstance(c, Stat) else None for c in cells]
            out[f"{column}_std"] = [c.std if isinstance(c, Stat) else None for c in cells]
            out[f"{column}_n"] = [c.n if isinstance(c, Stat) else None for c in cells]
        else:
            out[str(column)] = [cell_text(c) for c in cells]
    frame = pd.DataFrame(out)
    frame.insert(0, str(table.frame.index.name or "row"), [str(i) for i in table.frame.index])
    return frame


def rich_table(table: ReportTable) -> Table:
    out = Table(title=escape(table.title), caption=escape(table.note) if table.note else None)
    for i, name in enumerate(header(table)):
        out.add_column(escape(name), justify="left" if i == 0 else "right")
    for label, cells in rows(table):
        out.add_row(escape(label), *(f"[bold green]{escape(t)}[/]" if bold else escape(t) for _, t, bold in cells))
    return out
