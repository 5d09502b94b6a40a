"""Every option is declared once (issue 58): a config field carries it, and cli.py, which builds its commands from
the fields, declares none of them again and keeps each command short."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from fedcli.experiment import config
from fedcli.federate.config import FederateConfig
from fedcli.generators.config import GanConfig

CLI = Path(__file__).resolve().parents[1] / "fedcli" / "cli.py"


def declared_options(tree: ast.AST) -> set[str]:
    """The parameters cli.py gives a typer.Option or typer.Argument default."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            found |= {a.arg for a, d in zip(args, node.args.defaults)
                      if isinstance(d, ast.Call) and ast.unparse(d.func) in ("typer.Option", "typer.Argument")}
    return found


def test_cli_declares_no_option_a_config_field_declares():
    fields = {f.name for cls in (*[c for n, c in vars(config).items() if n.endswith("Config")], FederateConfig,
                                 GanConfig) if dataclasses.is_dataclass(cls) for f in dataclasses.fields(cls)}
    declared = declared_options(ast.parse(CLI.read_text()))
    assert "config" in declared and "tensorboard" in declared  # the reader sees the command's own options
    assert declared & fields == set()


def test_every_function_of_the_cli_is_under_40_lines():
    lengths = {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(CLI.read_text()))
               if isinstance(node, ast.FunctionDef)}
    assert max(lengths.values()) < 40, max(lengths, key=lengths.get)
