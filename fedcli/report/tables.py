"""Rich tables printed at the end of a stage."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.base import ENSEMBLE
from fedcli.report.collect import decoded_fidelity


def gan_table(summaries: list[dict]) -> Table:
    """Per node: FID of both phases (with the feature space's name), the kept snapshot's iteration of
    those run, why each phase stopped, the buffer, and its fidelity ratio (released buffer; standard
    generator's as `ratio 1`, the control's as `ratio ctrl`), class fidelity and the released buffer's
    flags (generators/fidelity.py shortfalls)."""
    fid_name = summaries[0]["metric_names"]["fid"] if summaries else "fid"
    uncalibrated = summaries and not summaries[0]["fid"]["calibrated"]
    table = Table(title="train-gan", caption="uncalibrated: fallback feature network (no ImageNet weights)"
                  if uncalibrated else None)
    rule = summaries[0]["phase1"].get("select") if summaries else None
    table.title = escape(f"train-gan ({fid_name}" + (f"; phase-1 snapshot: {rule})" if rule else ")"))
    columns = ["node", "images", "FID 1", "kept 1", "stop 1", "FID 2", "kept 2", "stop 2", "buffer"]
    scored = any(s.get("fidelity") for s in summaries)
    private = any(s.get("dp") for s in summaries)
    for column in columns + (["ratio", "ratio 1", "ratio ctrl", "class fid", "flags"] if scored else []) + \
            (DP_COLUMNS if private else []):
        table.add_column(column, justify="left" if column in ("node", "stop 1", "stop 2", "flags") else "right")
    for s in summaries:
        p1, p2, f = s["phase1"], s["phase2"], s.get("fidelity")
        cells = [s["node"], str(s["train_images"]), f"{p1['fid']:.4g}", phase1_kept(p1), p1["stopped"],
                 f"{p2['fid']:.4g}", f"{p2['kept_iteration']}/{p2['iterations']}", phase2_stop(p2),
                 str(s["buffer"]["size"])]
        if scored:
            control = f"{f['control']['ratio']:.3f}" if f and "control" in f else "-"
            cells += [f"{f['ratio']:.3f}", f"{f['phase1']['ratio']:.3f}", control, f"{f['class_fidelity']:.3f}",
                      ", ".join(f.get("flags", [])) or "-"] if f else ["-"] * 5
        if private:
            cells += dp_cells(s.get("dp"))
        table.add_row(*cells)
    return table


DP_COLUMNS = ["epsilon", "delta", "sigma"]


def dp_cells(dp: dict | None) -> list[str]:
    return [f"{dp['epsilon']:.3g}", f"{dp['delta']:.2g}", f"{dp['noise_multiplier']:.3g}"] if dp else ["-"] * 3


def vqvae2_table(summaries: list[dict]) -> Table:
    """Per node: its place in the serial chain, the bytes it received, its codes (usage, the final decoder's
    reconstruction error; not summarised under DP) and its buffer, with the fidelity of the buffer and of the
    decoded codes when scored, and the DP guarantee when trained under one."""
    scored = any(s.get("fidelity") for s in summaries)
    private = any(s.get("dp") for s in summaries)
    table = Table(title="train-gan (vqvae2, serial)")
    columns = ["node", "images", "position", "received", "perplexity top", "perplexity bottom", "recon MSE", "buffer"]
    for column in columns + (["ratio", "ratio decoded"] if scored else []) + (DP_COLUMNS if private else []):
        table.add_column(column, justify="left" if column in ("node", "buffer") else "right")
    for s in summaries:
        codes, f = s.get("codes"), s.get("fidelity")
        cells = [s["node"], str(s["train_images"]), str(s["serial"]["position"]),
                 f"{s['serial']['bytes_received'] / 1e6:.2f} MB",
                 *([f"{codes['perplexity_top']:.1f}", f"{codes['perplexity_bottom']:.1f}",
                    f"{codes['reconstruction_mse']:.4f}"] if codes else ["-"] * 3),
                 f"{s['buffer']['size']} {s['buffer_kind']}"]
        if scored:
            decoded = decoded_fidelity(s)
            cells += [f"{f['ratio']:.3f}" if f else "-", f"{decoded['ratio']:.3f}" if decoded else "-"]
        if private:
            cells += dp_cells(s.get("dp"))
        table.add_row(*cells)
    return table


def phase1_kept(phase1: dict) -> str:
    """The kept snapshot's iteration of those run."""
    return f"{phase1.get('best_iteration', '?')}/{phase1['iterations']}"


def phase2_stop(phase2: dict) -> str:
    """Why phase 2 ended; when the FID factor ended it before any snapshot, the privacy generator is
    the standard one, and the cell says so."""
    if phase2["stopped"] == "fid-factor" and phase2["kept_iteration"] == 0:
        return "fid-factor: = standard"
    return phase2["stopped"]


def final_round(rows: list[dict]) -> list[dict]:
    last = max(r["round"] for r in rows)
    return [r for r in rows if r["round"] == last]


def own_model_row(rows: list[dict], node: str) -> dict | None:
    """The model a node ends up with, on its own test set: its own model, or the shared one."""
    for r in rows:
        if r["test_node"] == node and (r["model_node"] == node or r["model_node"] in REGISTRY.shared_model_keys()):
            return r
    return None


def with_ci(row: dict, metric: str) -> str:
    return f"{row[metric]:.3f} [{row[metric + '_lo']:.2f}, {row[metric + '_hi']:.2f}]"


def node_performance_table(runs, nodes: list[str], metric: str = "accuracy") -> Table:
    """Each node's model on its own test set (final round), with bootstrap 95% intervals."""
    table = Table(title=f"node performance ({metric}, final round, 95% bootstrap CI)")
    for column in ("strategy", *nodes, "mean"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for run in runs:
        rows = final_round(run.rows)
        cells = [own_model_row(rows, node) for node in nodes]
        values = [c[metric] for c in cells if c is not None]
        table.add_row(run.strategy, *(with_ci(c, metric) if c else "-" for c in cells),
                      f"{sum(values) / len(values):.3f}" if values else "-")
    return table


def node_convergence_table(runs, nodes: list[str], metric: str = "accuracy") -> Table:
    """For each test set: mean and sample std over the node models (one shared model: its value)."""
    import numpy as np

    table = Table(title=f"node convergence ({metric} on each test set: mean ± std over node models)")
    for column in ("strategy", *nodes):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for run in runs:
        rows = final_round(run.rows)
        cells = []
        for node in nodes:
            values = [r[metric] for r in rows if r["test_node"] == node and r["model_node"] in nodes]
            if not values:
                values = [r[metric] for r in rows if r["test_node"] == node and r["model_node"] in REGISTRY.shared_model_keys()]
            std = np.std(values, ddof=1) if len(values) > 1 else 0.0
            cells.append(f"{np.mean(values):.3f} ± {std:.3f}")
        table.add_row(run.strategy, *cells)
    return table


def ensemble_table(runs, nodes: list[str], metric: str = "accuracy") -> Table | None:
    """Ensemble of node models (mean softmax) on each test set, next to the mean single model."""
    table = Table(title=f"single node model vs ensemble ({metric}, final round)")
    for column in ("strategy", "single (mean)", "ensemble (mean)", *nodes):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    shown = False
    for run in runs:
        rows = final_round(run.rows)
        ensemble = {r["test_node"]: r[metric] for r in rows if r["model_node"] == ENSEMBLE}
        if not ensemble:
            continue
        single = [r[metric] for r in rows if r["model_node"] in nodes]
        table.add_row(run.strategy, f"{sum(single) / len(single):.3f}",
                      f"{sum(ensemble.values()) / len(ensemble):.3f}", *(f"{ensemble[n]:.3f}" for n in nodes))
        shown = True
    return table if shown else None


def cv_table(runs, nodes: list[str], metric: str = "accuracy") -> Table:
    """Cross-validation: each node's own model on its validation fold, mean ± std over folds."""
    import numpy as np

    table = Table(title=f"cross-validation ({metric} on the held-out train fold, mean ± std over folds)",
                  caption="the GAN buffers were trained on every train fold, so they have seen each validation fold")
    for column in ("strategy", *nodes, "mean"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for strategy in dict.fromkeys(r.strategy for r in runs):
        per_fold = []
        for run in (r for r in runs if r.strategy == strategy):
            rows = final_round(run.rows)
            per_fold.append([own_model_row(rows, node)[metric] for node in nodes])
        values = np.array(per_fold)
        std = lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0  # noqa: E731
        table.add_row(strategy, *(f"{values[:, i].mean():.3f} ± {std(values[:, i]):.3f}" for i in range(len(nodes))),
                      f"{values.mean(axis=1).mean():.3f} ± {std(values.mean(axis=1)):.3f}")
    return table


def audit_table(summaries: list[dict]) -> Table:
    """Per node: members' projection LPIPS under the control and privacy generators with their paired
    effect, membership AUROC, reconstruction and buffer shares, and the verdict."""
    network = summaries[0]["lpips_network"] if summaries else "lpips"
    table = Table(title=escape(f"privacy audit (projection LPIPS[{network}] of members; effect = median privacy/"
                               "control ratio per image; membership AUROC, 0.5 = no leak)"))
    for column in ("node", "images/group", "LPIPS ctrl", "LPIPS priv", "effect", "AUROC ctrl", "AUROC priv",
                   "rebuilt m/nm", "buffer share", "verdict"):
        table.add_column(column, justify="left" if column in ("node", "effect", "verdict") else "right")
    for s in summaries:
        priv, rebuilt = s["generators"]["privacy"], s["generators"]["privacy"]["reconstruction_share"]
        ctrl, effect = s["generators"].get("control"), s.get("privacy_effect")  # a VQ-VAE-2's buffer has neither
        table.add_row(s["node"], str(s["members"]), f"{ctrl['member_lpips_mean']:.4f}" if ctrl else "-",
                      f"{priv['member_lpips_mean']:.4f}",
                      f"{effect['median_ratio']:.3f} {effect['verdict']}" if effect else "-",
                      f"{ctrl['mia']['auroc']:.3f}" if ctrl else "-", f"{priv['mia']['auroc']:.3f}",
                      f"{rebuilt['members']:.2f}/{rebuilt['non_members']:.2f}", f"{s['buffer']['dcr_share']:.3f}",
                      s["verdict"]["result"])
    return table


def attacks_table(attacked: dict[str, dict]) -> Table:
    """Per strategy, node and attack: the reconstructions' mean PSNR, SSIM and LPIPS against their originals (and
    against the nearest other real image), and the share closer to their own patient than to anyone else."""
    table = Table(title="reconstruction attacks on what each federation shared (white box; mean over images; "
                        "reconstructed = closer to its own image than to every other; chance = as many real images "
                        "of other patients, matched as the reconstructions are)")
    for column in ("strategy", "node", "attack", "batch", "PSNR (other)", "SSIM (other)", "LPIPS (other)",
                   "reconstructed [SSIM]", "chance"):
        table.add_column(column, justify="left" if column in ("strategy", "node", "attack") else "right")
    for strategy, summary in attacked.items():
        for r in summary["attacks"]:
            share = r["reconstructed"]["ssim"]
            table.add_row(strategy, r["node"], r["attack"], str(r["batch"]),
                          *(f"{r[f'{s}_mean']:.{d}f} ({r[f'{s}_nearest_other_mean']:.{d}f})"
                            for s, d in (("psnr", 1), ("ssim", 3), ("lpips", 3))),
                          f"{share['share']:.2f} [{share['ci_low']:.2f}-{share['ci_high']:.2f}]",
                          f"{r['chance']['ssim']['share']:.2f}")
    return table


def audit_phase2_note(summary: dict) -> str:
    """Why the privacy generator is the standard one, where it is."""
    if "dp" in summary and summary.get("attack") == "latent projection":  # a VQ-VAE-2 has no phase 2 at all
        return "; under DP no phase 2 runs: the released generator is the DP one, and the control is the same"
    if summary.get("phase2_kept_iteration") == 0:
        return ("; phase 2 kept no privacy snapshot (its first FID check exceeded the limit), so the privacy "
                "generator is the standard one")
    return ""


def audit_node_lines(s: dict) -> list[str]:
    """What audit-privacy prints of one node's summary: its verdict and privacy effect, its DP guarantee against the
    attack, and its controls (rich markup)."""
    lines = []
    verdict, effect = s["verdict"], s.get("privacy_effect")
    colour = {"pass": "green", "fail": "red"}.get(verdict["result"], "yellow")
    reasons = f" ({'; '.join(verdict['reasons'])})" if verdict["reasons"] else ""
    compared = (f"privacy effect vs control: {effect['verdict']} (median ratio {effect['median_ratio']:.3f}, 95% "
                f"CI {effect['ci_low']:.3f}-{effect['ci_high']:.3f}, p = {effect['p_value']:.2g}; pixel "
                f"{effect['pixel']['verdict']}, independent network {effect['independent']['verdict']})"
                if effect else "attacked through its buffer alone (no latent to project, no control)")
    lines.append(f"node {s['node']}: [{colour}]{verdict['result']}[/{colour}]{reasons}; {compared}"
                 + audit_phase2_note(s))
    if "dp" in s:
        dp = s["dp"]
        check = dp["audit_bound"]
        bound = ("holds" if check["holds"] else "[red]does NOT hold: check the DP training[/red]") + (
            "" if check["informative"] else f" but says nothing: at the FPRs {check['non_members']} non-members "
            "resolve, e^epsilon x FPR + delta is at least 1")
        lines.append(f"node {s['node']}: (epsilon {dp['epsilon']:.3g}, delta {dp['delta']:.2g})-DP per "
                     f"training image for the generator and buffer ({dp['accountant']}); the attack's TPR "
                     f"<= e^epsilon x FPR + delta {bound}")
    for name, control in s.get("controls", {}).items():
        mark = "[green]holds[/green]" if control["holds"] else "[red]does not hold[/red]"
        lines.append(f"node {s['node']} control {name}: expected {control['expected']}, "
                     f"{control['observed']}: {mark}")
    return lines
