"""A rich progress bar on stderr that a stage opens with `with`; subclasses add tasks and updates."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from fedcli import console


class ProgressBar:
    def __init__(self, *extra_columns):
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *extra_columns,
                                 TimeRemainingColumn(), console=console.err)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # a failure ends in one error line: the bar it interrupted goes
            self.progress.live.transient = True
        self.progress.__exit__(*exc)
