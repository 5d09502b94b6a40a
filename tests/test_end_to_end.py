"""A few real subprocess runs: the installed console script and `python -m fedcli`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedcli.data.manifest import Manifest

REPO = Path(__file__).resolve().parents[1]


def run(*args, **kwargs):
    return subprocess.run([*args], capture_output=True, text=True, timeout=120, **kwargs)


@pytest.mark.slow
def test_python_m_fedcli_partitions_with_the_quickstart_recipe(tmp_path):
    result = run(sys.executable, "-m", "fedcli", "partition", "--config", REPO / "recipes" / "quickstart.toml",
                 "--exp", tmp_path / "exp")
    assert result.returncode == 0, result.stderr
    assert "Jensen-Shannon" in result.stdout
    assert len(Manifest.load(tmp_path / "exp").node_names) == 3


@pytest.mark.slow
def test_console_script_error_is_one_line_with_exit_code_2(tmp_path):
    script = shutil.which("fedcli", path=str(Path(sys.executable).parent))
    assert script, "the fedcli console script is not installed next to this Python"
    result = run(script, "partition", "--image-size", "48", "--exp", tmp_path / "exp")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: --image-size must be a power of two >= 16 (16, 32, 64, "
                                                  "...), got 48"]
    assert not (tmp_path / "exp").exists()
