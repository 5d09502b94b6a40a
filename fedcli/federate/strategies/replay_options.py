"""The options of every strategy that reads the nodes' synthetic buffers (one meaning each)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from fedcli.core.errors import UserError
from fedcli.experiment.config import MAX_COUNT
from fedcli.federate.strategies.base import option

BufferCodec = Literal["png", "raw"]
SYNTHETIC_ONLY = "trains on synthetic data, so it needs --buffer-size > 0"  # after the strategy's name


def buffer_size() -> int | None:
    return option(None, 0, MAX_COUNT, help="Use the first k buffer images of each node; 0 = no replay "
                  "\\[default: all].")


def codec() -> BufferCodec:
    return dataclasses.field(default="png", metadata={"help": "How buffers travel: png (lossless, per image) or "
                                                              "raw.", "select": False})


def lam() -> float:
    return option(0.5, 0, 1, help="lambda: loss = lambda CE(real) + (1 - lambda) CE(buffer).",
                  why="lambda, the weight of the real-data loss")


@dataclasses.dataclass(frozen=True)
class PooledBufferOptions:
    """A strategy that trains on the pooled buffers: how many images of each."""

    buffer_size: int | None = buffer_size()

    def __post_init__(self) -> None:
        if self.buffer_size == 0:
            raise UserError(SYNTHETIC_ONLY)


@dataclasses.dataclass(frozen=True)
class ReplayOptions:
    """A strategy that sends its buffer to other nodes and trains on the one it receives."""

    buffer_size: int | None = buffer_size()
    buffer_codec: BufferCodec = codec()
    lam: float = lam()

    @property
    def replay(self) -> bool:
        return self.buffer_size != 0


@dataclasses.dataclass(frozen=True)
class SyntheticReplayOptions(ReplayOptions):
    """A strategy whose primary images are its own buffer."""

    def __post_init__(self) -> None:
        if not self.replay:
            raise UserError(SYNTHETIC_ONLY)
