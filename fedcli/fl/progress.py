"""Rich progress bar over federated rounds."""

from __future__ import annotations

from rich.progress import TimeElapsedColumn

from fedcli.progress import ProgressBar


class RoundProgress(ProgressBar):
    def __init__(self, label: str, rounds: int):
        super().__init__(TimeElapsedColumn())
        self.task = self.progress.add_task(f"{label} rounds", total=rounds)

    def update(self, round_: int) -> None:
        self.progress.update(self.task, completed=round_)
