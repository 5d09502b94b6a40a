"""A user's own classifier: `--model module:factory` (or the API's `model=`), or a classifier plugin
(core/plugins.py, group fedcli.models), either a function `factory(in_channels, num_classes)` returning the
`nn.Module` (the module is looked for on the Python path and in the current folder). The strategies that cut a
classifier (FedReplay, SplitNN) need the factory's own cuts: `factory.cuts = {"stem": split, ...}`, each
`split(model)` returning (bottom, top) made of the model's modules, under --cut's names (models/cuts.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from torch import nn

from fedcli.core import plugins
from fedcli.core.errors import UserError
from fedcli.experiment.config import MODELS, USER_FACTORY


def is_user_model(name: str) -> bool:
    return name not in MODELS and (name in plugins.names("models") or USER_FACTORY.fullmatch(name) is not None)


def factory(name: str) -> Callable:
    """The function `name` (module:factory, or a classifier plugin's name) names."""
    plugin = next((p for p in plugins.installed("models") if p.name == name), None)
    if plugin is not None:
        found = plugin.load()
        if not callable(found):
            raise plugin.refuse(f"names {plugin.value}, which is not a function")
        return found
    module, _, attribute = name.partition(":")
    sys.path.append(os.getcwd())  # the user's module beside them, after everything installed, while it is imported
    try:
        found = plugins.imported(name)
    except Exception as exc:  # the user's module: any failure in it is theirs to see, in one line
        raise UserError(f"--model {name}: cannot import {attribute} from {module} ({type(exc).__name__}: {exc}); "
                        "put the module on PYTHONPATH (or install it) and name a function in it") from exc
    finally:
        sys.path.pop()
    if not callable(found):
        raise UserError(f"--model {name} is not a function; name a factory(in_channels, num_classes)")
    return found


def build(name: str, in_channels: int, num_classes: int) -> nn.Module:
    model = factory(name)(in_channels, num_classes)
    if not isinstance(model, nn.Module):
        raise UserError(f"--model {name} returned {type(model).__name__}, not a torch.nn.Module; return the "
                        "classifier")
    return model


def cuts(name: str) -> dict[str, Callable[[nn.Module], tuple[nn.Module, nn.Module]]]:
    """The cuts the factory declares (`factory.cuts`), by --cut name."""
    declared = getattr(factory(name), "cuts", {})
    if not isinstance(declared, dict) or not all(callable(split) for split in declared.values()):
        raise UserError(f"--model {name}: its factory's `cuts` must map --cut names to functions model -> "
                        "(bottom, top)")
    return declared


def split(name: str, cut: str, model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(bottom, top) of `model` at `cut`, as the factory's own split gives them."""
    parts = cuts(name)[cut](model)
    if not (isinstance(parts, tuple) and len(parts) == 2 and all(isinstance(p, nn.Module) for p in parts)):
        raise UserError(f"--model {name}: its cut {cut!r} returned {type(parts).__name__}, not (bottom, top), "
                        "two torch.nn.Modules made of the model's own modules")
    return parts
