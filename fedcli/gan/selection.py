"""Which phase-1 snapshot to keep, and when phase 1 may stop, from its FID checks (`train-gan --select`).

One FID check is one noisy reading of a generator that still moves: on real chest X-rays the node-CNN
FID jumped between 162 and 1109 from check to check, and keeping the lowest single reading kept a nearly
untrained generator whose buffer taught a classifier less than chance; on digits a single high reading
just before the best snapshot is as common. The principle of `stable`: one reading is no evidence,
either way. A snapshot is judged by the median of its own FID and the two checks' before it (Tukey's
running median of three, which discards any single outlier, low or high); before the first check the
generator is untrained, so the missing readings count as infinitely bad: the first check is kept only
when it is the only one, and the second is judged by the worse of the first two. The kept snapshot is
the one with the lowest judgement (the earlier on a tie), and patience counts from the last check that
improved it, so a single low reading neither wins nor stops training. `last`: the full iterations, the last snapshot (a fixed-iteration
generator, whose training never read FID to stop or choose).
"""

from __future__ import annotations

import math
import typing

from fedcli.config import SelectRule

SELECT_RULES: tuple[str, ...] = typing.get_args(SelectRule)


class SnapshotSelection:
    """Feed it every FID check in order; it says whether to keep that check's snapshot and when to stop."""

    def __init__(self, rule: str, patience: int, every: int):
        if rule not in SELECT_RULES:
            raise ValueError(f"unknown snapshot rule {rule!r}")
        self.rule, self.patience, self.every = rule, patience, every
        self.recent = [math.inf, math.inf]  # the two readings before this check; none before the first
        self.judged = math.inf  # the kept snapshot's judgement
        self.kept_fid = math.nan
        self.kept_iteration = 0
        self.since_kept = 0

    def check(self, iteration: int, fid: float) -> bool:
        """Record a check; True when its snapshot replaces the kept one."""
        judged = sorted([*self.recent, fid])[1]
        self.recent = [self.recent[1], fid]
        keep = self.rule == "last" or self.kept_iteration == 0 or judged < self.judged
        if keep:
            self.judged, self.kept_fid, self.kept_iteration, self.since_kept = judged, fid, iteration, 0
        else:
            self.since_kept += self.every
        return keep

    @property
    def exhausted(self) -> bool:
        """Patience spent (never under `last`, which runs every iteration)."""
        return self.rule == "stable" and self.since_kept >= self.patience

    def record(self) -> dict:
        """The rule and its reading of the kept snapshot, for config.json."""
        return {"select": self.rule, "judged_fid": self.judged if math.isfinite(self.judged) else None}
