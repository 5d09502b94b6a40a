"""`--launch local`: one process per node on this machine, over loopback, as torchrun would start them.

The launcher hosts the rendezvous store itself (so a node that dies does not take the store with it, as with
torchrun's agent), starts the nodes with torchrun's environment variables, and watches them. When one fails,
the others stop on their own within the timeout (they name the missing node); any still running after that
are killed, so no process is left behind, and the launcher reports one line. federate and train-gan each start
their own node module through `spawn`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from fedcli.comm.group import published_verdict
from fedcli.comm.node_process import TENSORBOARD_FLAG, log_path
from fedcli.experiment import events
from fedcli.experiment.config import to_json
from fedcli.experiment.locking import TOKEN, TOKEN_ENV

GRACE_S = 5.0  # beyond the timeout, before the launcher kills a node that has not stopped


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclasses.dataclass
class Ended:
    """How the nodes of a launch ended: the exit code of each that failed, its last error line, the node the
    survivors named, and those the launcher had to kill."""

    failed: dict[str, int]
    errors: dict[str, str | None]
    named: str | None
    stuck: list[str]

    def line(self, exp: Path, timeout: float, tail: str) -> str:
        """One line: which node stopped and how, what the others saw, and how to continue (`tail`)."""
        killed = [f"{node} was killed by {signal.Signals(-code).name}" for node, code in self.failed.items()
                  if code < 0 and node not in self.stuck]
        causes = [f"node {node}: {message or f'exit code {self.failed[node]}; see its log'}"
                  for node, message in self.errors.items()
                  if self.failed[node] > 0 and not (message or "").startswith("lost ")]
        if killed:
            parts = killed + ([f"the others stopped ({self.named})"] if self.named else [])
        else:
            parts = causes[:1] or [self.named or "see the logs"]
        if self.stuck:
            parts.append(f"the launcher killed {', '.join(self.stuck)}, still running {timeout + GRACE_S:g} s later")
        return "distributed run failed: " + "; ".join(parts) + tail + f" (logs: {exp / 'logs'})"


def spawn(cfg, nodes: list[str], module: str) -> Ended:
    """One process per node (`python -m module CONFIG.json [--tensorboard]`, `cfg` as that node's with no launch
    and its share of the threads), rank by rank in `nodes` order, over a store this launcher hosts; watched
    until every one has ended."""
    exp, timeout = cfg.exp, cfg.timeout
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // len(nodes))
    configs = {node: to_json(dataclasses.replace(cfg, launch="none", threads=threads, node=node)) for node in nodes}
    flags = [TENSORBOARD_FLAG] if events.tensorboard_wanted() else []
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    with tempfile.TemporaryDirectory(prefix="fedcli-launch-") as tmp:
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(len(configs)),
               "LOCAL_WORLD_SIZE": str(len(configs)), "FEDCLI_STORE_HOSTED": "1", "OMP_NUM_THREADS": str(threads),
               TOKEN_ENV: TOKEN}
        procs, logs = {}, {}
        for rank, (node, values) in enumerate(configs.items()):
            config = Path(tmp) / f"{node}.json"  # the node is named, so no rank looks it up in another's manifest
            config.write_text(json.dumps({k: v for k, v in values.items() if v is not None}))
            log = log_path(exp, node)
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as handle:  # the child keeps its own descriptor
                logs[node] = (log, handle.tell())  # this launch's lines start here
                procs[node] = subprocess.Popen(
                    [sys.executable, "-m", module, str(config), *flags], stdout=handle,
                    stderr=None if rank == 0 else handle, env=env | {"RANK": str(rank), "LOCAL_RANK": str(rank)})
        try:
            stuck = watch(procs, timeout + GRACE_S)
        except BaseException:
            stop(procs)
            raise
    failed = {node: p.returncode for node, p in procs.items() if p.returncode != 0}
    return Ended(failed, {node: last_error(*logs[node]) for node in failed}, verdict(store) if failed else None, stuck)


def watch(procs: dict[str, subprocess.Popen], patience: float) -> list[str]:
    """Wait for every node; once one has failed, give the rest `patience` seconds, then kill them.
    Returns the nodes the launcher killed."""
    deadline = None
    while any(p.poll() is None for p in procs.values()):
        if deadline is None and any(p.returncode not in (None, 0) for p in procs.values()):
            deadline = time.monotonic() + patience
        if deadline is not None and time.monotonic() > deadline:
            return stop(procs)
        time.sleep(0.05)
    return []


def stop(procs: dict[str, subprocess.Popen]) -> list[str]:
    running = [node for node, p in procs.items() if p.poll() is None]
    for node in running:
        procs[node].kill()
    for p in procs.values():
        p.wait()
    return running


def verdict(store: dist.Store) -> str | None:
    """The missing node as the surviving nodes named it in the store, if they did."""
    try:
        published = published_verdict(dist.PrefixStore("fedcli", store))
    except RuntimeError:
        return None
    return None if published is None else published[0]


def last_error(log: Path, start: int) -> str | None:
    """The last `error:` line this launch's node wrote to its log."""
    if not log.is_file():
        return None
    with open(log, "rb") as handle:
        handle.seek(start)
        lines = handle.read().decode(errors="replace").splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    return errors[-1].removeprefix("error: ") if errors else None
