"""What a user meets before the first stage: the Python floor, the wheel `pip install` builds (license,
version, shipped recipes), `-h`, shell completion, a start-up without the stages' heavy libraries, and figures that
keep matplotlib out of $HOME."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import typer
from typer.testing import CliRunner

import fedcli
from fedcli.cli import app
from fedcli.experiment.plotting import keep_matplotlib_out_of_home
from fedcli.pipeline.shipped import shipped_recipes

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(fedcli.__file__).resolve().parent

# Standard-library modules added since Python 3.10 (What's New in Python 3.11-3.14; 3.12 and 3.13 added none),
# with the version that added them. sys.stdlib_module_names of the running interpreter says what is standard;
# this table says since when, for the versions between the floor and the running interpreter.
ADDED = {"tomllib": (3, 11), "wsgiref.types": (3, 11), "annotationlib": (3, 14), "compression": (3, 14),
         "concurrent.interpreters": (3, 14), "string.templatelib": (3, 14)}
ADDED_KNOWN_UP_TO = (3, 14)


def declared_floor() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec.strip()).groups()
    return int(major), int(minor)


def imported_modules() -> dict[str, set[str]]:
    """Every absolute module name fedcli's source imports (with `from a import b`, also `a.b`, which may be a
    submodule), anywhere in a file (imports inside functions too) -> the files that import it."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(PACKAGE.parent)))
    return found


def test_every_standard_library_module_fedcli_imports_exists_at_the_declared_floor():
    assert sys.version_info[:2] <= ADDED_KNOWN_UP_TO, (
        f"add the standard-library modules new in Python {sys.version_info[0]}.{sys.version_info[1]} to ADDED")
    floor = declared_floor()
    used = {name: files for name, files in imported_modules().items() if name.split(".")[0] in sys.stdlib_module_names}
    assert "tomllib" in used and "pathlib" in used  # the walk sees the standard library fedcli uses
    too_new = {name: (ADDED[name], sorted(files)) for name, files in used.items() if ADDED.get(name, floor) > floor}
    assert not too_new, f"imported but added after the declared floor {floor}: {too_new}"


def wheel_from_a_copy(tmp_path: Path) -> tuple[Path, str]:
    """The wheel `pip install .` builds (setuptools' PEP 517 hook, without build isolation), from a copy of the
    files it reads, so the checkout gets no build/ or egg-info. Returns the wheel and the build's output."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "recipes", source / "recipes")
    shutil.copytree(PACKAGE, source / "fedcli", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; "
                            f"print(build_meta.build_wheel({str(out)!r}))"],
                           cwd=source, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    return out / build.stdout.strip().splitlines()[-1], build.stdout + build.stderr


def test_the_wheel_carries_the_license_one_version_and_the_recipes_without_a_deprecation_warning(tmp_path):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]  # written once: fedcli.__version__
    wheel, log = wheel_from_a_copy(tmp_path)
    assert "deprecat" not in log.lower(), log
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"fedcli-{fedcli.__version__}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
    assert f"Version: {fedcli.__version__}\n" in metadata
    assert "License-Expression: MIT\n" in metadata and "License-File: LICENSE\n" in metadata
    assert f"{info}/licenses/LICENSE" in names
    assert f"Requires-Python: >={'.'.join(map(str, declared_floor()))}\n" in metadata
    assert {f"fedcli/recipes/{p.name}" for p in (ROOT / "recipes").glob("*.toml")} <= names


def test_the_shipped_recipes_are_the_repository_recipes():
    assert {name: path.read_bytes() for name, path in shipped_recipes().items()} == {
        p.stem: p.read_bytes() for p in (ROOT / "recipes").glob("*.toml")}
    assert "quickstart" in shipped_recipes()


def command_paths(command, path: tuple[str, ...] = ()):
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from command_paths(sub, (*path, name))


def test_h_is_help_on_every_command(cli):
    paths = list(command_paths(typer.main.get_command(app)))
    assert ("run",) in paths and ("weights", "fetch") in paths
    for path in paths:
        short = cli.ok(*path, "-h").output
        assert short == cli.ok(*path, "--help").output and "Usage:" in short


def test_shell_completion_is_offered_and_completes_commands_and_options(cli):
    assert "--install-completion" in cli.ok("--help").output

    def complete(words: str) -> list[str]:
        env = {"_FEDCLI_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        result = CliRunner().invoke(app, [], env=env, prog_name="fedcli")
        assert result.exit_code == 0, result.output
        return result.output.split()

    assert complete("fedcli train") == ["train-gan"]
    assert "--dry-run" in complete("fedcli run --d")


def test_figures_write_nothing_under_home(tmp_path):
    """matplotlib would put its font cache and config under $HOME/.cache and $HOME/.config. Every figure goes
    through fedcli.experiment.plotting, whose temporary folder for them is gone when the process ends."""
    importers = {name: files for name, files in imported_modules().items() if name.split(".")[0] == "matplotlib"}
    assert set().union(*importers.values()) == {"fedcli/experiment/plotting.py"}
    home, temp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}
    env |= {"HOME": str(home), "TMPDIR": str(temp), "PYTHONPATH": str(PACKAGE.parent)}
    draw = ("from fedcli.experiment.plotting import pyplot; plt = pyplot(); fig = plt.figure(); fig.text(0.5, 0.5, 'node0'); "
            f"fig.savefig({str(tmp_path / 'figure.png')!r})")
    run = subprocess.run([sys.executable, "-c", draw], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "figure.png").is_file()
    assert sorted(home.rglob("*")) == [] and sorted(temp.iterdir()) == []


def test_a_matplotlib_folder_the_user_chose_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mine"))
    monkeypatch.delitem(sys.modules, "matplotlib", raising=False)  # as before the process's first figure
    keep_matplotlib_out_of_home()
    assert os.environ["MPLCONFIGDIR"] == str(tmp_path / "mine")


def test_the_cli_starts_without_the_libraries_only_a_stage_needs():
    """Every command and every distributed rank imports fedcli.cli first: torchvision (the classifiers, FixMatch's
    augmentations), lpips and matplotlib load where a stage uses them, not on every start-up."""
    heavy = ("torchvision", "lpips", "matplotlib")
    probe = f"import sys, fedcli.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", probe], env=os.environ | {"PYTHONPATH": str(PACKAGE.parent)},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
