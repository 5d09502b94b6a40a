"""docs/python.md runs as written: its Python blocks in order (the worked example, in-process), its file blocks
written where they name (a strategy and a source plugin with their metadata), then its shell lines, in a fresh
process each, finding those plugins on PYTHONPATH."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import flat_pngs

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str, str]]:
    """(language, file it names or '', text) of every fenced block, in page order."""
    return [(lang, target.strip(), text) for lang, target, text in BLOCK.findall(PAGE.read_text())]


def test_the_pages_examples_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    page_blocks = blocks()
    code = [text for lang, target, text in page_blocks if lang == "python" and not target]
    assert len(code) >= 4
    namespace: dict = {}
    for text in code:
        exec(compile(text, str(PAGE), "exec"), namespace)
    fed, curve = namespace["fed"], namespace["curve"]
    assert set(fed.metrics.strategy) == {"feder", "fedavg"} and list(curve.columns) == ["fedavg", "feder"]
    assert (tmp_path / "results" / "notebook" / "accuracy.png").stat().st_size > 0
    assert "--rounds must lie in [1, 1000000], got 0" in capsys.readouterr().out  # the example's mistake

    files = [(target, text) for _, target, text in page_blocks if target]
    assert {Path(t).name for t, _ in files} >= {"entry_points.txt", "METADATA"}
    for target, text in files:
        (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / target).write_text(text)
    strategy = next(text for target, text in files if "halfway" in target)
    assert len(strategy.strip().splitlines()) < 60  # the bound on a strategy plugin

    flat_pngs(tmp_path / "scans", ("north", "south"), {"clear": 60, "opaque": 190}, [str(i) for i in range(12)])
    shell = [line for lang, _, text in page_blocks if lang == "sh" for line in text.strip().splitlines()]
    outputs = []
    for line in shell:
        words = shlex.split(line)
        env = dict(os.environ, **dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-")))
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
        command = [w for w in words if not ("=" in w and not w.startswith("-"))]
        assert command[0] == "fedcli", line
        done = subprocess.run([sys.executable, "-m", "fedcli", *command[1:], *(["--threads", "2"] if len(
            command) > 2 else [])], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        outputs.append(done.stdout)
    assert "strategy fedavg-half: myplugins.halfway from myplugins 0.1" in outputs[0]
    assert "data source flat: myplugins.flat:read" in outputs[0]
    assert (tmp_path / "results" / "flat" / "federate" / "fedavg-half" / "metrics.csv").is_file()
