"""Numeric options (issue 12, points 3, 7, 9, 10, 11): one range rule for every int and float option of
every command, checked before anything is read or written; `--threads` on every stage and `fedcli run`."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from pathlib import Path

import pytest
import typer
from typer.core import TyperOption

from conftest import record_case
from fedcli.cli import app
from fedcli.core.errors import UserError
from fedcli.experiment import config
from fedcli.experiment.artifacts import sha256_bytes
from fedcli.federate.config import FederateConfig
from fedcli.generators.config import GanConfig

RECIPE = '[partition]\nnodes = 2\nimage-size = 16\n\n[federate]\nstrategy = ["fedavg"]\n'
HUGE = {int: str(10**20), float: "1e300"}


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256_bytes(p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


def recipe(tmp_path: Path, text: str = RECIPE) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


def base_args(command: str, tmp_path: Path) -> list:
    """What each command needs besides the option under test; a new command must be added here."""
    exp = ["--exp", tmp_path / "exp"]
    return {"partition": exp, "train-gan": exp, "federate": exp, "audit-privacy": exp, "report": exp,
            "predict": [*exp, "--strategy", "fedavg", "--data-dir", tmp_path],
            "run": [recipe(tmp_path), *exp]}[command]


def numeric_options() -> list[tuple[str, str, type]]:
    """(command, option, int or float) for every numeric option of every command of the app."""
    group = typer.main.get_command(app)
    found = []
    for name, command in sorted(group.commands.items()):
        for param in command.params:
            kind = param.type_descriptor.annotation  # typer 0.29: the parameter's Python type
            if kind in (int, float) and isinstance(param, TyperOption):
                found.append((name, param.opts[0], kind))
    return found


def config_classes() -> list[type]:
    """Every stage's config: those of experiment/config.py, federate's (federate/config.py: its strategy options come
    from the strategy registry) and train-gan's (generators/config.py: its kinds' options come from their
    sub-packages)."""
    return [obj for name, obj in vars(config).items() if name.endswith("Config") and dataclasses.is_dataclass(obj)
            ] + [FederateConfig, GanConfig]


def numeric_fields(cls: type) -> list[tuple[dataclasses.Field, type]]:
    """(field, int or float) for each field whose type holds a number (`int | None`, `float | Literal[...]`)."""
    hints = typing.get_type_hints(cls)
    found = []
    for field in dataclasses.fields(cls):
        types = set(typing.get_args(hints[field.name]) or [hints[field.name]])
        if float in types or (int in types and bool not in types):
            found.append((field, float if float in types else int))
    return found


def test_the_walk_sees_every_command_and_config():
    commands = {c for c, _, _ in numeric_options()}
    assert commands == {"partition", "train-gan", "federate", "audit-privacy", "report", "predict", "run"}
    assert {c.__name__ for c in config_classes()} >= {"PartitionConfig", "GanConfig", "FederateConfig", "AuditConfig",
                                                      "ReportConfig", "PredictConfig"}


@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_every_numeric_config_field_declares_a_range_that_its_config_applies(cls):
    values = {"exp": Path("x"), "strategy": "fedavg", "data_dir": Path("x")}  # the fields some config requires
    required = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    assert numeric_fields(cls) or cls is config.ReportConfig
    for field, kind in numeric_fields(cls):
        assert "range" in field.metadata, f"{cls.__name__}.{field.name} has no declared range: use config.ranged"
        allowed = (math.inf,) if field.metadata["range"].inf_allowed else ()  # --dp-epsilon inf: no noise
        for value in {math.nan, math.inf, -math.inf, kind(float(HUGE[kind]))} - set(allowed):
            with pytest.raises(UserError, match=f"--{field.name.replace('_', '-')} must"):
                cls(**required, **{field.name: value})


@pytest.mark.parametrize("command, option, kind", numeric_options(), ids=lambda v: getattr(v, "__name__", v))
def test_every_numeric_option_refuses_nan_inf_and_huge_values_before_anything_is_written(cli, tmp_path, command,
                                                                                         option, kind):
    args = base_args(command, tmp_path)
    for value in ("nan", "inf", "-inf", HUGE[kind]):
        line = cli.user_error(command, *args, option, value)
        assert option in line, line
        assert not (tmp_path / "exp").exists()


def case_args(command: str, exp: Path, options: list[str]) -> list:
    overwrite = ["--overwrite"] if command in ("partition", "train-gan", "audit-privacy") else []
    return [command, "--exp", exp, *options, *overwrite]


@pytest.mark.parametrize("point, command, options, expected", [
    (3, "train-gan", ["--alpha", "nan"], "--alpha must be a number, got nan"),
    (3, "train-gan", ["--lr", "nan"], "--lr must be a number, got nan"),
    (3, "train-gan", ["--lr", "-1"], "--lr must be positive and at most 1, got -1"),
    (3, "train-gan", ["--fid-factor", "nan"], "--fid-factor must be a number"),
    (3, "train-gan", ["--r1-gamma", "nan"], "--r1-gamma must be a number, got nan"),
    (3, "train-gan", ["--r1-gamma", "fast"], "--r1-gamma must be a number or auto, got 'fast'"),
    (3, "train-gan", ["--ema-kimg", "inf"], "--ema-kimg must be a finite number"),
    (3, "train-gan", ["--ada-kimg", "0"], "--ada-kimg must be positive"),
    (3, "train-gan", ["--truncation", "1.5"], "--truncation must lie in [0, 1]"),
    (3, "federate", ["--mu", "nan"], "--mu must be a number, got nan"),
    (3, "federate", ["--lr", "nan"], "--lr must be a number, got nan"),
    (3, "federate", ["--lr", "-1"], "--lr must be positive"),
    (3, "federate", ["--lam", "nan"], "--lam must be a number"),
    (3, "federate", ["--timeout", "nan"], "--timeout must be a number"),
    (3, "federate", ["--timeout", "inf"], "--timeout must be a finite number"),
    (3, "audit-privacy", ["--lr", "-1"], "--lr must be positive"),
    (3, "audit-privacy", ["--min-distance", "nan"], "--min-distance must be a number"),
    (3, "audit-privacy", ["--max-auroc", "nan"], "--max-auroc must be a number"),
    (3, "partition", ["--alpha", "nan", "--scheme", "dirichlet"], "--alpha must be a number"),
    (3, "partition", ["--test-fraction", "nan"], "--test-fraction must be a number"),
    (7, "partition", ["--image-size", "1048576"], "--image-size must lie in [16, 1024]"),
    (9, "federate", ["--rounds", "100000000000000000000"], "--rounds must lie in [1, 1000000]"),
    (9, "federate", ["--rounds", "1e20"], "'--rounds'"),
    (9, "federate", ["--node-batch", "node0=100000000000000000000"], "--node-batch node0=B must lie in"),
    (9, "train-gan", ["--iterations", "100000000000000000000"], "--iterations must lie in"),
    (11, "train-gan", ["--threads", "0"], "--threads must lie in [1, 1024]"),
])
def test_bad_numbers_are_refused_before_anything_runs(cli, digits_exp, point, command, options, expected):
    """On a partitioned experiment, with --overwrite: without the check, each would have replaced or trained."""
    before = tree(digits_exp)
    args = case_args(command, digits_exp, options)
    result = cli(*args)
    intact = tree(digits_exp) == before
    record_case(point, f"{command} {' '.join(options)}", args, result, intact)
    assert result.exit_code == 2 and intact
    assert re.fullmatch(r"error: [^\n]+\n", result.stderr) and expected in result.stderr, result.stderr


@pytest.mark.parametrize("point, case, extra, recipe_text, expected", [
    (3, "run --set federate.lr=nan", ["--set", "federate.lr=nan"], RECIPE, "[federate] --lr must be a number"),
    (3, "a recipe with lr = nan", [], RECIPE + "lr = nan\n", "[federate] --lr must be a number"),
    (3, "a recipe with train_gan.alpha = inf", [], RECIPE + "[train_gan]\nalpha = inf\n",
     "[train_gan] --alpha must be a finite number"),
    (3, "a sweep with a nan", ["--set", "sweep.federate.mu=[0.1, nan]"], RECIPE,
     "(sub-experiment mu=nan) --mu must be a number"),
    (3, "a select grid with -1", ["--set", "select.lr=[0.1, -1.0]", "--set", "select.folds=2"], RECIPE,
     "[select] --lr must be positive"),
    (9, "run --set federate.rounds=1e20", ["--set", "federate.rounds=100000000000000000000"], RECIPE,
     "--rounds must lie in"),
    (11, "run --threads 0", ["--threads", "0"], RECIPE, "[partition] --threads must lie in [1, 1024]"),
])
def test_run_checks_every_value_before_any_stage_runs(cli, tmp_path, point, case, extra, recipe_text, expected):
    exp = tmp_path / "exp"
    args = ["run", recipe(tmp_path, recipe_text), "--exp", exp, *extra]
    result = cli(*args)
    record_case(point, case, args, result, not exp.exists())
    assert result.exit_code == 2 and not exp.exists()
    assert re.fullmatch(r"error: [^\n]+\n", result.stderr) and expected in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["partition", "run"])
def test_a_folder_given_as_recipe_is_named_a_folder(cli, tmp_path, command):
    folder = tmp_path / "recipes"
    folder.mkdir()
    exp = tmp_path / "exp"
    args = ["partition", "--config", folder, "--exp", exp] if command == "partition" else ["run", folder, "--exp", exp]
    result = cli(*args)
    record_case(10, f"{command}: a folder as the recipe", args, result, not exp.exists() and not any(folder.iterdir()))
    assert result.exit_code == 2 and not exp.exists()
    assert re.fullmatch(r"error: [^\n]+ is a folder, not a TOML file[^\n]*\n", result.stderr), result.stderr


def test_run_threads_reach_every_stage_are_recorded_and_rerun_nothing(cli, tmp_path, monkeypatch):
    """`fedcli run --threads N` sets every stage's threads; changing it skips up-to-date units. Only the
    partition is real (cheap); the other stages write stand-in outputs, enough for the run's ledger."""
    from fedcli.data.manifest import Manifest
    from fedcli.pipeline import runner
    from fedcli.report import build

    seen: list[tuple[str, int | None]] = []
    real_stage_run = runner.stage_run

    def stage_run(module, cfg, **extra):
        seen.append((module, cfg.threads))
        if module == "fedcli.data.partition":
            return real_stage_run(module, cfg, **extra)
        stage = {"fedcli.generators.stage": "gan", "fedcli.audit.stage": "audit"}[module]
        for node in Manifest.load(cfg.exp).node_names:
            stand_in(cfg.exp / stage / node / "config.json", cfg)

    def federate_run(cfg):
        seen.append(("federate", cfg.threads))
        stand_in(cfg.exp / "federate" / cfg.strategy[0] / "config.json", cfg)

    def report_run(cfg):
        seen.append(("report", cfg.threads))
        stand_in(cfg.exp / "report" / "report.md", cfg)

    monkeypatch.setattr(runner, "stage_run", stage_run)
    monkeypatch.setattr(runner, "federate_run", federate_run)
    monkeypatch.setattr(runner, "report_run", report_run)
    monkeypatch.setattr(build, "headline_table", lambda cfg: None)
    path, exp = recipe(tmp_path, RECIPE + "\n[train_gan]\nbuffer-size = 20\n"), tmp_path / "exp"  # GANs asked for

    first = cli.ok("run", path, "--exp", exp, "--threads", "1")
    assert "5 ran, 0 up to date" in first.output
    assert [threads for _, threads in seen] == [1] * 5 and len({unit for unit, _ in seen}) == 5
    assert json.loads((exp / "partition" / "config.json").read_text())["config"]["threads"] == 1

    second = cli.ok("run", path, "--exp", exp, "--threads", "2")
    assert "0 ran, 5 up to date (skipped)" in second.output and len(seen) == 5
    record_case(11, "fedcli run --threads 2 after --threads 1", ["run", path, "--exp", exp, "--threads", "2"], second,
                json.loads((exp / "partition" / "config.json").read_text())["config"]["threads"] == 1)


def stand_in(path: Path, cfg) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config.to_json(cfg)))


def test_threads_of_a_stage_are_recorded_in_its_config_json(cli, tmp_path):
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--threads", "1", "--exp", tmp_path / "exp")
    assert json.loads((tmp_path / "exp" / "partition" / "config.json").read_text())["config"]["threads"] == 1
    for cls in (GanConfig, FederateConfig, config.AuditConfig):  # their config.json is to_json(cfg)
        assert config.to_json(cls(exp=tmp_path, threads=3))["threads"] == 3
