"""Plugins: strategies, generator kinds, data sources and classifiers from other installed distributions, found
through their entry points, one group each (`fedcli.strategies`, `fedcli.generators`, `fedcli.sources`,
`fedcli.models`), so a user's own piece joins the built-in ones without a fork of fedcli.

An entry point's name is the name the piece takes on the command line and in recipes; its value is what the group
takes (docs/python.md): a strategy module declaring it in `DECLARED`, a generator kind's package (kind.py, options.py
as a built-in kind's), a source's reader function, a classifier factory. Names are read from the distributions'
metadata without importing anything, so the option types can list them. Every refusal is one line naming the
distribution. Before any command runs (the commands are built from them): a name given twice, a source's or
classifier's name taken by a built-in, a strategy plugin or a generator kind's options that fail to import or are not
what their group takes. Where a command first uses its group (their modules are imported only then): a generator
kind's KIND and its name (train-gan, federate, audit), a source's or classifier's function."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
from pathlib import Path
from typing import Any

from fedcli.core.errors import UserError

GROUPS = ("strategies", "generators", "sources", "models")
WHAT = {"strategies": "strategy", "generators": "generator kind", "sources": "data source", "models": "classifier"}


@dataclasses.dataclass(frozen=True)
class Plugin:
    group: str  # one of GROUPS
    name: str
    value: str  # module, or module:attribute
    distribution: str
    version: str
    location: str  # where the distribution is installed

    def refuse(self, why: str) -> UserError:
        return UserError(f"plugin {WHAT[self.group]} {self.name!r} of distribution {self.distribution} {self.version} "
                         f"{why}; fix that distribution or uninstall it (pip uninstall {self.distribution})")

    def load(self) -> Any:
        """The module or attribute the entry point names; an import that fails is refused in one line."""
        try:
            return imported(self.value)
        except Exception as exc:  # any failure inside a third party's module is its distribution's to fix
            raise self.refuse(f"fails to import ({self.value}: {type(exc).__name__}: {exc})") from exc


def imported(value: str) -> Any:
    """The module, or its attribute, that `module[:attribute.path]` names, as an entry point's value does."""
    module, _, attribute = value.partition(":")
    loaded = importlib.import_module(module.strip())
    for part in filter(None, attribute.strip().split(".")):
        loaded = getattr(loaded, part)
    return loaded


@functools.cache
def installed(group: str) -> tuple[Plugin, ...]:
    """The plugins of `group` installed on this Python's path, by name; one name given twice is refused."""
    found: dict[str, Plugin] = {}
    for point in sorted(importlib.metadata.entry_points(group=f"fedcli.{group}"), key=lambda p: p.name):
        dist = point.dist
        plugin = Plugin(group, point.name, point.value, dist.name if dist else "?", dist.version if dist else "?",
                        str(Path(str(dist.locate_file(""))).resolve()) if dist else "?")
        other = found.get(point.name)
        if other is not None and other != plugin:
            first, second = sorted((other, plugin), key=lambda p: (p.distribution, p.version))
            raise UserError(f"plugin {WHAT[group]} {point.name!r} is given by two distributions, {first.distribution} "
                            f"{first.version} and {second.distribution} {second.version}; uninstall one of them "
                            f"(pip uninstall {first.distribution}, or pip uninstall {second.distribution})")
        found[point.name] = plugin
    return tuple(found.values())


def names(group: str) -> tuple[str, ...]:
    return tuple(plugin.name for plugin in installed(group))


def checked(group: str, builtin: tuple[str, ...] | set[str]) -> tuple[Plugin, ...]:
    """The plugins of `group`, refusing one that takes a built-in name."""
    for plugin in installed(group):
        if plugin.name in builtin:
            raise plugin.refuse(f"takes the name of fedcli's built-in {WHAT[group]} {plugin.name!r}; rename it")
    return installed(group)


def every() -> tuple[Plugin, ...]:
    return tuple(plugin for group in GROUPS for plugin in installed(group))


def listed(group: str) -> str:
    """The plugins of `group` for an option's help: ' Plugins: a, b.' (empty without any)."""
    return f" Plugins: {', '.join(names(group))}." if names(group) else ""
