"""Names that come from data (nodes, sites, classes): checked before they are used.

Node and site names become folder and file names (`gan/<node>/`, `partition/nodes/<node>.json`),
so they may hold only ASCII letters, digits and `_ . + -`, must start with a letter or digit
(never `.`, `..`, empty or a path), and must differ after case folding (macOS and Windows fold
case). Class names never become paths, but they head CSV columns and figures: the same rule,
with inner spaces allowed ("normal or benign").
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from fedcli.core.errors import UserError

MAX_LENGTH = 64
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
CLASS_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9 _.+-]*[A-Za-z0-9_.+-])?")
RULES = {"node": NODE_NAME, "site": NODE_NAME, "class": CLASS_NAME}
ALLOWED = {"node": "ASCII letters, digits and _ . + -", "site": "ASCII letters, digits and _ . + -",
           "class": "ASCII letters, digits, inner spaces and _ . + -"}


def check_name(kind: str, name: object, origin: str) -> str:
    """`name` if it is a valid `kind` name ("node", "site" or "class"); else a UserError naming it."""
    text = name if isinstance(name, str) else None
    if text is None or not RULES[kind].fullmatch(text) or len(text) > MAX_LENGTH:
        shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else repr(name[:80] + "...")
        raise UserError(f"{origin}: {kind} name {shown} is not allowed ({kind} names need 1-{MAX_LENGTH} "
                        f"{ALLOWED[kind]}, starting with a letter or digit); rename it in the data")
    return text


def check_names(kind: str, names: Iterable[object], origin: str) -> list[str]:
    """Every name valid, and no two equal after case folding."""
    seen: dict[str, str] = {}
    checked = []
    for name in names:
        text = check_name(kind, name, origin)
        other = seen.setdefault(text.casefold(), text)
        if other != text:
            raise UserError(f"{origin}: {kind} names {other!r} and {text!r} differ only in case, which some file "
                            "systems do not tell apart; rename one")
        checked.append(text)
    return checked


def check_not_reserved(names: Iterable[str], reserved: Collection[str], origin: str, advice: str) -> None:
    """No node may be named as a model key a strategy produces (`global`, `ensemble`, ...): its rows, models
    and predictions would be read as, or overwrite, the shared model's (compared after case folding, as
    folder names are)."""
    taken = {name.casefold(): name for name in reserved}
    for name in names:
        if name.casefold() in taken:
            raise UserError(f"{origin}: node name {name!r} is reserved (fedcli names its shared models and results "
                            f"{', '.join(sorted(taken.values()))}); {advice}")
