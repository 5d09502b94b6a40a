"""`train-gan --help` and `federate --help` group their options in panels (issue 58: one flat panel of 60-odd
options each), each option in the panel its config field names, strategies' options in their strategies' panels."""

from __future__ import annotations

import dataclasses
import re

import pytest
import typer

from fedcli.cli_options import options_from
from fedcli.experiment.config import option, user_fields
from fedcli.federate.config import SharedOptions
from fedcli.generators.config import GanConfig


def panels_of(text: str) -> dict[str, list[str]]:
    """Each panel's options, as the help prints them (`--name` at a row's start)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        title = re.match(r"╭─ (.+?) ─", line)
        if title:
            current = found.setdefault(title.group(1), [])
        elif current is not None and (option := re.match(r"│ [*]? *(--[a-z0-9-]+)", line)):
            current.append(option.group(1))
    return found


@pytest.mark.parametrize("command, cls", [("federate", SharedOptions), ("train-gan", GanConfig)])
def test_every_option_is_printed_in_the_panel_its_field_names(cli, command, cls):
    result = cli(command, "--help")
    assert result.exit_code == 0
    found = panels_of(result.output)
    for field in user_fields(cls):
        assert "--" + field.name.replace("_", "-") in found[field.metadata["panel"]], field.name
    assert found["Options"] == ["--help"]
    assert {"--config", "--tensorboard"} <= set(found["Experiment and output"])


def test_strategy_options_sit_in_their_strategies_panel(cli):
    found = panels_of(cli("federate", "--help").output)
    assert {"--buffer-size", "--lam", "--replay-source"} <= set(found["Replay (FedER, CWT+Replay, FedAvg+Replay)"])
    assert {"--peers", "--policy", "--anonymize"} <= set(found["Peers (FedMatch, FedPerl)"])
    assert {"--server-lr", "--beta1", "--mu"} <= set(found["Server optimisers and FedProx"])


def test_an_option_in_no_panel_is_refused_when_the_command_is_made():
    @dataclasses.dataclass(frozen=True)
    class Forgetful:
        placed: int = option(1, "An option with its panel.", panel="Panel")
        stray: int = option(2, "An option whose field names no panel.")

    def command(ctx: typer.Context, **options):
        """A command with one option outside the panels."""
    with pytest.raises(ValueError, match="option 'stray' of command is in no help panel"):
        options_from(Forgetful, grouped=True)(command)
