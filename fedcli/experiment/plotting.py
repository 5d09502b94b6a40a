"""matplotlib for the stages' figures, kept inside the experiment's promise.

A stage writes only inside `--exp`, but matplotlib keeps its font cache and reads its config under
the home folder ($HOME/.cache/matplotlib, $HOME/.config/matplotlib). Unless the user chose a folder
for it (MPLCONFIGDIR, which is kept), fedcli points matplotlib at a temporary folder of its own,
removed when the process ends: the font cache is rebuilt once per process (about a second), and a
user's matplotlibrc under the home folder does not change fedcli's figures.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fedcli.experiment.artifacts import atomic_write_bytes

CONFIG_DIR = "MPLCONFIGDIR"


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    keep_matplotlib_out_of_home()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def keep_matplotlib_out_of_home() -> None:
    """Give matplotlib a temporary config and cache folder before its first import (it reads MPLCONFIGDIR
    then), unless the user set one."""
    if CONFIG_DIR in os.environ or "matplotlib" in sys.modules:
        return
    folder = tempfile.mkdtemp(prefix="fedcli-matplotlib-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ[CONFIG_DIR] = folder


def save_figure(fig, path: Path, **options) -> None:
    """Write `fig` to `path` (its format from the suffix) as every artifact is written, whole or not at all
    (artifacts.atomic_write_bytes: on a full disk no half figure stays and the line names the path), then
    free it."""
    data = io.BytesIO()
    fig.savefig(data, format=Path(path).suffix.lstrip("."), **options)
    pyplot().close(fig)
    atomic_write_bytes(path, data.getvalue())
