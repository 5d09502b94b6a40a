"""FedPerl's scenarios 2 (every label at the server: the held-apart set, on which it trains the global model) and 4
(a few fully labelled clients, the rest unlabelled): nodes without labels learn from their unlabelled images
alone, the server's training and its sends are counted, no hidden label is read, and both engines agree."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import Cli, copy_exp

from fedcli.data.manifest import Manifest
from fedcli.federate import stage
from fedcli.federate.config import FederateConfig

RUN = dict(rounds=2, epochs=1, init_epochs=0, batch=8, bootstrap=10, threads=1, ssl="fixmatch", unlabeled_ratio=2,
           confidence=0.25, weighting="equal", steps_per_round=3)
ARGS = ["--rounds", "2", "--epochs", "1", "--init-epochs", "0", "--batch", "8", "--bootstrap", "10", "--threads", "1",
        "--ssl", "fixmatch", "--unlabeled-ratio", "2", "--confidence", "0.25", "--weighting", "equal",
        "--steps-per-round", "3"]
SCENARIOS = {
    "2": ["--labeled-nodes", "none", "--held-apart-fraction", "0.1", "--held-apart-node", "node1"],
    "4": ["--labeled-nodes", "node0", "--labeled-nodes", "node3", "--labeled-fraction", "1"],
}


def partition(exp, scenario: str) -> None:
    fraction = [] if scenario == "4" else ["--labeled-fraction", "0.5"]
    Cli().ok("partition", "--nodes", "4", "--image-size", "16", *fraction, *SCENARIOS[scenario], "--exp", exp)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenarios")
    for scenario in SCENARIOS:
        partition(root / scenario, scenario)
    return root


def test_nodes_without_labels_learn_from_their_unlabelled_images_and_the_server_from_the_held_apart_set(
        scenarios, tmp_path):
    for scenario in SCENARIOS:
        exp = copy_exp(scenarios / scenario, tmp_path / scenario)
        stage.run(FederateConfig(exp=exp, strategy=("fedavg", "fedperl"), anonymize=True, **RUN))
        budget = pd.read_csv(exp / "federate" / "fedavg" / "budget.csv")
        nodes = budget[budget.key != "global"]
        unlabelled = nodes[nodes.key.isin(["node1", "node2"] if scenario == "4" else ["node0", "node1", "node2",
                                                                                       "node3"])]
        assert (unlabelled.steps > 0).all() and (unlabelled.real == 0).all()  # steps of unlabelled images alone
        comm = pd.read_csv(exp / "federate" / "fedperl" / "comm.csv")
        sent = comm[comm.kind == "server-model"]
        if scenario == "2":  # the server trains the global model every round and sends it to every other node
            server = budget[budget.key == "global"]
            assert list(server["round"]) == [1, 2] and (server.steps > 0).all() and (server.real > 0).all()
            assert sorted(zip(sent["round"], sent.receiver)) == [(r, n) for r in (1, 2) for n in ("node0", "node2",
                                                                                                    "node3")]
            assert set(sent.sender) == {"node1"}
        else:
            assert "global" not in set(budget.key) and sent.empty
            assert (nodes[nodes.key.isin(["node0", "node3"])].real > 0).all()


def test_without_fixmatch_scenario_2_is_the_servers_training_alone(scenarios, tmp_path):
    exp = copy_exp(scenarios / "2", tmp_path)
    stage.run(FederateConfig(exp=exp, strategy=("fedavg",), **{**RUN, "ssl": "none"}))
    budget = pd.read_csv(exp / "federate" / "fedavg" / "budget.csv")
    assert (budget[budget.key != "global"].steps == 0).all() and (budget[budget.key == "global"].steps > 0).all()


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_permuting_the_hidden_labels_changes_nothing_in_scenarios_2_and_4(scenario, tmp_path):
    from test_label_parts import rewrite_hidden_labels

    runs = {}
    for name, change in (("as-drawn", list), ("permuted", lambda labels: [(y + 1) % 10 for y in labels])):
        exp = tmp_path / name
        partition(exp, scenario)
        rewrite_hidden_labels(exp, change)
        stage.run(FederateConfig(exp=exp, strategy=("fedavg", "fedmatch"), **RUN))
        runs[name] = exp / "federate"
    for strategy in ("fedavg", "fedmatch"):
        folders = [runs[name] / strategy for name in runs]
        assert (folders[0] / "metrics.csv").read_text() == (folders[1] / "metrics.csv").read_text()
        assert (folders[0] / "models" / "global.safetensors").read_bytes() == \
            (folders[1] / "models" / "global.safetensors").read_bytes()


def test_scenario_2_gives_the_in_process_numbers_distributed(scenarios, tmp_path, cli):
    """Scored with local statistics: a node without labels re-estimates them on its unlabelled images."""
    reference = copy_exp(scenarios / "2", tmp_path / "in-process")
    stage.run(FederateConfig(exp=reference, strategy=("fedperl",), anonymize=True, eval_statistics="local", **RUN))
    exp = copy_exp(scenarios / "2", tmp_path / "distributed")
    cli.ok("federate", "--exp", exp, "--strategy", "fedperl", "--anonymize", *ARGS, "--engine", "distributed",
           "--launch", "local", "--eval-statistics", "local")
    folder, expected = exp / "federate" / "fedperl", reference / "federate" / "fedperl"
    pd.testing.assert_frame_equal(pd.read_csv(folder / "metrics.csv"), pd.read_csv(expected / "metrics.csv"))
    for name in ("comm.csv", "models/global.safetensors"):
        assert (folder / name).read_bytes() == (expected / name).read_bytes(), name


@pytest.mark.parametrize("scenario, args, says", [
    ("4", ["--strategy", "fedbn"], "fedbn trains on visible labels at every node"),
    ("2", ["--strategy", "standalone"], "standalone without --ssl has no labelled image to train on"),
])
def test_what_cannot_run_without_labels_is_refused_in_one_line(scenarios, cli, tmp_path, scenario, args, says):
    exp = copy_exp(scenarios / scenario, tmp_path)
    assert says in cli.user_error("federate", "--exp", exp, *args, "--rounds", "1", "--threads", "1")
    assert not (exp / "federate").exists()


def test_on_a_few_labels_partition_every_bound_takes_the_upper_bounds_steps_by_default(tmp_path):
    """Without --steps-per-round an epoch covers all of a node's training images, labelled or not, so the lower
    bound, FixMatch and the fully labelled upper bound train alike, and more than the few labels' handful."""
    exp = tmp_path / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--labeled-fraction", "0.1", "--exp", exp)
    steps = {}
    for name, config in (("lower", {}), ("fixmatch", {"ssl": "fixmatch"}), ("upper", {"labels": "all"})):
        stage.run(FederateConfig(exp=exp, strategy=("standalone",), rounds=1, epochs=1, init_epochs=0, batch=32,
                                 bootstrap=10, threads=1, unlabeled_ratio=1, overwrite=True, **config))
        steps[name] = pd.read_csv(exp / "federate" / "standalone" / "budget.csv").set_index("key").steps.to_dict()
    few = Manifest.load(exp)
    expected = {node: -(-sum(len(few.node(node)[part]) for part in ("train", "unlabeled")) // 32)
                for node in few.node_names}
    assert steps["lower"] == steps["fixmatch"] == steps["upper"] == expected
    assert all(count > -(-len(few.node(node)["train"]) // 32) for node, count in expected.items())
