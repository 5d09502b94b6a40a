"""The audit's statistics: the privacy loss's paired effect, membership inference at resolvable error
rates, reconstruction shares and the buffer's distance to closest record.

Every leak test is two-sided at ALPHA = 0.01 and every interval is 95%: a generator whose members sit further from
it than non-members leaks as much as one whose members sit closer (an attacker flips the score), and FedER's
nearest-form loss pushes samples away from members specifically, so that is the direction its leak would take. A
membership reading therefore carries its direction, and `strength`, the AUROC of the better of the two attackers.
A rate is reported only where the images can resolve it (at least 10 / FPR non-members for a TPR at that FPR);
otherwise the value is null with the reason, never interpolated.

Group sizes: under no leak the AUROC's standard error is about sqrt(1 / (6 n)) at n members and n non-members, so
its 95% interval is about +-0.13 at n = 40 and needs n = 64 per group to be +-0.1 (RESOLVES_TENTH), and about
130 per group to find a true AUROC of 0.6 four times in five.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

ALPHA = 0.01
FPRS = (0.1, 0.01, 0.001)
EFFECT = 1.1  # a privacy effect counts when the median per-image distance ratio is at least this
RESAMPLES = 2000
RESOLVES_TENTH = 64  # images per group whose 95% AUROC interval under no leak is +-0.1
REVERSED = "members further"


def wilcoxon_greater(a: np.ndarray, b: np.ndarray) -> float:
    """One-sided signed-rank p that a exceeds b pairwise; 1 when no pair differs."""
    if not np.any(a != b):
        return 1.0
    return float(stats.wilcoxon(a, b, alternative="greater").pvalue)


def bootstrap_interval(values: np.ndarray, statistic, rng: np.random.Generator) -> tuple[float, float]:
    draws = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
    estimates = np.array([statistic(values[row]) for row in draws])
    return float(np.quantile(estimates, 0.025)), float(np.quantile(estimates, 0.975))


def ratios(privacy: np.ndarray, control: np.ndarray) -> np.ndarray:
    """Per image, privacy distance / control distance of the same image (finite when both are 0)."""
    return (np.asarray(privacy, float) + 1e-12) / (np.asarray(control, float) + 1e-12)


def paired_ratio(privacy: np.ndarray, control: np.ndarray, rng: np.random.Generator) -> dict:
    """The per-image ratios' median, its bootstrap interval, and the one-sided signed-rank p of
    privacy > control (p_value) and of privacy < control (p_reversed)."""
    privacy, control = np.asarray(privacy, float), np.asarray(control, float)
    per_image = ratios(privacy, control)
    low, high = bootstrap_interval(per_image, np.median, rng)
    return {"median_ratio": float(np.median(per_image)), "ci_low": low, "ci_high": high,
            "p_value": wilcoxon_greater(privacy, control), "p_reversed": wilcoxon_greater(control, privacy),
            "images": int(len(per_image))}


def privacy_effect(privacy: np.ndarray, control: np.ndarray, is_member: np.ndarray, rng: np.random.Generator
                   ) -> dict:
    """The members' paired effect, with the non-members' under `non_members` and a verdict: `significant`
    (members' p < ALPHA, median ratio >= EFFECT, and members' ratios above the non-members' by a one-sided
    Mann-Whitney p < ALPHA: a push away from every image is generalisation, not member protection),
    `reversed` (the opposite one-sided paired test has p < ALPHA) or `none`."""
    members = paired_ratio(privacy[is_member == 1], control[is_member == 1], rng)
    others = paired_ratio(privacy[is_member == 0], control[is_member == 0], rng)
    per_image = ratios(privacy, control)
    above = float(stats.mannwhitneyu(per_image[is_member == 1], per_image[is_member == 0],
                                     alternative="greater").pvalue)
    if members["p_value"] < ALPHA and members["median_ratio"] >= EFFECT and above < ALPHA:
        label = "significant"
    elif members["p_reversed"] < ALPHA:
        label = "reversed"
    else:
        label = "none"
    return members | {"non_members": others, "p_members_above_non_members": above, "verdict": label}


def clopper_pearson(hits: int, n: int) -> tuple[float, float]:
    low = 0.0 if hits == 0 else float(stats.beta.ppf(0.025, hits, n - hits + 1))
    high = 1.0 if hits == n else float(stats.beta.ppf(0.975, hits + 1, n - hits))
    return low, high


def tpr_at_fpr(member_scores: np.ndarray, other_scores: np.ndarray, fpr: float) -> dict:
    """Flag scores above the threshold that lets at most floor(fpr x non-members) non-members through."""
    allowed = math.floor(fpr * len(other_scores))
    threshold = np.sort(other_scores)[::-1][allowed]
    hits = int((member_scores > threshold).sum())
    low, high = clopper_pearson(hits, len(member_scores))
    return {"fpr": float((other_scores > threshold).mean()), "tpr": hits / len(member_scores), "ci_low": low,
            "ci_high": high}


def auroc(member_scores: np.ndarray, other_scores: np.ndarray) -> float:
    ranks = stats.rankdata(np.concatenate([member_scores, other_scores]))
    n1, n0 = len(member_scores), len(other_scores)
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def auroc_difference(first: np.ndarray, second: np.ndarray, is_member: np.ndarray, rng: np.random.Generator
                     ) -> dict:
    """Membership AUROC of the distances `first` minus that of `second`, measured on the same images, with a
    paired bootstrap 95% interval (members and non-members resampled apart, one draw for both)."""
    first, second = -np.asarray(first, float), -np.asarray(second, float)
    members, others = np.flatnonzero(is_member == 1), np.flatnonzero(is_member == 0)

    def difference(m: np.ndarray, o: np.ndarray) -> float:
        return auroc(first[m], first[o]) - auroc(second[m], second[o])

    draws = [difference(rng.choice(members, len(members)), rng.choice(others, len(others)))
             for _ in range(RESAMPLES // 4)]
    return {"difference": difference(members, others), "ci_low": float(np.quantile(draws, 0.025)),
            "ci_high": float(np.quantile(draws, 0.975))}


def membership(distances: np.ndarray, is_member: np.ndarray, rng: np.random.Generator) -> dict:
    """The GAN-Leaks attack `score = -distance` (members closer): AUROC with its bootstrap interval (members and
    non-members resampled apart) and the two-sided Mann-Whitney p of AUROC != 0.5; its direction ("members
    closer", or REVERSED when the AUROC is below 0.5) and strength (the better attacker's AUROC, max(AUROC,
    1 - AUROC)); average precision, TPR at each resolvable FPR and at the lowest resolvable one, all of the
    attacker in the stronger direction."""
    from sklearn.metrics import average_precision_score

    scores = -np.asarray(distances, dtype=float)
    members, others = scores[is_member == 1], scores[is_member == 0]
    resampled = [auroc(rng.choice(members, len(members)), rng.choice(others, len(others)))
                 for _ in range(RESAMPLES // 4)]
    value = auroc(members, others)
    if value < 0.5:  # the stronger attacker flags the furthest images
        scores, members, others = -scores, -members, -others
    need = {fpr: math.ceil(10 / fpr) for fpr in FPRS}
    out = {"auroc": value, "auroc_ci_low": float(np.quantile(resampled, 0.025)),
           "auroc_ci_high": float(np.quantile(resampled, 0.975)),
           "p_value": float(stats.mannwhitneyu(members, others, alternative="two-sided").pvalue),
           "direction": REVERSED if value < 0.5 else "members closer", "strength": max(value, 1 - value),
           "average_precision": float(average_precision_score(is_member, scores)),
           "tpr_at_fpr": {str(fpr): tpr_at_fpr(members, others, fpr) if len(others) >= need[fpr] else None
                          for fpr in FPRS},
           "tpr_at_fpr_null_reason": {str(fpr): f"needs at least {need[fpr]} non-members, the audit has "
                                      f"{len(others)}" for fpr in FPRS if len(others) < need[fpr]}}
    lowest = 10 / len(others)
    out["tpr_at_min_fpr"] = tpr_at_fpr(members, others, lowest) | {"min_fpr": lowest} if lowest < 1 else None
    return out


def dp_bound(mia: dict, epsilon: float, delta: float, non_members: int) -> dict:
    """The (epsilon, delta)-DP sanity bound on a membership attack: at every FPR the audit resolves (with
    `non_members` images, 10 / n the lowest), TPR <= e^epsilon x FPR + delta (any test of one image's presence obeys
    it). `informative` is false where the bound is 1 at every such FPR: it then holds for any attack."""
    points = [p for p in [*mia["tpr_at_fpr"].values(), mia.get("tpr_at_min_fpr")] if p]
    limit = [min(1.0, math.exp(epsilon) * p["fpr"] + delta) for p in points]
    return {"holds": all(p["tpr"] <= bound for p, bound in zip(points, limit)),
            "informative": any(bound < 1 for bound in limit), "non_members": non_members,
            "points": [{"fpr": p["fpr"], "tpr": p["tpr"], "bound": bound} for p, bound in zip(points, limit)]}


def resolves(mia: dict, threshold: float) -> bool:
    """Whether a membership reading's 95% interval lies within [1 - threshold, threshold]: no leak of that
    strength in either direction."""
    return 1 - threshold <= mia["auroc_ci_low"] and mia["auroc_ci_high"] <= threshold


def excludes_chance(mia: dict) -> bool:
    """Whether a membership reading's 95% interval excludes 0.5, on either side."""
    return mia["auroc_ci_low"] > 0.5 or mia["auroc_ci_high"] < 0.5


def share_test(member_hits: np.ndarray, other_hits: np.ndarray) -> dict:
    """Shares of members and non-members with a property, and Fisher's two-sided p that they differ."""
    a, b = int(member_hits.sum()), int(other_hits.sum())
    table = [[a, len(member_hits) - a], [b, len(other_hits) - b]]
    return {"members": a / len(member_hits), "non_members": b / len(other_hits),
            "p_value": float(stats.fisher_exact(table, alternative="two-sided")[1])}


def reconstruction_share(projection: np.ndarray, nearest_other: np.ndarray, is_member: np.ndarray) -> dict:
    """Share of images whose projection is closer to them than their nearest other real image: a leak when
    members' share differs from non-members' (a generator that rebuilds unseen images as well generalises; one
    that rebuilds members less often than unseen images was pushed away from them, which names them as well)."""
    rebuilt = np.asarray(projection) < np.asarray(nearest_other)
    shares = share_test(rebuilt[is_member == 1], rebuilt[is_member == 0])
    return shares | {"leak": shares["p_value"] < ALPHA,
                     "direction": REVERSED if shares["members"] < shares["non_members"] else "members closer"}


def buffer_records(nearest_real: np.ndarray, is_member: np.ndarray, buffer_to_members: np.ndarray,
                   non_members_to_members: np.ndarray, rng: np.random.Generator, permutations: int = 2000) -> dict:
    """Distance to closest record: the share of synthetic images whose closest audited real image
    (`nearest_real`, an index into `is_member`) is a member; 0.5 when the buffer sits no closer to
    members than to equally many unseen images. Synthetic images are not independent trials (many can
    share one closest record; an untrained generator's all do), so the audited real images are the
    units: the p permutes their member labels (exchangeable when nothing leaks: the groups
    are size-matched and class-stratified), and the 95% interval is Clopper-Pearson over the distinct
    closest records, each counted once at the share of its synthetic images it draws. Also the 5th
    percentile of buffer-to-member distances against the same percentile for unseen real images'
    distances to the members. The p is two-sided (a share far below 0.5, a buffer kept away from exactly the
    members, names them too): the permuted shares at least as far from their mean as the observed one."""
    nearest_real, is_member = np.asarray(nearest_real), np.asarray(is_member)
    share = float(is_member[nearest_real].mean())
    shuffled = np.array([rng.permutation(is_member)[nearest_real].mean() for _ in range(permutations)])
    records = len(np.unique(nearest_real))
    low, high = clopper_pearson(round(share * records), records)
    centre = shuffled.mean()
    return {"dcr_share": share, "dcr_ci_low": low, "dcr_ci_high": high, "dcr_records": records,
            "dcr_p_value": float((1 + (abs(shuffled - centre) >= abs(share - centre) - 1e-12).sum())
                                 / (1 + permutations)),
            "dcr_direction": REVERSED if share < 0.5 else "members closer",
            "p5_buffer_to_members": float(np.quantile(buffer_to_members, 0.05)),
            "p5_non_members_to_members": float(np.quantile(non_members_to_members, 0.05))}


ATTACKS = {"mia": "membership (training LPIPS)", "mia_l2": "membership (pixel L2)",
           "mia_independent": "membership (audit-only LPIPS)", "mia_calibrated": "calibrated membership",
           "mia_lira": "LiRA membership"}


def membership_attacks(summary: dict) -> dict[str, dict]:
    """Every membership reading of what the node releases, by name: the privacy generator's by projection (in each
    distance, calibrated by the reference, by the LiRA game where they ran) and the buffer's by each image's
    nearest buffer image (in the training LPIPS and in pixels)."""
    privacy = summary["generators"]["privacy"]
    found = {name: privacy[key] for key, name in ATTACKS.items() if key in privacy}
    buffer = summary["buffer"]
    return found | {f"buffer {name}": buffer[key] for key, name in ATTACKS.items() if key in buffer}
