"""Privacy against utility over every way a federation shares data: the generators' settings (FedER's privacy loss at
each alpha and form, DP at each epsilon, none) scored by the generator audit, and the shared latents, activations
and gradients scored by the reconstruction attacks (audit/shared_attacks.py); and the regime they were run in
(`[regime]`, audit/regime.py). Membership and reconstruction are reported apart: their units differ.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pandas as pd

from fedcli.plotting import pyplot
from fedcli.report.collect import SEED_KEY, Stat, SubExperiment, load_json
from fedcli.report.figures import save
from fedcli.report.study import Built, Missing, ReportTable, interval, nodes_of, performance_cells

CHANCE = 0.5  # membership AUROC of an attack that learns nothing
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
    regime's), with its 95% t-interval; '-' for a VQ-VAE-2, whose attack (the nearest buffer image) is not the
    control's (latent projection)."""
    differences = []
    for s in reps:
        for a in s.audits:
            control = own_control(a)
            if control is None:
                control = controls.get((s.point.get(SEED_KEY), a["node"]))
            if a.get("attack") == "latent projection" and control is not None:
                differences.append(a["generators"]["privacy"]["mia"]["auroc"] - control)
    return interval(differences)


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
        effects = [a["privacy_effect"]["verdict"] for a in audits if "privacy_effect" in a]
        # summaries from before the interval lack it
        bounds = [a["generators"]["privacy"]["mia"].get("auroc_ci_low") for a in audits]
        leaking = [low > CHANCE for low in bounds if low is not None]
        rows[label] = {
            "membership AUROC": Stat.of([a["generators"]["privacy"]["mia"]["auroc"] for a in audits]),
            "calibrated AUROC": Stat.of([a["generators"]["privacy"]["mia_calibrated"]["auroc"] for a in audits
                                         if "mia_calibrated" in a["generators"]["privacy"]]),
            "buffer membership AUROC": Stat.of([a["buffer"]["mia"]["auroc"] for a in audits if "mia" in a["buffer"]]),
            "control AUROC": Stat.of([a["generators"]["control"]["mia"]["auroc"] for a in audits])
            if controlled else "-",
            "paired effect": Stat.of([a["privacy_effect"]["median_ratio"] for a in audits if "privacy_effect" in a])
            if controlled else "-",
            "effect significant": f"{effects.count('significant')}/{len(effects)}" if controlled else "-",
            "minus control, paired [95%]": below_control(reps, controls),
            "still leaking": f"{sum(leaking)}/{len(leaking)}" if leaking else "-",
            "members rebuilt": Stat.of([a["generators"]["privacy"]["reconstruction_share"]["members"] for a in audits]),
            "buffer closest records: members": Stat.of([a["buffer"]["dcr_share"] for a in audits]),
            "reconstructed by attack": "-", "by chance (decoys)": "-", "attack PSNR (dB)": "-",
            "fidelity ratio": Stat.of([(g.get("fidelity") or {}).get("ratio") for s in reps for g in s.gans]),
            metric: performance_cells(reps, "feder", metric, nodes)["mean"],
        }
    return rows


def distinct_attacks(subs: list[SubExperiment]) -> list[tuple[SubExperiment, str, dict]]:
    """(sub-experiment, strategy, attack summary), each measurement once: a summary that repeats another bitwise is
    the same federation attacked again in another sub-experiment (fedcli is deterministic), not another sample."""
    seen, found = set(), []
    for sub in subs:
        for strategy, summary in sub.attacks.items():
            if (key := (strategy, json.dumps(summary, sort_keys=True))) not in seen:
                seen.add(key)
                found.append((sub, strategy, summary))
    return found


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
    frame = pd.DataFrame({**generators, **attacks}).T.fillna("-")
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
                       "on how many nodes the released membership AUROC's 95% lower bound is still above 0.5. "
                       "Reconstruction: members rebuilt by projection closer than their nearest other real image; "
                       "the buffer's closest records that are members (0.5 = chance); for shared latents, activations "
                       "and gradients, the white-box attack's images closer (SSIM) to their own original than to any "
                       "other real image, the share as many real images of other patients reach so when matched to "
                       f"the batch as the reconstructions are (chance), and their PSNR. {metric}: FedER's with that "
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
