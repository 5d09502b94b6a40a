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


@pytest.fixture(scope="module")
def quick_exp(tmp_path_factory):
    """Partition and train-gan at the commands' own quick defaults: 3 digits nodes."""
    from conftest import Cli

    exp = tmp_path_factory.mktemp("quick") / "exp"
    Cli().ok("partition", "--nodes", "3", "--exp", exp)
    Cli().ok("train-gan", "--exp", exp)
    return exp


@pytest.mark.slow
def test_quick_config_buffers_are_class_faithful(quick_exp):
    """A classifier trained on a node's real digits labels its synthetic buffer mostly as the buffer's labels."""
    from sklearn.linear_model import LogisticRegression

    from fedcli.artifacts import load_tensors
    from fedcli.data.dataset import NodeDataset

    manifest = Manifest.load(quick_exp)
    for node in manifest.node_names:
        real = NodeDataset(manifest, node, "train")
        classifier = LogisticRegression(max_iter=2000, C=0.1).fit(real.images.flatten(1).numpy() / 255, real.labels)
        buffer = load_tensors(quick_exp / "gan" / node / "buffer.safetensors", "buffer")
        fidelity = classifier.score(buffer["images"].flatten(1).numpy() / 255, buffer["labels"].numpy())
        assert fidelity >= 0.7, (node, fidelity)


@pytest.mark.slow
def test_every_strategy_beats_chance_at_the_quick_config(quick_exp, cli):
    import pandas as pd

    from fedcli.fl.strategies import STRATEGIES

    args = [a for name in STRATEGIES for a in ("--strategy", name)]
    cli.ok("federate", "--exp", quick_exp, *args, "--bootstrap", "100", "--eval-every", "10")
    for name in STRATEGIES:
        metrics = pd.read_csv(quick_exp / "federate" / name / "metrics.csv")
        final = metrics[(metrics["round"] == metrics["round"].max()) & (metrics["model_node"] != "ensemble")]
        own = final[(final["model_node"] == final["test_node"]) | final["model_node"].isin(["global", "central"])]
        # chance on 10 balanced classes is 0.1; every node's own model must clear it with its whole 95% interval
        assert (own["accuracy_lo"] > 0.1).all() and own["accuracy"].mean() > 0.3, (name, own["accuracy"].tolist())
