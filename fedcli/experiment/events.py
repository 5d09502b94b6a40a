"""A stage's events as the run goes: `<exp>/logs/<stage>/events.jsonl`, one JSON object a line, and with
`--tensorboard` a few of the same numbers as TensorBoard runs, one per strategy (federate) or node (train-gan),
each its own folder `<exp>/logs/tensorboard/<stage>/<run>/` with the same tags as its siblings, so they overlay.

A running stage reports from deep inside (a generator kind's training loop, either federate engine), so
the stage opens its log for the block that runs it (`stage_log`, which writes the `start` line at once) and
the code that reports calls `record` (or `images`), which writes to the open log or, outside one (a rank that
does not write, a unit test), does nothing. The file is appended to: a rerun or a resumed run adds its lines
after a `start` line of its own, and a run that ends writes an `end` line (`"ok": false` when it failed), so
an interrupted one is the run without one. Each line is one `write` on a file opened for appending, which
other processes (two `train-gan --node` runs) cannot interleave. Nothing under `logs/` is an artifact: no
stage reads it back and no fingerprint covers it. A stage refused by a user error before its first result
leaves the log as it was (its start line withdrawn), as every refusal leaves the experiment.
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


def tensorboard_dir(exp: Path, stage: str, run: str) -> Path:
    """One TensorBoard run's folder: TensorBoard makes a run of each folder holding event files."""
    return inside(exp, "logs", "tensorboard", stage, run)


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
    """Stage logs opened in this block also write TensorBoard runs (`--tensorboard`); checked up front, so a
    missing package is one line before anything is written."""
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
    """One stage run's events file, opened with its `start` line, and its TensorBoard runs, each opened at its
    first number."""

    def __init__(self, exp: Path, stage: str, tensorboard: bool, start: Mapping[str, Any]):
        self.exp, self.stage, self.tensorboard = exp, stage, tensorboard
        self.path = events_path(exp, stage)
        self._size = self.path.stat().st_size if self.path.is_file() else None  # what a withdrawal restores
        self._made = [d for d in reversed(self.path.parents) if not d.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._boards: dict[str, Any] = {}
        self.recorded = False
        self._line("start", {"stage": stage, **start})

    def write(self, event: str, fields: Mapping[str, Any], run: str | None, scalars: Mapping[str, float] | None,
              step: int) -> None:
        self.recorded = True
        self._line(event, fields)
        board = self.board(run) if scalars else None
        if board is not None:
            for tag, value in scalars.items():
                board.add_scalar(tag, value, step)
            board.flush()

    def board(self, run: str | None):
        """`run`'s TensorBoard writer; None without --tensorboard or a run."""
        if not self.tensorboard or run is None:
            return None
        if run not in self._boards:
            self._boards[run] = summary_writer_class()(log_dir=str(tensorboard_dir(self.exp, self.stage, run)))
        return self._boards[run]

    def _line(self, event: str, fields: Mapping[str, Any]) -> None:
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")
        text = json.dumps(plain({"time": stamp, "event": event, **fields}), allow_nan=False, ensure_ascii=False)
        os.write(self._fd, (text + "\n").encode())

    def close(self, ok: bool) -> None:
        self._line("end", {"stage": self.stage, "ok": ok})
        os.close(self._fd)
        for board in self._boards.values():
            board.close()

    def withdraw(self) -> None:
        """Leave the log as it was before this run: a stage refused before its first result (a user error in its
        set-up) leaves nothing behind, as every refusal does."""
        os.close(self._fd)
        if self._size is None:
            self.path.unlink()
            for folder in reversed(self._made):
                folder.rmdir()
        else:
            os.truncate(self.path, self._size)


@contextlib.contextmanager
def stage_log(exp: Path, stage: str, **start: Any) -> Iterator[StageLog]:
    """`record` in this block writes to `stage`'s events (and TensorBoard, when on); the `start` line, with
    `start`'s fields, is written now, so a reader sees the stage begin before its first result."""
    log = StageLog(exp, stage, _tensorboard.get(), start)
    token = _open_log.set(log)
    try:
        yield log
    except UserError:
        _open_log.reset(token)
        if log.recorded:
            log.close(False)
        else:
            log.withdraw()
        raise
    except BaseException:
        _open_log.reset(token)
        log.close(False)
        raise
    _open_log.reset(token)
    log.close(True)


def record(event: str, fields: Mapping[str, Any], run: str | None = None,
           scalars: Mapping[str, float] | None = None, step: int = 0) -> None:
    """One line in the open stage log, and `scalars` (tag -> value) at `step` in TensorBoard run `run`; nothing
    when no log is open here."""
    log = _open_log.get()
    if log is not None:
        log.write(event, fields, run, scalars, step)


def images(run: str, grids: Mapping[str, Any], step: int = 0) -> None:
    """Image grids (tag -> an HxWxC uint8 array) in TensorBoard run `run`, when --tensorboard is on."""
    log = _open_log.get()
    board = log.board(run) if log is not None else None
    if board is not None:
        for tag, grid in grids.items():
            board.add_image(tag, grid, step, dataformats="HWC")
        board.flush()


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
