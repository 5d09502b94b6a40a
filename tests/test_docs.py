"""The README and docs/ stay true: every relative link reaches a file (and heading), and every `fedcli` command
line they show names a command and options that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from fedcli.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`(fedcli [^`]+)`")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [a or b for a, b in LINK.findall(text)]


def command_lines(page: Path) -> list[str]:
    """`fedcli ...` lines of code blocks (continuations joined, prompts and comments dropped) and inline spans."""
    text = page.read_text()
    lines = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("fedcli "):
                lines.append(line.split(" #")[0])
    return lines + INLINE.findall(FENCE.sub("", text))


def options_of(command) -> set[str]:
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}


ROOT_COMMAND = typer.main.get_command(app)


def check_line(line: str) -> str | None:
    """What is wrong with one shown command line, or None."""
    try:
        words = shlex.split(line)
    except ValueError:
        return "does not parse as a shell line"
    command = ROOT_COMMAND  # typer's click command tree: groups have `commands`
    for word in words[1:]:
        if hasattr(command, "commands") and not word.startswith("-"):
            if word not in command.commands:
                return f"names no command {word!r}"
            command = command.commands[word]
        elif word.startswith("--") or re.fullmatch(r"-[a-zA-Z]", word):
            option = word.split("=")[0]
            if option not in options_of(command):
                return f"names no option {option} of {command.name}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_reaches_its_file_and_heading(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # http, https, mailto
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_line_shown_names_options_that_exist(page):
    wrong = {line: problem for line in command_lines(page) if (problem := check_line(line)) is not None}
    assert not wrong, wrong


def test_the_checks_catch_what_they_look_for(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title\n[ok](#a-title) [bad](#nothing) [gone](missing.md)\n\n```\nfedcli partition --nodez 3\n"
                    "fedcli federate --strategy feder \\\n  --rounds 3\n```\n")
    assert links(page) == ["#a-title", "#nothing", "missing.md"] and anchors(page) == {"a-title"}
    assert [check_line(line) for line in command_lines(page)] == ["names no option --nodez of partition", None]
    assert check_line("fedcli trian-gan --exp x") == "names no command 'trian-gan'"
