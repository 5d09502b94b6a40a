"""The report stage against hand-made artifacts: every number below is known in advance.

No training: each experiment folder is written directly (manifest, metrics.csv, comm.csv,
config.json, GAN configs, audit summaries, sweep ledgers) with the formats the stages write.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from statistics import stdev

import pandas as pd
import pytest

from fedcli.experiment.config import METRIC_COLUMNS, ReportConfig
from fedcli.federate.strategies import REGISTRY
from fedcli.report import build, feder_study, figures, privacy_tables, skew_study, summaries
from fedcli.report.table import Missing, ReportTable
from fedcli.report.collect import Stat, by_dp_setting, load_experiment, replicate_groups
from fedcli.report.render import latex, markdown, numeric
from fedcli.report.tables import gan_table

NODES = ("n0", "n1")
# Each metric is a fixed multiple of the accuracy given, so a table in another metric is predictable.
SCALE = {"accuracy": 1.0, "balanced_accuracy": 0.5, "f1_macro": 0.25, "auroc": 0.1, "sensitivity": 0.9,
         "specificity": 0.8, "ece": 0.05, "f1_weighted": 0.3, "precision_macro": 0.35, "precision_weighted": 0.4,
         "auprc": 0.45, "adaptive_ece": 0.06, "adaptive_mce": 0.07}
COLUMNS = ["round", "strategy", "model_node", "test_node", "n_test"] + [
    f"{m}{suffix}" for m in SCALE for suffix in ("", "_lo", "_hi")]
# Rounds before the last get these values in turn, far from every final one: using them shows.
EARLIER = (0.1, 0.99)
MB = 1e6


# ---------------------------------------------------------------------------------------------
# Artifact writers


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def write_manifest(folder: Path, seed: int = 0, skew: float = 0.25) -> None:
    """n0: train labels [0, 0, 1], test [0, 1]; n1: train [1, 1, 1], test [1]."""
    layout = {"n0": ([0, 0, 1], [0, 1]), "n1": ([1, 1, 1], [1])}
    nodes = [{"name": name, "site": f"site-{name}", "acquisition": {"name": "none"},
              "train": [{"id": f"{name}-tr{i}", "label": label, "index": i, "fold": i % 2}
                        for i, label in enumerate(train)],
              "test": [{"id": f"{name}-te{i}", "label": label, "index": 100 + i} for i, label in enumerate(test)]}
             for name, (train, test) in layout.items()]
    write_json(folder / "partition" / "manifest.json", {
        "schema": "fedcli.manifest/1", "source": "digits", "scheme": "site-shift", "seed": seed, "image_size": 16,
        "channels": 1, "label_names": ["neg", "pos"], "test_fraction": 0.2, "folds": 2, "nodes": nodes,
        "statistics": {"label_skew_js": skew, "label_skew_ks": None}})


def write_metrics(folder: Path, strategy: str, final: dict[tuple[str, str], float], rounds: int) -> None:
    """metrics.csv with rounds 0..rounds; `final` maps (model_node, test_node) to the last round's accuracy."""
    rows = []
    for round_ in range(rounds + 1):
        for (model, test), acc in final.items():
            acc = acc if round_ == rounds else EARLIER[round_ % len(EARLIER)]
            row = {"round": round_, "strategy": strategy, "model_node": model, "test_node": test, "n_test": 20}
            for metric, scale in SCALE.items():
                value = acc * scale
                row[metric], row[f"{metric}_lo"], row[f"{metric}_hi"] = value, value - 0.01, value + 0.01
            rows.append(row)
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=COLUMNS).to_csv(folder / "metrics.csv", index=False)


def write_run(folder: Path, strategy: str, final: dict, rounds: int = 2, epochs: int = 1, fold: int | None = None,
              buffer_size: int | None = None, comm: list[tuple] | None = None) -> None:
    """One strategy's federate output folder (final run or cross-validation fold). Its config records the shared
    options and only the options its strategy declares, as federate's config.json does."""
    write_metrics(folder, strategy, final, rounds)
    declared = {f.name for f in REGISTRY[strategy].option_fields()}
    options = {k: v for k, v in {"mu": 0.01, "buffer_size": buffer_size, "replay_mix": "batch",
                                 "encoder_rule": "plateau"}.items() if k in declared}
    config = {"exp": "x", "rounds": rounds, "epochs": epochs, "lr": 0.001, **options,
              "fold": fold, "cv": fold is not None, "seed": 0, "strategy": strategy, "inputs": {}}
    write_json(folder / "config.json", {"stage": "federate", "fedcli_version": "0.1.0", "seed": 0, "config": config,
                                        "inputs": {}})
    if comm is not None:
        pd.DataFrame(comm, columns=["round", "sender", "receiver", "kind", "bytes"]).to_csv(folder / "comm.csv",
                                                                                         index=False)


def write_gan(folder: Path, node: str, fid1: float, fid2: float, alpha: float = 1.0, kept: int = 100) -> None:
    """`kept` < 100: the FID factor stopped phase 2 after the snapshot of iteration `kept`."""
    phase2 = {"fid": fid2, "kept_iteration": kept} | ({"iterations": 100, "stopped": "cap"} if kept == 100
                                                      else {"iterations": kept + 20, "stopped": "fid-factor"})
    write_json(folder / "gan" / node / "config.json", {
        "stage": "train-gan", "config": {"alpha": alpha}, "node": node,
        "metric_names": {"fid": "fid[alex-random]"}, "phase1": {"fid": fid1, "iterations": 400, "stopped": "cap"},
        "phase2": phase2, "buffer": {"size": 512}})


def write_audit(folder: Path, node: str, lpips_ctrl: float, lpips_priv: float, auroc_ctrl: float, auroc_priv: float,
                share: float, verdict: str, auroc_std: float | None = None) -> None:
    """A node's audit summary; `auroc_std` adds the standard generator, as audit-privacy --standard does."""
    write_json(folder / "audit" / node / "config.json", {"stage": "audit-privacy", "config": {}})
    rebuilt = {"members": 0.1, "non_members": 0.1}
    ratio = lpips_priv / lpips_ctrl
    write_json(folder / "audit" / node / "summary.json", {
        "generators": ({} if auroc_std is None else {"standard": {"member_lpips_mean": lpips_ctrl,
                                                                  "mia": {"auroc": auroc_std}}}) | {
                       "control": {"member_lpips_mean": lpips_ctrl, "mia": {"auroc": auroc_ctrl}},
                       "privacy": {"member_lpips_mean": lpips_priv, "reconstruction_share": rebuilt,
                                   "mia": {"auroc": auroc_priv, "tpr_at_min_fpr": {"tpr": 0.25, "min_fpr": 0.1,
                                                                                  "ci_low": 0.1, "ci_high": 0.45}}}},
        "privacy_effect": {"median_ratio": ratio, "p_value": 0.001, "verdict": "significant",
                           "pixel": {"median_ratio": 1.2}, "independent": {"median_ratio": 1.3}},
        "buffer": {"dcr_share": share}, "node": node, "lpips_network": "alex-random",
        "verdict": {"result": verdict, "reasons": [f"reason of {node}"] if verdict == "fail" else []},
        "controls": {"memoriser": {"expected": "verdict fail", "observed": f"verdict {verdict}",
                                   "holds": verdict == "fail"}}})


def write_point(folder: Path, *point: tuple) -> None:
    write_json(folder / ".fedcli-run.json", {"units": {}, "point": [list(p) for p in point]})


def own_cross(own: dict[str, float], cross: dict[tuple[str, str], float], ensemble: dict | None = None) -> dict:
    """(model, test) -> accuracy from each node's own score, its cross scores and the ensemble's."""
    cells = {(node, node): v for node, v in own.items()} | dict(cross)
    return cells | {("ensemble", test): v for test, v in (ensemble or {}).items()}


def shared(name: str, values: dict[str, float]) -> dict:
    return {(name, test): v for test, v in values.items()}


# ---------------------------------------------------------------------------------------------
# The experiments

# Final-round accuracies of the single experiment. Own-model scores per strategy:
#   feder .80 .90 (mean .85) | feder-a .70 .80 (.75) | fedavg .90 .50 (.70) | standalone .75 .85 (.80)
#   central .60 .70 (.65)
FEDER = own_cross({"n0": 0.8, "n1": 0.9}, {("n0", "n1"): 0.6, ("n1", "n0"): 0.7}, {"n0": 0.85, "n1": 0.95})
FEDER_A = own_cross({"n0": 0.7, "n1": 0.8}, {("n0", "n1"): 0.5, ("n1", "n0"): 0.6})
STANDALONE = own_cross({"n0": 0.75, "n1": 0.85}, {("n0", "n1"): 0.4, ("n1", "n0"): 0.3})
FEDAVG = shared("global", {"n0": 0.9, "n1": 0.5})
CENTRAL = shared("central", {"n0": 0.6, "n1": 0.7})

# feder, 2 rounds: 5 MB sent by the nodes (4 MB models, 1 MB buffers), the same received.
FEDER_COMM = [(1, "n0", "n1", "model", 1_000_000), (1, "n0", "n1", "buffer", 500_000),
              (1, "n1", "n0", "model", 1_000_000), (1, "n1", "n0", "buffer", 500_000),
              (2, "n0", "n1", "model", 1_000_000), (2, "n1", "n0", "model", 1_000_000),
              (2, "n0", "n1", "eval", 1_500_000), (2, "n1", "n0", "eval", 1_500_000)]  # cross-evaluation only
# fedavg, 1 round: each node contributes a 1 MB all-reduce volume at rounds 0 and 1.
FEDAVG_COMM = [(r, n, "all", "all-reduce", 1_000_000) for r in (0, 1) for n in ("n0", "n1")]


def make_single(exp: Path) -> Path:
    """One experiment: partition, GANs, audits, five strategies, and cross-validation folds."""
    write_manifest(exp)
    fed = exp / "federate"
    write_run(fed / "feder", "feder", FEDER, rounds=2, buffer_size=20, comm=FEDER_COMM)
    write_run(fed / "feder-a", "feder-a", FEDER_A, rounds=2, buffer_size=20)
    write_run(fed / "standalone", "standalone", STANDALONE, rounds=1)
    write_run(fed / "fedavg", "fedavg", FEDAVG, rounds=1, comm=FEDAVG_COMM)
    write_run(fed / "central", "central", CENTRAL, rounds=1, comm=[])
    # Cross-validation (the layout federate --cv and the runner's [select] write): own-model scores per fold.
    cv = [(fed / "cv", "feder", 2, 1, [{"n0": 0.6, "n1": 0.8}, {"n0": 0.7, "n1": 0.9}]),
          (fed / "cv", "fedavg", 2, 1, [{"n0": 0.5, "n1": 0.6}, {"n0": 0.7, "n1": 0.4}]),
          (exp / "select" / "rounds=4,epochs=2" / "federate" / "cv", "feder", 4, 2,
           [{"n0": 0.9, "n1": 0.7}, {"n0": 0.8, "n1": 1.0}])]
    for root, strategy, rounds, epochs, folds in cv:
        for k, own in enumerate(folds):
            cells = shared("global", own) if strategy == "fedavg" else own_cross(own, {("n0", "n1"): 0.0})
            write_run(root / strategy / f"fold{k}", strategy, cells, rounds=rounds, epochs=epochs, fold=k)
    write_gan(exp, "n0", 50.0, 60.0)
    write_gan(exp, "n1", 40.0, 70.0, kept=0)
    write_audit(exp, "n0", 0.01, 0.05, 0.70, 0.52, 0.50, "pass", auroc_std=0.66)
    write_audit(exp, "n1", 0.02, 0.06, 0.65, 0.55, 0.45, "fail", auroc_std=0.64)
    return exp


def make_seeds(exp: Path) -> Path:
    """A seed sweep: runs/seed=0 and runs/seed=1, feder and standalone in each, one audit each."""
    write_json(exp / ".fedcli-run.json", {"units": {}})
    per_seed = {
        0: (own_cross({"n0": 0.8, "n1": 0.6}, {("n0", "n1"): 0.5, ("n1", "n0"): 0.4}),
            own_cross({"n0": 0.7, "n1": 0.5}, {("n0", "n1"): 0.2, ("n1", "n0"): 0.3}), 0.05, "pass"),
        1: (own_cross({"n0": 0.7, "n1": 0.9}, {("n0", "n1"): 0.3, ("n1", "n0"): 0.6}),
            own_cross({"n0": 0.9, "n1": 0.7}, {("n0", "n1"): 0.2, ("n1", "n0"): 0.3}), 0.07, "fail"),
    }
    for seed, (feder, standalone, lpips_priv, verdict) in per_seed.items():
        sub = exp / "runs" / f"seed={seed}"
        write_point(sub, ("partition", "seed", seed))
        write_manifest(sub, seed=seed)
        write_run(sub / "federate" / "feder", "feder", feder, rounds=2, buffer_size=20)
        write_run(sub / "federate" / "standalone", "standalone", standalone, rounds=2)
        write_audit(sub, "n0", 0.01, lpips_priv, 0.6, 0.5, 0.5, verdict)
    return exp


def make_buffers(exp: Path) -> Path:
    """A buffer-size sweep: 0 (one seed) and 20 (seeds 0 and 1), FedER only."""
    subs = [("buffer-size=0", [("federate", "buffer_size", 0)], 0,
             {("n0", "n0"): 0.5, ("n1", "n0"): 0.3, ("n0", "n1"): 0.2, ("n1", "n1"): 0.6}),
            ("buffer-size=20", [("federate", "buffer_size", 20)], 20,
             {("n0", "n0"): 0.8, ("n1", "n0"): 0.7, ("n0", "n1"): 0.6, ("n1", "n1"): 0.9}),
            ("buffer-size=20,seed=1", [("federate", "buffer_size", 20), ("partition", "seed", 1)], 20,
             {("n0", "n0"): 0.9, ("n1", "n0"): 0.5, ("n0", "n1"): 0.4, ("n1", "n1"): 0.7})]
    for name, point, size, cells in subs:
        sub = exp / "runs" / name
        write_point(sub, *point)
        write_manifest(sub)
        write_run(sub / "federate" / "feder", "feder", cells, rounds=2, buffer_size=size)
    return exp


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    return make_single(tmp_path_factory.mktemp("single") / "exp")


@pytest.fixture(scope="module")
def single_report(single) -> build.Report:
    return build.run(ReportConfig(exp=single))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Path:
    return make_seeds(tmp_path_factory.mktemp("seeds") / "exp")


@pytest.fixture(scope="module")
def seeds_report(seeds) -> build.Report:
    return build.run(ReportConfig(exp=seeds))


@pytest.fixture(scope="module")
def buffers(tmp_path_factory) -> Path:
    return make_buffers(tmp_path_factory.mktemp("buffers") / "exp")


@pytest.fixture(scope="module")
def buffers_report(buffers) -> build.Report:
    return build.run(ReportConfig(exp=buffers))


# ---------------------------------------------------------------------------------------------
# Helpers for the assertions


def cell(table: ReportTable, row: str, column: str) -> Stat:
    value = table.frame.loc[row, column]
    assert isinstance(value, Stat), (row, column, value)
    return value


def means(table: ReportTable) -> dict[str, dict[str, float]]:
    """{row: {column: mean}} of every Stat cell."""
    return {str(row): {str(c): v.mean for c, v in cells.items() if isinstance(v, Stat)}
            for row, cells in table.frame.iterrows()}


def assert_means(table: ReportTable, expected: dict[str, dict[str, float]]) -> None:
    got = means(table)
    assert list(got) == list(expected)
    for row, values in expected.items():
        assert got[row] == pytest.approx(values), row


def assert_stat(value: Stat, mean: float, std: float, n: int) -> None:
    assert value.n == n
    assert value.mean == pytest.approx(mean, abs=1e-12)
    assert value.std == pytest.approx(std, abs=1e-12)


def built(result) -> ReportTable:
    assert isinstance(result, ReportTable), result
    return result


def read_csv(report: build.Report, key: str) -> pd.DataFrame:
    return pd.read_csv(report.path.parent / f"{key}.csv")


# ---------------------------------------------------------------------------------------------
# Node performance: Table 2, Table 4, the headline


def test_table2_own_model_at_final_round_and_shared_models(single):
    table = built(feder_study.table2(load_experiment(single), "accuracy"))
    assert list(table.frame.index) == ["feder", "standalone", "central"]
    assert list(table.frame.columns) == ["n0", "n1", "mean"]
    assert_means(table, {
        "feder": {"n0": 0.8, "n1": 0.9, "mean": 0.85},
        "standalone": {"n0": 0.75, "n1": 0.85, "mean": 0.8},
        "central": {"n0": 0.6, "n1": 0.7, "mean": 0.65},  # the one central model on each test set
    })
    for row in table.frame.index:
        for column in table.frame.columns:
            assert cell(table, row, column).n == 1 and cell(table, row, column).std == 0.0


def test_table4_compares_federated_strategies_with_the_global_model(single):
    table = built(feder_study.table4(load_experiment(single), "accuracy"))
    assert list(table.frame.index) == ["feder", "fedavg"]
    assert means(table)["fedavg"] == pytest.approx({"n0": 0.9, "n1": 0.5, "mean": 0.7})
    assert means(table)["feder"] == pytest.approx({"n0": 0.8, "n1": 0.9, "mean": 0.85})


def test_headline_has_every_strategy(single):
    table = built(feder_study.headline(load_experiment(single), "accuracy"))
    assert list(table.frame.index) == ["feder", "feder-a", "fedavg", "standalone", "central"]
    assert {row: m["mean"] for row, m in means(table).items()} == pytest.approx(
        {"feder": 0.85, "feder-a": 0.75, "fedavg": 0.7, "standalone": 0.8, "central": 0.65})


@pytest.mark.parametrize("choice", list(METRIC_COLUMNS))
def test_metric_choice_picks_its_column(single, choice):
    metric = METRIC_COLUMNS[choice]
    scale = SCALE[metric]
    table = built(feder_study.table2(load_experiment(single), metric))
    assert means(table)["feder"] == pytest.approx({"n0": 0.8 * scale, "n1": 0.9 * scale, "mean": 0.85 * scale})
    assert means(table)["central"] == pytest.approx({"n0": 0.6 * scale, "n1": 0.7 * scale, "mean": 0.65 * scale})


def test_balanced_accuracy_report_shows_balanced_accuracy(tmp_path):
    exp = make_single(tmp_path / "exp")
    report = build.run(ReportConfig(exp=exp, metric="balanced-accuracy"))
    frame = read_csv(report, "table2_node_performance").set_index("strategy")
    assert frame.loc["feder", "n0"] == pytest.approx(0.4)
    assert frame.loc["feder", "mean"] == pytest.approx(0.425)
    assert frame.loc["central", "n1"] == pytest.approx(0.35)
    assert "Metric: balanced-accuracy" in report.path.read_text()
    assert "balanced_accuracy of each node's final model" in report.path.read_text()


def test_rounds_figure_curve_uses_every_round(single):
    subs = load_experiment(single)
    feder = subs[0].run("feder").metrics
    # own models only (not the cross scores, not the ensemble): rounds 0 and 1 are EARLIER, round 2 final
    assert figures.per_round(feder, "accuracy") == pytest.approx({0: 0.1, 1: 0.99, 2: 0.85})
    assert figures.per_round(subs[0].run("fedavg").metrics, "accuracy") == pytest.approx({0: 0.1, 1: 0.7})


# ---------------------------------------------------------------------------------------------
# Replicates


def test_replicates_give_mean_and_sample_std(seeds):
    subs = load_experiment(seeds)
    assert [s.folder.name for s in subs] == ["seed=0", "seed=1"]  # the sweep root holds no artifacts
    assert list(replicate_groups(subs)) == [""]
    table = built(feder_study.table2(subs, "accuracy"))
    assert_stat(cell(table, "feder", "n0"), 0.75, stdev([0.8, 0.7]), 2)
    assert_stat(cell(table, "feder", "n1"), 0.75, stdev([0.6, 0.9]), 2)
    assert_stat(cell(table, "feder", "mean"), 0.75, stdev([0.7, 0.8]), 2)  # mean over seeds of per-task means
    assert_stat(cell(table, "standalone", "n0"), 0.8, stdev([0.7, 0.9]), 2)
    assert_stat(cell(table, "standalone", "mean"), 0.7, stdev([0.6, 0.8]), 2)
    assert stdev([0.8, 0.7]) == pytest.approx(0.0707107, abs=1e-6)  # sample std (ddof=1), not population
    assert str(cell(table, "feder", "n0")) == "0.750 ± 0.071"
    assert str(cell(table, "feder", "n1")) == "0.750 ± 0.212"


def test_replicates_in_report_md_csv_and_tex(seeds_report):
    text = seeds_report.path.read_text()
    assert "| feder | 0.750 ± 0.071 | 0.750 ± 0.212 | 0.750 ± 0.071 |" in text
    assert "2 sub-experiment(s) in 1 group(s)" in text
    frame = read_csv(seeds_report, "table2_node_performance").set_index("strategy")
    assert frame.loc["feder", "n0"] == pytest.approx(0.75)
    assert frame.loc["feder", "n0_std"] == pytest.approx(stdev([0.8, 0.7]))
    assert frame.loc["feder", "n0_n"] == 2
    tex = (seeds_report.path.parent / "tex" / "table2_node_performance.tex").read_text()
    assert r"feder & 0.750 $\pm$ 0.071 & 0.750 $\pm$ 0.212 & 0.750 $\pm$ 0.071 \\" in tex


def test_table3_pools_node_models_over_replicates(seeds):
    table = built(feder_study.table3(load_experiment(seeds), "accuracy"))
    # on n0's test set: n0's and n1's models, both seeds; likewise n1
    assert_stat(cell(table, "feder", "n0"), 0.625, stdev([0.8, 0.4, 0.7, 0.6]), 4)
    assert_stat(cell(table, "feder", "n1"), 0.575, stdev([0.5, 0.6, 0.3, 0.9]), 4)


def test_paired_differences_from_feder_are_taken_within_each_seed(seeds):
    paired = built(feder_study.paired_table(load_experiment(seeds), "accuracy"))
    row = paired.frame.loc["standalone"]
    # own test sets: seed 0 0.6 - 0.7, seed 1 0.8 - 0.8; t(0.975, 1) = 12.71 times the standard error 0.05
    assert row["seeds"] == 2 and row["own test sets (Tables 2, 4, 7)"] == "-0.050 [-0.685, +0.585]"
    # every node model on every test set: seed 0 0.425 - 0.575, seed 1 0.525 - 0.625
    assert row["every node model, every test set (Table 3)"] == "-0.125 [-0.443, +0.193]"
    assert isinstance(feder_study.paired_table(load_experiment(seeds)[:1], "accuracy"), Missing)


def test_privacy_table_over_replicates(seeds):
    table = built(privacy_tables.privacy_table(load_experiment(seeds)))
    assert_stat(cell(table, "n0", "LPIPS priv"), 0.06, stdev([0.05, 0.07]), 2)
    assert table.frame.loc["n0", "verdict"] == "fail, pass"
    assert "AUROC std" not in table.frame.columns  # audited without --standard


# ---------------------------------------------------------------------------------------------
# Table 3, best marking, Tables 5, 7, 8, 1, privacy, partition, GAN


def test_table3_convergence_mean_and_std_over_node_models(single):
    table = built(feder_study.table3(load_experiment(single), "accuracy"))
    assert list(table.frame.index) == ["feder", "standalone"]
    assert_stat(cell(table, "feder", "n0"), 0.75, stdev([0.8, 0.7]), 2)
    assert_stat(cell(table, "feder", "n1"), 0.75, stdev([0.6, 0.9]), 2)
    assert_stat(cell(table, "standalone", "n0"), 0.525, stdev([0.75, 0.3]), 2)
    assert_stat(cell(table, "standalone", "n1"), 0.625, stdev([0.4, 0.85]), 2)
    assert stdev([0.6, 0.9]) == pytest.approx(0.2121320, abs=1e-6)


def test_table4_bolds_the_best_of_each_column_only(single):
    table = built(feder_study.table4(load_experiment(single), "accuracy"))
    md = markdown(table).splitlines()
    assert "| feder | 0.800 | **0.900** | **0.850** |" in md
    assert "| fedavg | **0.900** | 0.500 | 0.700 |" in md
    rows = [line for line in md if line.startswith("| fed")]
    assert sum(line.count("**") for line in rows) == 2 * 3
    tex = latex(table)
    assert r"feder & 0.800 & \textbf{0.900} & \textbf{0.850} \\" in tex
    assert r"fedavg & \textbf{0.900} & 0.500 & 0.700 \\" in tex
    assert tex.count(r"\textbf") == 3


def test_headline_bolds_best_across_all_strategies(single):
    md = markdown(built(feder_study.headline(load_experiment(single), "accuracy")))
    assert "| fedavg | **0.900** | 0.500 | 0.700 |" in md
    assert "| feder | 0.800 | **0.900** | **0.850** |" in md
    assert "| standalone | 0.750 | 0.850 | 0.800 |" in md
    assert md.count("**") == 2 * 3 + 2  # three best cells, plus the bold title


def test_tables_without_mark_best_bold_nothing(single):
    tex = latex(built(feder_study.table2(load_experiment(single), "accuracy")))
    assert r"\textbf" not in tex


def test_table5_single_vs_ensemble(single):
    table = built(feder_study.table5(load_experiment(single), "accuracy"))
    assert list(table.frame.index) == ["feder"]  # only feder has ensemble rows here
    assert_stat(cell(table, "feder", "n0 single"), 0.75, stdev([0.8, 0.7]), 2)
    assert_stat(cell(table, "feder", "n0 ensemble"), 0.85, 0.0, 1)
    assert_stat(cell(table, "feder", "n1 single"), 0.75, stdev([0.6, 0.9]), 2)
    assert_stat(cell(table, "feder", "n1 ensemble"), 0.95, 0.0, 1)
    assert_stat(cell(table, "feder", "mean single"), 0.75, stdev([0.8, 0.7, 0.6, 0.9]), 4)
    assert_stat(cell(table, "feder", "mean ensemble"), 0.9, stdev([0.85, 0.95]), 2)


def test_table7_variants(single):
    table = built(feder_study.table7(load_experiment(single), "accuracy"))
    assert list(table.frame.index) == ["feder", "feder-a"]
    assert means(table)["feder-a"] == pytest.approx({"n0": 0.7, "n1": 0.8, "mean": 0.75, "convergence": 0.65,
                                                     "model spread": (stdev([0.7, 0.6]) + stdev([0.5, 0.8])) / 2})
    assert means(table)["feder"] == pytest.approx({"n0": 0.8, "n1": 0.9, "mean": 0.85, "convergence": 0.75,
                                                   "model spread": (stdev([0.8, 0.7]) + stdev([0.6, 0.9])) / 2})
    assert cell(table, "feder-a", "convergence").std == pytest.approx(0.0)  # both test sets average 0.65
    assert cell(table, "feder-a", "model spread").std == pytest.approx(stdev([stdev([0.7, 0.6]),
                                                                              stdev([0.5, 0.8])]))


def test_table8_bytes_per_node(single):
    table = built(feder_study.table8(load_experiment(single), "accuracy"))
    assert list(table.frame.index) == ["feder", "fedavg", "central"]  # runs with a comm.csv
    assert list(table.frame.columns) == ["training sent/node (MB)", "training received/node (MB)", "model (MB)",
                                         "buffer (MB)", "all-reduce (MB)", "eval (MB)",
                                         "training sent/node/round (MB)"]
    got = means(table)
    assert got["feder"] == pytest.approx({"training sent/node (MB)": 2.5, "training received/node (MB)": 2.5,
                                          "model (MB)": 2.0, "buffer (MB)": 0.5, "all-reduce (MB)": 0.0,
                                          "eval (MB)": 1.5, "training sent/node/round (MB)": 1.25})
    assert got["fedavg"] == pytest.approx({"training sent/node (MB)": 2.0, "training received/node (MB)": 2.0,
                                           "model (MB)": 0.0, "buffer (MB)": 0.0, "all-reduce (MB)": 2.0,
                                           "eval (MB)": 0.0, "training sent/node/round (MB)": 2.0})
    assert all(v == 0 for v in got["central"].values())


def test_the_batchnorm_table_reads_each_gap_as_sound_lag_the_training_mix_or_the_average(tmp_path):
    """(stored, refreshed, as trained) per node's own test set; the reading follows the largest gaps."""
    cases = {"standalone": [(0.90, 0.91, 0.91), (0.80, 0.80, 0.80)],  # within 0.02: sound
             "feder-a": [(0.70, 0.90, 0.90), (0.80, 0.80, 0.80)],  # as trained far from stored: lag
             "feder": [(0.90, 0.80, 0.91), (0.80, 0.85, 0.80)],  # stored = as trained, refreshed apart: the mix
             "cyclic": [(0.90, 0.86, 0.90), (0.80, 0.80, 0.80)],  # real only, refresh unaugmented: still the mix
             "fedavg": [(0.60, 0.90, 0.90), (0.90, 0.90, 0.90)]}  # one shared model: the average
    write_manifest(tmp_path)
    for name, per_node in cases.items():
        folder = tmp_path / "federate" / name
        write_run(folder, name, own_cross({"n0": per_node[0][0], "n1": per_node[1][0]}, {}), rounds=1)
        key = "global" if name == "fedavg" else None
        pd.DataFrame([{"model_node": key or node, "test_node": node, "accuracy_stored": a, "accuracy_refreshed": b,
                       "accuracy_refreshed_as_trained": c} for node, (a, b, c) in zip(NODES, per_node)]
                     ).to_csv(folder / "bn_statistics.csv", index=False)
    table = built(feder_study.batchnorm_table(load_experiment(tmp_path), "accuracy"))
    assert dict(table.frame["reading"]) == {
        "standalone": "sound", "feder-a": "lag: the statistics trail the weights",
        "feder": "the training mix (real + received buffer), not lag",
        "cyclic": "the training mix (real images, augmented as in training), not lag",
        "fedavg": "the average: one set of statistics shared by hospitals that differ"}
    assert cell(table, "feder", "largest gap, refreshed vs stored").mean == pytest.approx(0.10)
    assert cell(table, "feder", "largest gap, as trained vs stored").mean == pytest.approx(0.01)
    assert cell(table, "feder-a", "stored").mean == pytest.approx(0.75)


def test_table1_cross_validation_grid(single):
    table = built(feder_study.table1(load_experiment(single), "accuracy"))
    frame = table.frame.reset_index()
    assert list(frame.columns) == ["strategy", "rounds", "epochs", "n0", "n1", "mean", "chosen"]
    rows = {(r.strategy, r.rounds, r.epochs): r for r in frame.itertuples()}
    assert set(rows) == {("feder", 2, 1), ("feder", 4, 2), ("fedavg", 2, 1)}
    short, long, avg = rows["feder", 2, 1], rows["feder", 4, 2], rows["fedavg", 2, 1]
    assert_stat(short.n0, 0.65, stdev([0.6, 0.7]), 2)
    assert_stat(short.n1, 0.85, stdev([0.8, 0.9]), 2)
    assert_stat(short.mean, 0.75, stdev([0.7, 0.8]), 2)
    assert_stat(long.n0, 0.85, stdev([0.9, 0.8]), 2)
    assert_stat(long.n1, 0.85, stdev([0.7, 1.0]), 2)
    assert_stat(long.mean, 0.85, stdev([0.8, 0.9]), 2)
    assert_stat(avg.mean, 0.55, 0.0, 2)
    assert (short.chosen, long.chosen, avg.chosen) == ("", "yes", "yes")  # best mean per strategy


def test_privacy_table(single):
    table = built(privacy_tables.privacy_table(load_experiment(single)))
    assert list(table.frame.index) == ["n0", "n1"]
    assert_means(table, {
        "n0": {"LPIPS ctrl": 0.01, "LPIPS priv": 0.05, "effect": 5.0, "AUROC std": 0.66, "AUROC ctrl": 0.70,
               "AUROC priv": 0.52, "buffer member share": 0.50},
        "n1": {"LPIPS ctrl": 0.02, "LPIPS priv": 0.06, "effect": 3.0, "AUROC std": 0.64, "AUROC ctrl": 0.65,
               "AUROC priv": 0.55, "buffer member share": 0.45}})
    assert list(table.frame["verdict"]) == ["pass", "fail"]
    assert list(table.frame["privacy effect"]) == ["significant"] * 2
    assert list(table.frame["effect pixel / independent"]) == ["1.200 / 1.300"] * 2
    assert list(table.frame["TPR at lowest FPR"]) == ["0.25 at 0.1 [0.10, 0.45]"] * 2
    assert "alex-random" in table.note and "Verdict reasons: n1: fail (reason of n1)" in table.note
    controls = built(privacy_tables.controls_table(load_experiment(single)))
    assert controls.frame.to_dict("index") == {
        "n0 memoriser": {"expected": "verdict fail", "observed": "verdict pass", "holds": "NO"},
        "n1 memoriser": {"expected": "verdict fail", "observed": "verdict fail", "holds": "yes"}}


def test_partition_and_gan_summaries(single):
    subs = load_experiment(single)
    part = built(summaries.partition_table(subs))
    assert part.frame.loc["n0"].to_dict() == {"site": "site-n0", "train": 3, "test": 2, "classes": "2/2",
                                              "smallest class (train)": 1}
    assert part.frame.loc["n1"].to_dict() == {"site": "site-n1", "train": 3, "test": 1, "classes": "1/2",
                                              "smallest class (train)": 3}
    assert "digits" in part.note and "0.25" in part.note
    gan = built(summaries.gan_summary(subs))
    assert_stat(cell(gan, "n1", "FID standard"), 40.0, 0.0, 1)
    assert_stat(cell(gan, "n1", "FID privacy"), 70.0, 0.0, 1)
    assert gan.frame.loc["n0", "iterations"] == "400 + 100" and gan.frame.loc["n0", "buffer"] == "512"
    # n1's phase 2 broke the FID limit at its first check: the table and the note say so
    assert gan.frame.loc["n0", "phase 2 kept"] == "100/100 (cap)"
    assert gan.frame.loc["n1", "phase 2 kept"] == "0/20 (fid-factor)"
    assert "FID limit" in gan.note and "on n1:" in gan.note


SETTINGS = {"r1_gamma": 0.05, "ada_kimg": 20, "ema_kimg": 10, "style_mixing": 0.9, "alpha": 1.0}


def test_the_gan_note_names_each_departure_from_the_studys_privacy_loss():
    assert summaries.settings_note(SETTINGS, {}, 1.0).endswith("alpha 1 all-pairs absolute (the study's form).")
    note = summaries.settings_note(SETTINGS | {"privacy_loss": "nearest", "privacy_scale": "relative"}, {}, 1.0)
    assert "departures: each synthetic image pushed from its nearest real training image; L_PP divided by" in note


def test_train_gan_table_says_when_the_fid_factor_left_the_standard_generator():
    def summary(node, kept, run, stopped):
        return {"node": node, "train_images": 10, "metric_names": {"fid": "fid[cnn-node]"},
                "fid": {"calibrated": False}, "buffer": {"size": 30},
                "phase1": {"fid": 5.0, "iterations": 40, "stopped": "cap"},
                "phase2": {"fid": 6.0, "kept_iteration": kept, "iterations": run, "stopped": stopped}}

    table = gan_table([summary("a", 0, 20, "fid-factor"), summary("b", 20, 40, "fid-factor"),
                       summary("c", 60, 60, "cap")])
    kept, stop = (list(table.columns[i].cells) for i in (6, 7))
    assert kept == ["0/20", "20/40", "60/60"]
    assert stop == ["fid-factor: = standard", "fid-factor", "cap"]


# ---------------------------------------------------------------------------------------------
# Table 6 across a buffer-size sweep


def test_table6_buffer_sizes_pooled_over_seeds(buffers):
    subs = load_experiment(buffers)
    assert list(replicate_groups(subs)) == ["buffer-size=0", "buffer-size=20"]
    table = built(feder_study.table6(subs, "accuracy"))
    assert list(table.frame.index) == ["buffer 0", "buffer 20"]
    assert table.frame.index.name == "buffer"
    assert_stat(cell(table, "buffer 0", "n0"), 0.4, stdev([0.5, 0.3]), 2)
    assert_stat(cell(table, "buffer 0", "n1"), 0.4, stdev([0.2, 0.6]), 2)
    assert_stat(cell(table, "buffer 0", "mean"), 0.4, 0.0, 2)
    assert_stat(cell(table, "buffer 20", "n0"), 0.725, stdev([0.8, 0.7, 0.9, 0.5]), 4)
    assert_stat(cell(table, "buffer 20", "n1"), 0.65, stdev([0.6, 0.9, 0.4, 0.7]), 4)
    assert_stat(cell(table, "buffer 20", "mean"), (0.725 + 0.65) / 2, stdev([0.725, 0.65]), 2)


def test_buffer_sweep_report_has_a_section_per_group(buffers_report):
    out = buffers_report.path.parent
    text = buffers_report.path.read_text()
    assert "## Federated learning (buffer-size=0)" in text and "## Federated learning (buffer-size=20)" in text
    assert "Table 6" in text.split("## Not in this report")[0]
    frame = pd.read_csv(out / "table6_buffer_size.csv").set_index("buffer")
    assert frame.loc["buffer 20", "n0"] == pytest.approx(0.725)
    assert frame.loc["buffer 20", "n0_n"] == 4
    # the group tables carry the group in their file name
    head20 = pd.read_csv(out / "headline__buffer-size=20.csv").set_index("strategy")
    assert head20.loc["feder", "n0"] == pytest.approx((0.8 + 0.9) / 2)
    assert head20.loc["feder", "n0_std"] == pytest.approx(stdev([0.8, 0.9]))
    assert (out / "figures" / "rounds_buffer-size=0.png").is_file()


# ---------------------------------------------------------------------------------------------
# build.run: the files


def test_report_writes_md_csv_tex_and_figures(single_report):
    out = single_report.path.parent
    assert single_report.path == out / "report.md" and out.name == "report"
    keys = {t.key for t in single_report.tables}
    assert {"partition_summary", "gan_summary", "headline", "table1_selection_grid", "table2_node_performance",
            "table3_node_convergence", "table4_federated", "table5_ensemble", "table7_variants",
            "table8_communication", "privacy_summary"} <= keys
    assert single_report.headline is not None and single_report.headline.key == "headline"
    for key in keys:
        assert (out / f"{key}.csv").is_file(), key
        tex = (out / "tex" / f"{key}.tex").read_text()
        assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule"), key
        assert f"[csv]({key}.csv)" in single_report.path.read_text()
    assert (out / "figures" / "rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_csv_columns_are_numbers(single_report):
    frame = read_csv(single_report, "table2_node_performance")
    assert list(frame.columns) == ["strategy", "n0", "n0_std", "n0_n", "n1", "n1_std", "n1_n", "mean", "mean_std",
                                   "mean_n"]
    for column in frame.columns[1:]:
        assert pd.api.types.is_numeric_dtype(frame[column]), column
    frame = frame.set_index("strategy")
    assert frame.loc["central", "mean"] == pytest.approx(0.65) and frame.loc["central", "mean_std"] == 0
    comm = read_csv(single_report, "table8_communication").set_index("strategy")
    assert comm.loc["feder", "training sent/node (MB)"] == pytest.approx(2.5)


def test_report_md_bold_and_missing_tables(single_report):
    text = single_report.path.read_text()
    assert "| fedavg | **0.900** | 0.500 | 0.700 |" in text
    body, missing = text.split("## Not in this report")
    assert "Table 6" not in body
    lines = [line for line in missing.splitlines() if line.startswith("- ")]
    assert any(line.startswith("- Table 6.") and "several buffer sizes" in line for line in lines), lines
    assert any("alpha" in line for line in lines)
    assert {m.title.split(".")[0] for m in single_report.missing} >= {"Table 6"}
    assert not any(m.title.startswith(("Table 1.", "Table 2.", "Table 4.")) for m in single_report.missing)


def test_report_on_partition_only_lists_every_federated_table_as_missing(tmp_path):
    write_manifest(tmp_path / "exp")
    report = build.run(ReportConfig(exp=tmp_path / "exp"))
    assert report.headline is None
    assert [t.key for t in report.tables] == ["partition_summary"]
    titles = " ".join(m.title for m in report.missing)
    for number in range(1, 9):
        assert f"Table {number}." in titles
    assert not (report.path.parent / "figures" / "rounds.png").exists()


def test_report_replaces_an_earlier_report(tmp_path):
    exp = make_single(tmp_path / "exp")
    build.run(ReportConfig(exp=exp))
    (exp / "report" / "stale.csv").write_text("x\n")
    build.run(ReportConfig(exp=exp))
    assert not (exp / "report" / "stale.csv").exists()
    assert (exp / "report" / "report.md").is_file()


def test_numeric_keeps_text_columns_as_text(single):
    frame = numeric(built(feder_study.table1(load_experiment(single), "accuracy")))
    assert sorted(frame["chosen"]) == ["", "yes", "yes"]
    assert not any(math.isnan(v) for v in frame["mean"])


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_positional_folder(cli, tmp_path):
    exp = make_single(tmp_path / "exp")
    result = cli.ok("report", exp)
    assert (exp / "report" / "report.md").is_file()
    assert "wrote" in result.output and "Every strategy" in result.output


def test_cli_exp_option_and_metric(cli, tmp_path):
    exp = make_single(tmp_path / "exp")
    cli.ok("report", "--exp", exp, "--metric", "f1")
    frame = pd.read_csv(exp / "report" / "table2_node_performance.csv").set_index("strategy")
    assert frame.loc["feder", "n1"] == pytest.approx(0.9 * SCALE["f1_macro"])


def test_cli_empty_folder_is_a_user_error(cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = cli.user_error("report", empty)
    assert "no fedcli artifacts" in line
    assert not (empty / "report").exists()


def test_cli_missing_folder_is_a_user_error(cli, tmp_path):
    line = cli.user_error("report", "--exp", tmp_path / "nope")
    assert "does not exist" in line
    assert not (tmp_path / "nope").exists()


def test_cli_bogus_metric_is_a_user_error(cli, tmp_path):
    exp = make_single(tmp_path / "exp")
    line = cli.user_error("report", exp, "--metric", "bogus")
    assert "--metric" in line
    assert not (exp / "report").exists()


def test_cli_two_different_folders_is_a_user_error(cli, tmp_path):
    exp = make_single(tmp_path / "exp")
    line = cli.user_error("report", exp, "--exp", tmp_path / "other")
    assert "two experiment folders" in line
    assert not (exp / "report").exists()


# ---------------------------------------------------------------------------------------------
# Across a sweep: GAN alpha, scalability, shared runs


def write_nodes_manifest(folder: Path, n: int) -> None:
    nodes = [{"name": f"n{i}", "site": "s", "train": [{"id": f"n{i}-tr", "label": 0, "index": i, "fold": 0}],
              "test": [{"id": f"n{i}-te", "label": 0, "index": 100 + i}]} for i in range(n)]
    write_json(folder / "partition" / "manifest.json", {"source": "digits", "scheme": "iid", "seed": 0,
                                                        "image_size": 16, "label_names": ["a"], "nodes": nodes})


def test_alpha_table_shows_fid_distance_and_auroc_per_alpha(tmp_path):
    for alpha, fid, distance, auroc in ((0.0, 10.0, 0.1, 0.7), (2.0, 30.0, 0.3, 0.5)):
        sub = tmp_path / "runs" / f"alpha={alpha}"
        write_point(sub, ("train_gan", "alpha", alpha))
        write_manifest(sub)
        for node in NODES:
            write_gan(sub, node, fid1=1.0, fid2=fid, alpha=alpha)
            write_audit(sub, node, 0.1, 0.2, 0.6, auroc, 0.5, "pass")
            summary = json.loads((sub / "audit" / node / "summary.json").read_text())
            summary["buffer"]["synthetic_nearest_real_lpips_mean"] = distance
            write_json(sub / "audit" / node / "summary.json", summary)
        write_run(sub / "federate" / "feder", "feder", own_cross({"n0": 0.5 + alpha / 10, "n1": 0.7}, {}))
    table = feder_study.alpha_table(load_experiment(tmp_path), "accuracy")
    assert list(table.frame.index) == ["alpha 0", "alpha 2"]
    assert table.frame.loc["alpha 2", "FID"].mean == 30.0 and table.frame.loc["alpha 0", "FID"].n == 2
    assert table.frame.loc["alpha 2", "nearest-real LPIPS"].mean == pytest.approx(0.3)
    assert table.frame.loc["alpha 0", "AUROC priv"].mean == pytest.approx(0.7)
    assert table.frame.loc["alpha 2", "privacy effect"].mean == pytest.approx(2.0)
    assert table.frame.loc["alpha 2", "FedER accuracy"].mean == pytest.approx((0.7 + 0.7) / 2)
    assert isinstance(feder_study.alpha_table(load_experiment(tmp_path)[:1], "accuracy"), Missing)


def test_dp_table_orders_settings_and_shows_the_guarantee_utility_and_attack_per_node(tmp_path):
    settings = {"off": (None, 0.9, 0.60), 10.0: (9.9, 0.8, 0.55), 1.0: (0.99, 0.5, 0.50),
                math.inf: (math.inf, 0.85, 0.5)}  # setting: epsilon spent, FedER accuracy, AUROC
    for setting, (spent, accuracy, auroc) in settings.items():
        sub = tmp_path / "runs" / f"dp-epsilon={setting}"
        write_point(sub, ("train_gan", "dp-epsilon", setting))
        write_manifest(sub)
        for node in NODES:
            write_gan(sub, node, fid1=1.0, fid2=2.0)
            write_audit(sub, node, 0.1, 0.1, auroc, auroc, 0.5, "pass")
            gan, audit = sub / "gan" / node / "config.json", sub / "audit" / node / "summary.json"
            config, summary = json.loads(gan.read_text()), json.loads(audit.read_text())
            config["config"]["dp_epsilon"] = None if setting == "off" else setting
            if spent is not None:
                dp = {"epsilon": spent, "delta": 1e-4, "noise_multiplier": 1.5}
                config["dp"], summary["dp"] = dp, dp | {"audit_bound": {"holds": setting != 1.0}}
            write_json(gan, config)
            write_json(audit, summary)
        write_run(sub / "federate" / "feder", "feder", own_cross({"n0": accuracy, "n1": accuracy}, {}))
    subs = load_experiment(tmp_path)
    table = built(feder_study.dp_table(subs, "accuracy"))
    assert list(table.frame.index) == [f"{setting}, {node}" for setting in
                                       ("epsilon 1", "epsilon 10", "epsilon inf", "no DP") for node in NODES]
    assert table.frame.loc["epsilon 10, n0", "epsilon spent"].mean == pytest.approx(9.9)
    assert table.frame.loc["epsilon 1, n1", "FedER accuracy"].mean == pytest.approx(0.5)
    assert table.frame.loc["no DP, n0", "AUROC"].mean == pytest.approx(0.6)
    assert table.frame.loc["no DP, n0", "epsilon spent"] == "-"
    assert table.frame.loc["epsilon 1, n0", "TPR within the DP bound"] == "NO"
    assert table.frame.loc["epsilon inf, n0", "TPR within the DP bound"] == "yes"
    assert isinstance(feder_study.dp_table(by_dp_setting(subs)[None], "accuracy"), Missing)


def test_scalability_figure_needs_several_node_counts_and_counts_a_shared_run_once(tmp_path):
    for n in (2, 3):
        sub = tmp_path / "runs" / f"nodes={n}"
        write_point(sub, ("partition", "nodes", n))
        write_nodes_manifest(sub, n)
        write_run(sub / "federate" / "fedavg", "fedavg", shared("global", {f"n{i}": 0.5 + n / 10 for i in range(n)}))
    subs = load_experiment(tmp_path)
    assert figures.scalability_figure(subs, "accuracy", tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    assert not figures.scalability_figure(subs[:1], "accuracy", tmp_path / "t.png")

    # a buffer sweep whose second point links the first one's FedER run (a symlink) counts it once
    buffers = tmp_path / "buffers"
    for size in (0, 10):
        sub = buffers / "runs" / f"buffer-size={size}"
        write_point(sub, ("federate", "buffer_size", size))
        write_manifest(sub)
        write_run(sub / "federate" / "feder", "feder", FEDER, buffer_size=size)
    linked = buffers / "runs" / "mu=1"
    write_point(linked, ("federate", "mu", 1.0))
    write_manifest(linked)
    (linked / "federate").mkdir()
    (linked / "federate" / "feder").symlink_to(buffers / "runs" / "buffer-size=10" / "federate" / "feder")
    table = feder_study.table6(load_experiment(buffers), "accuracy")
    assert table.frame.loc["buffer 10", "n0"].n == 2  # two node models, not four


def test_the_report_never_imports_the_pipeline_that_runs_it():
    """One direction only: fedcli run makes sub-experiments and the report reads them, through the naming
    both share (fedcli/experiment/subexperiments.py)."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, fedcli.report.build; "
                             "print(sorted(m for m in sys.modules if m.startswith('fedcli.pipeline')))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_paired_table_differences_strategies_on_the_same_resamples_of_each_test_set(tmp_path):
    """Two strategies' saved softmax on the same test sets: the table's point is the difference of their
    scores, and its interval the percentiles of that difference over the shared resamples (by hand)."""
    import numpy as np
    import torch

    from fedcli.experiment.artifacts import save_tensors
    from fedcli.metrics.scores import metric_values, resample_counts

    exp = tmp_path / "exp"
    write_manifest(exp)
    labels = {"n0": np.array([0, 1, 1, 0, 1, 0]), "n1": np.array([1, 1, 0, 1])}
    rng = np.random.default_rng(0)
    probs = {name: {node: rng.dirichlet(np.ones(2), len(y)) for node, y in labels.items()}
             for name in ("feder", "scaffold")}
    models = {"feder": {"n0": "n0", "n1": "n1"}, "scaffold": {"n0": "global", "n1": "global"}}
    for name in probs:
        folder = exp / "federate" / name
        write_run(folder, name, {(node if name == "feder" else "global", node): 0.5 for node in NODES})
        config = json.loads((folder / "config.json").read_text())
        config["config"]["bootstrap"] = 200
        write_json(folder / "config.json", config)
        save_tensors(folder / "predictions.safetensors",
                     {f"{models[name][node]}/{node}": torch.from_numpy(p) for node, p in probs[name].items()} |
                     {f"labels/{node}": torch.from_numpy(y) for node, y in labels.items()})
    frame = feder_study.table4_paired(load_experiment(exp), "specificity").frame

    def values(name, node):
        counts = np.vstack([np.ones((1, len(labels[node]))), resample_counts(0, node, len(labels[node]), 200)])
        return metric_values(labels[node], probs[name][node], counts, positive=1)["specificity"]

    diff = {node: values("scaffold", node) - values("feder", node) for node in NODES}
    diff["mean"] = (values("scaffold", "n0") + values("scaffold", "n1")) / 2 - \
        (values("feder", "n0") + values("feder", "n1")) / 2
    for column, d in diff.items():
        lo, hi = np.percentile(d[1:][np.isfinite(d[1:])], [2.5, 97.5])
        assert frame.loc["scaffold", column] == f"{d[0]:+.3f} [{lo:+.3f}, {hi:+.3f}]", column
    assert list(frame.index) == ["scaffold"] and frame.loc["scaffold", "seeds"] == 1



def skew_experiment(tmp_path, scores: dict) -> None:
    """Sub-experiments at (ks, seed), each with cwt's and fedavg's shared models scoring `scores[(ks, seed)]`."""
    for (ks, seed), (cwt, fedavg) in scores.items():
        sub = tmp_path / "runs" / f"ks={ks}_seed={seed}"
        write_point(sub, ("partition", "ks", ks), ("partition", "seed", seed))
        write_manifest(sub, seed)
        manifest = json.loads((sub / "partition" / "manifest.json").read_text())
        manifest |= {"ks": ks, "statistics": {"label_skew_js": 0.1, "label_skew_ks": ks + 0.01, "label_skew_tv": ks + 0.01,
                                              "test_label_skew_ks": 0.0, "test_label_skew_tv": 0.0}}
        write_json(sub / "partition" / "manifest.json", manifest)
        write_run(sub / "federate" / "cwt", "cwt", shared("global", {"n0": cwt, "n1": cwt}))
        write_run(sub / "federate" / "fedavg", "fedavg", shared("global", {"n0": fedavg - 0.1, "n1": fedavg + 0.1}))


def test_the_label_skew_table_and_figure_give_each_method_per_skew_level_over_seeds(tmp_path):
    """Two KS levels, two seeds each: cwt's shared model and fedavg's, mean over nodes, then over seeds."""
    scores = {(0.0, 0): (0.9, 0.7), (0.0, 1): (0.8, 0.6), (0.6, 0): (0.5, 0.7), (0.6, 1): (0.3, 0.5)}
    skew_experiment(tmp_path, scores)
    subs = load_experiment(tmp_path)
    table = skew_study.skew_table(subs, "accuracy")
    assert list(table.frame.index) == ["KS 0", "KS 0.6"]
    assert list(table.frame.columns) == ["reached (KS, training)", "test splits' KS", "cwt", "fedavg"]
    half = 12.706 * stdev([0.5, 0.3]) / 2 ** 0.5  # t(0.975, 1 degree of freedom) x the standard error
    assert table.frame.loc["KS 0.6", "cwt"] == f"0.400 [{0.4 - half:.3f}, {0.4 + half:.3f}]"
    assert table.frame.loc["KS 0", "fedavg"].startswith("0.650 [")
    assert table.frame.loc["KS 0.6", "reached (KS, training)"].mean == pytest.approx(0.61)
    assert "own test set" in table.note
    assert figures.skew_figure(subs, "accuracy", tmp_path / "k.png")
    assert (tmp_path / "k.png").read_bytes()[:4] == b"\x89PNG"
    one_level = [s for s in subs if s.manifest["ks"] == 0.0]
    assert isinstance(skew_study.skew_table(one_level, "accuracy"), Missing)
    for sub, source in zip(subs, ["codes", "buffers", "codes", "buffers"]):  # a replay method, per replay source
        write_run(sub.folder / "federate" / "cwt-replay", "cwt-replay", shared("global", {"n0": 0.5, "n1": 0.5}))
        config = json.loads((sub.folder / "federate" / "cwt-replay" / "config.json").read_text())
        config["config"]["replay_source"] = source
        write_json(sub.folder / "federate" / "cwt-replay" / "config.json", config)
    table = skew_study.skew_table(load_experiment(tmp_path), "accuracy")
    assert {"cwt-replay [codes]", "cwt-replay [buffers]"} <= set(table.frame.columns)
    assert not figures.skew_figure(one_level, "accuracy", tmp_path / "none.png")


def global_rows(folder: Path, strategy: str, scores: dict[str, float]) -> None:
    """global_test.csv: each model's final (round 2) accuracy on the global test set."""
    pd.DataFrame([{"round": 2, "strategy": strategy, "model_node": key, "test_node": "global-test", "n_test": 40,
                   "accuracy": value} for key, value in scores.items()]).to_csv(folder / "global_test.csv", index=False)


def test_the_skew_tables_read_the_global_test_set_pair_by_seed_and_count_the_budget(tmp_path):
    scores = {(0.0, 0): (0.9, 0.7), (0.0, 1): (0.8, 0.6), (0.6, 0): (0.5, 0.7), (0.6, 1): (0.3, 0.5)}
    skew_experiment(tmp_path, scores)
    replay = {(0.0, 0): 0.95, (0.0, 1): 0.8, (0.6, 0): 0.6, (0.6, 1): 0.5}
    for (ks, seed), (cwt, fedavg) in scores.items():
        sub = tmp_path / "runs" / f"ks={ks}_seed={seed}"
        write_run(sub / "federate" / "cwt-replay", "cwt-replay", shared("global", {"n0": 0.1, "n1": 0.1}))
        global_rows(sub / "federate" / "cwt", "cwt", {"global": cwt - 0.2})
        global_rows(sub / "federate" / "fedavg", "fedavg", {"global": fedavg - 0.2})
        global_rows(sub / "federate" / "cwt-replay", "cwt-replay", {"global": replay[ks, seed]})
        for name, steps, replayed in (("cwt", 3, 0), ("cwt-replay", 3, 96)):
            pd.DataFrame([{"round": r, "key": node, "steps": steps, "real": 96, "replayed": replayed}
                          for r in (0, 1) for node in ("n0", "n1")]).to_csv(sub / "federate" / name / "budget.csv",
                                                                           index=False)
    subs = load_experiment(tmp_path)
    table = skew_study.skew_table(subs, "accuracy")
    assert table.frame.loc["KS 0.6", "cwt"].startswith("0.200 [")  # the global test set's, not the own-site 0.400
    assert "global test set" in table.note
    paired = skew_study.paired_table(subs, "accuracy").frame
    half = 12.706 * stdev([0.6 - 0.3, 0.5 - 0.1]) / 2 ** 0.5
    assert paired.loc["KS 0.6: cwt-replay", "minus cwt"] == f"0.350 [{0.35 - half:.3f}, {0.35 + half:.3f}]"
    assert paired.loc["KS 0: cwt-replay", "minus fedavg"].startswith(f"{(0.95 - 0.5 + 0.8 - 0.4) / 2:.3f} [")
    assert paired.loc["KS 0: cwt-replay", "minus central"] == "-"  # no central run to pair with
    budget = skew_study.budget_table(subs).frame
    assert budget.loc["cwt", "steps/node/round (rounds >= 1)"].mean == 3
    assert budget.loc["cwt-replay", "replayed images seen/node"].mean == 192
    assert budget.loc["cwt", "replayed images seen/node"].mean == 0


def test_a_replay_or_fedreplay_run_made_before_the_step_budget_rules_is_left_out_as_stale(tmp_path):
    skew_experiment(tmp_path, {(0.0, 0): (0.9, 0.7), (0.6, 0): (0.5, 0.7)})
    for ks in (0.0, 0.6):
        for name, option in (("cwt-replay", "replay_mix"), ("fedreplay", "encoder_rule")):
            folder = tmp_path / "runs" / f"ks={ks}_seed=0" / "federate" / name
            write_run(folder, name, shared("global", {"n0": 0.5, "n1": 0.5}))
            meta = json.loads((folder / "config.json").read_text())
            del meta["config"][option]  # as federate wrote it before the option existed
            write_json(folder / "config.json", meta)
    subs = load_experiment(tmp_path)
    assert all(s.run("cwt-replay") is None and s.run("fedreplay") is None for s in subs)
    assert {tuple(st.inputs) for s in subs for st in s.stale} == {
        ("the rule before replay on the real images' steps (--replay-mix)",),
        ("the rule before FedReplay's trained encoder (--encoder-rule)",)}
    assert list(skew_study.skew_table(subs, "accuracy").frame.columns)[2:] == ["cwt", "fedavg"]
