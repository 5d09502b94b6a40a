"""Progress over federated rounds: a rich bar on a terminal, plain lines elsewhere (fedcli/core/progress.py)."""

from __future__ import annotations

from rich.progress import TimeElapsedColumn

from fedcli.core.progress import ProgressBar


class RoundProgress(ProgressBar):
    def __init__(self, label: str, rounds: int):
        super().__init__("federate", "round", TimeElapsedColumn())
        self.task = self.progress.add_task(f"{label} rounds", total=rounds)

    def update(self, round_: int) -> None:
        self.progress.update(self.task, completed=round_)
