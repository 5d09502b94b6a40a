"""Which phase-1 snapshot to keep, and when phase 1 may stop, from its checks (`train-gan --select`).

One FID check is one noisy reading of a generator that still moves. On real chest X-rays the node-CNN
FID of 512 images jumped between 162 and 1109 from check to check, and between 21 and 229 on another
node whose buffers' fidelity rose with training all the same (0.48 at iteration 25, where the FID read
44, to 0.96 at 375); keeping the lowest single reading, with patience counted from it, once stopped at
iteration 250 and kept a nearly untrained generator whose buffer taught a classifier less than chance.

The principle of `stable`: a later snapshot has had more training, and only the FID's evidence beyond
its own noise may overrule that. The noise is the median change of log FID between consecutive checks
so far (a robust scale of how much one reading moves from the next; FID varies by factors, hence the
log). The kept snapshot is the latest whose FID is within that noise of the lowest reading so far, and
patience counts from it: phase 1 stops only when no check has come within the noise for `patience`
iterations. A single low reading therefore neither stops training nor holds the choice against the
checks after it, and a generator that collapses beyond the noise is not kept. `last`: every iteration,
the last snapshot (a fixed-iteration generator, whose training never read FID to stop or choose).

`fidelity` reads what the fidelity ratio measures instead of FID: at each check the snapshot's buffer
trains one classifier (generators/fidelity.py SelectionJudge), scored on the node's own training images (never
its test images, which the reported ratio reads). FID can be fooled where the buffer is not: on chest
X-rays a generator at iteration 75 had the lowest FID of its run and a buffer that taught a classifier
chance (0.50 against 0.88 at iteration 300). The kept snapshot is the one with the highest reading (the
later of equal ones), and patience counts from it. It costs one classifier's training per check.
"""

from __future__ import annotations

import math
import statistics
import typing

from fedcli.generators.stylegan2.options import SelectRule

SELECT_RULES: tuple[str, ...] = typing.get_args(SelectRule)


class SnapshotSelection:
    """Feed it every check in order (its FID, and under `fidelity` its buffer's accuracy); it says whether to
    keep that check's snapshot and when to stop."""

    def __init__(self, rule: str, patience: int, every: int):
        if rule not in SELECT_RULES:
            raise ValueError(f"unknown snapshot rule {rule!r}")
        self.rule, self.patience, self.every = rule, patience, every
        self.logs: list[float] = []  # log FID of every finite reading so far
        self.kept_fid = math.nan
        self.kept_accuracy = -math.inf  # under `fidelity`: the kept snapshot's reading
        self.kept_iteration = 0
        self.since_kept = 0

    @property
    def noise(self) -> float:
        """The median absolute change of log FID between consecutive readings (0 before two readings)."""
        changes = [abs(b - a) for a, b in zip(self.logs, self.logs[1:])]
        return statistics.median(changes) if changes else 0.0

    def check(self, iteration: int, fid: float, accuracy: float = math.nan) -> bool:
        """Record a check; True when its snapshot replaces the kept one. Under `stable` the FID is judged
        against the noise of the readings before it; under `fidelity` the accuracy against the kept one's."""
        keep = self.rule == "last" or self.kept_iteration == 0
        if math.isfinite(fid):
            noise, reading = self.noise, math.log(max(fid, 1e-12))
            self.logs.append(reading)
            keep = keep or (self.rule == "stable" and reading <= min(self.logs) + noise)
        if self.rule == "fidelity":
            keep = keep or accuracy >= self.kept_accuracy
        if keep:
            self.kept_fid, self.kept_iteration, self.since_kept = fid, iteration, 0
            self.kept_accuracy = accuracy
        else:
            self.since_kept += self.every
        return keep

    @property
    def exhausted(self) -> bool:
        """Patience spent (never under `last`, which runs every iteration)."""
        return self.rule != "last" and self.since_kept >= self.patience

    def record(self) -> dict:
        """The rule, and for `stable` the lowest reading and the noise as a factor (for `fidelity` the kept
        snapshot's accuracy on the training images), for config.json."""
        if self.rule == "fidelity":
            return {"select": self.rule, "selection_accuracy": self.kept_accuracy}
        if self.rule == "last" or not self.logs:
            return {"select": self.rule}
        return {"select": self.rule, "lowest_fid": math.exp(min(self.logs)), "noise_factor": math.exp(self.noise)}
