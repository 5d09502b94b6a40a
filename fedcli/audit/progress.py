"""Progress of projection: images done, steps/s, current mean distance (fedcli/core/progress.py: a rich bar on a
terminal, plain lines elsewhere)."""

from __future__ import annotations

from rich.progress import TextColumn

from fedcli.core.progress import ProgressBar


class ProjectionProgress(ProgressBar):
    def __init__(self, label: str, images: int, steps: int):
        super().__init__("audit-privacy", "image", TextColumn("{task.fields[status]}"))
        self.task = self.progress.add_task(f"{label} projection", total=images, status="")
        self.steps = steps
        self._count = 0

    def step(self, step: int, mean_distance: float) -> None:
        elapsed = self.progress.tasks[0].elapsed or 0.0
        self._count += 1
        rate = f"{self._count / elapsed:.1f} steps/s" if elapsed else ""
        self.progress.update(self.task, status=f"step {step + 1}/{self.steps} {rate} lpips {mean_distance:.4f}")

    def batch_done(self, n: int) -> None:
        self.progress.advance(self.task, n)
