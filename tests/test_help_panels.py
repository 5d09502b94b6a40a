"""`train-gan --help` and `federate --help` group their options in panels (issue 58: one flat panel of 60-odd
options each), strategies' options in their strategies' panels."""

from __future__ import annotations

import re

import pytest
import typer

from fedcli.help_panels import FEDERATE, TRAIN_GAN, grouped


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


@pytest.mark.parametrize("command, table", [("federate", FEDERATE), ("train-gan", TRAIN_GAN)])
def test_every_option_is_printed_in_its_panel(cli, command, table):
    result = cli(command, "--help")
    assert result.exit_code == 0
    found = panels_of(result.output)
    for panel, names in table.items():
        flags = {"--" + n.replace("_", "-") for n in names}
        assert flags <= set(found[panel]), (panel, flags - set(found[panel]))
    assert found["Options"] == ["--help"]


def test_strategy_options_sit_in_their_strategies_panel(cli):
    found = panels_of(cli("federate", "--help").output)
    assert {"--buffer-size", "--lam", "--replay-source"} <= set(found["Replay (FedER, CWT+Replay, FedAvg+Replay)"])
    assert {"--peers", "--policy", "--anonymize"} <= set(found["Peers (FedMatch, FedPerl)"])
    assert {"--server-lr", "--beta1", "--mu"} <= set(found["Server optimisers and FedProx"])


def test_an_option_in_no_panel_is_refused_when_the_command_is_made():
    def command(placed: int = typer.Option(1), stray: int = typer.Option(2)):
        """A command with one option the table forgot."""
    with pytest.raises(ValueError, match="option 'stray' of command is in no help panel"):
        grouped({"Panel": ("placed",)})(command)
