"""Logs that work without a terminal (issue 31, point 4): plain progress lines off a terminal, a stage's
events (`<exp>/logs/<stage>/events.jsonl`) written as the run goes, and `--tensorboard`.

The GAN's events come from the session's tiny-GAN experiment (no GAN is trained here); one one-round run of
FedAvg and Standalone serves the federate checks.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from rich.console import Console

from conftest import copy_exp
from fedcli.core import console, progress
from fedcli.core.progress import StepProgress
from fedcli.experiment import events
from fedcli.experiment.artifact_kinds import kind_of
from fedcli.experiment.artifacts import read_json
from fedcli.federate import stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.progress import RoundProgress
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategy_runs import ROUND_METRICS, computed, json_sha256
from fedcli.generators.progress import TrainingProgress
from fedcli.generators.samples import write_samples

STAMP = re.compile(r"^\d\d:\d\d:\d\d ")


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def gan_row(phase, iteration: int, fid: float | None = None) -> dict:
    row = {"phase": phase, "iteration": iteration, "loss_g": 0.5, "loss_d": 0.25, "r1": float("nan"), "ada_p": 0.0,
           "rt": 0.1}
    return row | ({"fid": fid} if fid is not None else {})


def test_off_a_terminal_a_task_gets_a_plain_line_when_it_starts_each_interval_and_when_it_ends(capsys, monkeypatch):
    monkeypatch.setattr(progress, "POLL_S", 3600.0)  # the line writer's own thread stays idle: ticks come from here
    bar = TrainingProgress("node0", iterations=6, pp_iterations=2)
    with bar:
        bar.update(gan_row(1, 1))
        start = bar.lines.last_line
        bar.lines.tick(start + 1)  # first advance
        bar.lines.tick(start + 2)  # nothing new, and the interval has not passed
        for i in (2, 3):
            bar.update(gan_row(1, i, fid=123.456 if i == 3 else None))
        bar.lines.tick(start + 1 + progress.INTERVAL_S)  # the interval: a line for the running task
        for i in (4, 5, 6):
            bar.update(gan_row(1, i))
        bar.update(gan_row(2, 1))  # phase 1 ends at 6/6
        bar.lines.tick(start + 2 + progress.INTERVAL_S)
        bar.update(gan_row(2, 2, fid=7.5))
    lines = capsys.readouterr().err.splitlines()

    assert all(STAMP.match(line) for line in lines), lines
    heads = [STAMP.sub("", line).split(",")[0] for line in lines]
    assert heads == ["train-gan node0 phase 1: 1/6", "train-gan node0 phase 1: 3/6", "train-gan node0 phase 1: 6/6",
                     "train-gan node0 phase 2: 1/2", "train-gan node0 phase 2: 2/2"]
    assert "eta " in lines[1] and "done in " in lines[2] and "done in " in lines[4]
    assert lines[1].endswith("| G 0.50 D 0.25 p 0.00 fid 123")  # the whole status, not cut to 80 columns
    assert max(map(len, lines)) > 80
    assert not any("\x1b" in line or "━" in line for line in lines)  # no control codes, no bar


def test_a_failed_task_adds_no_line_after_what_was_written(capsys, monkeypatch):
    monkeypatch.setattr(progress, "POLL_S", 3600.0)
    with pytest.raises(RuntimeError):
        with RoundProgress("fedavg", 3) as bar:
            bar.update(1)
            bar.lines.tick(bar.lines.last_line)
            raise RuntimeError
    assert [STAMP.sub("", line).split(",")[0] for line in capsys.readouterr().err.splitlines()] == [
        "federate fedavg rounds: 1/3"]


def test_a_step_without_a_count_gets_a_line_when_it_starts_each_interval_and_when_it_ends(capsys, monkeypatch):
    monkeypatch.setattr(progress, "POLL_S", 3600.0)
    with StepProgress("train-gan", "node0 fidelity score") as step:
        step.lines.tick(step.lines.last_line + progress.INTERVAL_S - 1)
        step.lines.tick(step.lines.last_line + progress.INTERVAL_S)
    states = [STAMP.sub("", line).split(", ")[0] for line in capsys.readouterr().err.splitlines()]
    assert [s.rsplit(" ", 1)[0] for s in states] == ["train-gan node0 fidelity score: elapsed",
                                                     "train-gan node0 fidelity score: elapsed",
                                                     "train-gan node0 fidelity score: done in"]


def test_on_a_terminal_the_rich_bar_is_drawn_as_before(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=screen, force_terminal=True, width=100))
    with RoundProgress("fedavg", 2) as bar:
        bar.update(2)
    assert bar.lines is None and "fedavg rounds" in screen.getvalue() and "━" in screen.getvalue()


def test_each_fid_check_is_a_line_of_the_events_before_the_stage_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "POLL_S", 3600.0)
    path = events.events_path(tmp_path, "train-gan")
    with events.stage_log(tmp_path, "train-gan", nodes=["node0"]), \
            TrainingProgress("node0", iterations=4, pp_iterations=2) as bar:
        assert [line["event"] for line in lines_of(path)] == ["start"]  # written as the stage starts
        bar.update(gan_row(1, 1))
        bar.update(gan_row(1, 2, fid=80.0))
        written = lines_of(path)
    assert [line["event"] for line in written] == ["start", "check"]
    assert written[0] | {"time": None} == {"time": None, "event": "start", "stage": "train-gan", "nodes": ["node0"]}
    check = written[1]
    assert check["node"] == "node0" and check["phase"] == 1 and check["iteration"] == 2
    assert check["scores"] == {"loss_g": 0.5, "loss_d": 0.25, "r1": None, "ada_p": 0.0, "rt": 0.1, "fid": 80.0}
    assert lines_of(path)[-1] | {"time": None} == {"time": None, "event": "end", "stage": "train-gan", "ok": True}


def test_a_node_is_a_tensorboard_run_of_its_checks_fid_and_losses_and_its_sample_grids(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Flat:  # a generator whose every sample is mid-grey
        def sample(self, labels, stream, truncation):
            return torch.zeros(len(labels), 1, 4, 4)

    monkeypatch.setattr(progress, "POLL_S", 3600.0)
    with events.tensorboard(True), events.stage_log(tmp_path, "train-gan"):
        for node in ("node0", "node1"):
            with TrainingProgress(node, iterations=4, pp_iterations=2) as bar:
                bar.update(gan_row(1, 2, fid=80.0))
                bar.update(gan_row(2, 2, fid=90.0))
        write_samples(tmp_path / "samples.png", {"phase2": Flat()}, {"phase2": "released"}, [0, 1], ["a", "b"],
                      seed=0, node="node0", device="cpu")
    boards = {node: EventAccumulator(str(events.tensorboard_dir(tmp_path, "train-gan", node))).Reload()
              for node in ("node0", "node1")}
    tags = {node: board.Tags() for node, board in boards.items()}
    assert tags["node0"]["scalars"] == tags["node1"]["scalars"]  # the nodes' runs overlay
    assert set(tags["node0"]["scalars"]) == {f"{phase}/{score}" for phase in ("phase1", "phase2")
                                             for score in ("fid", "loss_g", "loss_d")}
    assert [(s.step, s.value) for s in boards["node1"].Scalars("phase2/fid")] == [(2, 90.0)]
    grid = boards["node0"].Images("samples/phase2")  # samples.png's grid: two classes of eight 4x4 images
    assert tags["node0"]["images"] == ["samples/phase2"] and (grid[0].height, grid[0].width) == (2 * 4, 8 * 4)


def test_train_gan_logged_one_line_per_fid_check_of_every_node(gan3_exp):
    logged = lines_of(gan3_exp / "logs" / "train-gan" / "events.jsonl")
    assert logged[0]["event"] == "start" and logged[-1]["event"] == "end" and logged[-1]["ok"]
    for node in ("node0", "node1", "node2"):
        metrics = pd.read_csv(gan3_exp / "gan" / node / "metrics.csv")
        fid = next(c for c in metrics.columns if c.startswith("fid["))
        checks = metrics[metrics[fid].notna()]
        mine = [line for line in logged if line["event"] == "check" and line["node"] == node]
        assert [(str(c["phase"]), c["iteration"]) for c in mine] == list(zip(checks["phase"].astype(str),
                                                                              checks["iteration"]))
        assert [c["scores"]["fid"] for c in mine] == pytest.approx(checks[fid].tolist(), rel=1e-12)


STRATEGIES = ("fedavg", "standalone")


@pytest.fixture(scope="module")
def federated(gan3_exp, tmp_path_factory):
    """One run of two strategies, one round each, with --tensorboard: its experiment, the events on disk as each
    round ended, and what it wrote on stderr (off a terminal)."""
    exp = copy_exp(gan3_exp, tmp_path_factory.mktemp("logs"))
    path = events.events_path(exp, "federate")
    seen = {}

    def after_round(strategy, round_):
        seen[strategy, round_] = [(line["strategy"], line["round"]) for line in lines_of(path)
                                  if line["event"] == "round"]

    with events.tensorboard(True), contextlib.redirect_stderr(io.StringIO()) as err:
        stage.run(FederateConfig(exp=exp, strategy=STRATEGIES, rounds=1, init_epochs=0, batch=64, bootstrap=10,
                                 threads=1), after_round=after_round)
    return exp, seen, err.getvalue()


def test_federate_logs_each_round_as_it_ends_round_0_first(federated):
    exp, seen, err = federated
    assert seen == {("fedavg", 0): [("fedavg", 0)], ("fedavg", 1): [("fedavg", 0), ("fedavg", 1)],
                    ("standalone", 0): [("fedavg", 0), ("fedavg", 1), ("standalone", 0)],
                    ("standalone", 1): [("fedavg", 0), ("fedavg", 1), ("standalone", 0), ("standalone", 1)]}
    logged = lines_of(events.events_path(exp, "federate"))
    assert [line["event"] for line in logged] == ["start", "round", "round", "round", "round", "end"]
    for line in logged[1:5]:
        assert (line["fold"], line["rounds"]) == (None, 1)
        out = exp / "federate" / line["strategy"]
        comm, metrics = pd.read_csv(out / "comm.csv"), pd.read_csv(out / "metrics.csv")
        assert line["bytes"] == comm[(comm["round"] == line["round"]) & (comm["kind"] != "eval")]["bytes"].sum()
        expected = metrics[metrics["round"] == line["round"]].drop(columns=["round", "strategy"])
        assert [row["model_node"] for row in line["metrics"]] == expected["model_node"].tolist()
        assert [row["accuracy"] for row in line["metrics"]] == pytest.approx(expected["accuracy"].tolist())
    plain = [STAMP.sub("", line) for line in err.splitlines()]
    assert any(line.startswith("federate fedavg rounds: 1/1, ") and "done in" in line for line in plain), plain
    assert {kind_of(p.relative_to(exp).as_posix()).name for p in (exp / "logs").rglob("*") if p.is_file()} == {
        "stage events"}


def test_the_start_line_names_each_run_with_its_options_and_config_hashes_before_the_first_round(federated):
    exp, _, _ = federated
    start, first = lines_of(events.events_path(exp, "federate"))[:2]
    assert start["event"] == "start" and start["stage"] == "federate" and first["round"] == 0
    assert start["time"] <= first["time"]
    assert [(run["strategy"], run["fold"]) for run in start["runs"]] == [(name, None) for name in STRATEGIES]
    for run in start["runs"]:
        config = read_json(exp / "federate" / run["strategy"] / "config.json", "config")["config"]
        assert run["config"] == json_sha256(config) and run["options"] == json_sha256(computed(config))
    assert len({run["options"] for run in start["runs"]}) == 2


def test_tensorboard_has_one_run_per_strategy_with_the_same_few_tags(federated):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    exp, _, _ = federated
    root = exp / "logs" / "tensorboard" / "federate"
    assert sorted(p.name for p in root.iterdir()) == sorted(STRATEGIES)
    boards = {name: EventAccumulator(str(root / name)).Reload() for name in STRATEGIES}
    tags = {name: set(board.Tags()["scalars"]) for name, board in boards.items()}
    assert tags["fedavg"] == tags["standalone"] == {"comm/bytes", *(f"test/{m}" for m in ROUND_METRICS),
                                                   *(f"node/{n}/accuracy" for n in ("node0", "node1", "node2"))}
    for name, board in boards.items():
        metrics = pd.read_csv(exp / "federate" / name / "metrics.csv")
        own = metrics[metrics.model_node.isin(REGISTRY.shared_model_keys()) | (metrics.model_node == metrics.test_node)]
        accuracy = board.Scalars("test/accuracy")  # TensorBoard keeps float32
        assert [s.step for s in accuracy] == [0, 1]
        assert [s.value for s in accuracy] == pytest.approx(own.groupby("round").accuracy.mean().tolist())
        node1 = own[own.test_node == "node1"].accuracy.tolist()
        assert [s.value for s in board.Scalars("node/node1/accuracy")] == pytest.approx(node1)
    assert [s.value for s in boards["standalone"].Scalars("comm/bytes")] == [0.0, 0.0]
    assert boards["fedavg"].Scalars("comm/bytes")[1].value > 0  # round 1's all-reduce (no init epochs: none in 0)


def test_tensorboard_without_its_package_is_one_error_line_that_says_how_to_install_it(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    exp = tmp_path / "exp"
    line = cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", "--tensorboard")
    assert "pip install 'fedcli[tensorboard]'" in line, line
    assert not exp.exists()
