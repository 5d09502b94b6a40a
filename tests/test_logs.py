"""Logs that work without a terminal (issue 31, point 4): plain progress lines off a terminal, a stage's
events (`<exp>/logs/<stage>/events.jsonl`) written as the run goes, and `--tensorboard`.

The GAN's events come from the session's tiny-GAN experiment (no GAN is trained here); one two-round FedAvg
run serves the federate checks.
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from conftest import copy_exp
from fedcli.core import console, progress
from fedcli.core.progress import StepProgress
from fedcli.experiment import events
from fedcli.experiment.artifact_kinds import kind_of
from fedcli.federate import stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.progress import RoundProgress
from fedcli.generators.progress import TrainingProgress

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
    with events.stage_log(tmp_path, "train-gan"), TrainingProgress("node0", iterations=4, pp_iterations=2) as bar:
        bar.update(gan_row(1, 1))
        assert not path.exists()  # nothing before the first event
        bar.update(gan_row(1, 2, fid=80.0))
        written = lines_of(path)
    assert [line["event"] for line in written] == ["start", "check"]
    check = written[1]
    assert check["node"] == "node0" and check["phase"] == 1 and check["iteration"] == 2
    assert check["scores"] == {"loss_g": 0.5, "loss_d": 0.25, "r1": None, "ada_p": 0.0, "rt": 0.1, "fid": 80.0}
    assert lines_of(path)[-1] | {"time": None} == {"time": None, "event": "end", "stage": "train-gan", "ok": True}


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


def test_federate_logs_each_round_as_it_ends_and_as_tensorboard_scalars(gan3_exp, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    exp = copy_exp(gan3_exp, tmp_path)
    path = events.events_path(exp, "federate")
    seen = {}

    def after_round(strategy, round_):
        seen[round_] = [line["round"] for line in lines_of(path) if line["event"] == "round"]

    with events.tensorboard(True):
        stage.run(FederateConfig(exp=exp, strategy=("fedavg",), rounds=2, bootstrap=10, threads=1),
                  after_round=after_round)
    assert seen == {1: [1], 2: [1, 2]}  # each round's line is on disk when the next round starts

    logged = lines_of(path)
    assert [line["event"] for line in logged] == ["start", "round", "round", "end"]
    metrics = pd.read_csv(exp / "federate" / "fedavg" / "metrics.csv")
    comm = pd.read_csv(exp / "federate" / "fedavg" / "comm.csv")
    for line in logged[1:3]:
        assert (line["strategy"], line["fold"], line["rounds"]) == ("fedavg", None, 2)
        assert line["bytes"] == comm[comm["round"] == line["round"]]["bytes"].sum() > 0
        expected = metrics[metrics["round"] == line["round"]].drop(columns=["round", "strategy"])
        assert [row["model_node"] for row in line["metrics"]] == expected["model_node"].tolist()
        assert [row["accuracy"] for row in line["metrics"]] == pytest.approx(expected["accuracy"].tolist())
    board = EventAccumulator(str(exp / "logs" / "tensorboard" / "federate"))
    board.Reload()
    sent = board.Scalars("fedavg/bytes")  # TensorBoard keeps float32
    assert [s.step for s in sent] == [1, 2] and [s.value for s in sent] == pytest.approx([logged[1]["bytes"],
                                                                                          logged[2]["bytes"]])
    accuracy = board.Scalars("fedavg/global@node0/accuracy")
    assert [s.value for s in accuracy] == pytest.approx(
        [next(r["accuracy"] for r in line["metrics"] if r["model_node"] == "global" and r["test_node"] == "node0")
         for line in logged[1:3]])
    plain = [STAMP.sub("", line) for line in capsys.readouterr().err.splitlines()]
    assert any(line.startswith("federate fedavg rounds: 2/2, ") and "done in" in line for line in plain), plain
    assert {kind_of(p.relative_to(exp).as_posix()).name for p in (exp / "logs").rglob("*") if p.is_file()} == {
        "stage events"}


def test_tensorboard_without_its_package_is_one_error_line_that_says_how_to_install_it(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    exp = tmp_path / "exp"
    line = cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", "--tensorboard")
    assert "pip install 'fedcli[tensorboard]'" in line, line
    assert not exp.exists()
