"""fedcli.api: the stages from Python write what the command line writes for the same options, byte for byte
(the quickstart's partition and a short train-gan from its table), raise the command's one-line message for a
mistake and write nothing, and return frames read from the artifacts (federate's: docs/python.md's example,
tests/test_python_docs.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from conftest import flat_pngs
from fedcli import api
from fedcli.core.errors import UserError

QUICKSTART = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.toml"
SHORT_GAN = dict(iterations=12, patience=100, pp_iterations=6, fid_every=6, fid_images=32, buffer_size=30,
                 fidelity_epochs=1, fidelity_seeds=1, threads=2)


def files(exp: Path) -> dict[str, bytes]:
    """Every file of an experiment but the event logs (their wall-clock times)."""
    return {str(p.relative_to(exp)): p.read_bytes() for p in sorted(exp.rglob("*"))
            if p.is_file() and p.relative_to(exp).parts[0] != "logs"}


def test_the_api_and_the_command_line_write_the_same_bytes(cli, tmp_path, monkeypatch):
    for folder in ("cli", "api"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "cli")  # the same relative --exp, which config.json records
    cli.ok("partition", "--config", QUICKSTART, "--exp", "exp")
    cli.ok("train-gan", "--config", QUICKSTART, "--exp", "exp", "--node", "node0",
           *[a for key, value in SHORT_GAN.items() for a in (f"--{key.replace('_', '-')}", str(value))])
    monkeypatch.chdir(tmp_path / "api")
    part = api.partition("exp", config_file=QUICKSTART)
    gans = api.train_generators("exp", config_file=QUICKSTART, node="node0", **SHORT_GAN)

    expected, got = files(tmp_path / "cli" / "exp"), files(tmp_path / "api" / "exp")
    assert got.keys() == expected.keys() and len(got) > 10
    assert [name for name in got if got[name] != expected[name]] == []
    assert part.nodes == ("node0", "node1", "node2") and part.manifest.is_file()
    assert list(gans.folders) == ["node0"] and set(gans.metrics.node) == {"node0"}
    assert part.summary.equals(pd.read_csv(tmp_path / "cli" / "exp" / "partition" / "summary.csv"))
    audited = api.audit("exp", node="node0", steps=3, max_images=10, batch_size=10, threads=2)
    assert [s["node"] for s in audited.summaries] == ["node0"] and set(audited.distances.node) == {"node0"}


def test_a_mistake_raises_the_command_lines_message_and_writes_nothing(cli, tmp_path):
    line = cli.user_error("partition", "--exp", tmp_path / "cli", "--nodes", "0")
    with pytest.raises(UserError) as raised:
        api.partition(tmp_path / "api", nodes=0)
    assert f"error: {raised.value}" == line
    assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()
    with pytest.raises(UserError, match="fedcli.api: 'nodez' is not an option of partition; its options: source, "
                                        "data_dir, "):
        api.partition(tmp_path / "api", nodez=3)
    with pytest.raises(UserError, match=r"fedcli.api.federate: federate.rounds = '3' must be of type int"):
        api.federate(tmp_path / "api", rounds="3")
    with pytest.raises(UserError, match="cannot be imported again by the nodes"):
        api.federate(tmp_path / "api", model=lambda in_channels, num_classes: None)
    assert not (tmp_path / "api").exists()


def test_run_and_report_return_what_the_stages_wrote(tmp_path):
    scans = flat_pngs(tmp_path / "scans", ("east", "west"), {"benign": 70, "malignant": 180},
                      [f"p{i}-1" for i in range(10)])
    recipe = tmp_path / "tiny.toml"  # every plugin of the tests' distribution (tests/plugins), as built-in ones
    recipe.write_text(f'[partition]\nsource = "studies"\ndata-dir = "{scans}"\nimage-size = 16\n\n'
                      '[train_gan]\ngenerator = "class-mean"\nfidelity-seeds = 0\n\n'
                      '[federate]\nstrategy = ["fedavg-step", "feder"]\nmodel = "tinycnn"\nrounds = 1\nepochs = 1\n'
                      "init-epochs = 0\nbootstrap = 10\n")
    done = api.run(recipe, exp=tmp_path / "exp", threads=2)
    assert done.counts["ran"] >= 3 and done.report.path.is_file() and done.report.tables
    assert done.report.tables["headline"].strategy.tolist() == ["feder", "fedavg-step"]  # every strategy's nodes
    assert set(done.report.tables["gan_summary"]["kind"]) == {"class-mean"}
    again = api.run(recipe, exp=tmp_path / "exp", threads=2)
    assert again.counts["ran"] == 0 and again.report.tables.keys() == done.report.tables.keys()
    reported = api.report(tmp_path / "exp", metric="balanced-accuracy")
    assert reported.path == done.report.path and reported.tables.keys() == done.report.tables.keys()
