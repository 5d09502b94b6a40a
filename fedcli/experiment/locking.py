"""Experiment locks: one process at a time writes a stage output.

A stage takes the lock of every output it will write before it starts (before any training), so a
second process on the same experiment is refused at once with one line naming the holder, instead
of both training and the loser failing at the end or leaving a checkpoint that a later `--resume`
would use. A lock is `flock` on a file under `<exp>/.locks/`: the kernel drops it when its process
dies, so a killed run never leaves a stale lock. The file records the holder (pid, host, command
line, start time) for that line, and is removed on release. Locks are reentrant within a process
(`fedcli run` calls the stages in process).

A federate output is locked per node part (its checkpoint has one part per node): the in-process
engine and `--launch local` lock every node's part, a rank started by hand (torchrun) only its own.
The ranks of one `--launch local` run share their launcher's locks: the launcher gives them its
token (FEDCLI_LOCK_TOKEN) and a rank accepts a lock held under that token.

The process that takes an output's lock removes the leftovers of an interrupted write of it (see
`artifacts.remove_leftovers`) and says so in a `note:` line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shlex
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from fedcli.core import console
from fedcli.core.errors import UserError
from fedcli.experiment.artifacts import in_folder, remove_leftovers

LOCKS = ".locks"
TOKEN_ENV = "FEDCLI_LOCK_TOKEN"
TOKEN = secrets.token_hex(8)  # this process's: every lock it takes records it


class Locked(UserError):
    """Another process holds the lock of an output."""


@dataclasses.dataclass
class Held:
    fd: int | None  # None: held under the launcher's token (or this process's, by another path)
    created: list[Path]  # folders made for the lock file, removed with it when empty
    depth: int = 1


HELD: dict[Path, Held] = {}


@contextlib.contextmanager
def locked(exp: Path, outputs: Iterable[Path], parts: Iterable[str] | None = None) -> Iterator[None]:
    """Hold the locks of `outputs` (or of the given node `parts` of each) for the block; refuse at once,
    naming the holder, when another process holds one."""
    parts = None if parts is None else list(parts)
    taken: list[Path] = []
    try:
        for output in outputs:
            fresh = False
            for part in [None] if parts is None else parts:
                path = lock_path(exp, output, part)
                fresh |= enter(path, output)
                taken.append(path)
            if fresh and Path(output) != Path(exp):
                tidy(Path(output))
        yield
    finally:
        for path in reversed(taken):
            leave(path)


def lock_path(exp: Path, output: Path, part: str | None) -> Path:
    """`<exp>/.locks/federate#feder@node0.lock`: `#` and `@` never occur in checked names."""
    name = "#".join(Path(output).relative_to(exp).parts) or "experiment"
    return Path(exp) / LOCKS / (name + (f"@{part}" if part else "") + ".lock")


def enter(path: Path, output: Path) -> bool:
    """Take (or re-enter, or inherit) one lock; True when this call took it."""
    held = HELD.get(path)
    if held is not None:
        held.depth += 1
        return False
    try:
        fd, created = take(path)
    except Busy as busy:
        ours = {TOKEN, os.environ.get(TOKEN_ENV)} - {None}  # this process (the same file by another path), its launcher
        if busy.holder and busy.holder.get("token") in ours:
            HELD[path] = Held(None, [])
            return False
        raise Locked(f"{output} is being written by {describe(busy.holder)}; wait for it to finish or stop it") \
            from None
    HELD[path] = Held(fd, created)
    return True


def leave(path: Path) -> None:
    held = HELD[path]
    held.depth -= 1
    if held.depth:
        return
    del HELD[path]
    if held.fd is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # still locked: a process that opened it meanwhile finds it unlinked and retries
        os.close(held.fd)
    remove_empty([*held.created, path.parent])  # .locks goes when empty, whoever made it


def remove_empty(folders: list[Path]) -> None:
    """The folders a lock created (outermost first), innermost first, where nothing else was put."""
    for folder in reversed(folders):
        with contextlib.suppress(OSError):
            folder.rmdir()


class Busy(Exception):
    def __init__(self, holder: dict | None):
        super().__init__()
        self.holder = holder


def take(path: Path) -> tuple[int, list[Path]]:
    """Lock the file at `path` (created if needed) and record this process in it."""
    created: list[Path] = []
    try:
        while True:
            missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
            in_folder(path.parent)
            created += reversed(missing)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:  # a releasing holder removed the empty folder meanwhile
                continue
            current = False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                current = same_file(fd, path)
                if current:
                    write_record(fd)
            except BlockingIOError:
                holder = read_holder(fd)
                os.close(fd)
                raise Busy(holder) from None
            except BaseException:
                if current:
                    path.unlink(missing_ok=True)
                os.close(fd)
                raise
            if current:
                return fd, created
            os.close(fd)  # its holder released (and unlinked) it between our open and flock: try again
    except BaseException:
        remove_empty(created)
        raise


def write_record(fd: int) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command_line(), "since": time.time(),
              "token": TOKEN}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)


def same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def read_holder(fd: int) -> dict | None:
    """The holder's record; None when it has not written it yet (or it is not ours)."""
    try:
        record = json.loads(os.pread(fd, 1 << 16, 0))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe(holder: dict | None) -> str:
    """`pid 123 (fedcli federate --exp x, since 12:03)`."""
    if holder is None:
        return "another process"
    host = holder.get("host")
    where = f" on {host}" if host and host != socket.gethostname() else ""
    since = holder.get("since")
    when = ""
    if isinstance(since, (int, float)):
        same_day = time.localtime(since)[:3] == time.localtime()[:3]
        when = ", since " + time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", time.localtime(since))
    command = str(holder.get("command", "?"))
    command = command if len(command) <= 100 else command[:97] + "..."
    return f"pid {holder.get('pid', '?')}{where} ({command}{when})"


def command_line() -> str:
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    program = "fedcli" if program in ("fedcli", "__main__.py") else program
    return shlex.join([program, *sys.argv[1:]])


def tidy(output: Path) -> None:
    removed, restored = remove_leftovers(output)
    if removed:
        put_back = "; the previous output, moved aside, was put back" if restored else ""
        console.out.print(f"note: removed {len(removed)} leftover folder(s) of an interrupted write of {output} "
                          f"({', '.join(removed)}){put_back}", markup=False, soft_wrap=True)
