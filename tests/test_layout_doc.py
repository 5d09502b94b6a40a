"""docs/layout.md names every module of the package (issue 58: it had left out 46), and every path it names
exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def entries() -> dict[str, str]:
    """The layout block's entries: a path under fedcli/ and its description, continuation lines joined."""
    block = (ROOT / "docs" / "layout.md").read_text().split("```")[1]
    found: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        match = re.match(r"(fedcli/\S*)\s*(.*)", line)
        if match:
            current = match.group(1)
            found[current] = match.group(2)
        elif current and line.startswith(" "):
            found[current] += " " + line.strip()
    return found


def named_in(entry: str, found: dict[str, str]) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9_]+/?", found.get(entry, "")))


def test_every_module_is_named_in_its_packages_entry():
    found = entries()
    missing = []
    for path in sorted((ROOT / "fedcli").glob("**/*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" or rel in found:
            continue
        package = path.parent.relative_to(ROOT).as_posix() + "/"
        parent = path.parent.parent.relative_to(ROOT).as_posix() + "/"
        # a module of a sub-package its parent's entry names (strategies/, sources/) is described there
        if path.stem not in named_in(package, found) and path.parent.name + "/" not in named_in(parent, found):
            missing.append(rel)
    assert not missing, f"name these in docs/layout.md: {missing}"


def test_every_path_the_layout_names_exists():
    assert [entry for entry in entries() if not (ROOT / entry).exists()] == []
