"""Few labels, paired: each variant against SSFL, and the regime check (the upper bound against both lower bounds).

Within a seed every variant ran on one partition, so its clients' test sets and their bootstrap resamples
(keyed by the seed and the test node) are the same: a variant's client mean and the reference's on resample b
are two measurements of the same images, and their difference on b one draw of the difference's sampling
distribution (report/paired.py). Per seed the client-mean difference is taken resample by resample; the
differences are averaged over the seeds; the cell is the whole test sets' difference and the 2.5-97.5
percentiles of the resamples': a paired 95% interval on the final round's models.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcli.metrics.scores import percentile_interval
from fedcli.report.collect import Run, SubExperiment, final_rows, own_rows
from fedcli.report.few_labels import BASELINE, LOCAL, SSFL, bounds, variants
from fedcli.report.paired import cell, scores, with_mean
from fedcli.report.table import Built, Missing, ReportTable

PLATEAU = 0.02  # the upper bound has reached a plateau when its client mean moved less than this over its last
# evaluation interval


def client_means(run: Run, sub: SubExperiment, metric: str) -> np.ndarray | None:
    scored = scores(run, sub, metric)
    return None if scored is None else with_mean(scored, sub.nodes)["mean"]


def by_partition(pairs: list[tuple[Run, SubExperiment]]) -> dict[tuple, tuple[Run, SubExperiment]]:
    return {(sub.manifest.get("content_hash"), run.config.get("bootstrap")): (run, sub) for run, sub in pairs}


def paired(found: dict[str, list[tuple[Run, SubExperiment]]], name: str, reference: str,
           metric: str) -> tuple[np.ndarray, int] | None:
    """`name` minus `reference`, client means per resample, averaged over the seeds both ran; and how many."""
    mine, theirs = by_partition(found.get(name, [])), by_partition(found.get(reference, []))
    per_seed = []
    for key in sorted(set(mine) & set(theirs), key=str):
        a, b = client_means(*mine[key], metric), client_means(*theirs[key], metric)
        if a is not None and b is not None:
            per_seed.append(a - b)
    return (np.mean(per_seed, axis=0), len(per_seed)) if per_seed else None


def against_ssfl_table(subs: list[SubExperiment], metric: str) -> Built:
    title = "Few labels: every variant minus SSFL (FedAvg with FixMatch at its participation), paired"
    found, rows = variants(subs), {}
    for name, pairs in found.items():
        ssfl = bounds(pairs[0][0].config)[2]
        if name != ssfl and (result := paired(found, name, ssfl, metric)) is not None:
            rows[name] = {f"{metric} difference [95% interval]": cell(result[0]), "seeds": str(result[1])}
    if not rows:
        return Missing(title, f"few-labels runs of {SSFL} beside other variants, with their predictions")
    return ReportTable("few_labels_vs_ssfl", title, pd.DataFrame(rows).T,
                       "the client mean of each client's own test set under the final model, the variant's minus "
                       f"{SSFL}'s on the same test sets and resamples, averaged over the seeds both ran; "
                       "above 0: better than SSFL", rows_are="variant")


def plateau_change(pairs: list[tuple[Run, SubExperiment]], metric: str) -> float:
    """The upper bound's client mean at its final evaluated round minus at the one before, mean over seeds."""
    changes = []
    for run, _ in pairs:
        own = own_rows(run.metrics)
        rounds = sorted(set(own["round"]))
        if len(rounds) >= 2:
            means = own.groupby("round")[metric].mean()
            changes.append(means[rounds[-1]] - means[rounds[-2]])
    return float(np.mean(changes)) if changes else float("nan")


def regime_table(subs: list[SubExperiment], metric: str) -> Built:
    """Whether the federation learns at this budget: the upper bound beats both lower bounds, on a plateau."""
    title = "Few labels: the regime check (the upper bound against both lower bounds)"
    found, rows, final = variants(subs), {}, set()
    for upper, pairs in found.items():
        local, lower, _, named = bounds(pairs[0][0].config)
        if upper != named:
            continue
        final |= {int(final_rows(run.metrics)["round"].max()) for run, _ in pairs}
        change = plateau_change(pairs, metric)
        for bound in (local, lower):
            if (result := paired(found, upper, bound, metric)) is None:
                continue
            diff, seeds = result
            rows[f"{upper} minus {bound}"] = {
                f"{metric} difference [95% interval]": cell(diff), "seeds": str(seeds),
                "upper bound's change over its last evaluation interval": f"{change:+.3f}",
                "holds": "yes" if percentile_interval(diff[1:])[0] > 0 and abs(change) < PLATEAU else "no"}
    if not rows:
        return Missing(title, f"few-labels runs of {LOCAL}, {BASELINE} and the upper bound (federate --labels all)")
    note = (f"the final round ({', '.join(map(str, sorted(final)))}); paired as every few-labels difference is; "
            f"holds: the interval above 0 and the upper bound's client mean moved less than {PLATEAU} over its last "
            "evaluation interval (a plateau), the sanity condition under which the methods between the bounds can be "
            "ordered")
    return ReportTable("few_labels_regime", title, pd.DataFrame(rows).T, note, rows_are="comparison")
