"""One node's process of a distributed stage, started by torchrun or by a launcher's `spawn`
(fedcli/comm/launcher.py): its log (`<exp>/logs/<node>.log`), its place in the group, and the entry point that
reads its config and ends a user error in one line of that log."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from fedcli.comm.group import Group
from fedcli.comm.relay_group import RelayGroup
from fedcli.core.devices import distributed_backend, resolve_device
from fedcli.core.errors import UserError, environment_message
from fedcli.data.node_manifest import load_node_manifest
from fedcli.experiment import events
from fedcli.experiment.config import stage_values
from fedcli.experiment.paths import inside

MISMATCH_EXIT = 3  # an error whose `node_exit` says so (a checkpoint from other options): the launcher tells it apart
RELAY_PORT = "FEDCLI_RELAY_PORT"  # --engine flower: the node's postbox port, for its bridge
TENSORBOARD_FLAG = "--tensorboard"  # how a launcher passes the stage's --tensorboard on to its nodes


def log_path(exp: Path, node: str) -> Path:
    return inside(exp, "logs", f"{node}.log")


def node_logger(exp: Path, node: str) -> logging.Logger:
    path = log_path(exp, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger(f"fedcli.node.{node}")
    logger.handlers.clear()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


@contextlib.contextmanager
def joined(cfg, stage: str = ""):
    """This process as a rank of `cfg`'s group: (group, its node's manifest, its log, its device); a user error
    is logged before it propagates, and the group is left at the end."""
    backend, device = distributed_backend(resolve_device(cfg.device))
    if cfg.engine == "flower":
        device = "cpu"  # the relay carries bytes; its collectives sum here
        manifest = load_node_manifest(cfg.exp, cfg.node, 0)
        group = RelayGroup(cfg.timeout, manifest.own, manifest.node_names, Path(cfg.bundle), relay_port())
    else:
        group = Group(cfg.timeout, backend, device)
    error = "stopped"
    try:
        manifest = load_node_manifest(cfg.exp, cfg.node, group.rank)
        log = node_logger(cfg.exp, manifest.own)
        log.info("%srank %d of %d, backend %s, device %s", stage, group.rank, group.world, group.backend, device)
        try:
            yield group, manifest, log, device
            error = None
        except UserError as exc:
            log.error("error: %s", exc)
            error = str(exc)
            raise
    finally:
        group.close(error)


def relay_port() -> int:
    """The loopback port this node's postbox serves its bridge on (set by whoever starts the bridge)."""
    try:
        return int(os.environ[RELAY_PORT])
    except (KeyError, ValueError):
        raise UserError(f"--engine flower: {RELAY_PORT} does not name this node's postbox port; start the node with "
                        "fedcli federate --engine flower (it starts the SuperNode and the bridge)") from None


def node_main(argv: list[str], config_class: type, stage: str, run: Callable) -> None:
    """`python -m MODULE CONFIG.json [--tensorboard]`: how a launcher's `spawn` starts a node of `stage`. Its
    output goes to the node's log, where the launcher reads the error line."""
    values = json.loads(Path(argv[0]).read_text())
    try:
        cfg = config_class(exp=Path(values.pop("exp")), **stage_values(config_class, stage, values, "launch config"))
        with events.tensorboard(TENSORBOARD_FLAG in argv[1:]):
            run(cfg)
    except UserError as exc:
        print(f"error: {exc}", flush=True)
        sys.exit(getattr(exc, "node_exit", 2))
    except OSError as exc:  # as the CLI does: a full disk or a denied folder is one line, in the node's log
        print(f"error: {environment_message(exc)}", flush=True)
        sys.exit(2)
