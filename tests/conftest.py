"""Shared fixtures: the CLI runner, builders of small fake datasets, the real reference data."""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
from pathlib import Path

# The tests' plugin distribution (tests/plugins: a strategy, a generator kind, a source and a classifier, with its
# metadata) is installed for every test and every process a test starts, before fedcli builds its registries.
PLUGINS = str(Path(__file__).parent / "plugins")
sys.path.insert(0, PLUGINS)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (PLUGINS, os.environ.get("PYTHONPATH"))))

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

from fedcli.cli import app
from fedcli.data.manifest import Manifest

SHARED = Path(os.environ.get("FEDCLI_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def shared_file(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference data {path} is absent (set FEDCLI_SHARED_DATA)")
    return path


class Cli:
    """Runs fedcli in-process and keeps stdout and stderr apart."""

    def __init__(self):
        self.runner = CliRunner()

    def __call__(self, *args: str):
        return self.runner.invoke(app, [str(a) for a in args])

    def ok(self, *args: str):
        result = self(*args)
        assert result.exit_code == 0, result.output + result.stderr
        return result

    def user_error(self, *args: str) -> str:
        """Assert the run failed as a user error: exit 2, one line on stderr, no traceback."""
        result = self(*args)
        assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert "Traceback" not in result.output + result.stderr
        return lines[0]


TEST_THREADS = 2  # CI's cores; one thread made the quickstart test 1.8x slower (625 s against 345 s)


@pytest.fixture(scope="session", autouse=True)
def pinned_torch_threads():
    """Results on CPU depend on torch's thread count, which defaults to the machine's cores: every
    in-process test runs with TEST_THREADS, so it computes the same numbers on any machine (stages
    called without --threads keep it; distributed nodes get theirs from the launcher)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(TEST_THREADS)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cli() -> Cli:
    return Cli()


@pytest.fixture(scope="session")
def digits_exp(tmp_path_factory) -> Path:
    """A digits partition (3 site-shifted nodes) shared by read-only tests."""
    exp = tmp_path_factory.mktemp("digits") / "exp"
    Cli().ok("partition", "--source", "digits", "--nodes", "3", "--exp", exp)
    return exp


@pytest.fixture(scope="session")
def digits_manifest(digits_exp) -> Manifest:
    return Manifest.load(digits_exp)


TINY_GAN = ["--iterations", "12", "--patience", "100", "--pp-iterations", "6", "--fid-every", "6", "--fid-images",
            "32", "--batch", "8", "--channel-base", "128", "--channel-max", "16", "--z-dim", "16", "--w-dim", "16",
            "--buffer-size", "30", "--fidelity-epochs", "1", "--fidelity-seeds", "1"]


def tiny_gan_exp(tmp_path_factory, nodes: int, *options: str, partition: tuple[str, ...] = ()) -> Path:
    """A 16x16 digits partition with tiny GANs trained on every node (buffers of 30 images); `partition`: more
    partition options."""
    exp = tmp_path_factory.mktemp("gan") / "exp"
    cli = Cli()
    cli.ok("partition", "--nodes", str(nodes), "--image-size", "16", "--exp", exp, *partition)
    cli.ok("train-gan", "--exp", exp, *TINY_GAN, *options)
    return exp


@pytest.fixture(scope="session")
def gan3_exp(tmp_path_factory) -> Path:
    """One tiny-GAN experiment of three nodes for every federate test module; tests copy it before writing."""
    return tiny_gan_exp(tmp_path_factory, nodes=3)


def copy_exp(src: Path, tmp_path: Path) -> Path:
    """A private copy of a shared experiment, for tests that change it."""
    dst = tmp_path / "exp"
    shutil.copytree(src, dst)
    return dst


def flat_pngs(folder: Path, sites: tuple[str, ...], levels: dict[str, int], names: list[str]) -> Path:
    """A flat folder of `<site>__<label>__<name>.png` files (the source plugins' of tests/plugins and
    docs/python.md), each label's images noise around a brightness of its own."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for site in sites:
        for label, level in levels.items():
            for name in names:
                pixels = np.clip(rng.normal(level, 30, (20, 20)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{site}__{label}__{name}.png")
    return folder


def write_png(path: Path, value: int, size: int = 12, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(value)
    shape = (size, size) if mode == "L" else (size, size, 3)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(path)


def make_tuberculosis(root: Path, montgomery=(10, 8), shenzhen=(14, 16)) -> Path:
    """Montgomery and Shenzhen in their official archive layouts, plus macOS debris to ignore."""
    for folder, prefix, (normal, tb) in (("MontgomerySet/CXR_png", "MCUCXR", montgomery),
                                         ("ChinaSet_AllFiles/CXR_png", "CHNCXR", shenzhen)):
        labels = [0] * normal + [1] * tb
        for i, label in enumerate(labels, start=1):
            write_png(root / folder / f"{prefix}_{i:04d}_{label}.png", i)
    (root / "__MACOSX" / "MontgomerySet").mkdir(parents=True)
    (root / "__MACOSX" / "MontgomerySet" / "._MCUCXR_0001_0.png").write_bytes(b"\x00junk")
    (root / "MontgomerySet" / "NLM-MontgomeryCXRSet-ReadMe.pdf").write_bytes(b"%PDF")
    return root


def jpeg_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (180, 120, 90)).save(buffer, "JPEG")
    return buffer.getvalue()


def make_isic(root: Path, rows: int | None = None, metadata_sex_column: str = "sex") -> Path:
    """The real ISIC 2019 tables (optionally their first `rows` rows) with placeholder images."""
    truth = pd.read_csv(shared_file("isic2019", "ISIC_2019_Training_GroundTruth.csv"))
    meta = pd.read_csv(shared_file("isic2019", "ISIC_2019_Training_Metadata.csv"))
    if rows is not None:
        keep = meta["lesion_id"].notna()
        chosen = pd.concat([meta[keep].groupby(meta[keep]["lesion_id"].str[:3]).head(rows // 3), meta[~keep].head(5)])
        meta = meta[meta["image"].isin(chosen["image"])]
        truth = truth[truth["image"].isin(meta["image"])]
    meta = meta.rename(columns={"sex": metadata_sex_column})
    images = root / "ISIC_2019_Training_Input"
    images.mkdir(parents=True)
    truth.to_csv(root / "ISIC_2019_Training_GroundTruth.csv", index=False)
    meta.to_csv(root / "ISIC_2019_Training_Metadata.csv", index=False)
    data = jpeg_bytes()
    for name in truth["image"]:
        (images / f"{name}.jpg").write_bytes(data)
    return root


@pytest.fixture(scope="session")
def isic_full(tmp_path_factory) -> Path:
    return make_isic(tmp_path_factory.mktemp("isic-full"))


def make_folders(root: Path, layout: dict[str, dict[str, int]], mode: str = "L") -> Path:
    """root/<node>/<class>/img_k.png with the given counts."""
    seed = 0
    for node, classes in layout.items():
        for cls, count in classes.items():
            for k in range(count):
                seed += 1
                write_png(root / node / cls / f"img_{k}.png", seed, mode=mode)
    return root


def copy_pneumonia(tmp_path: Path) -> Path:
    target = tmp_path / "pneumoniamnist.npz"
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copy(shared_file("medmnist", "pneumoniamnist.npz"), target)
    return target


# Hostile-input cases (issue 12): every test of a bad input records its outcome here; with
# FEDCLI_CASE_TABLE=FILE set, the session ends by writing them as one Markdown table.
HOSTILE_CASES: list[dict] = []


def one_clean_line(result) -> bool:
    """A failure as one `error:` line on stderr with no traceback, or a success with no traceback and no
    Python warning (`RuntimeWarning: ...`) on stderr, where progress bars and fedcli's own notes go."""
    text = result.output + result.stderr
    if "Traceback" in text:
        return False
    if result.exit_code == 0:
        return not re.search(r"\w+Warning: ", result.stderr)
    lines = result.stderr.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("error: ")


def record_case(point: int, case: str, args, result, intact: bool) -> None:
    """Note one hostile-input case: its issue point, what was run, exit code, clean line, artifacts intact."""
    command = "fedcli " + " ".join(str(a) for a in args) if args else case
    HOSTILE_CASES.append({"point": point, "case": case, "command": command, "exit": result.exit_code,
                          "clean": one_clean_line(result), "intact": intact,
                          "line": (result.stderr.strip().splitlines() or [""])[-1][:160]})


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    target = os.environ.get("FEDCLI_CASE_TABLE")
    if not target or not HOSTILE_CASES:
        return
    rows = ["| # | case | command | exit | one clean line | artifacts intact | message |", "|---|---|---|---|---|---|---|"]
    for c in sorted(HOSTILE_CASES, key=lambda c: c["point"]):
        command = c["command"].replace("|", "\\|")
        rows.append(f"| {c['point']} | {c['case']} | `{command}` | {c['exit']} | {'yes' if c['clean'] else 'no'} | "
                    f"{'yes' if c['intact'] else 'no'} | {c['line'].replace('|', '/')} |")
    Path(target).write_text("\n".join(rows) + "\n")
