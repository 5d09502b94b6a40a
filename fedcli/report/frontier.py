"""Privacy against utility over every way a federation shares data: the generators' settings (FedER's privacy loss at
each alpha and form, DP at each epsilon, none) scored by the generator audit, and the shared latents, activations
and gradients scored by the reconstruction attacks (audit/shared_attacks.py); and the regime they were run in
(`[regime]`, audit/regime.py). Membership and reconstruction are reported apart: their units differ.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pandas as pd

from fedcli.audit import effects
from fedcli.experiment.plotting import pyplot
from fedcli.report.classifier_membership import classifier_rows, low_fpr_cell
from fedcli.report.collect import SEED_KEY, Stat, SubExperiment, distinct_attacks, load_json
from fedcli.report.figures import save
from fedcli.report.table import Built, Missing, ReportTable, interval, nodes_of, performance_cells

TITLE = "Privacy against utility: what each method's shared data reveals, and what it buys"


def generator_setting(sub: SubExperiment) -> tuple[str, str, float, str] | None:
    """(curve, label, place on the curve, the place's name) of a sub-experiment's generators: FedER's privacy loss
    of one form at its alpha, DP at its epsilon, or none; a VQ-VAE-2's decoded codes or prior samples; None when its
    nodes' generators differ or it has none."""
    settings = {(g["config"].get("generator", "stylegan2"), g["config"].get("alpha"), g["config"].get("privacy_loss"),
                 g["config"].get("dp_epsilon"), g["config"].get("prior_iterations")) for g in sub.gans}
    if len(settings) != 1:
        return None
    kind, alpha, loss, epsilon, prior = settings.pop()
    place = f"epsilon {float(epsilon):g}" if epsilon not in (None, "off") else None
    if kind == "vqvae2":  # named by what it releases (under DP, prior samples only)
        what = "prior samples" if prior else "decoded codes"
        if place:
            return "VQ-VAE-2 DP", f"VQ-VAE-2 DP {place}: {what}", float(epsilon), place
        return f"VQ-VAE-2 {what}", f"VQ-VAE-2: {what}", 0.0, what
    prefix = "" if kind == "stylegan2" else f"{kind} "
    if place:
        return f"{prefix}DP", f"{prefix}DP {place}", float(epsilon), place
    if not alpha:
        return f"{prefix}no privacy loss", f"{prefix}no privacy loss (alpha 0)", 0.0, "alpha 0"
    return f"{prefix}FedER {loss}", f"{prefix}FedER alpha {alpha:g} ({loss})", float(alpha), f"alpha {alpha:g}"


def own_control(audit: dict) -> float | None:
    """The membership AUROC of the audit's own alpha-0 control; None for a DP generator (its own control, no
    phase 2) and a VQ-VAE-2 (none)."""
    if "dp" in audit or "control" not in audit["generators"]:
        return None
    return audit["generators"]["control"]["mia"]["auroc"]


def regime_controls(subs: list[SubExperiment]) -> dict[tuple, float]:
    """The alpha-0 control's membership AUROC per (seed, node), where every audit of that seed and node that
    projected one agrees on it: the regime's unprotected generator, which a DP generator is compared with."""
    found: dict[tuple, set[float]] = defaultdict(set)
    for sub in subs:
        for a in sub.audits:
            if (control := own_control(a)) is not None:
                found[(sub.point.get(SEED_KEY), a["node"])].add(control)
    return {key: values.pop() for key, values in found.items() if len(values) == 1}


def below_control(reps: list[SubExperiment], controls: dict[tuple, float]) -> str:
    """Released minus control membership AUROC, paired by seed and node (an audit's own control, else the
    regime's), with its 95% t-interval and the pairs dropped for want of a control (a DP generator whose seed and
    node have no agreed regime control); '-' for a VQ-VAE-2, whose attack (the nearest buffer image) is not the
    control's (latent projection)."""
    differences, dropped = [], 0
    for s in reps:
        for a in s.audits:
            if a.get("attack") != "latent projection":
                continue
            control = own_control(a)
            if control is None:
                control = controls.get((s.point.get(SEED_KEY), a["node"]))
            if control is None:
                dropped += 1
            else:
                differences.append(a["generators"]["privacy"]["mia"]["auroc"] - control)
    return interval(differences) + (f" ({dropped} pair{'s' * (dropped != 1)} dropped: no control)" if dropped else "")


def strongest(audit: dict) -> tuple[float, str]:
    """The strongest membership attack on what a node released (the better direction's AUROC) and its name, with
    "reversed" where members sat further than non-members (read off the AUROC, so that summaries from before
    two-sided readings are read alike)."""
    def strength(mia: dict) -> float:
        return max(mia["auroc"], 1 - mia["auroc"])

    name, mia = max(effects.membership_attacks(audit).items(), key=lambda item: strength(item[1]))
    return strength(mia), f"{name}{', reversed' if mia['auroc'] < 0.5 else ''}"


def leaking(audit: dict) -> bool:
    """Whether any membership attack's 95% interval on what a node released excludes 0.5, on either side."""
    return any(effects.excludes_chance(mia) for mia in effects.membership_attacks(audit).values()
               if "auroc_ci_low" in mia)


def lira_cells(audits: list[dict]) -> dict[str, object]:
    """The LiRA game's columns (training LPIPS statistic, the released generator the target): the target's AUROC,
    TPR at the lowest FPR its trials resolve (with n), and the empirical epsilon lower bound; '-' without a game."""
    games = [a["lira"]["privacy"]["lpips"] for a in audits if "lira" in a]
    if not games:
        return {"LiRA AUROC": "-", "LiRA TPR at low FPR": "-", "empirical epsilon": "-"}
    return {"LiRA AUROC": Stat.of([g["target"]["auroc"] for g in games]), "LiRA TPR at low FPR": low_fpr_cell(games),
            "empirical epsilon": Stat.of([g["empirical_epsilon"]["epsilon_lower_bound"] for g in games])}


def by_setting(subs: list[SubExperiment]) -> dict[tuple[str, str, float, str], list[SubExperiment]]:
    """The audited sub-experiments by generator setting (generator_setting), each curve's settings together and
    along the curve (sub-experiments come sorted by name: alpha-16 before alpha-4)."""
    groups: dict[tuple[str, str, float, str], list[SubExperiment]] = defaultdict(list)
    for sub in subs:
        if sub.audits and (setting := generator_setting(sub)) is not None:
            groups[setting].append(sub)
    curves = list(dict.fromkeys(setting[0] for setting in groups))
    return {setting: groups[setting] for setting in sorted(groups, key=lambda s: (curves.index(s[0]), s[2]))}


def generator_rows(subs: list[SubExperiment], metric: str) -> dict[str, dict]:
    controls = regime_controls(subs)
    nodes = nodes_of(subs)
    rows = {}
    for (_, label, _, _), reps in by_setting(subs).items():
        audits = [a for s in reps for a in s.audits]
        controlled = all(own_control(a) is not None for a in audits)
        verdicts = [a["privacy_effect"]["verdict"] for a in audits if "privacy_effect" in a]
        leaks = [leaking(a) for a in audits]
        found = [strongest(a) for a in audits]
        names = sorted(set(name for _, name in found))
        dp = [a["dp"]["epsilon"] for a in audits if "epsilon" in a.get("dp", {})]
        rows[label] = {
            "membership AUROC": Stat.of([a["generators"]["privacy"]["mia"]["auroc"] for a in audits]),
            "strongest attack (AUROC, better direction)": f"{Stat.of([v for v, _ in found])} ({'; '.join(names)})",
            "calibrated AUROC": Stat.of([a["generators"]["privacy"]["mia_calibrated"]["auroc"] for a in audits
                                         if "mia_calibrated" in a["generators"]["privacy"]]),
            "buffer membership AUROC": Stat.of([a["buffer"]["mia"]["auroc"] for a in audits if "mia" in a["buffer"]]),
            "control AUROC": Stat.of([a["generators"]["control"]["mia"]["auroc"] for a in audits])
            if controlled else "-",
            "paired effect": Stat.of([a["privacy_effect"]["median_ratio"] for a in audits if "privacy_effect" in a])
            if controlled else "-",
            "effect significant": f"{verdicts.count('significant')}/{len(verdicts)}" if controlled else "-",
            "minus control, paired [95%]": below_control(reps, controls),
            "still leaking": f"{sum(leaks)}/{len(leaks)}",
            **lira_cells(audits), "DP epsilon": Stat.of(dp) if dp else "-",
            "members rebuilt": Stat.of([a["generators"]["privacy"]["reconstruction_share"]["members"] for a in audits]),
            "buffer closest records: members": Stat.of([a["buffer"]["dcr_share"] for a in audits]),
            "reconstructed by attack": "-", "by chance (decoys)": "-", "attack PSNR (dB)": "-",
            "fidelity ratio": Stat.of([(g.get("fidelity") or {}).get("ratio") for s in reps for g in s.gans]),
            metric: performance_cells(reps, "feder", metric, nodes)["mean"],
        }
    return rows


def attack_rows(subs: list[SubExperiment], metric: str) -> dict[str, dict]:
    measured = distinct_attacks(subs)
    pooled: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for _, strategy, summary in measured:
        for row in summary["attacks"]:
            pooled[(strategy, row["attack"], row["batch"])].append(row)
    nodes = nodes_of(subs)
    rows = {}
    for (strategy, attack, batch), found in pooled.items():
        label = f"{strategy}: {attack}" + (f" (batch {batch})" if attack in ("gradient", "round update") else "")
        rows[label] = {"membership AUROC": "-", "calibrated AUROC": "-", "buffer membership AUROC": "-",
                       "control AUROC": "-", "paired effect": "-",
                       "effect significant": "-", "minus control, paired [95%]": "-", "still leaking": "-",
                       "members rebuilt": "-", "buffer closest records: members": "-",
                       "reconstructed by attack": Stat.of([r["reconstructed"]["ssim"]["share"] for r in found]),
                       "by chance (decoys)": Stat.of([r["chance"]["ssim"]["share"] for r in found if "chance" in r]),
                       "attack PSNR (dB)": Stat.of([r["psnr_mean"] for r in found]), "fidelity ratio": "-",
                       metric: performance_cells([s for s, name, _ in measured if name == strategy], strategy,
                                                 metric, nodes)["mean"]}
    return rows


def frontier_table(subs: list[SubExperiment], metric: str) -> Built:
    generators, attacks = generator_rows(subs, metric), attack_rows(subs, metric)
    if len(generators) + len(attacks) < 2:
        return Missing(TITLE, "several generator privacy settings, or audit-privacy --shared on federations that "
                       "share latents, activations or models (recipes/privacy-frontier.toml)")
    frame = pd.DataFrame({**generators, **attacks, **classifier_rows(subs, metric)}).T.fillna("-")
    return ReportTable("privacy_frontier", TITLE, frame,
                       "mean ± std over nodes and seeds. Membership (generators): the GAN-Leaks attack's AUROC on the "
                       "released generator (calibrated by a reference GAN without the members where train-gan "
                       "--reference made one; for a VQ-VAE-2, which has no latent to project, each image's distance "
                       "to its nearest buffer image), the same nearest-buffer-image attack on every method's buffer "
                       "(buffer membership), and on its alpha-0 control (0.5 = no leak), the paired effect (median "
                       "per-member ratio of the released generator's projection distance to the control's, > 1 = "
                       "pushed away) and on how many nodes it is significant (and above the non-members'); the "
                       "released minus the control's membership AUROC, paired by seed and node (a DP generator "
                       "against the alpha-0 control of its seed and node), with the 95% t-interval over the pairs; "
                       "the strongest of every membership attack on the released generator and buffer (projection "
                       "distance in the training LPIPS, in pixels and in an audit-only LPIPS network, calibrated, LiRA; "
                       "the buffer's nearest image in LPIPS and pixels) as the AUROC of the better direction, named, "
                       "'reversed' where members sat further than non-members; on how many nodes any of them has a "
                       "95% interval excluding 0.5, on either side (still leaking); where train-gan "
                       "--lira-references ran, the LiRA game (training LPIPS statistic): the released generator's "
                       "AUROC, TPR at the lowest FPR its trials resolve (n OUT trials, every model in turn the target) "
                       "and the empirical epsilon lower bound (95% Clopper-Pearson, threshold chosen on half the "
                       "images) beside the accountant's DP epsilon. "
                       "Reconstruction: members rebuilt by projection closer than their nearest other real image; "
                       "the buffer's closest records that are members (0.5 = chance); for shared latents, activations "
                       "and gradients, the white-box attack's images closer (SSIM) to their own original than to any "
                       "other real image, the share as many real images of other patients reach so when matched to "
                       "the batch as the reconstructions are (chance), and their PSNR. Membership of the shared "
                       "classifiers (audit-privacy --shared): the loss-threshold attack's AUROC on each node's "
                       "members and non-members under the strategy's last-round models, and with "
                       "--classifier-references the LiRA game against per-node reference classifiers trained "
                       f"locally (a lower bound on what better references would find). {metric}: FedER's with that "
                       "generator's buffer, or the sharing strategy's own, on each node's test set at the final round",
                       rows_are="method")


def frontier_figure(subs: list[SubExperiment], metric: str, path: Path) -> bool:
    """Two panels, y = the method's federated score: membership AUROC of the released generator (left) and the
    share of images reconstructed (right: by projection for generators, by the attack for shared data); each
    generator curve (an alpha series of one form, DP's epsilons) joined in its own order."""
    generators, attacks = generator_rows(subs, metric), attack_rows(subs, metric)
    if len(generators) + len(attacks) < 2:
        return False
    curves: dict[str, dict[str, str]] = defaultdict(dict)  # curve -> its labels along it -> each place's name
    for curve, label, _, place in by_setting(subs):
        curves[curve][label] = place
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis in (left, right):  # up to 18 series (more than one 10-colour cycle), no two alike
        axis.set_prop_cycle(color=[*plt.get_cmap("tab10").colors, *plt.get_cmap("Dark2").colors])
    for curve, places in curves.items():
        labels = list(places)
        for axis, column in ((left, "membership AUROC"), (right, "members rebuilt")):
            xs, ys = ([generators[label][c] for label in labels] for c in (column, metric))
            axis.errorbar([x.mean for x in xs], [y.mean for y in ys], xerr=[x.std for x in xs],
                          yerr=[y.std for y in ys], marker="o", capsize=3, label=curve)
            for label, x, y in zip(labels, xs, ys):
                axis.annotate(places[label], (x.mean, y.mean), fontsize=6, xytext=(3, 3), textcoords="offset points")
    for label, row in attacks.items():
        x, y = row["reconstructed by attack"], row[metric]
        right.errorbar([x.mean], [y.mean], xerr=[x.std], yerr=[y.std], marker="s", capsize=3, label=label)
    left.axvline(0.5, color="grey", linewidth=0.8, linestyle=":")
    left.set_xlabel("membership AUROC of the released generator\n(0.5 = no leak; VQ-VAE-2: of its buffer)")
    right.set_xlabel("share of images reconstructed\n(closer to their own than to any other)")
    left.set_ylabel(f"federated {metric}")
    for axis, title in ((left, "Membership"), (right, "Reconstruction")):
        axis.set_title(title)
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    save(fig, path)
    return True


def regime_table(exp: Path) -> ReportTable:
    """The [regime] sweep: each setting tried, each node's control membership AUROC with its interval, and the
    choice the rule made (or that none leaked)."""
    regime = load_json(Path(exp) / "regime" / "regime.json")
    rows = {}
    for setting in regime["settings"]:
        for reading in setting["readings"]:
            rows[f"{setting['name']}, {reading['node']}"] = {
                "members": reading["members"], "control AUROC": f"{reading['auroc']:.3f}",
                "95% interval": f"[{reading['ci_low']:.3f}, {reading['ci_high']:.3f}]",
                "setting meets the rule": "yes" if setting["met"] else "no"}
    return ReportTable("regime", "Regime: where the unprotected generator leaks", pd.DataFrame(rows).T,
                       f"rule, fixed before the sweep: {regime['rule']}. {regime['said']}.",
                       rows_are="setting and node")
