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


@pytest.mark.slow
def test_quick_config_buffer_is_class_faithful(tmp_path, cli):
    """A classifier trained on a node's real digits labels its synthetic buffer mostly as the buffer's labels."""
    from sklearn.linear_model import LogisticRegression

    from fedcli.artifacts import load_tensors
    from fedcli.data.dataset import NodeDataset

    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "3", "--exp", exp)
    cli.ok("train-gan", "--exp", exp, "--node", "node1")  # the command's own quick defaults
    manifest = Manifest.load(exp)
    real = NodeDataset(manifest, "node1", "train")
    classifier = LogisticRegression(max_iter=2000, C=0.1).fit(real.images.flatten(1).numpy() / 255, real.labels)
    buffer = load_tensors(exp / "gan" / "node1" / "buffer.safetensors", "buffer")
    fidelity = classifier.score(buffer["images"].flatten(1).numpy() / 255, buffer["labels"].numpy())
    assert fidelity >= 0.7, fidelity
