"""A memorising regime, chosen by a rule fixed before its sweep (`[regime]` in a recipe).

A privacy loss can only be seen to reduce a leak where there is one. The rule: the alpha-0 control (phase 2 without
the privacy loss, trained as long as the privacy generator) leaks membership on every node, in either direction:
its membership AUROC's 95% interval lies above `threshold`, or below 1 - `threshold` (members further than
non-members, which an attacker flips). 0.6 by default: 40 members against 40 non-members resolve about +-0.13, so
the point estimate must reach about 0.73. The settings are swept on the recipe's `[regime] seed` (a seed the
recipe does not report, so that the seed that picked the regime is not one read with it). The recipe lists its grid's
settings in the order it will try them
(cheapest first); the regime is the first setting that meets the rule, and the sweep stops there. A sweep in which
no setting meets it says so and chooses none: the methods are then not compared on a leak that is not there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedcli.experiment.artifacts import read_json

THRESHOLD = 0.6
READ = "control"  # the generator whose leak the rule reads: phase 2 at alpha 0


@dataclasses.dataclass(frozen=True)
class Rule:
    threshold: float = THRESHOLD

    def describe(self) -> str:
        return (f"the alpha-0 control's membership AUROC has its 95% interval above {self.threshold:g} (or below "
                f"{1 - self.threshold:g}: reversed) on every node")

    def met(self, readings: list[dict]) -> bool:
        return bool(readings) and all(self.leaks(r) for r in readings)

    def leaks(self, reading: dict) -> bool:
        return reading["ci_low"] > self.threshold or reading["ci_high"] < 1 - self.threshold

    def margin(self, reading: dict) -> float:
        """How far the reading's interval clears the threshold in its better direction (positive: it leaks)."""
        return max(reading["ci_low"] - self.threshold, 1 - self.threshold - reading["ci_high"])


def readings(audit_root: Path, nodes: list[str]) -> list[dict]:
    """Each node's control membership attack, from its audit summary."""
    out = []
    for node in nodes:
        summary = read_json(audit_root / node / "summary.json", f"node {node}'s audit summary")
        mia = summary["generators"][READ]["mia"]
        out.append({"node": node, "auroc": mia["auroc"], "ci_low": mia["auroc_ci_low"],
                    "ci_high": mia["auroc_ci_high"], "members": summary["members"]})
    return out


def choose(swept: list[tuple[str, list[dict]]], rule: Rule) -> str | None:
    """The first setting (in the order tried) whose readings meet the rule; None when none does."""
    return next((name for name, found in swept if rule.met(found)), None)


def outcome(swept: list[tuple[str, list[dict]]], rule: Rule, tried: int) -> dict:
    """What regime.json records: the rule, every reading, the choice (or null) and a sentence saying which."""
    chosen = choose(swept, rule)
    if chosen is not None:
        said = f"regime: {chosen}, the first of {tried} settings to meet the rule"
    else:
        best = max(((name, min(rule.margin(r) for r in found)) for name, found in swept if found),
                   key=lambda item: item[1], default=None)
        said = (f"regime: none of the {tried} settings leaks by the rule ({rule.describe()})"
                + (f"; the closest, {best[0]}, missed it on its worst node by {-best[1]:.3f}" if best else ""))
    return {"rule": rule.describe(), "threshold": rule.threshold, "chosen": chosen, "said": said,
            "settings": [{"name": name, "met": rule.met(found), "readings": found} for name, found in swept]}
