"""The command line: commands, help, recipes, and the one-line errors."""

from __future__ import annotations

import json


from fedcli import __version__
from fedcli.data.manifest import Manifest

STAGES = ["partition", "train-gan", "federate", "audit-privacy", "report"]


def test_version(cli):
    assert cli.ok("--version").output.strip() == f"fedcli {__version__}"


def test_help_lists_the_five_stages_each_with_an_example(cli):
    text = cli.ok("--help").output
    for stage in STAGES:
        assert stage in text
        assert "Example: fedcli " + stage in cli.ok(stage, "--help").output


def test_help_keeps_bracketed_names_that_rich_markup_would_swallow(cli):
    assert "[sweep]" in cli.ok("run", "--help").output and "[select]" in cli.ok("run", "--help").output
    assert "[stage]" in cli.ok("partition", "--help").output


def test_parser_errors_are_one_line_too(cli, tmp_path):
    line = cli.user_error("partition", "--source", "mnist", "--exp", tmp_path)
    assert "--source" in line and "--help" in line


def test_recipe_sets_options_and_command_line_overrides_it(cli, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[partition]\nnodes = 4\ntest-fraction = 0.25\nseed = 7\n[federate]\n')
    cli.ok("partition", "--config", recipe, "--exp", tmp_path / "a")
    a = Manifest.load(tmp_path / "a")
    assert len(a.node_names) == 4 and a["test_fraction"] == 0.25 and a["seed"] == 7

    cli.ok("partition", "--config", recipe, "--nodes", "2", "--exp", tmp_path / "b")
    b = Manifest.load(tmp_path / "b")
    assert len(b.node_names) == 2 and b["seed"] == 7
    resolved = json.loads((tmp_path / "b" / "partition" / "config.json").read_text())["config"]
    assert resolved["nodes"] == 2 and resolved["test_fraction"] == 0.25 and resolved["scheme"] == "site-shift"


def test_recipe_with_unknown_key_names_it_and_the_valid_ones(cli, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[partition]\nnode = 4\n")
    line = cli.user_error("partition", "--config", recipe, "--exp", tmp_path / "exp")
    assert "partition.node" in line and "nodes" in line and "test-fraction" in line
    assert not (tmp_path / "exp").exists()


def test_recipe_with_unknown_table_or_bad_value(cli, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[partitoin]\nnodes = 4\n")
    assert "[partitoin]" in cli.user_error("partition", "--config", recipe, "--exp", tmp_path / "exp")
    recipe.write_text('[partition]\nnodes = "four"\n')
    assert "partition.nodes" in cli.user_error("partition", "--config", recipe, "--exp", tmp_path / "exp")
    recipe.write_text('[partition]\nscheme = "random"\n')
    assert "site-shift" in cli.user_error("partition", "--config", recipe, "--exp", tmp_path / "exp")
    assert "not found" in cli.user_error("partition", "--config", tmp_path / "none.toml", "--exp", tmp_path / "e")
    assert not (tmp_path / "exp").exists()
