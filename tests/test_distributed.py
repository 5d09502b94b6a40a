"""`fedcli federate --engine distributed`: one process per node over torch.distributed (gloo, loopback).

The distributed engine must give the in-process engine's numbers, survive a node's death with one
clear line and a resumable checkpoint, and never let a node read another node's data.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import copy_exp, make_folders
from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import read_json

DISTRIBUTED = ["--engine", "distributed", "--launch", "local"]
ONE_THREAD = ["--threads", "1"]  # CPU results depend on the thread count: fix it in both engines


@pytest.fixture(scope="module")
def fl_exp(gan3_exp):
    return gan3_exp


def frames(exp: Path, strategy: str, name: str = "metrics.csv") -> pd.DataFrame:
    return pd.read_csv(exp / "federate" / strategy / name)


def own_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    own = metrics[(metrics.model_node == metrics.test_node) | (metrics.model_node == "global")]
    return own.reset_index(drop=True)


def worker_pids(exp: Path) -> dict[int, int]:
    """rank -> pid of the node processes started for `exp` (they inherit FEDCLI_TEST_RUN)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes()
            environ = dict(item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if b"fedcli.federate.node" in command and environ.get(b"FEDCLI_TEST_RUN") == str(exp).encode():
            found[int(environ[b"RANK"])] = int(entry.name)
    return found


def start(exp: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedcli", "federate", "--exp", str(exp), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FEDCLI_TEST_RUN": str(exp), **(env or {})})


def test_a_killed_node_stops_the_others_and_either_engine_resumes_to_the_same_metrics(cli, fl_exp, tmp_path):
    args = ["--strategy", "feder", "--rounds", "4", "--epochs", "2", "--bootstrap", "20", *ONE_THREAD]
    reference = copy_exp(fl_exp, tmp_path / "reference")
    cli.ok("federate", "--exp", reference, *args)

    exp = copy_exp(fl_exp, tmp_path / "killed")
    timeout = 20
    launcher = start(exp, *args, *DISTRIBUTED, "--timeout", str(timeout))
    work = exp / "federate" / ".feder.checkpoint"
    deadline = time.monotonic() + 120
    while not (work / "node1" / "round-2.json").is_file():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.02)
    pids = worker_pids(exp)
    assert sorted(pids) == [0, 1, 2]
    os.kill(pids[1], signal.SIGKILL)
    killed_at = time.monotonic()
    _, stderr = launcher.communicate(timeout=timeout + 30)
    stopped_within = time.monotonic() - killed_at

    assert launcher.returncode == 2
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "Traceback" not in stderr
    assert "node1 was killed by SIGKILL; the others stopped (lost node1 (rank 1) during" in lines[-1]
    assert "--resume" in lines[-1]
    assert stopped_within < timeout  # a dead peer is noticed at once, not after the timeout
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids.values())  # no process left behind
    assert not (exp / "federate" / "feder").exists()
    for node in ("node0", "node1", "node2"):
        assert (work / node / "round-2.json").is_file()

    in_process = copy_exp(exp, tmp_path / "in-process")  # the same checkpoint, resumed by the other engine
    cli.ok("federate", "--exp", exp, *args, *DISTRIBUTED, "--resume")
    pd.testing.assert_frame_equal(frames(exp, "feder"), own_rows(frames(reference, "feder")))
    cli.ok("federate", "--exp", in_process, *args, "--resume")
    resumed = frames(in_process, "feder")
    last = frames(reference, "feder")["round"].max()
    pd.testing.assert_frame_equal(resumed[resumed["round"] == last].reset_index(drop=True),
                                  frames(reference, "feder").query(f"round == {last}").reset_index(drop=True))


OPEN_HOOK = '''
import os, sys
_log = os.environ.get("FEDCLI_TEST_OPEN_LOG")
if _log and "fedcli.federate.node" in sys.orig_argv:
    _fd = os.open(f"{_log}.{os.environ.get('RANK', 'x')}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def _hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            os.write(_fd, os.fsencode(os.path.abspath(os.fsdecode(args[0]))) + b"\\n")

    sys.addaudithook(_hook)
'''


def test_a_node_process_opens_only_its_own_image_files(cli, tmp_path):
    """Every hospital's images lie in one tree here; an audit hook records each file a node process opens."""
    data = make_folders(tmp_path / "data", {site: {"benign": 8, "malign": 8} for site in ("east", "north", "south")})
    exp = tmp_path / "exp"
    cli.ok("partition", "--source", "folders", "--data-dir", data, "--image-size", "16", "--exp", exp)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(OPEN_HOOK)
    log = tmp_path / "opened"
    launcher = start(exp, "--strategy", "fedbn", "--strategy", "standalone", "--rounds", "1", "--bootstrap", "20",
                     *DISTRIBUTED, env={"PYTHONPATH": str(hook), "FEDCLI_TEST_OPEN_LOG": str(log)})
    _, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, stderr

    manifest = Manifest.load(exp)
    files = {node: {str((data / r["path"]).resolve()) for split in ("train", "test")
                    for r in manifest.records(node, split)} for node in manifest.node_names}
    every_image = set().union(*files.values())
    for rank, node in enumerate(manifest.node_names):
        opened = {line for line in Path(f"{log}.{rank}").read_text().splitlines()}
        images = opened & every_image
        assert images == files[node], node  # all of its own images, and no other node's
        assert str((exp / "partition" / "manifest.json").resolve()) not in opened  # it lists every hospital
        manifests = {str((exp / "partition" / "nodes" / f"{n}.json").resolve()): n for n in manifest.node_names}
        assert {n for path, n in manifests.items() if path in opened} == {node}  # its own, no other hospital's

    # without --cross-eval each node tests only the model it holds, and no model travels for it
    for strategy in ("fedbn", "standalone"):
        metrics = frames(exp, strategy)
        assert (metrics.model_node == metrics.test_node).all() and len(metrics) == 2 * 3
        assert "eval" not in set(frames(exp, strategy, "comm.csv").kind)
    cli.ok("report", exp)
    assert "Cross-evaluation was off for fedbn, standalone" in (exp / "report" / "report.md").read_text()


def test_a_hung_node_is_named_and_the_others_stop_within_the_timeout(fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    timeout = 3
    launcher = start(exp, "--strategy", "fedavg", "--rounds", "20", "--bootstrap", "20", *ONE_THREAD, *DISTRIBUTED,
                     "--timeout", str(timeout))
    deadline = time.monotonic() + 120
    while not (exp / "federate" / ".fedavg.checkpoint" / "node2" / "round-1.json").is_file():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.02)
    pids = worker_pids(exp)
    os.kill(pids[2], signal.SIGSTOP)  # alive but silent, as a frozen machine
    stopped_at = time.monotonic()
    _, stderr = launcher.communicate(timeout=60)
    line = stderr.strip().splitlines()[-1]
    assert launcher.returncode == 2 and "lost node2 (rank 2)" in line, stderr
    assert "the launcher killed node2" in line and "--resume" in line
    for node in ("node0", "node1"):  # the others stopped on their own, within the timeout (+ the diagnosis)
        log = (exp / "logs" / f"{node}.log").read_text()
        assert "error: lost node2 (rank 2)" in log
    assert time.monotonic() - stopped_at < timeout + 5 + 10
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids.values())


def test_a_node_that_cannot_start_is_reported_with_its_own_reason(cli, fl_exp, tmp_path):
    """Only node2's process reads node2's manifest; the others see it vanish. The line gives node2's reason."""
    exp = copy_exp(fl_exp, tmp_path)
    path = exp / "partition" / "nodes" / "node2.json"
    path.write_text(path.read_text().replace('"label": 1', '"label": 2', 1))
    line = cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", "--rounds", "1", *DISTRIBUTED,
                          "--timeout", "20")
    assert "node node2:" in line and "node2's unmodified" in line and "--resume" not in line
    assert "error: lost rank 2 during the rendezvous" in (exp / "logs" / "node0.log").read_text()  # before names


def test_partition_writes_a_manifest_per_node_holding_only_its_own_records(digits_exp):
    from fedcli.data.node_manifest import load_node_manifest

    manifest = Manifest.load(digits_exp)
    for rank, node in enumerate(manifest.node_names):
        view = read_json(digits_exp / "partition" / "nodes" / f"{node}.json", "node manifest")
        assert view["partition_hash"] == manifest.content_hash and view["node"] == node
        for entry in view["nodes"]:
            if entry["name"] == node:
                assert entry == manifest.node(node)
            else:
                full = manifest.node(entry["name"])
                assert entry == {"name": full["name"], "site": full["site"], "train_count": len(full["train"]),
                                 "test_count": len(full["test"])}
        assert "statistics" not in view  # per-node label counts of the others
        loaded = load_node_manifest(digits_exp, None, rank)
        assert loaded.own == node and loaded.content_hash == manifest.content_hash
        assert loaded.records(node, "test") == manifest.records(node, "test")
        other = manifest.node_names[(rank + 1) % 3]
        with pytest.raises(UserError, match=f"holds only node {node}'s records"):
            loaded.records(other, "train")


def test_an_edited_node_manifest_is_refused(digits_exp, tmp_path):
    from fedcli.data.node_manifest import load_node_manifest

    exp = copy_exp(digits_exp, tmp_path)
    path = exp / "partition" / "nodes" / "node1.json"
    path.write_text(path.read_text().replace('"label": 1', '"label": 2', 1))
    with pytest.raises(UserError, match="node1's unmodified"):
        load_node_manifest(exp, "node1", 0)


@pytest.mark.parametrize("args, expected", [
    (["--launch", "local"], "--launch applies to --engine distributed"),
    (["--cross-eval"], "--cross-eval applies to --engine distributed"),
    (["--engine", "distributed", "--strategy", "central"], "central pools every node's data"),
    (["--engine", "distributed", "--launch", "local", "--node", "node0"], "drop --node"),
    (["--engine", "distributed"], "needs a rendezvous"),
    (["--engine", "distributed", "--timeout", "0"], "--timeout must be positive"),
])
def test_distributed_options_that_cannot_work_are_one_line_errors(cli, digits_exp, args, expected, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert expected in cli.user_error("federate", "--exp", digits_exp, "--strategy", "fedavg", *args)
