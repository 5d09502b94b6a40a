"""Progress on stderr that a stage opens with `with`; subclasses add tasks and updates.

On a terminal, a rich bar. Anywhere else (a cluster job, nohup, tee) rich would print each bar once, when
it ends, cut to the console's width; there the same tasks are written as plain lines instead (`PlainLines`).
"""

from __future__ import annotations

import datetime
import threading
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, Task, TextColumn, TimeRemainingColumn

from fedcli.core import console

POLL_S = 1.0  # how often the line writer looks at the tasks
INTERVAL_S = 15.0  # between two lines of a task still running


class ProgressBar:
    """`stage` and `unit` (what a task counts, e.g. "it") name the plain lines; `on_terminal=False` draws
    nothing on a terminal (a step that had no bar there)."""

    announce = False  # off a terminal, a line for each task at once rather than at its first advance

    def __init__(self, stage: str, unit: str, *extra_columns, on_terminal: bool = True):
        terminal = console.err.is_terminal
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *extra_columns,
                                 TimeRemainingColumn(), console=console.err, disable=not (terminal and on_terminal))
        self.lines = None if terminal else PlainLines(self.progress, stage, unit)

    def __enter__(self):
        self.progress.__enter__()
        if self.lines is not None:
            self.lines.start(self.announce)
        return self

    def __exit__(self, *exc) -> None:
        if self.lines is not None:
            self.lines.stop(failed=exc[0] is not None)
        if exc[0] is not None:  # a failure ends in one error line: the bar it interrupted goes
            self.progress.live.transient = True
        self.progress.__exit__(*exc)


class StepProgress(ProgressBar):
    """A long step outside the bars (a buffer's fidelity score, FID's feature network, a VQ-VAE-2's turn in the
    serial chain), so that a log off a terminal does not fall silent during it: a line when it starts (it has
    no first advance to wait for; it runs after the stage's checks), every interval, and when it ends. Without
    `total` it has no count and a terminal shows nothing, as before; with `total` steps, each `advance` counts
    one, its lines show the count, rate and time left, and a terminal draws its bar."""

    announce = True

    def __init__(self, stage: str, description: str, total: int | None = None):
        super().__init__(stage, "step", on_terminal=total is not None)
        self.task = self.progress.add_task(description, total=total)

    def advance(self, steps: int = 1) -> None:
        self.progress.advance(self.task, steps)


class PlainLines:
    """A bar's tasks as plain lines, without control codes or a width limit: a line when a task first
    advances, one for every running task each INTERVAL_S seconds, and one when it ends, each with the
    stage, the task, its count and total, rate, time left and its status. A thread of their own writes
    them, so a slow step (a long round) still gets its lines on time; a failure adds none (its error line
    follows what was written)."""

    def __init__(self, progress: Progress, stage: str, unit: str):
        self.progress, self.stage, self.unit = progress, stage, unit
        self.shown: set[int] = set()
        self.ended: set[int] = set()
        self.last_line = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fedcli-progress-lines", daemon=True)

    def start(self, announce: bool = False) -> None:
        self.last_line = time.monotonic()
        if announce:
            started = [task for task in self.progress.tasks if task.started]
            self.shown.update(task.id for task in started)
            self.write([self.line(task) for task in started])
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        """Lines for the tasks that first advanced or ended since the last tick, and for every running task
        once INTERVAL_S has passed since the last line."""
        due = now - self.last_line >= INTERVAL_S
        lines = []
        for task in self.progress.tasks:
            finished = task.finished
            if not task.started or task.id in self.ended:
                continue
            if finished:
                self.ended.add(task.id)
            elif not (due or (task.completed > 0 and task.id not in self.shown)):
                continue
            self.shown.add(task.id)
            lines.append(self.line(task, ended=finished))
        if lines:
            self.last_line = now
            self.write(lines)

    def stop(self, failed: bool) -> None:
        """Stop the thread; after a success, the last line of every task not yet ended."""
        self._stop.set()
        self._thread.join()
        if failed:
            return
        self.tick(time.monotonic())
        left = [task for task in self.progress.tasks if task.started and task.id not in self.ended]
        self.ended.update(task.id for task in left)
        self.write([self.line(task, ended=True) for task in left])

    def line(self, task: Task, ended: bool = False) -> str:
        parts = []
        if task.total is not None or task.completed:  # a step without a count has none to show
            parts.append(f"{task.completed:.0f}" + ("" if task.total is None else f"/{task.total:.0f}"))
        elapsed = (task.finished_time if ended and task.finished_time is not None else task.elapsed) or 0.0
        rate = (task.completed / elapsed if elapsed else None) if ended else task.speed
        if rate:
            parts.append(rate_text(rate, self.unit))
        if ended:
            parts.append(f"done in {duration(elapsed)}")
        else:
            if task.time_remaining is not None:
                parts.append(f"eta {duration(task.time_remaining)}")
            parts.append(f"elapsed {duration(elapsed)}")
        status = task.fields.get("status")
        return (f"{time.strftime('%H:%M:%S')} {self.stage} {task.description}: {', '.join(parts)}"
                + (f" | {status}" if status else ""))

    @staticmethod
    def write(lines: list[str]) -> None:
        for line in lines:
            console.err.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)


def rate_text(per_second: float, unit: str) -> str:
    return f"{per_second:.1f} {unit}/s" if per_second >= 1 else f"{1 / per_second:.1f} s/{unit}"


def duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))
