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
def quickstart(tmp_path_factory):
    """The README's main job, in-process: `fedcli run recipes/quickstart.toml` (about 3 minutes on 2 cores)."""
    from conftest import Cli

    exp = tmp_path_factory.mktemp("quickstart") / "exp"
    output = Cli().ok("run", REPO / "recipes" / "quickstart.toml", "--exp", exp).output
    return exp, output


@pytest.mark.slow
def test_quickstart_report_holds_the_study_tables_and_figures(quickstart):
    exp, output = quickstart
    assert f"report: {exp / 'report' / 'report.md'}" in output
    report = (exp / "report" / "report.md").read_text()
    for table in ("Table 2.", "Table 3.", "Table 4.", "Table 5.", "Table 7.", "Table 8.", "Privacy summary",
                  "Partition summary", "GAN summary"):
        assert f"**{table}" in report, table
    made, missing = report.split("## Not in this report")
    assert "Table 1." in missing and "Table 6." in missing and "Table 1." not in made
    for figure in ["rounds.png", "partition.png"] + [f"audit_node{i}_{kind}.png" for i in range(3)
                                                     for kind in ("histogram", "pairs")]:
        assert (exp / "report" / "figures" / figure).stat().st_size > 1000, figure
        assert f"(figures/{figure})" in report
    for key in ("table2_node_performance", "table4_federated", "table8_communication", "privacy_summary"):
        assert (exp / "report" / f"{key}.csv").is_file()
        assert "\\toprule" in (exp / "report" / "tex" / f"{key}.tex").read_text()


@pytest.mark.slow
def test_quickstart_buffers_are_class_faithful(quickstart):
    """A classifier trained on a node's real digits labels its synthetic buffer mostly as the buffer's labels."""
    from sklearn.linear_model import LogisticRegression

    from fedcli.experiment.artifacts import load_tensors
    from fedcli.data.dataset import NodeDataset

    exp, _ = quickstart
    manifest = Manifest.load(exp)
    for node in manifest.node_names:
        real = NodeDataset(manifest, node, "train")
        classifier = LogisticRegression(max_iter=2000, C=0.1).fit(real.images.flatten(1).numpy() / 255, real.labels)
        buffer = load_tensors(exp / "gan" / node / "buffer.safetensors", "buffer")
        fidelity = classifier.score(buffer["images"].flatten(1).numpy() / 255, buffer["labels"].numpy())
        assert fidelity >= 0.7, (node, fidelity)


@pytest.mark.slow
def test_quickstart_every_strategy_beats_chance(quickstart):
    import tomllib

    import pandas as pd

    exp, _ = quickstart
    recipe = tomllib.loads((REPO / "recipes" / "quickstart.toml").read_text())
    assert len(recipe["federate"]["strategy"]) == 11  # every strategy of the study, each checked below
    for name in recipe["federate"]["strategy"]:
        metrics = pd.read_csv(exp / "federate" / name / "metrics.csv")
        final = metrics[(metrics["round"] == metrics["round"].max()) & (metrics["model_node"] != "ensemble")]
        own = final[(final["model_node"] == final["test_node"]) | final["model_node"].isin(["global", "central"])]
        # chance on 10 balanced classes is 0.1: every strategy clears it on average, and every node's own model
        # with its whole 95% interval where it trains on real images. FedER-B trains on synthetic images only;
        # on the inverted scanner its stored BatchNorm statistics score near chance (its bn_statistics.csv shows
        # how much re-estimated ones recover), a result the report shows rather than a broken pipeline.
        assert own["accuracy"].mean() > 0.3, (name, own["accuracy"].tolist())
        if name != "feder-b":
            assert (own["accuracy_lo"] > 0.1).all(), (name, own["accuracy"].tolist())


@pytest.mark.slow
def test_quickstart_second_run_skips_every_stage(quickstart, cli):
    exp, _ = quickstart
    before = (exp / "report" / "report.md").read_bytes()
    output = cli.ok("run", REPO / "recipes" / "quickstart.toml", "--exp", exp).output
    assert "0 ran, 15 up to date" in output
    assert (exp / "report" / "report.md").read_bytes() == before
