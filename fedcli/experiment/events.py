"""A stage's events as the run goes: `<exp>/logs/<stage>/events.jsonl`, one JSON object a line, and with
`--tensorboard` the same numbers as TensorBoard scalars under `<exp>/logs/tensorboard/<stage>/`.

A running stage reports from deep inside (a generator kind's training loop, either federate engine), so
the stage opens its log for the block that runs it (`stage_log`) and the code that reports calls
`record`, which writes to the open log or, outside one (a rank that does not write, a unit test), does
nothing. The file is appended to: a rerun or a resumed run adds its lines after a `start` line of its own,
and a run that ends writes an `end` line (`"ok": false` when it failed), so an interrupted one is the run
without one. Each line is one `write` on a file opened for appending, which other processes (two
`train-gan --node` runs) cannot interleave. Nothing under `logs/` is an artifact: no stage reads it back
and no fingerprint covers it. A run that fails before its first event writes nothing there.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fedcli.core.errors import UserError
from fedcli.experiment.paths import inside

EVENTS = "events.jsonl"
INSTALL_HINT = "pip install 'fedcli[tensorboard]' (or pip install tensorboard)"

_tensorboard = contextvars.ContextVar("fedcli_tensorboard", default=False)
_open_log: contextvars.ContextVar[StageLog | None] = contextvars.ContextVar("fedcli_stage_log", default=None)


def events_path(exp: Path, stage: str) -> Path:
    return inside(exp, "logs", stage, EVENTS)


def tensorboard_dir(exp: Path, stage: str) -> Path:
    return inside(exp, "logs", "tensorboard", stage)


def summary_writer_class():
    """torch's TensorBoard writer, which needs the tensorboard package; refused with how to install it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise UserError(f"--tensorboard needs the tensorboard package, which is not installed: {INSTALL_HINT}, "
                        "or drop --tensorboard") from exc
    return SummaryWriter


@contextlib.contextmanager
def tensorboard(on: bool) -> Iterator[None]:
    """Stage logs opened in this block also write TensorBoard scalars (`--tensorboard`); checked up front, so
    a missing package is one line before anything is written."""
    if on:
        summary_writer_class()
    token = _tensorboard.set(on)
    try:
        yield
    finally:
        _tensorboard.reset(token)


def tensorboard_wanted() -> bool:
    """Whether `--tensorboard` is on here (the distributed launcher passes it on to its nodes)."""
    return _tensorboard.get()


class StageLog:
    """One stage run's events file (and TensorBoard writer), both opened at the first event."""

    def __init__(self, exp: Path, stage: str, tensorboard: bool):
        self.path, self.stage = events_path(exp, stage), stage
        self.board_dir = tensorboard_dir(exp, stage) if tensorboard else None
        self._fd: int | None = None
        self._board = None

    def write(self, event: str, fields: Mapping[str, Any], scalars: Mapping[str, float] | None = None,
              step: int = 0) -> None:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            self._line("start", {"stage": self.stage})
        self._line(event, fields)
        if scalars and self.board_dir is not None:
            if self._board is None:
                self._board = summary_writer_class()(log_dir=str(self.board_dir))
            for tag, value in scalars.items():
                self._board.add_scalar(tag, value, step)
            self._board.flush()

    def _line(self, event: str, fields: Mapping[str, Any]) -> None:
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")
        text = json.dumps(plain({"time": stamp, "event": event, **fields}), allow_nan=False, ensure_ascii=False)
        os.write(self._fd, (text + "\n").encode())

    def close(self, ok: bool) -> None:
        if self._fd is not None:
            self._line("end", {"stage": self.stage, "ok": ok})
            os.close(self._fd)
            self._fd = None
        if self._board is not None:
            self._board.close()
            self._board = None


@contextlib.contextmanager
def stage_log(exp: Path, stage: str) -> Iterator[StageLog]:
    """`record` in this block writes to `stage`'s events (and TensorBoard, when on)."""
    log = StageLog(exp, stage, _tensorboard.get())
    token = _open_log.set(log)
    ok = False
    try:
        yield log
        ok = True
    finally:
        _open_log.reset(token)
        log.close(ok)


def record(event: str, fields: Mapping[str, Any], scalars: Mapping[str, float] | None = None, step: int = 0) -> None:
    """One line in the open stage log, and `scalars` (tag -> value) at `step` for TensorBoard; nothing when no
    log is open here."""
    log = _open_log.get()
    if log is not None:
        log.write(event, fields, scalars, step)


def plain(value: Any) -> Any:
    """`value` as strict JSON: NaN and infinities become null, numpy scalars Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def scalars_of(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers among `values` (booleans aside), for TensorBoard."""
    found = {}
    for key, value in values.items():
        value = plain(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[key] = float(value)
    return found
