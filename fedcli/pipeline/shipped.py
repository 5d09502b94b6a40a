"""The recipes shipped with fedcli (package data, `fedcli/recipes/`; in a checkout that folder links to
the repository's `recipes/`), so that `fedcli run quickstart` works wherever fedcli is installed.

A recipe's relative paths (`partition.data-dir`) are read from the current folder, as the same option
on the command line is, whether the recipe is shipped or a file: a shipped recipe's own folder is inside
the installed package, where no data lies.
"""

from __future__ import annotations

from pathlib import Path

from fedcli.core.errors import UserError

SHIPPED = Path(__file__).resolve().parents[1] / "recipes"


def shipped_recipes() -> dict[str, Path]:
    """Name (the file's stem) -> path of every shipped recipe."""
    return {path.stem: path for path in sorted(SHIPPED.glob("*.toml"))}


def locate(recipe: Path) -> Path:
    """The recipe file `fedcli run RECIPE` means: a file of that path, else, for a bare name (no folder, no
    suffix), the shipped recipe of that name."""
    recipe = Path(recipe)
    if recipe.is_file():
        return recipe
    shipped = shipped_recipes()
    if len(recipe.parts) == 1 and not recipe.suffix and recipe.name in shipped:
        return shipped[recipe.name]
    if not recipe.exists():
        raise UserError(f"recipe {recipe} not found: no such file, nor a recipe shipped with fedcli "
                        f"({', '.join(shipped)}); check the path or the name")
    return recipe  # a folder: reading it says so
