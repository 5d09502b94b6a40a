"""The strategy registry: every module of this package declares its strategies in `DECLARED`, and
everything else in fedcli reads the strategies from here (names, facts, options, model keys,
transfer kinds). Adding a strategy is adding a module."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from typing import Any

from fedcli.core import plugins
from fedcli.core.errors import UserError
from fedcli.experiment.config import check_ranges
from fedcli.federate.strategies.base import ENSEMBLE, GLOBAL_TEST, LABELS, NODES, Declaration, Strategy

EVAL = "eval"  # the transfer kind of models sent only to be tested on another node's test set


ORDER = ("feder", "feder-a", "feder-b", "cyclic", "cwt", "cwt-replay", "splitnn", "fedreplay", "fedavg", "fedavg-share",
         "fedprox", "fedbn", "fedavg-replay", "fedavgm", "fedadam", "fedmatch", "fedyogi", "fedperl", "fedadagrad",
         "scaffold", "standalone", "central", "central-synthetic", "central-mixed")
"""Every strategy's place in listings, help and the report's tables, in one list: FedER and its variants, the
travelling and split methods, the averaging and few-labels families, the pooled references. A strategy module
not named here is listed after them."""


class Registry:
    """Declarations by name, in `order`, with one meaning per option name."""

    def __init__(self, order: tuple[str, ...] = ORDER):
        self.order = order
        self._declared: dict[str, Declaration] = {}
        self._options: dict[str, tuple[dataclasses.Field, str]] = {}  # name -> (field, first declarer)
        self._types: dict[str, Any] = {}  # option name -> its type, resolved

    def add(self, declaration: Declaration) -> None:
        if declaration.name in self._declared:
            raise ValueError(f"strategy {declaration.name!r} is declared twice")
        for field in declaration.option_fields():
            if field.name in self._options:
                known, owner = self._options[field.name]
                if meaning(known) != meaning(field):
                    raise ValueError(f"strategy {declaration.name!r} declares option {field.name!r} with another "
                                     f"meaning than {owner!r} does (type, range and help must agree); choose a new "
                                     "name")
            else:
                self._options[field.name] = (field, declaration.name)
                self._types[field.name] = typing.get_type_hints(declaration.options)[field.name]
        self._declared[declaration.name] = declaration
        self._declared = dict(sorted(self._declared.items(), key=lambda item: self.place(item[0])))

    def place(self, name: str) -> int:
        """A strategy's place in listings: its index in `order`; one not listed there follows them all, in the
        order it was added."""
        return self.order.index(name) if name in self.order else len(self.order)

    def names(self) -> tuple[str, ...]:
        return tuple(self._declared)

    def __getitem__(self, name: str) -> Declaration:
        if name not in self._declared:
            raise UserError(f"unknown strategy {name!r}; choose from {', '.join(self._declared)}")
        return self._declared[name]

    def get(self, name: str) -> Declaration | None:
        return self._declared.get(name)

    def __iter__(self):
        return iter(self._declared.values())

    def options(self) -> dict[str, dataclasses.Field]:
        """Every option any strategy declares, by name, in the strategies' order."""
        fields: dict[str, dataclasses.Field] = {}
        for declaration in self:
            for field in declaration.option_fields():
                fields.setdefault(field.name, field)
        return fields

    def option_type(self, name: str) -> Any:
        return self._types[name]

    def declaring(self, option: str) -> list[Declaration]:
        return [d for d in self if option in {f.name for f in d.option_fields()}]

    def selectable(self) -> tuple[str, ...]:
        """Strategy options that a [select] grid may vary."""
        return tuple(name for name, field in self.options().items() if field.metadata.get("select"))

    def shared_model_keys(self) -> tuple[str, ...]:
        """The model keys that name no node (`global`, `central`)."""
        return tuple(dict.fromkeys(d.model_key for d in self if d.model_key != NODES))

    def pooled_keys(self) -> tuple[str, ...]:
        """Model keys of strategies that pool every node's data: held by no node."""
        return tuple(dict.fromkeys(d.model_key for d in self if d.pooled and d.model_key != NODES))

    def reserved_names(self) -> tuple[str, ...]:
        """Names no node may take: every model key a strategy produces, the ensemble's, and the labels' key of
        predictions.safetensors and the global test set's test node (a node of that name would be read as, or
        overwrite, one of them)."""
        return (*self.shared_model_keys(), ENSEMBLE, LABELS, GLOBAL_TEST)

    def transfer_kinds(self) -> tuple[str, ...]:
        """Every kind of transfer, training kinds in the order strategies declare them, then eval."""
        return (*dict.fromkeys(kind for d in self for kind in d.transfers), EVAL)

    def family(self, name: str) -> tuple[str, ...]:
        """The strategies the report compares in one table family, in order."""
        return tuple(d.name for d in self if name in d.families)

    def resolved_options(self, name: str, given: dict[str, Any]) -> Any:
        """The options dataclass of strategy `name`: each value given (not None), else its default."""
        declaration = self[name]
        values = {f.name: given[f.name] for f in declaration.option_fields() if given.get(f.name) is not None}
        try:
            options = declaration.options(**values)
        except UserError as exc:
            raise UserError(f"{name} {exc}") from exc
        check_ranges(options)
        return options

    def build(self, name: str, given: dict[str, Any]) -> Strategy:
        return self[name].build(self.resolved_options(name, given))


def meaning(field: dataclasses.Field) -> tuple:
    return field.type, field.metadata.get("range"), field.metadata.get("help")


def discover() -> Registry:
    """The strategies of this package's modules, then those of strategy plugins (core/plugins.py)."""
    registry = Registry()
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            for declaration in getattr(importlib.import_module(f"{__name__}.{module.name}"), "DECLARED", ()):
                registry.add(declaration)
    for plugin in plugins.checked("strategies", set(registry.names())):
        try:
            registry.add(plugin_declaration(plugin))
        except ValueError as exc:  # an option of another meaning under a taken name
            raise plugin.refuse(f"cannot join the registry ({exc})") from exc
    return registry


def plugin_declaration(plugin: plugins.Plugin) -> Declaration:
    """The declaration a strategy plugin's module gives under the plugin's name, its options checked as a
    built-in's are when the registry adds them."""
    declared = {getattr(d, "name", None): d for d in getattr(plugin.load(), "DECLARED", ())}
    declaration = declared.get(plugin.name)
    if not isinstance(declaration, Declaration):
        raise plugin.refuse(f"names module {plugin.value}, whose DECLARED holds no Declaration named {plugin.name!r}")
    if not dataclasses.is_dataclass(declaration.options):
        raise plugin.refuse(f"declares options {declaration.options!r}, not a dataclass")
    for field in declaration.option_fields():
        if not field.metadata.get("help") or field.default is dataclasses.MISSING:
            raise plugin.refuse(f"declares option {field.name!r} without a default and help; declare it with "
                                "fedcli.federate.strategies.base.option(default, low, high, help) or flag(default, help)")
    return declaration


REGISTRY = discover()
