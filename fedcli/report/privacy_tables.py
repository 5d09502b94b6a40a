"""The privacy audit's tables: each node's membership, reconstruction and buffer readings, the DP bound against the
attack, and the controls whose answer is known."""

from __future__ import annotations

import pandas as pd

from fedcli.report.collect import Stat, SubExperiment
from fedcli.report.table import Built, Missing, ReportTable


def privacy_table(subs: list[SubExperiment]) -> Built:
    title = "Privacy summary per node: privacy-preserving GAN vs its control"
    audits = [a for s in subs for a in s.audits]
    if not audits:
        return Missing(title, "fedcli audit-privacy")
    rows = {}
    for node in dict.fromkeys(a["node"] for a in audits):
        mine = [a for a in audits if a["node"] == node]
        generators = {name: [a["generators"][name] for a in mine if name in a["generators"]]
                      for name in ("standard", "control", "privacy")}
        effects = [a["privacy_effect"] for a in mine if "privacy_effect" in a]  # a VQ-VAE-2 has no control
        rows[node] = {
            "LPIPS ctrl": Stat.of([g["member_lpips_mean"] for g in generators["control"]]),
            "LPIPS priv": Stat.of([g["member_lpips_mean"] for g in generators["privacy"]]),
            "effect": Stat.of([e["median_ratio"] for e in effects]),
            "effect p": ", ".join(f"{e['p_value']:.2g}" for e in effects),
            "effect pixel / independent": ", ".join(f"{e['pixel']['median_ratio']:.3f} / "
                                                    f"{e['independent']['median_ratio']:.3f}" for e in effects),
            "privacy effect": ", ".join(sorted({e["verdict"] for e in effects})),
            **({"AUROC std": Stat.of([g["mia"]["auroc"] for g in generators["standard"]])}
               if generators["standard"] else {}),  # audit-privacy --standard
            "AUROC ctrl": Stat.of([g["mia"]["auroc"] for g in generators["control"]]),
            "AUROC priv": Stat.of([g["mia"]["auroc"] for g in generators["privacy"]]),
            "TPR at lowest FPR": ", ".join(lowest_fpr_tpr(g["mia"].get("tpr_at_min_fpr"))
                                           for g in generators["privacy"]),
            "rebuilt members / non-members": ", ".join(
                f"{g['reconstruction_share']['members']:.2f} / {g['reconstruction_share']['non_members']:.2f}"
                for g in generators["privacy"]),
            "buffer member share": Stat.of([a["buffer"]["dcr_share"] for a in mine]),
            "verdict": ", ".join(sorted({a["verdict"]["result"] for a in mine})),
        }
        calibrated = [g["mia_calibrated"]["auroc"] for g in generators["privacy"] if "mia_calibrated" in g]
        if calibrated:
            rows[node]["AUROC priv calibrated"] = Stat.of(calibrated)
        private = [a["dp"] for a in mine if "dp" in a]
        if private:  # train-gan --dp-epsilon: the guarantee, and whether the attack stayed within it
            rows[node]["DP epsilon"] = Stat.of([d["epsilon"] for d in private])
            rows[node]["TPR within e^eps FPR + delta"] = ", ".join(
                dict.fromkeys(bound_reading(d["audit_bound"]) for d in private))
    network = audits[0].get("lpips_network", "lpips")
    reasons = "; ".join(f"{a['node']}: {a['verdict']['result']} ({', '.join(a['verdict']['reasons'])})"
                        for a in audits if a["verdict"].get("reasons"))
    return ReportTable("privacy_summary", title, pd.DataFrame(rows).T,
                       f"LPIPS[{network}] of the best latent projection of member (train) images (higher = the "
                       "generator cannot rebuild them), under the control (phase 2 at alpha 0, same iterations and "
                       "draws) and the privacy-preserving generator; effect = median over members of the per-image "
                       "privacy/control ratio, with its one-sided signed-rank p, in pixels and in an audit-only "
                       "LPIPS network; significant = p < 0.01, ratio >= 1.1 and members' ratios above the "
                       "non-members' (Mann-Whitney p < 0.01). "
                       "Membership AUROC from the distance (0.5 = no leak; std = the phase-1 generator, projected "
                       "with audit-privacy --standard), calibrated = GAN-Leaks-cal (distance minus the distance "
                       "under a reference GAN trained without the members; needs train-gan --reference); rebuilt = "
                       "share of images whose projection is closer than their nearest other real image; buffer "
                       "member share = share of synthetic images whose closest audited real image is a member "
                       "(0.5 = none); TPR at the lowest FPR the non-members resolve (10 / their number), with its "
                       "Clopper-Pearson interval. Empirical attack scores, not a formal privacy guarantee"
                       + ("; DP epsilon: the formal one of a DP generator and its buffer (train-gan --dp-epsilon; "
                          "FedER's travelling classifiers are not DP), with the sanity check that the attack's TPR "
                          "stays within e^epsilon x FPR + delta at every resolvable FPR."
                          if any("dp" in a for a in audits) else ".")
                       + (f" Verdict reasons: {reasons}." if reasons else ""), rows_are="node")


def bound_reading(bound: dict) -> str:
    """Whether an attack stayed within the DP bound, and where the bound could not have been broken (1 at every FPR
    the non-members resolve), that it says nothing; summaries before that reading say yes or NO alone."""
    said = "yes" if bound["holds"] else "NO"
    if bound.get("informative", True):
        return said
    return f"{said} (uninformative: bound 1 at every FPR {bound['non_members']} non-members resolve)"


def lowest_fpr_tpr(rate: dict | None) -> str:
    if not rate:
        return "none resolvable"
    return f"{rate['tpr']:.2f} at {rate['min_fpr']:.2g} [{rate['ci_low']:.2f}, {rate['ci_high']:.2f}]"


def controls_table(subs: list[SubExperiment]) -> Built:
    title = "Audit controls: generators whose answer is known"
    rows = {f"{a['node']} {name}": {"expected": c["expected"], "observed": c["observed"],
                                    "holds": "yes" if c["holds"] else "NO"}
            for s in subs for a in s.audits for name, c in a.get("controls", {}).items()}
    if not rows:
        return Missing(title, "fedcli train-gan --controls and fedcli audit-privacy --controls")
    return ReportTable("privacy_controls", title, pd.DataFrame(rows).T,
                       "Each control audited exactly as the node's own generators: memoriser = renders mixtures of "
                       "the audited members (must fail); data-free = an untrained generator (must not fail for "
                       "leakage); reseeded = the alpha-0 control against its twin from another random stream (privacy "
                       "effect must be none); tiny-node = a GAN trained as long on tens of the node's images, against "
                       "the standard generator on those images (its membership AUROC must be the higher)",
                       rows_are="node and control")
