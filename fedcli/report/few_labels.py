"""FedPerl's readings (Bdair et al.: its Table 2 and its community figure) from a few-labels experiment.

Every run of the experiment's sub-experiments is one variant: its strategy, its peer settings, its participation
and what it learnt from (the visible labels only, the lower bound; FixMatch on the unlabelled images; every label,
the oracle's upper bound). A variant's cell pools its seeds: per seed, the mean, median and standard deviation
over the clients of each client's own test set under the final model, then their means over the seeds.
- RI: the relative improvement of the mean over local training on the labelled images (the paper's Table 2), and,
  named, over FedAvg on them.
- AC: the models a client receives per round beyond SSFL's one (FedAvg with FixMatch, same participation),
  relative to it, counted from the transfers (comm.csv); the training bytes beyond SSFL's beside it, measured.
- Calibration: the adaptive ECE and MCE (metrics/scores.py), means over clients and seeds, and the AURC of the
  pooled predictions (report/calibration.py, which also draws the reliability and risk-coverage figure).
- The community matrix: how often each node chose each peer (peers.csv), over rounds and seeds.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.peer_learning import ANONYMISED, PEER_MODEL, peer_server
from fedcli.report.collect import Run, SubExperiment, best_validation_scores, own_scores
from fedcli.report.table import Built, Missing, ReportTable, nodes_of

LOWER, SEMI, UPPER = "labelled only", "FixMatch", "all labels"
LOCAL, BASELINE, SSFL = f"standalone [{LOWER}]", f"fedavg [{LOWER}]", f"fedavg [{SEMI}]"


def learnt_from(run: Run) -> str:
    if run.config.get("labels") == "all":
        return UPPER
    declared = REGISTRY.get(run.strategy)
    return SEMI if run.config.get("ssl", "none") != "none" or (declared and declared.fixmatch) else LOWER


def few_labels_runs(subs: list[SubExperiment]) -> list[tuple[Run, SubExperiment]]:
    """The runs (with their sub-experiment) of sub-experiments whose partition hides labels."""
    return [(run, s) for s in subs if s.manifest and (s.manifest.get("labels") or {}).get("fraction", 1) < 1
            for run in s.runs if run.fold is None]


def variants(subs: list[SubExperiment]) -> dict[str, list[tuple[Run, SubExperiment]]]:
    """Each variant's runs, seeds pooled, in the order they were found."""
    found: dict[str, list[tuple[Run, SubExperiment]]] = defaultdict(list)
    for run, sub in few_labels_runs(subs):
        found[variant(run)].append((run, sub))
    return dict(found)


def variant(run: Run) -> str:
    """`fedperl (T=2, PA, gated-similarity 0.95) [FixMatch]`: what distinguishes a run in the table."""
    config, details = run.config, []
    if "peers" in config:
        details.append(f"T={config['peers']}")
        details += ["PA"] if config.get("anonymize") else []
        if config.get("policy", "static") != "static":
            threshold = config.get("policy_threshold")
            details.append(config["policy"] + ("" if threshold is None else f" {threshold:g}"))
    details += participating(config)
    return labelled(run.strategy, details, learnt_from(run))


def participating(config: dict) -> list[str]:
    share = float(config.get("participation", 1.0))
    return [f"{share:.0%} participation"] if share < 1 else []


def bounds(config: dict) -> tuple[str, str, str, str]:
    """The variants a run at `config`'s participation is read against: the local and the FedAvg lower bounds,
    SSFL and the upper bound (the references ran at the same participation)."""
    share = participating(config)
    return (labelled("standalone", share, LOWER), labelled("fedavg", share, LOWER), labelled("fedavg", share, SEMI),
            labelled("fedavg", share, UPPER))


def labelled(strategy: str, details: list[str], learnt: str) -> str:
    shown = f" ({', '.join(details)})" if details else ""
    return f"{strategy}{shown} [{learnt}]"


MODELS = {"last": own_scores, "best-validation": best_validation_scores}  # which model of each client is read


def client_mean(runs: list[Run], metric: str, model: str = "last") -> float:
    """The mean over runs of the mean over clients of `metric`."""
    return float(np.mean([np.mean(list(MODELS[model](run.metrics, metric).values())) for run in runs]))


def training_bytes(run: Run) -> float:
    return float(run.comm[run.comm.kind != "eval"].bytes.sum()) if run.comm is not None else float("nan")


def models_received(run: Run, manifest: dict) -> float:
    """The models a client receives per round (the average, and its peer models), over the clients and rounds in
    which it received a peer model (every client and round where none did); the anonymising server left out."""
    comm = run.comm
    if comm is None:
        return float("nan")
    anonymised = bool(run.config.get("anonymize"))
    server = peer_server(run.config.get("server_node"), ((manifest.get("labels") or {}).get("held_apart") or {})
                         .get("holder"), [node["name"] for node in manifest["nodes"]]) if anonymised else None
    averages = comm[comm.kind == "all-reduce"].groupby(["round", "sender"]).size().rename_axis(["round", "client"])
    teachers = comm[comm.kind == (ANONYMISED if anonymised else PEER_MODEL)]
    taught = teachers.groupby(["round", "receiver"]).size().rename_axis(["round", "client"])
    received = averages.add(taught, fill_value=0)
    received = received[[client != server for _, client in received.index]]
    if len(taught):
        received = received[received.index.isin(taught.index)]
    return float(received.mean()) if len(received) else float("nan")


def improvement(value: float, reference: float) -> float:
    """The relative improvement of `value` over `reference`, in percent (the paper's RI and AC)."""
    return 100 * (value - reference) / reference


def relative(value: float, reference: float, digits: int) -> str:
    return f"{improvement(value, reference):+.{digits}f}" if reference and np.isfinite(reference) else ""


def few_labels_table(subs: list[SubExperiment], metric: str, aurc: dict[str, float] | None = None,
                     model: str = "last") -> Built:
    """`aurc`: each variant's area under its risk-coverage curve (report/calibration.py), a column where given.
    `model`: each client's final model (`last`), or its model of the evaluated round with the best accuracy on
    its validation part (`best-validation`, the authors' reading)."""
    title = "Few labels (FedPerl's Table 2): every variant over the clients" + (
        "" if model == "last" else ", each client's best-validation model")
    found = variants(subs)
    if model != "last":
        found = {name: pairs for name, pairs in found.items()
                 if all(best_validation_scores(run.metrics, metric) for run, _ in pairs)}
    by_variant = {name: [run for run, _ in pairs] for name, pairs in found.items()}
    if not by_variant:
        return Missing(title, "federate runs on a few-labels partition (partition --labeled-fraction)" + (
            "" if model == "last" else " with validation parts (--validation-fraction), evaluated every round"))
    rows, means, sent, models, refs = {}, {}, {}, {}, {}
    for name, group in by_variant.items():
        refs[name] = bounds(group[0].config)
        scores = [np.array(list(MODELS[model](run.metrics, metric).values())) for run in group]
        means[name] = float(np.mean([s.mean() for s in scores]))
        sent[name] = float(np.mean([training_bytes(run) for run in group]))
        models[name] = float(np.mean([models_received(run, sub.manifest) for run, sub in found[name]]))
        median, spread = np.mean([np.median(s) for s in scores]), np.mean([s.std() for s in scores])
        rows[name] = {f"{metric}: mean (median) ± std over clients": f"{means[name]:.3f} ({median:.3f}) ± {spread:.3f}",
                      "adaptive ECE": f"{client_mean(group, 'adaptive_ece', model):.3f}",
                      "adaptive MCE": f"{client_mean(group, 'adaptive_mce', model):.3f}",
                      **({"AURC": f"{aurc[name]:.3f}"} if aurc and name in aurc else {}), "seeds": str(len(group))}
    for name in rows:
        local, lower, ssfl, _ = refs[name]
        rows[name]["RI (%)"] = relative(means[name], means.get(local, float("nan")), 2)
        rows[name]["RI vs labelled-only FedAvg (%)"] = relative(means[name], means.get(lower, float("nan")), 2)
        rows[name]["AC (%)"] = relative(models[name], models.get(ssfl, float("nan")), 0)
        rows[name]["bytes beyond SSFL (%)"] = relative(sent[name], sent.get(ssfl, float("nan")), 0)
    frame = pd.DataFrame(rows).T
    holders = sorted({(s.manifest.get("labels") or {}).get("held_apart", {}).get("holder")
                      for s in subs if s.manifest and (s.manifest.get("labels") or {}).get("held_apart")})
    reading = "the final model" if model == "last" else (
        "its model of the evaluated round with the best accuracy on its validation part (the first such round)")
    note = (f"each client's own test set under {reading}; per seed the mean (median) ± std over the clients, "
            f"then the mean over the seeds; RI relative to {LOCAL} (the paper's), a second RI to {BASELINE}; AC the "
            f"models a client receives per round beyond {SSFL}'s one, relative to it, per client and round with "
            "peers, counted from comm.csv (the anonymising server left out); the bytes moved in training beyond "
            f"{SSFL}'s, measured; each at the variant's participation and absent without that run; adaptive ECE and "
            "MCE: Ding et al.'s adaptive bins (metrics/adaptive_bins.py), means over clients; AURC: the area under the "
            "risk-coverage curve, lower is better")
    statistics = {run.config.get("eval_statistics", "stored") for group in by_variant.values() for run in group}
    if "local" in statistics:
        note += ("; every model scored with BatchNorm statistics re-estimated on the client's own training images "
                 "(federate --eval-statistics local)" if statistics == {"local"} else
                 "; the variants' runs scored with different --eval-statistics")
    if holders:
        note += (f". {', '.join(holders)} held the held-apart set: real labelled images from every node "
                 "(FedPerl's global validation set, read by the validation policies)")
    return ReportTable("few_labels" if model == "last" else "few_labels_best_validation", title, frame, note,
                       rows_are="variant")


def community_tables(subs: list[SubExperiment]) -> list[Built]:
    """Per peer-learning variant: how often each node (rows) chose each peer (columns), over rounds and seeds."""
    choices: dict[str, list[pd.DataFrame]] = defaultdict(list)
    for run, _ in few_labels_runs(subs):
        if (run.folder / "peers.csv").is_file():
            choices[variant(run)].append(pd.read_csv(run.folder / "peers.csv"))
    if not choices:
        return [Missing("Peer choices (FedPerl's community matrix)", "a fedperl or fedmatch run with peers (peers.csv)")]
    tables = []
    for name, frames in choices.items():
        chosen = pd.concat(frames)
        nodes = nodes_of(subs) or sorted(set(chosen.node) | set(chosen.peer))
        matrix = pd.crosstab(chosen.node, chosen.peer).reindex(index=nodes, columns=nodes, fill_value=0)
        tables.append(ReportTable(f"community__{''.join(c if c.isalnum() else '_' for c in name)}",
                                  f"Peer choices of {name}: how often each node chose each peer", matrix.astype(str),
                                  f"counts over {chosen['round'].nunique()} round(s) and {len(frames)} seed(s)",
                                  rows_are="node"))
    return tables
