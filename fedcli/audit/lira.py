"""A LiRA-style membership game (Carlini et al. 2022, "Membership inference attacks from first principles").

Models are trained exactly as the audited one, each on a half of a pool of images (the audited members and as many
non-members); for every (model, image) the attack statistic is known, and whether the image was IN the model's
training set. Each model in turn is the target and the others its references (leave one out): per image, the
references' statistics IN and OUT are fitted by Gaussians with per-image means and, as LiRA's variant for few
references, one variance each shared over the images (here the pooled within-image variance of the references'
statistics, not the spread of the raw statistics over images, which would count how images differ as noise). The
score is the likelihood ratio log N(s; mu_in, sd_in) - log N(s; mu_out, sd_out): high when the target looks trained
on the image.

Every (target, image) with at least one IN and one OUT reference is a trial. From the trials: the target's own
AUROC, TPR at the lowest FPR the OUT trials resolve (10 of them flagged), and an empirical epsilon lower bound:
a threshold on the score chosen on half the images (keyed), the bound computed on the other half from 95%
Clopper-Pearson limits of TPR and FPR at that threshold, as the largest epsilon any of the four DP inequalities
that one test and its complement imply (both directions, so a reversed signal counts). Trials share models and
images, so the Clopper-Pearson limits, which assume independent trials, are an approximation.
"""

from __future__ import annotations

import math

import numpy as np

from fedcli.audit.effects import clopper_pearson, membership, tpr_at_fpr

FPRS = (0.01, 0.001)  # reported where at least 10 / FPR OUT trials exist
SD_FLOOR = 1e-3  # the smallest standard deviation a side is given, as a fraction of the statistics' spread


def fit(statistics: np.ndarray, inside: np.ndarray) -> dict[str, np.ndarray | float]:
    """Per image (columns), the mean statistic of the models (rows) that had it IN and of those that had it OUT
    (nan where none did), and the pooled within-image standard deviation of each side."""
    statistics, inside = np.asarray(statistics, float), np.asarray(inside, bool)
    counts = {"in": inside.sum(axis=0), "out": (~inside).sum(axis=0)}
    out: dict[str, np.ndarray | float] = {}
    for side, mask in (("in", inside), ("out", ~inside)):
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(mask, statistics, 0).sum(axis=0) / counts[side]
        residual = np.where(mask, statistics - mean, 0)
        freedom = (counts[side] - 1).clip(min=0).sum()
        out[f"mean_{side}"] = np.where(counts[side] > 0, mean, np.nan)
        out[f"sd_{side}"] = float(np.sqrt(np.square(residual).sum() / freedom)) if freedom > 0 else math.nan
    return out


def log_normal(x: np.ndarray, mean: np.ndarray, sd: float) -> np.ndarray:
    return -0.5 * np.square((x - mean) / sd) - math.log(sd) - 0.5 * math.log(2 * math.pi)


def ratio(target: np.ndarray, fitted: dict) -> np.ndarray:
    """The likelihood-ratio score of each image's target statistic under the fitted IN and OUT Gaussians."""
    return log_normal(target, fitted["mean_in"], fitted["sd_in"]) - log_normal(target, fitted["mean_out"],
                                                                                 fitted["sd_out"])


def leave_one_out(statistics: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """(models, images) scores, each model scored against the others; nan where an image lacks an IN or an OUT
    reference, or a side's variance cannot be estimated. A side whose references agree exactly (a memoriser
    rebuilds every image it stored at distance 0) gets SD_FLOOR of the statistics' spread, not a zero variance."""
    statistics, inside = np.asarray(statistics, float), np.asarray(inside, bool)
    scores = np.full(statistics.shape, np.nan)
    floor = SD_FLOOR * float(statistics.std()) or SD_FLOOR
    for m in range(len(statistics)):
        others = np.arange(len(statistics)) != m
        fitted = fit(statistics[others], inside[others])
        if math.isfinite(fitted["sd_in"]) and math.isfinite(fitted["sd_out"]):
            fitted |= {side: max(fitted[side], floor) for side in ("sd_in", "sd_out")}
            scores[m] = ratio(statistics[m], fitted)
    return scores


def epsilon_bound(tp: int, positives: int, fp: int, negatives: int, delta: float) -> float:
    """The largest epsilon lower bound the four (epsilon, delta)-DP inequalities of one test and its complement
    give at 95% Clopper-Pearson limits of TPR and FPR; 0 where none is positive."""
    tpr_low, tpr_high = clopper_pearson(tp, positives)
    fpr_low, fpr_high = clopper_pearson(fp, negatives)
    # each inequality P[S | D] <= e^eps P[S | D'] + delta with the left side at its lower limit, the right at its upper
    candidates = [(tpr_low - delta, fpr_high), (1 - fpr_high - delta, 1 - tpr_low),  # flagged = IN
                  (fpr_low - delta, tpr_high), (1 - tpr_high - delta, 1 - fpr_low)]  # flagged = OUT (reversed)
    return max([0.0] + [math.log(a / b) for a, b in candidates if a > 0 and b > 0 and a > b])


def best_threshold(scores: np.ndarray, inside: np.ndarray, delta: float) -> float:
    """The score threshold (flag scores above it) of the largest epsilon bound on these trials."""
    candidates = np.unique(scores)
    positives, negatives = int(inside.sum()), int((~inside).sum())
    best, chosen = -1.0, math.inf
    for threshold in candidates:
        flagged = scores > threshold
        bound = epsilon_bound(int(flagged[inside].sum()), positives, int(flagged[~inside].sum()), negatives, delta)
        if bound > best:
            best, chosen = bound, float(threshold)
    return chosen


def empirical_epsilon(scores: np.ndarray, inside: np.ndarray, image_half: np.ndarray, delta: float) -> dict:
    """The threshold chosen on the trials of images in half 0, the bound computed on half 1's (`scores`, `inside`
    and `image_half` flat over the trials)."""
    choose, bound = image_half == 0, image_half == 1
    threshold = best_threshold(scores[choose], inside[choose], delta)
    flagged, held = scores[bound] > threshold, inside[bound]
    tp, fp = int(flagged[held].sum()), int(flagged[~held].sum())
    positives, negatives = int(held.sum()), int((~held).sum())
    return {"epsilon_lower_bound": epsilon_bound(tp, positives, fp, negatives, delta), "delta": delta,
            "threshold": threshold, "tpr": tp / positives if positives else math.nan,
            "fpr": fp / negatives if negatives else math.nan, "in_trials": positives, "out_trials": negatives,
            "confidence": "95% Clopper-Pearson per rate"}


def low_fpr(scores: np.ndarray, inside: np.ndarray) -> dict:
    """TPR at the lowest FPR the OUT trials resolve (10 / n), and at 1% and 0.1% where they resolve those."""
    members, others = scores[inside], scores[~inside]
    lowest = 10 / len(others)
    out = {"out_trials": len(others), "in_trials": len(members),
           "at_min_fpr": tpr_at_fpr(members, others, lowest) | {"min_fpr": lowest} if lowest < 1 else None}
    for fpr in FPRS:
        out[str(fpr)] = tpr_at_fpr(members, others, fpr) if len(others) >= math.ceil(10 / fpr) else None
    return out


def game(statistics: np.ndarray, inside: np.ndarray, target: int, delta: float, rng: np.random.Generator) -> dict:
    """The game on (models, images) statistics (higher = more member-like) and IN flags; `target`: the row of the
    audited model. Its own membership attack (the GAN-Leaks-style summary of effects.membership on its LiRA
    scores), and over every model as target, TPR at low FPR and the empirical epsilon."""
    scores = leave_one_out(statistics, inside)
    inside = np.asarray(inside, bool)
    valid = np.isfinite(scores)
    image_half = np.broadcast_to(rng.permutation(np.arange(scores.shape[1]) % 2), scores.shape)
    own = valid[target]
    flat = {"scores": scores[valid], "inside": inside[valid], "half": image_half[valid]}
    return {"models": int(len(scores)), "images": int(scores.shape[1]), "trials": int(valid.sum()),
            "skipped_trials": int((~valid).sum()),
            "target": membership(-scores[target][own], inside[target][own].astype(int), rng),
            "low_fpr": low_fpr(flat["scores"], flat["inside"]),
            "empirical_epsilon": empirical_epsilon(flat["scores"], flat["inside"], flat["half"], delta)}


DISTANCES = {"lpips": "training LPIPS", "l2": "pixel L2", "lpips_independent": "audit-only LPIPS"}


def distance_games(target: dict[str, np.ndarray], references: dict[str, np.ndarray], inside: np.ndarray,
                   is_member: np.ndarray, delta: float, rng: np.random.Generator) -> dict[str, dict]:
    """The game in each of DISTANCES: `target[d]` the audited generator's projection distance per pooled image,
    `references[d]` the references' (references, images); the statistic is minus the log distance (members are
    closer, and a log makes distances' spread more nearly Gaussian)."""
    games = {}
    for name in DISTANCES:
        statistics = -np.log(np.vstack([references[name], target[name][None]]) + 1e-12)
        rows = np.vstack([inside, np.asarray(is_member, bool)[None]])
        games[name] = game(statistics, rows, len(rows) - 1, delta, rng)
    return games
