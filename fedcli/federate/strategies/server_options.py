"""Options of the strategies with a server step on the averaged update (one meaning each)."""

from __future__ import annotations

from fedcli.federate.strategies.base import option


def server_lr(default: float) -> float:
    return option(default, 0, 10, low_open=True, select=True,
                  help="Server learning rate: the server's step along the nodes' averaged update (Reddi et al.'s eta).")
