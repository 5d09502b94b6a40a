"""Rich tables printed at the end of a stage."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table


def gan_table(summaries: list[dict]) -> Table:
    """Per node: FID of both phases (with the feature space's name), iterations, and the buffer."""
    fid_name = summaries[0]["metric_names"]["fid"] if summaries else "fid"
    uncalibrated = summaries and not summaries[0]["fid"]["calibrated"]
    table = Table(title="train-gan", caption="uncalibrated: fallback feature network (no ImageNet weights)"
                  if uncalibrated else None)
    table.title = escape(f"train-gan ({fid_name})")
    for column in ("node", "images", "FID 1", "iters 1", "stop 1", "FID 2", "iters 2", "stop 2", "buffer"):
        table.add_column(column, justify="left" if column in ("node", "stop 1", "stop 2") else "right")
    for s in summaries:
        p1, p2 = s["phase1"], s["phase2"]
        table.add_row(s["node"], str(s["train_images"]), f"{p1['fid']:.4g}", str(p1["iterations"]), p1["stopped"],
                      f"{p2['fid']:.4g}", str(p2["iterations"]), p2["stopped"], str(s["buffer"]["size"]))
    return table
