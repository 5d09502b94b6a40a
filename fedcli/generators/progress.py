"""Progress of one node's GAN training: the bar (iteration rate, losses, FID and ETA per phase; plain lines
off a terminal, fedcli/core/progress.py) and, in the stage's events (fedcli/experiment/events.py), one `check` line per
FID
evaluation with the row's scores."""

from __future__ import annotations

import math
from pathlib import Path

from rich.progress import TextColumn

from fedcli.core.progress import ProgressBar
from fedcli.experiment import events

RUN_KEYS = ("phase", "iteration")  # where a row stands; the rest are its scores
CHECK_SCALARS = ("fid", "loss_g", "loss_d", "l_pp")  # a check's scores in TensorBoard: FID and the losses


class TrainingProgress(ProgressBar):
    def __init__(self, node: str, iterations: int, pp_iterations: int, controls: bool = False,
                 reference: bool = False):
        super().__init__("train-gan", "it", TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[status]}"))
        self.node = node
        self.tasks = {1: self.progress.add_task(f"{node} phase 1", total=iterations, rate="", status=""),
                      2: self.progress.add_task(f"{node} phase 2", total=pp_iterations, rate="", status="",
                                                start=False),
                      "control": self.progress.add_task(f"{node} control", total=None, rate="", status="",
                                                        start=False)}
        if controls:
            self.tasks["reseeded"] = self.progress.add_task(f"{node} reseeded", total=None, rate="", status="",
                                                            start=False)
            self.tasks["tiny"] = self.progress.add_task(f"{node} tiny node", total=iterations, rate="", status="",
                                                        start=False)
        if reference:
            self.tasks["reference"] = self.progress.add_task(f"{node} reference", total=iterations, rate="",
                                                             status="", start=False)
        self.fid = dict.fromkeys(self.tasks, math.nan)
        self.previous = 1

    def update(self, row: dict) -> None:
        phase = row["phase"]
        task = self.tasks[phase]
        if phase != self.previous:  # the phase before ends where it stopped
            done = self.tasks[self.previous]
            self.progress.update(done, total=self.progress.tasks[done].completed)
            self.progress.start_task(task)
            self.previous = phase
        if "fid" in row:
            self.fid[phase] = row["fid"]
            self.record_check(row)
        speed = self.progress.tasks[task].speed
        status = f"G {row['loss_g']:.2f} D {row['loss_d']:.2f} p {row['ada_p']:.2f} fid {self.fid[phase]:.3g}"
        if "lpips_mean" in row:
            status += f" lpips {row['lpips_mean']:.3f}"
        self.progress.update(task, completed=row["iteration"], status=status,
                             rate=f"{speed:.1f} it/s" if speed else "")

    def reused(self, iterations: int, source: Path) -> None:
        """Phase 1 taken from another experiment (train-gan --phase1-from): its bar full, one line in the events."""
        self.progress.update(self.tasks[1], total=iterations, completed=iterations, status=f"from {source}")
        events.record("phase1-reused", {"node": self.node, "from": str(source), "iterations": iterations})

    def record_check(self, row: dict) -> None:
        """The check's line in the stage's events; in the node's TensorBoard run, `<phase>/<score>` for the
        scores of CHECK_SCALARS it holds (the same tags in every node's run), step the phase's iteration."""
        scores = {k: v for k, v in row.items() if k not in RUN_KEYS}
        phase = f"phase{row['phase']}" if isinstance(row["phase"], int) else row["phase"]
        events.record("check", {"node": self.node, "phase": row["phase"], "iteration": row["iteration"],
                                "scores": scores}, self.node,
                      {f"{phase}/{k}": v for k, v in events.scalars_of(scores).items() if k in CHECK_SCALARS},
                      row["iteration"])
