"""A command's options built from its config's fields, so each option is declared once: the field carries its
default, help, panel, extra flags, parser and range (experiment/config.py `option`), and this module turns it
into the Typer option; a strategy option comes from the registry's declaration the same way.

`options_from` replaces a command's `**options` with one parameter per field; the command then resolves its
config from the parsed values (`resolved_config` in cli.py), so parsing, recipes and `--set` read one
declaration."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any, Optional

import typer

from fedcli.experiment.config import user_fields
from fedcli.federate.strategies import REGISTRY

CLI_ONLY_PANEL = None  # the command's own options (--config, --tensorboard) follow the command's panels


def cli_type(annotation: Any, parsed: bool) -> Any:
    """The type Typer parses a field of `annotation` as: a tuple as a repeatable list, a value with a parser as the
    text it parses, None as an option left out."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = [a for a in typing.get_args(annotation) if a is not type(None)] if union else [annotation]
    optional = union and len(members) < len(typing.get_args(annotation))
    tuples = [m for m in members if typing.get_origin(m) is tuple]
    if parsed:
        base = str
    elif tuples:
        base = list[typing.get_args(tuples[0])[0]]
    elif len(members) == 1:
        base = members[0]
    else:
        raise TypeError(f"a field of type {annotation} needs a parser to be an option")
    return Optional[base] if optional else base


def field_parameter(field: dataclasses.Field, annotation: Any, required: bool) -> inspect.Parameter:
    """One field as a Typer option. A field without a default is required, or, where a recipe may give it
    (`required=False`), optional on the command line."""
    meta = field.metadata
    default = field.default
    missing = default is dataclasses.MISSING
    cli_default = ... if missing and required else None if missing else list(default) \
        if isinstance(default, tuple) else default
    info = typer.Option(cli_default, *meta.get("flags", ()), help=meta["help"], parser=meta.get("parser"),
                        show_default=cli_default not in (None, [], ...), rich_help_panel=meta.get("panel"))
    kind = cli_type(annotation, meta.get("parser") is not None)
    return inspect.Parameter(field.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=info,
                             annotation=Optional[kind] if missing and not required else kind)


def config_parameters(cls: type, required: bool = False) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(cls)
    return [field_parameter(f, hints[f.name], required) for f in user_fields(cls) if f.init]


def strategy_parameters() -> list[inspect.Parameter]:
    """One option per strategy option of the registry (federate/strategies/), in its declaration's panel: the help
    names the strategies that take it and their defaults."""
    added = []
    for name, field in REGISTRY.options().items():
        defaults: dict[str, list[str]] = {}
        for declaration in REGISTRY.declaring(name):
            default = getattr(declaration.options(), name)
            defaults.setdefault("all" if default is None else str(default), []).append(declaration.name)
        who = "; ".join(f"{', '.join(names)}: {default}" for default, names in defaults.items())
        info = typer.Option(None, help=f"{field.metadata['help']} \\[{who}]", show_default=False,
                            rich_help_panel=REGISTRY.declaring(name)[0].panel)
        added.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=info,
                                       annotation=Optional[REGISTRY.option_type(name)]))
    return added


def options_from(cls: type, *, required: bool = False, grouped: bool = False, extra: typing.Callable[[], list] = list):
    """A decorator giving `command` (whose options are `**options`) one option per field of `cls`, then
    `extra()`'s, then the command's own parameters; `required`: fields without a default must be given here
    (no recipe can give them); `grouped`: every option must name its --help panel, so a new one cannot land
    outside the panels."""
    def decorate(command):
        signature = inspect.signature(command)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        context = [p for p in own if p.default is inspect.Parameter.empty]
        added = config_parameters(cls, required) + extra()
        stray = [p.name for p in added if grouped and not p.default.rich_help_panel]
        if stray:
            raise ValueError(f"option {stray[0]!r} of {command.__name__} is in no help panel: give its field a panel")
        command.__signature__ = signature.replace(
            parameters=context + added + [p for p in own if p.default is not inspect.Parameter.empty])
        command.__annotations__ = {**command.__annotations__, **{p.name: p.annotation for p in added}}
        return command
    return decorate
