"""Experiment locks, leftovers of killed stages, resume edges, and federate's write check before
training (issue 12, points 7-9)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import Cli, copy_exp, make_folders, record_case
from fedcli.experiment.artifacts import remove_leftovers
from fedcli.experiment.locking import TOKEN, TOKEN_ENV, Busy, Locked, lock_path, locked, take
from fedcli.federate import engine, stage
from fedcli.federate.config import FederateConfig
from test_distributed import DISTRIBUTED

FAST = ["--strategy", "fedavg", "--epochs", "1", "--bootstrap", "10", "--threads", "1"]
HOLD = """
import sys, time
from pathlib import Path
from fedcli.experiment.artifacts import staged_output
from fedcli.experiment.locking import locked
exp, out = Path(sys.argv[1]), Path(sys.argv[2])
with locked(exp, [out], parts=sys.argv[3:]), staged_output(out, overwrite=True):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def part_exp(tmp_path_factory) -> Path:
    """Two small hospitals (16 images each), 16x16."""
    root = tmp_path_factory.mktemp("locking")
    data = make_folders(root / "data", {site: {"benign": 8, "malign": 8} for site in ("east", "west")})
    Cli().ok("partition", "--source", "folders", "--data-dir", data, "--image-size", "16", "--exp", root / "exp")
    return root / "exp"


@pytest.fixture(scope="module")
def interrupted(part_exp, tmp_path_factory) -> Path:
    """An experiment whose 2-round fedavg run stopped after its last round, before writing its output:
    rounds 1 and 2 are checkpointed."""
    exp = copy_exp(part_exp, tmp_path_factory.mktemp("interrupted"))

    def crash(strategy, round_):
        if round_ == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage.run(FederateConfig(exp=exp, strategy=("fedavg",), rounds=2, epochs=1, bootstrap=10, threads=1),
                  after_round=crash)
    return exp


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` with its content hash (folders as "dir")."""
    return {p.relative_to(folder).as_posix(): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


def hold(exp: Path, out: Path, *parts: str) -> subprocess.Popen:
    """Another process inside a stage's write of `out`: it holds the locks and a staging folder."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(exp), str(out), *parts], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (result.output, result.stderr)
    assert "Traceback" not in result.output + result.stderr
    return lines[0]


def no_training(monkeypatch) -> None:
    def trained(*args, **kwargs):
        raise AssertionError("federate trained before refusing")
    monkeypatch.setattr(engine, "run_rounds", trained)  # the round loop of both engines


def test_a_second_federate_is_refused_at_once_and_a_killed_holder_leaves_no_lock_only_leftovers(
        cli, part_exp, tmp_path, monkeypatch):
    exp = copy_exp(part_exp, tmp_path)
    out = exp / "federate" / "fedavg"
    args = ["federate", "--exp", exp, *FAST, "--rounds", "1"]
    holder = hold(exp, out, "east", "west")
    try:
        before = snapshot(exp)
        no_training(monkeypatch)
        result = cli(*args)
        line = one_line(result)
        assert f"{out} is being written by pid {holder.pid} (" in line and "wait for it to finish or stop it" in line
        record_case(8, "a second federate while another holds the experiment's lock", args, result,
                    snapshot(exp) == before)
    finally:
        holder.kill()  # SIGKILL, mid-write: the kernel drops its lock, its staging folder stays
        holder.wait()
    monkeypatch.undo()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".fedavg.staging-")]
    partition = snapshot(exp / "partition")

    result = cli(*args)
    assert result.exit_code == 0, result.output + result.stderr
    assert "note: removed 1 leftover folder(s) of an interrupted write of" in result.output
    assert sorted(p.name for p in out.parent.iterdir()) == ["fedavg"] and not (exp / ".locks").exists()
    record_case(9, "a SIGKILLed stage left its staging folder (and its lock file)", args, result,
                snapshot(exp / "partition") == partition)


def test_locks_are_reentrant_and_a_launched_node_accepts_only_its_launchers(tmp_path, monkeypatch):
    exp = tmp_path / "exp"
    out = exp / "report"
    path = lock_path(exp, out, None)
    with locked(exp, [out]):
        with locked(exp, [out]):  # fedcli run calls a stage in process
            assert json.loads(path.read_text())["pid"] == os.getpid()
        (tmp_path / "alias").symlink_to(exp)
        with locked(tmp_path / "alias", [tmp_path / "alias" / "report"]):  # the same lock by another path
            pass
        with pytest.raises(Busy):  # still held: another open file cannot take it
            take(path)
    assert not exp.exists()  # the lock file, .locks and the experiment folder they needed are gone

    fd, _ = take(path)  # a launcher's hold (its record, with its token, written below)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": "fedcli federate", "token": "launcher"}).encode(), 0)
        monkeypatch.setenv(TOKEN_ENV, "launcher")  # a node it started
        with locked(exp, [out]):
            pass
        monkeypatch.setenv(TOKEN_ENV, "another launcher's token")
        with pytest.raises(Locked, match=f"{out} is being written by pid {os.getpid()}"):
            with locked(exp, [out]):
                pass
    finally:
        os.close(fd)


def test_a_launched_distributed_federate_runs_under_its_launchers_lock(cli, part_exp, tmp_path, monkeypatch):
    from fedcli.comm import launcher as launch

    exp = copy_exp(part_exp, tmp_path)
    holders = []
    watch = launch.watch

    def watched(procs, patience):
        with pytest.raises(Busy) as busy:  # while the nodes run, the launcher holds each node's lock
            take(lock_path(exp, exp / "federate" / "fedavg", "west"))
        holders.append(busy.value.holder)
        return watch(procs, patience)

    monkeypatch.setattr(launch, "watch", watched)
    cli.ok("federate", "--exp", exp, *FAST, "--rounds", "1", *DISTRIBUTED)
    assert holders[0]["pid"] == os.getpid() and holders[0]["token"] == TOKEN
    assert (exp / "federate" / "fedavg" / "metrics.csv").is_file() and not (exp / ".locks").exists()


def test_a_leftover_of_a_replacement_killed_between_its_renames_is_put_back(tmp_path):
    final = tmp_path / "gan" / "node0"
    (tmp_path / "gan" / ".node0.old-x1" / "node0").mkdir(parents=True)
    (tmp_path / "gan" / ".node0.old-x1" / "node0" / "config.json").write_text("{}")
    (tmp_path / "gan" / ".node0.staging-x2").mkdir()
    assert remove_leftovers(final) == ([".node0.old-x1", ".node0.staging-x2"], True)
    assert sorted(p.name for p in final.parent.iterdir()) == ["node0"] and (final / "config.json").is_file()


@pytest.mark.parametrize("damage", ["truncated safetensors", "invalid JSON"])
def test_resume_falls_back_to_the_previous_round_when_the_newest_is_damaged(cli, interrupted, tmp_path, damage):
    exp = copy_exp(interrupted, tmp_path)
    work = exp / "federate" / ".fedavg.checkpoint"
    kept = pd.DataFrame(json.loads((work / "east" / "round-2.json").read_text())["rows"])  # east's test rows
    if damage == "invalid JSON":
        (work / "west" / "round-2.json").write_text('{"round": 2, "rows": [')
    else:
        data = (work / "west" / "round-2.safetensors").read_bytes()
        (work / "west" / "round-2.safetensors").write_bytes(data[:len(data) // 2])
    args = ["federate", "--exp", exp, *FAST, "--rounds", "2", "--resume"]
    result = cli(*args)
    assert result.exit_code == 0, result.output + result.stderr
    assert "round 2 of the checkpoint" in result.output and "resuming from round 1" in result.output
    metrics = pd.read_csv(exp / "federate" / "fedavg" / "metrics.csv")
    assert sorted(metrics["round"].unique()) == [0, 1, 2] and not metrics.duplicated(
        ["round", "model_node", "test_node"]).any()
    redone = metrics[metrics.test_node == "east"].reset_index(drop=True)  # round 2 again, from round 1
    pd.testing.assert_frame_equal(redone, kept[redone.columns], check_dtype=False)
    record_case(9, f"--resume with the newest checkpoint round damaged ({damage})", args, result, True)


def test_resume_with_no_readable_round_and_a_rerun_that_would_discard_a_checkpoint(cli, interrupted, tmp_path,
                                                                                   monkeypatch):
    exp = copy_exp(interrupted, tmp_path)
    work = exp / "federate" / ".fedavg.checkpoint"
    for json_file in work.glob("east/round-*.json"):
        json_file.write_text("not json")
    before = snapshot(exp)
    no_training(monkeypatch)
    args = ["federate", "--exp", exp, *FAST, "--rounds", "2", "--resume"]
    result = cli(*args)
    assert "has no readable round" in one_line(result)
    record_case(7, "--resume with every checkpoint round unreadable (corrupt JSON)", args, result,
                snapshot(exp) == before)

    exp = copy_exp(interrupted, tmp_path / "discard")
    work = exp / "federate" / ".fedavg.checkpoint"
    before = snapshot(exp)
    args = ["federate", "--exp", exp, *FAST, "--rounds", "2"]
    result = cli(*args)
    assert "pass --resume to continue from round 2, or --overwrite to start over" in one_line(result)
    record_case(9, "a rerun without --resume would discard a resumable checkpoint", args, result,
                snapshot(exp) == before)
    monkeypatch.undo()
    result = cli.ok(*args, "--overwrite", "--rounds", "1")
    assert "note: --overwrite: discarding the checkpoint of round 2" in result.output
    assert not work.exists() and (exp / "federate" / "fedavg" / "metrics.csv").is_file()


def refuse_writes_under(monkeypatch, root: Path) -> None:
    """EACCES for every file or folder created under `root`, as for a folder without write permission
    (the tests run as root, where chmod blocks nothing)."""
    def guard(real, creates):
        def call(path, *args, **kwargs):
            if creates(*args) and Path(os.path.abspath(path)).is_relative_to(os.path.abspath(root)):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real(path, *args, **kwargs)
        return call
    monkeypatch.setattr(os, "open", guard(os.open, lambda flags, *rest: flags & os.O_CREAT))
    monkeypatch.setattr(os, "mkdir", guard(os.mkdir, lambda *rest: True))


@pytest.mark.parametrize("unwritable", ["federate", "."])
def test_federate_checks_it_can_write_before_training(cli, part_exp, tmp_path, monkeypatch, unwritable):
    exp = copy_exp(part_exp, tmp_path)
    before = snapshot(exp)
    no_training(monkeypatch)
    refuse_writes_under(monkeypatch, exp / unwritable)
    args = ["federate", "--exp", exp, *FAST, "--rounds", "1"]
    result = cli(*args)
    monkeypatch.undo()
    line = one_line(result)
    assert "Permission denied" in line and "check the folder's permissions" in line
    where = "its federate folder" if unwritable == "federate" else "the whole experiment folder"
    record_case(7, f"federate into an unwritable --exp ({where}; EACCES injected)", args, result,
                snapshot(exp) == before)
