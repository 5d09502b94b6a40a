"""Plugins from another distribution (tests/plugins: fedcli-test-plugins 0.1, on every test's path, see conftest):
its strategy, generator kind, data source and classifier appear in --help and `fedcli plugins`, and go through
partition, train-gan, federate (both engines), predict and report as built-in ones do; a plugin that takes a
taken name or fails to import is refused in one line naming its distribution. The registry's parametrised tests
(resume, engine equality, fingerprints: test_strategy_registry.py) run on its strategy too."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import flat_pngs
from fedcli.core import plugins
from fedcli.core.errors import UserError
from fedcli.experiment.artifacts import parse_tensors
from fedcli.experiment.config import ranged
from fedcli.experiment.panels import GENERATOR
from fedcli.federate.strategies import discover as discover_strategies
from fedcli.generators.config import merged_fields
from fedcli.generators.registry import discover as discover_kinds

DIST = "fedcli-test-plugins"
FAST = ("--rounds", "2", "--epochs", "1", "--init-epochs", "0", "--bootstrap", "20", "--threads", "1")


def studies(folder: Path) -> Path:
    """The `studies` source's files: two sites, two labels, ten patients with two studies each."""
    return flat_pngs(folder, ("east", "west"), {"benign": 70, "malignant": 180},
                     [f"p{patient}-{study}" for patient in range(10) for study in (1, 2)])


def test_fedcli_plugins_lists_each_plugin_with_its_distribution_and_help_names_them(cli):
    lines = cli.ok("plugins").stdout.strip().splitlines()
    location = str(Path(__file__).parent / "plugins")
    assert lines == [f"{what} {name}: {value} from {DIST} 0.1 ({location})" for what, name, value in (
        ("strategy", "fedavg-step", "fedcli_test_plugins.strategy"),
        ("generator kind", "class-mean", "fedcli_test_plugins.class_mean"),
        ("data source", "studies", "fedcli_test_plugins.studies:read"),
        ("classifier", "tinycnn", "fedcli_test_plugins.tinycnn:tiny_cnn"))]
    assert "studies" in cli.ok("partition", "--help").stdout
    assert "class-mean" in cli.ok("train-gan", "--help").stdout
    federate_help = cli.ok("federate", "--help").stdout
    assert "fedavg-step: FedAvg-step" in federate_help and "tinycnn" in federate_help


def test_every_plugin_goes_through_every_stage_on_both_engines(cli, tmp_path):
    exp, data = tmp_path / "exp", studies(tmp_path / "scans")
    cli.ok("partition", "--source", "studies", "--data-dir", data, "--image-size", "16", "--exp", exp)
    manifest = json.loads((exp / "partition" / "manifest.json").read_text())
    assert manifest["source"] == "studies" and [n["name"] for n in manifest["nodes"]] == ["east", "west"]
    for node in manifest["nodes"]:  # each patient's two studies on one side of the split
        assert not {r["group"] for r in node["test"]} & {r["group"] for r in node["train"]}

    gan = ("--generator", "class-mean", "--fidelity-seeds", "1", "--fidelity-epochs", "1", "--threads", "1")
    cli.ok("train-gan", "--exp", exp, *gan)
    alone = tmp_path / "alone"
    cli.ok("partition", "--source", "studies", "--data-dir", data, "--image-size", "16", "--exp", alone)
    for node in ("east", "west"):  # each hospital on its own machine
        cli.ok("train-gan", "--exp", alone, "--node", node, *gan)
        assert (alone / "gan" / node / "buffer.safetensors").read_bytes() == \
            (exp / "gan" / node / "buffer.safetensors").read_bytes()

    model = ("--model", "tinycnn")
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg-step", "--strategy", "feder", *model, *FAST)
    cli.ok("federate", "--exp", alone, "--strategy", "fedavg-step", "--strategy", "feder", *model, *FAST,
           "--engine", "distributed", "--launch", "local", "--cross-eval")
    for name in ("fedavg-step", "feder"):
        pd.testing.assert_frame_equal(pd.read_csv(alone / "federate" / name / "metrics.csv"),
                                      pd.read_csv(exp / "federate" / name / "metrics.csv"),
                                      check_exact=False, rtol=0, atol=1e-6)
    config = json.loads((exp / "federate" / "fedavg-step" / "config.json").read_text())["config"]
    assert config["server_lr"] == 0.8 and config["model"] == ["tinycnn"]

    predicted = {}
    for folder in (exp, alone):
        predicted[folder] = tmp_path / f"{folder.name}.csv"
        cli.ok("predict", "--exp", folder, "--strategy", "fedavg-step", "--data-dir", data, "--out", predicted[folder],
               "--device", "cpu")
        cli.ok("report", folder)
        report = (folder / "report" / "report.md").read_text()
        assert "fedavg-step" in report and "class-mean" in report
    assert len(pd.read_csv(predicted[exp])) == len(list(data.glob("*.png")))
    assert predicted[exp].read_bytes() == predicted[alone].read_bytes()  # the same model from either engine


def test_fedavg_step_is_fedavgm_without_momentum(cli, digits_exp, tmp_path):
    exp = tmp_path / "exp"
    cli.ok("partition", "--source", "digits", "--nodes", "2", "--image-size", "16", "--train-size", "64",
           "--exp", exp)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg-step", "--strategy", "fedavgm", "--server-lr", "0.7",
           "--server-momentum", "0", *FAST)
    frames = [pd.read_csv(exp / "federate" / name / "metrics.csv").drop(columns="strategy")
              for name in ("fedavg-step", "fedavgm")]
    pd.testing.assert_frame_equal(*frames)


def distribution(root: Path, name: str, entry_points: str, files: dict[str, str] = {}) -> Path:
    """A plugin distribution under `root`: its metadata and files (module paths), as an install would lay them out."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture
def extra_distribution(tmp_path, monkeypatch):
    """Put a distribution made by the test on the path, for in-process discovery."""
    def put(*args, **kwargs):
        monkeypatch.syspath_prepend(str(distribution(tmp_path, *args, **kwargs)))
        plugins.installed.cache_clear()
    yield put
    plugins.installed.cache_clear()


@pytest.mark.parametrize("group,name,what", [("strategies", "fedavg", "strategy"), ("sources", "digits", "data source"),
                                             ("models", "resnet18", "classifier")])
def test_a_plugin_taking_a_built_in_name_stops_the_command_line_in_one_line(tmp_path, group, name, what):
    root = distribution(tmp_path, "clash", f"[fedcli.{group}]\n{name} = clash_plugin:read\n",
                        {"clash_plugin.py": "DECLARED = ()\n"})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ["PYTHONPATH"]]))
    done = subprocess.run([sys.executable, "-m", "fedcli", "partition", "--help"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"error: plugin {what} {name!r} of distribution clash 0.1 takes the name of fedcli's built-in {what} "
        f"{name!r}; rename it; fix that distribution or uninstall it (pip uninstall clash)"]


CLASHING = """import dataclasses
from fedcli.federate.strategies.base import Declaration, option

@dataclasses.dataclass(frozen=True)
class Options:
    server_lr: float = option(1.0, 0, 5, help="A step of another meaning.")

DECLARED = (Declaration("clashing", "a clash", lambda o: None, options=Options),)
"""
KIND = "from fedcli.generators.vqvae2.kind import KIND\n"
OPTIONS = "from fedcli.generators.vqvae2.options import OPTIONS\n"


@pytest.mark.parametrize("group,entry,files,expected", [
    ("strategies", "broken = broken", {"broken.py": "raise ImportError('no torch_geometric')"},
     "plugin strategy 'broken' of distribution bad 0.1 fails to import (broken: ImportError: no torch_geometric)"),
    ("strategies", "nothing = broken", {"broken.py": "DECLARED = ()"},
     "plugin strategy 'nothing' of distribution bad 0.1 names module broken, whose DECLARED holds no Declaration "
     "named 'nothing'"),
    ("strategies", "fedavg-step = broken", {"broken.py": "DECLARED = ()"},
     "plugin strategy 'fedavg-step' is given by two distributions, bad 0.1 and fedcli-test-plugins 0.1; uninstall "
     "one of them (pip uninstall bad, or pip uninstall fedcli-test-plugins)"),
    ("strategies", "clashing = clashing", {"clashing.py": CLASHING},  # a module name of its own: one import per test run
     "plugin strategy 'clashing' of distribution bad 0.1 cannot join the registry (strategy 'clashing' declares "
     "option 'server_lr' with another meaning than"),
    ("generators", "lost = broken", {"broken.py": ""},
     "plugin generator kind 'lost' of distribution bad 0.1 fails to import (broken.kind:KIND: ModuleNotFoundError"),
    ("generators", "vqvae2 = twin", {"twin/__init__.py": "", "twin/kind.py": KIND, "twin/options.py": OPTIONS},
     "plugin generator kind 'vqvae2' of distribution bad 0.1 takes the name of fedcli's generator kind 'vqvae2'"),
    ("generators", "other = twin", {"twin/__init__.py": "", "twin/kind.py": KIND, "twin/options.py": OPTIONS},
     "plugin generator kind 'other' of distribution bad 0.1 declares KIND named 'vqvae2' in twin.kind, not 'other'"),
])
def test_a_plugin_that_fails_or_takes_a_taken_name_is_refused_naming_its_distribution(
        extra_distribution, group, entry, files, expected):
    extra_distribution("bad", f"[fedcli.{group}]\n{entry}\n", files)
    with pytest.raises(UserError) as raised:
        discover_strategies() if group == "strategies" else discover_kinds()
    assert str(raised.value).startswith(expected) and "pip uninstall bad" in str(raised.value)


def test_a_model_factory_of_the_users_own_runs_and_declares_its_cuts(cli, tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "from fedcli_test_plugins.tinycnn import tiny_cnn, stem\n\n"
        "def plain(in_channels, num_classes):\n    return tiny_cnn(in_channels, num_classes)\n\n"
        "def not_a_module(in_channels, num_classes):\n    return 'a string'\n")
    monkeypatch.chdir(tmp_path)  # the user's module, beside them
    exp = tmp_path / "exp"
    cli.ok("partition", "--source", "digits", "--nodes", "2", "--image-size", "16", "--train-size", "64",
           "--exp", exp)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--model", "my_models:plain", *FAST)
    tensors, _ = parse_tensors((exp / "federate" / "fedavg" / "models" / "global.safetensors").read_bytes())
    assert "0.weight" in tensors and tensors["9.weight"].shape == (10, 16)  # the factory's own layers
    assert "declares no `cuts`" in cli.user_error("federate", "--exp", exp, "--strategy", "splitnn", "--model",
                                                  "my_models:plain", *FAST)
    assert "cannot import nothing from my_models" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "fedavg", "--model", "my_models:nothing", "--overwrite", *FAST)
    assert "not a torch.nn.Module" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "fedavg", "--model", "my_models:not_a_module", "--overwrite", *FAST)
    cli.ok("federate", "--exp", exp, "--strategy", "splitnn", "--strategy", "fedreplay", "--model", "tinycnn", "--cut",
           "stem", *FAST)
    assert "--cut layer1 is not a cut of --model tinycnn (it declares stem)" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "splitnn", "--model", "tinycnn", "--cut", "layer1", "--overwrite",
        *FAST)


def test_a_generator_plugins_options_are_options_of_its_own():
    plugin = plugins.Plugin("generators", "mine", "mine", "mine", "0.1", "/site-packages")

    @dataclasses.dataclass(frozen=True)
    class Plain:
        depth: int = 3

    @dataclasses.dataclass(frozen=True)
    class Taken:
        batch: int = ranged(3, 1, 9, help="Batch.")

    @dataclasses.dataclass(frozen=True)
    class Own:
        depth: int = ranged(3, 1, 9, help="Depth of the decoder.")

    with pytest.raises(UserError, match="declares option 'depth' without a default and help; declare it with"):
        merged_fields([(Plain, plugin)])
    with pytest.raises(UserError, match="'batch', which train-gan or another generator kind declares"):
        merged_fields([(Taken, plugin)])
    [(name, _, field)] = merged_fields([(Own, plugin)])
    assert name == "depth" and field.metadata["panel"] == GENERATOR and field.metadata["help"]
