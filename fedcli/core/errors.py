"""The one exception type for mistakes a user can fix, and the one line an environment failure
(a full disk, a folder without write permission, a file where a folder should be) becomes: the CLI
prints either as one line, exit code 2."""

from __future__ import annotations

import errno

ADVICE = {
    errno.ENOSPC: "free some disk space (or choose another --exp) and rerun",
    errno.EDQUOT: "free some of your disk quota (or choose another --exp) and rerun",
    errno.EACCES: "check the folder's permissions or choose another --exp",
    errno.EPERM: "check the folder's permissions or choose another --exp",
    errno.EROFS: "the file system is read-only: choose another --exp",
    errno.ENOTDIR: "a file stands where a folder is needed: move it away or choose another --exp",
    errno.EISDIR: "a folder stands where a file is needed: move it away",
    errno.EEXIST: "something already stands there: move it away",
    errno.ENAMETOOLONG: "choose a shorter --exp path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) and rerun",
}


class UserError(Exception):
    """Bad input, options or artifacts. The message says what is wrong and what to do."""


def environment_message(exc: OSError) -> str:
    """One line for an OSError the machine raised: what failed, where, and what to do."""
    where = f" {exc.filename}" if exc.filename is not None else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    advice = ADVICE.get(exc.errno, "check the path and the disk, then rerun")
    return f"cannot use{where} ({reason}); {advice}"
