"""Rich progress bar over federated rounds."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
    TimeRemainingColumn

from fedcli import console


class RoundProgress:
    def __init__(self, label: str, rounds: int):
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=console.err)
        self.task = self.progress.add_task(f"{label} rounds", total=rounds)

    def __enter__(self) -> "RoundProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, round_: int) -> None:
        self.progress.update(self.task, completed=round_)
