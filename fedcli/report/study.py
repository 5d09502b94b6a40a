"""The study's tables, numbered as in the FedER paper, built from collected artifacts.

Each builder takes the replicates of one sweep group (or, for the tables across a sweep, every
sub-experiment) and the metrics.csv column to show, and returns a `ReportTable`, or a `Missing`
that says what would produce it. Cells are `Stat`s: mean +- std over seeds or folds.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fedcli.config import LOWER_IS_BETTER, architectures
from fedcli.fl.federate_config import select_keys, varies_for
from fedcli.fl.strategies import REGISTRY
from fedcli.fl.strategies.base import ENSEMBLE
from fedcli.fl.transport import EVERYONE
from fedcli.report.collect import (Stat, SubExperiment, by_dp_setting, cross_scores, decoded_fidelity,
                                   dp_label, own_rows, own_scores, stylegan_subs)
from fedcli.report.paired import paired_bootstrap_frame

# the table families strategies declare (fl/strategies/): Tables 2, 4 and the paired table, 7, and 3
BASELINES, FEDERATED, VARIANTS, CONVERGENCE = "baselines", "federated", "variants", "convergence"
MB = 1e6


@dataclasses.dataclass
class ReportTable:
    key: str  # file stem of its CSV and LaTeX files
    title: str
    frame: pd.DataFrame  # index: row labels; cells: Stat or str
    note: str = ""
    mark_best: bool = False  # bold the best value of each Stat column
    lower_is_better: bool = False  # the best is the lowest (ECE)
    rows_are: str = "strategy"  # what the row labels name, when the frame's index has no name

    def __post_init__(self) -> None:
        if self.frame.index.name is None:
            self.frame = self.frame.rename_axis(self.rows_are)


@dataclasses.dataclass
class Missing:
    title: str
    needs: str


Built = ReportTable | Missing


def strategies_in(subs: list[SubExperiment], family: str) -> list[str]:
    """The strategies of a table family (fl/strategies/) that the sub-experiments ran, in the registry's order."""
    present = {r.strategy for s in subs for r in s.runs}
    return [name for name in REGISTRY.family(family) if name in present]


def distinct(subs: list[SubExperiment], strategy: str) -> list[SubExperiment]:
    """Sub-experiments with their own run of `strategy`: one that a sweep shared (a symlink) counts once."""
    seen, out = set(), []
    for s in subs:
        run = s.run(strategy)
        if run is not None and run.folder.resolve() not in seen:
            seen.add(run.folder.resolve())
            out.append(s)
    return out


def nodes_of(subs: list[SubExperiment]) -> list[str]:
    return next((s.nodes for s in subs if s.nodes), [])


def performance_cells(subs: list[SubExperiment], strategy: str, metric: str, nodes: list[str]) -> dict:
    """Own-model score per node and the per-task mean, each a Stat over the replicates."""
    scores = [own_scores(run.metrics, metric) for s in subs if (run := s.run(strategy)) is not None]
    cells = {node: Stat.of([sc.get(node) for sc in scores]) for node in nodes}
    cells["mean"] = Stat.of([np.mean([sc[n] for n in nodes if n in sc]) for sc in scores])
    return cells


def convergence_values(subs: list[SubExperiment], strategy: str, metric: str, nodes: list[str]) -> dict:
    """Per test set: every node model's score, pooled over replicates."""
    pooled: dict[str, list[float]] = defaultdict(list)
    for s in subs:
        if (run := s.run(strategy)) is not None and cross_evaluated(run.config):
            for node, values in cross_scores(run.metrics, metric, nodes).items():
                pooled[node] += values
    return pooled


def performance_table(key: str, title: str, subs, strategies, metric: str, mark_best: bool = False,
                      note: str = "") -> ReportTable:
    nodes = nodes_of(subs)
    frame = pd.DataFrame({name: performance_cells(subs, name, metric, nodes) for name in strategies}).T
    frame.index.name = "strategy"
    return ReportTable(key, title, frame, note, mark_best, lower_is_better=metric in LOWER_IS_BETTER)


def cross_evaluated(config: dict) -> bool:
    """Whether a run tested every node model on every test set (the distributed engine only with
    --cross-eval; the in-process simulation always)."""
    return config.get("engine", "inprocess") != "distributed" or bool(config.get("cross_eval"))


def engine_note(subs: list[SubExperiment]) -> str | None:
    """Which strategies ran one process per node, and whether their models travelled for evaluation."""
    runs = {r.strategy: r for s in subs for r in s.runs if r.config.get("engine") == "distributed"}
    if not runs:
        return None
    sent = [name for name, r in runs.items() if r.comm is not None and (r.comm.kind == "eval").any()]
    published = [name for name in sent if (d := REGISTRY.get(name)) is not None and d.published]
    moved = [name for name in sent if name not in published]
    off = [name for name, r in runs.items() if not r.config.get("cross_eval") and name not in published]
    parts = [f"{', '.join(runs)} ran on the distributed engine (one torch.distributed process per node)."]
    if moved:
        parts.append(f"Cross-evaluation was on for {', '.join(moved)}: every node model was sent to every node to be "
                     "tested (eval traffic in Table 8), which FedER-A otherwise never does.")
    if published:
        parts.append(f"The model of {', '.join(published)}, which one node holds after each round, was sent to every "
                     "other node to be tested there (eval traffic in Table 8).")
    if off:
        parts.append(f"Cross-evaluation was off for {', '.join(off)}: each node tested only the models it holds, so "
                     "these have no node-convergence (Table 3) or ensemble entries.")
    return " ".join(parts)


def disclosure_note(subs: list[SubExperiment]) -> str | None:
    """Who received what a strategy computes from the nodes' images (latents, activations, the images
    themselves), read from what travelled."""
    seen: dict[tuple[str, str], tuple[set, set]] = {}  # (strategy, kind) -> receivers, senders over every run
    for run in (r for s in subs for r in s.runs):
        declaration = REGISTRY.get(run.strategy)
        if declaration is None or run.comm is None:
            continue
        for kind in declaration.discloses:
            sent = run.comm[run.comm.kind == kind]
            if len(sent):
                receivers, senders = seen.setdefault((run.strategy, kind), (set(), set()))
                receivers.update(sent.receiver)
                senders.update(sent.sender)
    parts = [f"In {name}, {', '.join(sorted(receivers))} received from {', '.join(sorted(senders))} the "
             f"{REGISTRY[name].discloses[kind]}: {'that rank' if len(receivers) == 1 else 'those ranks'} saw them."
             for (name, kind), (receivers, senders) in seen.items()]
    return " ".join(parts) or None


def by_strategy(label: str, subs: list[SubExperiment], describe: Callable[[dict], str]) -> str:
    """`label: strategies: description; ...`, strategies whose runs' configs read alike grouped."""
    described = {}
    for run in (r for s in subs for r in s.runs):
        described.setdefault(run.strategy, describe(run.config))
    if not described:
        return ""
    groups = defaultdict(list)
    for strategy, text in described.items():
        groups[text].append(strategy)
    return f"{label}: " + "; ".join(f"{', '.join(names)}: {text}" for text, names in groups.items()) + "."


def architecture_note(subs: list[SubExperiment]) -> str:
    """Each strategy's classifier, and each node's own where --model NODE=ARCH gave one."""
    nodes = nodes_of(subs)

    def describe(config: dict) -> str:
        default, own = architectures(config.get("model", "cnn"))
        return ", ".join(f"{node} {own.get(node, default)}" for node in nodes) if own else default
    return by_strategy("Classifiers", subs, describe)


def budget_note(subs: list[SubExperiment]) -> str:
    """How long each strategy trained, in epochs over its training data, and at what learning rate."""
    def describe(config: dict) -> str:
        init, rounds, epochs = (config.get(k) for k in ("init_epochs", "rounds", "epochs"))
        phases, rule, cap = "round 0, then R x E", config.get("encoder_rule"), config.get("encoder_epochs")
        if rule is not None:  # fedreplay: its encoder's own epochs (fl/strategies/fedreplay.py), then the head's
            init = {"untrained": "untrained encoder", "fixed": f"{cap} encoder epochs"}.get(
                rule, f"up to {cap} encoder epochs (until the loss changed under 1% over 3)")
            phases = "R x E of the head" if rule == "untrained" else "the encoder node, then R x E of the head"
        schedule = {"cosine": "annealed to 0 along a cosine over those epochs",
                    "step": f"times {config.get('lr_step_factor')} every {config.get('lr_step_epochs')} of those "
                            "epochs"}.get(config.get("lr_schedule"), "constant")
        optimizer = (f"SGD (momentum {config.get('sgd_momentum')})" if config.get("optimizer") == "sgd" else "Adam")
        decay = f", weight decay {config['weight_decay']:g}" if config.get("weight_decay") else ""
        return f"{init} + {rounds} x {epochs} epochs ({phases}), {optimizer} lr {config.get('lr')} " \
               f"{schedule}{decay}"
    return by_strategy("Budget", subs, describe)


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


def interval(differences: list[float]) -> str:
    """mean [low, high] of paired differences, the 95% t-interval over them; '-' with fewer than two."""
    if len(differences) < 2:
        return "-"
    mean, half = float(np.mean(differences)), t_half_width(float(np.std(differences, ddof=1)), len(differences))
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def t_half_width(std: float, n: int) -> float:
    """Half the width of the 95% t-interval of a mean of n values with sample std `std`."""
    return float(scipy_stats.t.ppf(0.975, n - 1)) * std / np.sqrt(n)


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
    """The final round's BatchNorm diagnostic (fl/batchnorm_check.py), per strategy; in accuracy, whatever
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


def partition_table(subs: list[SubExperiment]) -> Built:
    title = "Partition summary"
    sub = next((s for s in subs if s.manifest), None)
    if sub is None:
        return Missing(title, "fedcli partition")
    manifest = sub.manifest
    rows = {}
    for node in manifest["nodes"]:
        counts = {split: defaultdict(int) for split in ("train", "test")}
        for split in counts:
            for record in node[split]:
                counts[split][record["label"]] += 1
        rows[node["name"]] = {"site": node.get("site", ""), "train": sum(counts["train"].values()),
                              "test": sum(counts["test"].values()),
                              "classes": f"{len(counts['train'])}/{len(manifest['label_names'])}",
                              "smallest class (train)": min(counts["train"].values()) if counts["train"] else 0}
    skew = (manifest.get("statistics") or {}).get("label_skew_js")
    return ReportTable("partition_summary", title, pd.DataFrame(rows).T,
                       f"{manifest['source']}, scheme {manifest['scheme']}, {manifest['image_size']} px, seed "
                       f"{manifest['seed']}; label skew of the training splits (mean pairwise Jensen-Shannon "
                       f"distance) {skew}",
                       rows_are="node")


def gan_summary(subs: list[SubExperiment]) -> Built:
    title = "GAN summary per node"
    gans = [g for s in subs for g in s.gans]
    if not gans:
        return Missing(title, "fedcli train-gan")
    if all("serial" in g for g in gans):
        return vqvae2_summary(subs, gans)
    standalone = [own_scores(run.metrics, "accuracy") for s in subs if (run := s.run("standalone")) is not None]
    rows = {}
    for node in dict.fromkeys(g["node"] for g in gans):
        mine = [g for g in gans if g["node"] == node]
        rows[node] = {"FID standard": Stat.of([g["phase1"]["fid"] for g in mine]),
                      "FID privacy": Stat.of([g["phase2"]["fid"] for g in mine]),
                      "iterations": f"{mine[0]['phase1']['iterations']} + {mine[0]['phase2']['iterations']}",
                      "phase 1 kept": ", ".join(dict.fromkeys(phase1_kept(g["phase1"]) for g in mine)),
                      "phase 2 kept": ", ".join(dict.fromkeys(phase2_kept(g["phase2"]) for g in mine)),
                      "buffer": str(mine[0]["buffer"]["size"])}
        scored = [g["fidelity"] for g in mine if g.get("fidelity")]
        if scored:
            rows[node] |= {"fidelity ratio": Stat.of([f["ratio"] for f in scored]),
                           "ratio standard": Stat.of([f["phase1"]["ratio"] for f in scored]),
                           "ratio control": Stat.of([f.get("control", {}).get("ratio") for f in scored]),
                           "synthetic acc": Stat.of([f["synthetic_accuracy"] for f in scored]),
                           "real acc": Stat.of([f["real_accuracy"] for f in scored]),
                           "class fidelity": Stat.of([f["class_fidelity"] for f in scored]),
                           "flags": flag_counts(scored)}
        if standalone:
            rows[node]["standalone acc"] = Stat.of([sc.get(node) for sc in standalone])
        private = [g["dp"] for g in mine if g.get("dp")]
        if private:
            rows[node]["DP epsilon"] = Stat.of([d["epsilon"] for d in private])
    note = (f"{gans[0]['metric_names']['fid']}; the privacy generator trades FID for distance to the real images. "
            "Fidelity (no pretrained network): the federate classifier trained on the released buffer only "
            "(synthetic acc) or on the node's real training images (real acc), both tested on the node's real "
            "test images, mean of the classifier seeds; ratio = synthetic / real, for the released buffer, the "
            "standard (phase 1) generator and the control (phase 2 at alpha 0), each from the same draws; class "
            "fidelity = the real classifier's accuracy on the buffer.")
    flagged = [node for node, row in rows.items() if row.get("flags")]
    if flagged:
        note += (f" Flagged released buffers: {', '.join(flagged)} (below chance: its classifier did no better than "
                 "always answering the test set's most frequent class; below control: below the control's ratio by "
                 "more than the 95% interval of a difference of two accuracies on the same test images).")
    stopped = sorted({g["node"] for g in gans if g["phase2"]["stopped"] == "fid-factor"})
    if stopped:
        note += (" Phase 2 exceeded its FID limit (--fid-factor x the kept phase-1 snapshot's FID) on "
                 f"{', '.join(stopped)}: the privacy generator is the last snapshot within the limit, and the "
                 "standard generator itself where none was (kept iteration 0).")
    if any(g.get("dp") for g in gans):
        note += (" DP epsilon: the RDP accountant's for the discriminator's DP-SGD steps (train-gan --dp-epsilon), "
                 "per training image, at delta 1 / (10 N) unless set; no phase 2 runs under DP, so the privacy "
                 "generator is the last EMA of phase 1.")
    settings = gans[0].get("settings")
    if settings:
        note += " " + settings_note(settings, gans[0]["config"], gans[0]["buffer"].get("truncation", 1.0))
    return ReportTable("gan_summary", title, pd.DataFrame(rows).T, note, rows_are="node")


def vqvae2_summary(subs: list[SubExperiment], gans: list[dict]) -> Built:
    """The VQ-VAE-2 kind's nodes: where each stood in the serial chain, its codes, and the fidelity of its buffer
    and of its decoded codes, saying which buffers are reconstructions of real patients."""
    standalone = [own_scores(run.metrics, "accuracy") for s in subs if (run := s.run("standalone")) is not None]
    rows = {}
    for node in dict.fromkeys(g["node"] for g in gans):
        mine = [g for g in gans if g["node"] == node]
        rows[node] = {"chain position": str(mine[0]["serial"]["position"]),
                      **{name: Stat.of([g["codes"][key] for g in mine if "codes" in g])  # none under DP
                         for name, key in (("reconstruction MSE", "reconstruction_mse"),
                                           ("perplexity top", "perplexity_top"),
                                           ("perplexity bottom", "perplexity_bottom"))},
                      "buffer": f"{mine[0]['buffer']['size']} {mine[0]['buffer_kind']}"}
        scored = [g["fidelity"] for g in mine if g.get("fidelity")]
        if scored:
            rows[node] |= {"fidelity ratio": Stat.of([f["ratio"] for f in scored]),
                           "ratio decoded codes": Stat.of([d["ratio"] for g in mine if (d := decoded_fidelity(g))]),
                           "real acc": Stat.of([f["real_accuracy"] for f in scored]),
                           "class fidelity": Stat.of([f["class_fidelity"] for f in scored])}
        if standalone:
            rows[node]["standalone acc"] = Stat.of([sc.get(node) for sc in standalone])
    decoded = sorted({g["node"] for g in gans if g["buffer_kind"] == "decoded codes"})
    note = ("VQ-VAE-2 (train-gan --generator vqvae2), trained serially across the nodes in the chain's order; "
            "reconstruction MSE: the final decoder's on the node's codes against its real training images ([-1, 1] "
            "units); perplexity: how many codes its codes use, as if equally. Fidelity ratio: as for GAN buffers, "
            "the federate classifier trained on the released buffer over one trained on real images, both tested "
            "on the node's real test images; ratio decoded codes: the same for decoded codes of the node's images. "
            "Codes of real images, decoded, are reconstructions of real patients' images: any replay of codes "
            "(cwt-replay, fedavg-replay) hands them to every node.")
    private = sorted({g["node"] for g in gans if g.get("dp")})
    if private:
        note += (f" The VQ-VAE-2s of {', '.join(private)} were trained under --dp-epsilon: no "
                 "codes left those nodes, their codes are not summarised, and their buffers are prior samples.")
    if decoded:
        note += (f" The buffers of {', '.join(decoded)} are decoded codes (no prior was trained): reconstructions of "
                 "real patients, not synthetic images.")
    return ReportTable("gan_summary", "VQ-VAE-2 summary per node", pd.DataFrame(rows).T, note, rows_are="node")


def phase1_kept(phase1: dict) -> str:
    """The kept standard snapshot's iteration of those run, why phase 1 stopped, and the rule that kept it."""
    rule = f", {phase1['select']}" if "select" in phase1 else ""
    return f"{phase1.get('best_iteration', '?')}/{phase1['iterations']} ({phase1['stopped']}{rule})"


def flag_counts(scores: list[dict]) -> str:
    """Each flag the node's released buffers carried (gan/fidelity.py shortfalls), in how many of its runs."""
    flags = [flag for f in scores for flag in f.get("flags", [])]
    return ", ".join(f"{flag} {flags.count(flag)}/{len(scores)}" for flag in dict.fromkeys(flags))


def phase2_kept(phase2: dict) -> str:
    """The kept privacy snapshot's iteration of those run, and why phase 2 stopped."""
    return f"{phase2['kept_iteration']}/{phase2['iterations']} ({phase2['stopped']})"


def settings_note(settings: dict, config: dict, truncation: float) -> str:
    """The generator's training settings, each `auto` shown with the value it resolved to."""
    def shown(name: str, label: str) -> str:
        value = settings[name]
        return f"{label} {value:.4g}" + (" (auto)" if config.get(name) == "auto" else "")

    form, scale = settings.get("privacy_loss", "all-pairs"), settings.get("privacy_scale", "absolute")
    departures = [text for text, departs in (
        ("each synthetic image pushed from its nearest real training image", form != "all-pairs"),
        ("L_PP divided by the node's real-vs-real LPIPS of the same form", scale != "absolute")) if departs]
    return ("Settings: " + ", ".join([shown("r1_gamma", "R1 gamma"), shown("ada_kimg", "ADA kimg"),
                                      shown("ema_kimg", "EMA half-life kimg"), shown("style_mixing", "style mixing")])
            + f", buffer truncation {truncation:g}, privacy loss alpha {settings.get('alpha', 1):g} {form} {scale}"
            + (f" (departures: {'; '.join(departures)})." if departures else " (the study's form)."))


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
