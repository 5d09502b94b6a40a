"""The FedER study's tables, numbered as in the paper (Tables 1-8, the paired table, the BatchNorm reading), and its
alpha and DP sweeps, built from collected artifacts: each builder takes the replicates of one sweep group (or,
for the tables across a sweep, every sub-experiment) and the metrics.csv column to show."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from fedcli.comm.transport import EVERYONE
from fedcli.experiment.config import LOWER_IS_BETTER
from fedcli.federate.config import select_keys, varies_for
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.base import ENSEMBLE
from fedcli.report.collect import Stat, SubExperiment, by_dp_setting, dp_label, own_rows, own_scores, stylegan_subs
from fedcli.report.paired import paired_bootstrap_frame
from fedcli.report.privacy_tables import bound_reading, lowest_fpr_tpr
from fedcli.report.table import (BASELINES, CONVERGENCE, FEDERATED, MB, VARIANTS, Built, Missing, ReportTable,
                                 convergence_values, distinct, interval, nodes_of, performance_cells, performance_table,
                                 strategies_in)


def table2(subs: list[SubExperiment], metric: str) -> Built:
    title = "Table 2. Node performance: FedER vs standalone and centralized training"
    present = strategies_in(subs, BASELINES)
    if "feder" not in present or len(present) < 2:
        return Missing(title, "federate --strategy feder with standalone and/or central, central-synthetic, "
                       "central-mixed")
    return performance_table("table2_node_performance", title, subs, present, metric,
                             note=f"{metric} of each node's final model on its own test set; mean = per-task mean")


def table3(subs: list[SubExperiment], metric: str) -> Built:
    title = "Table 3. Node convergence: every node model on each node's test set"
    present = strategies_in(subs, CONVERGENCE)
    nodes = nodes_of(subs)
    if "feder" not in present:
        return Missing(title, "federate --strategy feder (and standalone to compare)")
    rows = {}
    for name in present:
        pooled = convergence_values(subs, name, metric, nodes)
        if any(pooled.values()):
            rows[name] = {node: Stat.of(pooled[node]) for node in nodes}
    if "feder" not in rows:
        return Missing(title, "every node model on every test set: the in-process engine, or --engine distributed "
                       "with --cross-eval")
    return ReportTable("table3_node_convergence", title, pd.DataFrame(rows).T,
                       f"{metric} on each test set: mean ± std over the node models (a small std = the nodes' "
                       "models agree)")


def table4(subs: list[SubExperiment], metric: str) -> Built:
    title = "Table 4. FedER vs the federated baselines"
    present = strategies_in(subs, FEDERATED)
    if "feder" not in present or len(present) < 2:
        return Missing(title, "federate --strategy feder with fedavg, fedprox, fedbn, fedadam, fedyogi, fedadagrad "
                       "and/or scaffold")
    return performance_table("table4_federated", title, subs, present, metric, mark_best=True,
                             note=f"{metric} of each node's final model on its own test set; best per column in bold")


def table4_paired(subs: list[SubExperiment], metric: str) -> Built:
    title = "Table 4, paired. Each federated baseline minus FedER, on the same bootstrap resamples"
    frame = paired_bootstrap_frame(subs, strategies_in(subs, FEDERATED), metric)
    if frame is None:
        return Missing(title, "federate --strategy feder with a federated baseline, each run with its test-set "
                       "predictions (predictions.safetensors, written since issue 17)")
    direction = "lower is better" if metric == "ece" else "negative: FedER is better"
    return ReportTable("table4_paired_bootstrap", title, frame,
                       f"{metric} of the strategy minus FedER's, each node's final model on its own test set (mean: "
                       "over nodes), on the whole test set, with the 95% percentile interval of the same difference "
                       f"over the bootstrap resamples both strategies were scored on ({direction}); with several "
                       "seeds, each resample's difference is averaged over them")


def table5(subs: list[SubExperiment], metric: str) -> Built:
    title = "Table 5. Single node model vs ensemble of node models"
    nodes = nodes_of(subs)
    rows = {}
    for name in dict.fromkeys(r.strategy for s in subs for r in s.runs):
        singles: dict[str, list[float]] = defaultdict(list)
        ensembles: dict[str, list[float]] = defaultdict(list)
        for s in subs:
            run = s.run(name)
            if run is None:
                continue
            last = run.metrics[run.metrics["round"] == run.metrics["round"].max()]
            for node in nodes:
                at = last[last.test_node == node]
                singles[node] += at[at.model_node.isin(nodes)][metric].astype(float).tolist()
                ensembles[node] += at[at.model_node == ENSEMBLE][metric].astype(float).tolist()
        if not any(ensembles.values()):
            continue
        row = {}
        for node in nodes:
            row[f"{node} single"] = Stat.of(singles[node])
            row[f"{node} ensemble"] = Stat.of(ensembles[node])
        row["mean single"] = Stat.of([v for node in nodes for v in singles[node]])
        row["mean ensemble"] = Stat.of([v for node in nodes for v in ensembles[node]])
        rows[name] = row
    if not rows:
        return Missing(title, "a strategy with one model per node (feder, standalone, fedbn, ...)")
    return ReportTable("table5_ensemble", title, pd.DataFrame(rows).T,
                       f"{metric} per test set; single = mean ± std over node models, ensemble = mean softmax of "
                       "the node models")


def table6(subs: list[SubExperiment], metric: str) -> Built:
    title = "Table 6. Buffer-size ablation: FedER node convergence per buffer size"
    nodes = nodes_of(subs)
    by_size: dict[int, list[SubExperiment]] = defaultdict(list)
    for s in distinct(subs, "feder"):
        by_size[int(s.run("feder").config.get("buffer_size") or 0)].append(s)
    if len(by_size) < 2:
        return Missing(title, "FedER runs with several buffer sizes (recipes/buffer-ablation.toml)")
    rows = {}
    for size in sorted(by_size):
        pooled = convergence_values(by_size[size], "feder", metric, nodes)
        row = {node: Stat.of(pooled[node]) for node in nodes}
        row["mean"] = Stat.of([np.mean(pooled[node]) for node in nodes])
        rows[f"buffer {size}"] = row
    return ReportTable("table6_buffer_size", title, pd.DataFrame(rows).T,
                       f"{metric} on each test set, mean ± std over node models (and seeds); buffer 0 = model "
                       "passing without replay", rows_are="buffer")


def table7(subs: list[SubExperiment], metric: str) -> Built:
    title = "Table 7. FedER vs FedER-A vs FedER-B"
    present = strategies_in(subs, VARIANTS)
    if "feder" not in present or len(present) < 2:
        return Missing(title, "federate --strategy feder with feder-a and/or feder-b (recipes/privacy-variants.toml)")
    nodes = nodes_of(subs)
    rows = {}
    for name in present:
        row = performance_cells(subs, name, metric, nodes)
        pooled = convergence_values(subs, name, metric, nodes)
        row["convergence"] = Stat.of([np.mean(pooled[n]) for n in nodes])
        row["model spread"] = Stat.of([np.std(pooled[n], ddof=1) for n in nodes if len(pooled[n]) > 1])
        rows[name] = row
    return ReportTable("table7_variants", title, pd.DataFrame(rows).T,
                       f"node columns and mean: {metric} of each node's model on its own test set; convergence: mean "
                       "over test sets of the node models' mean; model spread: mean over test sets of their std")


def paired_table(subs: list[SubExperiment], metric: str) -> Built:
    """Each strategy minus FedER within each seed (the same partition, GANs and test sets), with a 95%
    t-interval over the seeds: a ranking that holds seed by seed, not only on average."""
    title = "Paired differences from FedER, seed by seed"
    with_feder = [s for s in subs if s.run("feder") is not None]
    if len(with_feder) < 2:
        return Missing(title, "federate --strategy feder on two or more seeds (recipes/quickstart-seeds.toml)")
    nodes = nodes_of(subs)

    def own_mean(sub: SubExperiment, name: str) -> float:
        scores = own_scores(sub.run(name).metrics, metric)
        return float(np.mean([scores[n] for n in nodes if n in scores]))

    def convergence(sub: SubExperiment, name: str) -> float | None:
        pooled = convergence_values([sub], name, metric, nodes)
        return float(np.mean([np.mean(pooled[n]) for n in nodes])) if all(pooled.get(n) for n in nodes) else None

    rows = {}
    for name in dict.fromkeys(r.strategy for s in with_feder for r in s.runs if r.strategy != "feder"):
        subs_with = [s for s in with_feder if s.run(name) is not None]
        own = [own_mean(s, name) - own_mean(s, "feder") for s in subs_with]
        pairs = [(convergence(s, name), convergence(s, "feder")) for s in subs_with]
        converged = [a - b for a, b in pairs if a is not None and b is not None]
        rows[name] = {"seeds": len(own), "own test sets (Tables 2, 4, 7)": interval(own),
                      "every node model, every test set (Table 3)": interval(converged)}
    frame = pd.DataFrame(rows).T
    frame.index.name = "strategy"
    return ReportTable("paired_differences", title, frame,
                       f"{metric} of the strategy minus FedER's, computed within each seed and then averaged, with "
                       "the 95% t-interval over seeds (negative: FedER is better); own test sets: the mean over "
                       "nodes of each node's final model on its own test set; Table 3: the mean over test sets of "
                       "the node models' mean (strategies with node models only)")


BN_TOLERANCE = 0.02  # the largest |refreshed - stored| a final accuracy may show and still be the weights' own


def as_trained_on(name: str) -> str | None:
    """The batches a strategy's nodes train on, where its declaration names them."""
    declared = REGISTRY.get(name)
    return declared.as_trained_on if declared is not None else None


def batchnorm_reading(name: str, refreshed_gap: float, as_trained_gap: float) -> str:
    """What a strategy's largest BatchNorm gaps say: sound, lag, the training mix, or the average."""
    if refreshed_gap <= BN_TOLERANCE:
        return "sound"
    declared = REGISTRY.get(name)
    if declared is not None and declared.bn_averaged:
        return declared.bn_averaged
    if as_trained_gap > BN_TOLERANCE:
        return "lag: the statistics trail the weights"
    return f"the training mix ({as_trained_on(name) or 'real images, augmented as in training'}), not lag"


def batchnorm_table(subs: list[SubExperiment], metric: str) -> Built:
    """The final round's BatchNorm diagnostic (training/batchnorm_check.py), per strategy; in accuracy, whatever
    `metric` the other tables show."""
    title = "BatchNorm diagnostic: final accuracy with stored and re-estimated statistics"
    runs = [r for s in subs for r in s.runs if r.batchnorm is not None]
    if not runs:
        return Missing(title, "fedcli federate (bn_statistics.csv)")
    rows = {}
    for name in dict.fromkeys(r.strategy for r in runs):
        own = [own_rows(r.batchnorm) for r in runs if r.strategy == name]
        refreshed_gaps = [(f.accuracy_refreshed - f.accuracy_stored).abs().max() for f in own]
        as_trained_gaps = [(f.accuracy_refreshed_as_trained - f.accuracy_stored).abs().max() for f in own]
        rows[name] = {"stored": Stat.of([f.accuracy_stored.mean() for f in own]),
                      "refreshed": Stat.of([f.accuracy_refreshed.mean() for f in own]),
                      "as trained": Stat.of([f.accuracy_refreshed_as_trained.mean() for f in own]),
                      "largest gap, refreshed vs stored": Stat.of(refreshed_gaps),
                      "largest gap, as trained vs stored": Stat.of(as_trained_gaps),
                      "as trained on": as_trained_on(name) or "the node's real images",
                      "reading": batchnorm_reading(name, max(refreshed_gaps), max(as_trained_gaps))}
    frame = pd.DataFrame(rows).T
    frame.index.name = "strategy"
    return ReportTable("batchnorm_diagnostic", title, frame,
                       "accuracy of each node's final model on its own test set (mean over nodes; every metric is "
                       "accuracy here, whatever the report's metric), the weights unchanged: stored = BatchNorm "
                       "running statistics as trained (what every other table shows); refreshed = re-estimated on the"
                       " node's real training images; as trained = re-estimated on the batches the node trains on in "
                       "the last round, as composed in training (column 'as trained on'). Largest gaps: over the "
                       "nodes, per seed; the reading takes the largest over seeds. Reading: sound = refreshed within "
                       f"{BN_TOLERANCE} of stored; lag = stored far from as trained (statistics trail the weights); "
                       "the training "
                       "mix = stored within the tolerance of as trained, and both far from refreshed: the model was "
                       "normalised, in training as in its stored statistics, with batches unlike the node's real "
                       "images alone (another hospital's synthetic ones, other hospitals' real ones, the training "
                       "augmentation), so refreshing adapts it to a population it was not trained on. The average: "
                       "FedAvg and FedProx normalise every hospital with one set of statistics, the mean of every "
                       "node's, while each node trained with its own batches' statistics; FedBN's were estimated "
                       "under each node's weights, which the last average then moved. Just before that average every "
                       "node's model scored within the tolerance of its refreshed score, on the quickstart and on "
                       "pneumonia (docs/report.md), so this gap is what the method does on hospitals that differ, not lag; "
                       "its refreshed column is test-time adaptation, another method.")


def table8(subs: list[SubExperiment], metric: str) -> Built:
    title = "Table 8. Communication per node (measured bytes), by strategy"
    nodes = nodes_of(subs)
    rows = {}
    for name in dict.fromkeys(r.strategy for s in subs for r in s.runs):
        per_rep = defaultdict(list)
        for s in subs:
            run = s.run(name)
            if run is None or run.comm is None:
                continue
            comm, n = run.comm, len(nodes)
            rounds = int(run.config.get("rounds") or 1)
            training = comm[comm.kind != "eval"]
            sent = training[training.sender.isin(nodes)].bytes.sum() / n
            received = training[training.receiver.isin([*nodes, EVERYONE])].bytes.sum() / n  # ring: as sent
            per_rep["training sent/node (MB)"].append(sent / MB)
            per_rep["training received/node (MB)"].append(received / MB)
            for kind in REGISTRY.transfer_kinds():
                per_rep[f"{kind} (MB)"].append(comm[comm.kind == kind].bytes.sum() / n / MB)
            per_rep["training sent/node/round (MB)"].append(sent / rounds / MB)
        if per_rep:
            rows[name] = {k: Stat.of(v) for k, v in per_rep.items()}
    if not rows:
        return Missing(title, "federate runs (comm.csv)")
    frame = pd.DataFrame(rows).T
    frame = frame[[c for c in frame.columns if any(cell.mean > 0 for cell in frame[c])] or frame.columns[:1]]
    return ReportTable("table8_communication", title, frame,
                       "bytes as measured on the transport, per node. Training traffic: model = model passing, "
                       "buffer = synthetic buffers, all-reduce = the volume a ring all-reduce sends per node when "
                       "averaging (computed from the vector size, the same on both engines); eval = models sent "
                       "only to be tested on other nodes' test sets (distributed --cross-eval), never counted as "
                       "training; per round = over the R rounds, although the averaging strategies also average "
                       "once at round 0 (their init_epochs, as FedER's M^0). Centralized training moves raw data "
                       "and is not counted")


def table1(subs: list[SubExperiment], metric: str) -> Built:
    """Cross-validation grid (rounds x epochs, plus lr, mu and server lr where they vary), mean ± std over folds."""
    title = "Table 1. Model selection grid: cross-validation per node"
    runs = [(s, r) for s in subs for r in s.cv_runs]
    if not runs:
        return Missing(title, "cross-validation runs: a [select] table in the recipe, or federate --cv")
    nodes = nodes_of(subs)
    keys = [k for k in select_keys() if len({r.config.get(k) for _, r in runs if varies_for(k, r.strategy)}) > 1] \
        or ["rounds", "epochs"]
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for _, r in runs:
        label = (r.strategy, *(r.config.get(k) if varies_for(k, r.strategy) else "-"
                               for k in keys))
        scores = own_scores(r.metrics, metric)
        for node in nodes:
            cells[label][node].append(scores.get(node))
        cells[label]["mean"].append(np.mean([scores[n] for n in nodes if n in scores]))
    index = pd.MultiIndex.from_tuples(list(cells), names=["strategy", *keys])
    frame = pd.DataFrame([{c: Stat.of(v) for c, v in row.items()} for row in cells.values()], index=index)
    best = {}
    for label in cells:
        score = frame.loc[label, "mean"].mean * (-1 if metric in LOWER_IS_BETTER else 1)
        if label[0] not in best or score > best[label[0]][0]:
            best[label[0]] = (score, label)
    frame["chosen"] = ["yes" if best[label[0]][1] == label else "" for label in frame.index]
    return ReportTable("table1_selection_grid", title, frame.reset_index().set_index("strategy"),
                       f"{metric} of each node's model on its held-out train fold, mean ± std over folds; chosen = "
                       "the best mean per strategy, then trained on the whole train split and tested once")


def headline(subs: list[SubExperiment], metric: str) -> Built:
    title = "Every strategy: node performance"
    present = list(dict.fromkeys(r.strategy for s in subs for r in s.runs))
    if not present:
        return Missing(title, "fedcli federate")
    return performance_table("headline", title, subs, present, metric, mark_best=True,
                             note=f"{metric} of each node's final model on its own test set; best per column in bold")


def alpha_table(subs: list[SubExperiment], metric: str) -> Built:
    """Per privacy-loss weight: FID, synthetic-to-nearest-real LPIPS, membership AUROC, FedER accuracy."""
    title = "GAN privacy weight alpha: fidelity against distance to the real images"
    by_alpha: dict[float, list[SubExperiment]] = defaultdict(list)
    for s in stylegan_subs(subs):
        alphas = {g["config"]["alpha"] for g in s.gans}
        if len(alphas) == 1:
            by_alpha[alphas.pop()].append(s)
    if len(by_alpha) < 2:
        return Missing(title, "train-gan runs with several --alpha values (recipes/gan-alpha.toml)")
    nodes = nodes_of(subs)
    rows = {}
    for alpha in sorted(by_alpha):
        reps = by_alpha[alpha]
        audits = [a for s in reps for a in s.audits]
        rows[f"alpha {alpha:g}"] = {
            "FID": Stat.of([g["phase2"]["fid"] for s in reps for g in s.gans]),
            "nearest-real LPIPS": Stat.of([a["buffer"].get("synthetic_nearest_real_lpips_mean") for a in audits]),
            "AUROC priv": Stat.of([a["generators"]["privacy"]["mia"]["auroc"] for a in audits]),
            "privacy effect": Stat.of([a["privacy_effect"]["median_ratio"] for a in audits]),
            "fidelity ratio": Stat.of([(g.get("fidelity") or {}).get("ratio") for s in reps for g in s.gans]),
            f"FedER {metric}": performance_cells(reps, "feder", metric, nodes)["mean"],
        }
    fid_name = next(g for s in subs for g in s.gans)["metric_names"]["fid"]
    return ReportTable("gan_alpha", title, pd.DataFrame(rows).T,
                       f"{fid_name} of the privacy-preserving generator and the mean LPIPS of each synthetic image to "
                       "its nearest real one (mean ± std over nodes and seeds); privacy effect = median per-member "
                       "ratio of the privacy generator's projection LPIPS to its alpha-0 control's; fidelity ratio = "
                       "the released buffer's (classifier trained on it / on real images); alpha 0 = a standard GAN",
                       rows_are="alpha")


def dp_table(subs: list[SubExperiment], metric: str) -> Built:
    """Privacy-utility: per DP setting and node, the accountant's (epsilon, delta) and what the buffer,
    FedER and the attack show."""
    title = "Differential privacy: privacy against utility per node"
    groups = by_dp_setting(subs)
    if len(groups) < 2 or not any(setting is not None for setting in groups):
        return Missing(title, "train-gan runs with several --dp-epsilon values (recipes/dp-utility.toml)")
    nodes = nodes_of(subs)
    rows = {}
    for setting, reps in groups.items():
        feder = performance_cells(reps, "feder", metric, nodes)
        for node in nodes:
            gans = [g for s in reps for g in s.gans if g["node"] == node]
            audits = [a for s in reps for a in s.audits if a["node"] == node]
            dps = [g.get("dp") or {} for g in gans]
            privacy = [a["generators"]["privacy"] for a in audits]
            rows[f"{dp_label(setting)}, {node}"] = {
                "epsilon spent": Stat.of([d.get("epsilon") for d in dps]) if setting is not None else "-",
                "delta": f"{dps[0]['delta']:.2g}" if dps and dps[0] else "-",
                "sigma": Stat.of([d.get("noise_multiplier") for d in dps]) if setting is not None else "-",
                "fidelity ratio": Stat.of([(g.get("fidelity") or {}).get("ratio") for g in gans]),
                f"FedER {metric}": feder[node],
                "AUROC": Stat.of([p["mia"]["auroc"] for p in privacy]),
                "TPR at lowest FPR": ", ".join(lowest_fpr_tpr(p["mia"].get("tpr_at_min_fpr")) for p in privacy),
                "rebuilt members": Stat.of([p["reconstruction_share"]["members"] for p in privacy]),
                "TPR within the DP bound": ", ".join(dict.fromkeys(
                    bound_reading(a["dp"]["audit_bound"]) for a in audits if "dp" in a)) or "-",
            }
    return ReportTable("dp_utility", title, pd.DataFrame(rows).T,
                       "epsilon spent: the RDP accountant's (Opacus) for the discriminator's Poisson-sampled DP-SGD "
                       "steps, at delta (default 1 / (10 N)); the unit is one training image; the generator and its "
                       "buffer are DP by post-processing, FedER's travelling classifiers are not. epsilon inf: the "
                       "same DP code path (Poisson sampling, per-image clipping, no ADA, no phase 2, uniform fake "
                       "labels) with no noise; no DP: the standard privacy-preserving generator. fidelity ratio: the "
                       "classifier trained on the buffer over the one trained on real images; FedER: the node's "
                       "final model on its own test set; AUROC, TPR at the lowest resolvable FPR (with its "
                       "Clopper-Pearson interval) and rebuilt members: the audit's membership attack and "
                       "reconstruction share on the released generator; the DP bound: TPR <= e^epsilon x FPR + "
                       "delta at every resolvable FPR (a sanity check: an attack measured above it would mean "
                       "the training is not what the accountant assumed)", rows_are="setting and node")
