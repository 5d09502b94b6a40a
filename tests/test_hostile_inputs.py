"""Hostile inputs (issue 12): names that would lead paths out of the experiment, environment failures
(disk full, no permission, a file in the way) and the message fixes. Each case is also recorded for
the closing note's table (conftest's `record_case`)."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import copy_exp, make_folders, record_case, write_png
from fedcli.core.errors import UserError
from fedcli.data.manifest import content_hash
from fedcli.experiment.artifacts import sha256_bytes
from fedcli.experiment.paths import gan_dir, inside


def tree(root: Path) -> dict[str, str]:
    """Every file below `root` with its content hash: what 'intact' is checked against."""
    return {str(p.relative_to(root)): sha256_bytes(p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


def csv_data(root: Path, rows: list[tuple[str, str, str]]) -> Path:
    """labels.csv with path,label,node rows and tiny PNGs."""
    for i, (path, _, _) in enumerate(rows):
        write_png(root / path, i)
    (root / "labels.csv").write_text("path,label,node\n" + "".join(f"{p},{label},{node}\n" for p, label, node in rows))
    return root


def two_sites(first: str, second: str, labels=("a", "b")) -> list[tuple[str, str, str]]:
    return [(f"img{s}_{i}.png", labels[i % 2], site) for s, site in enumerate((first, second)) for i in range(12)]


@pytest.mark.parametrize("node", ["../../x", "/abs/x", "", "a/b", ".hidden", "..", "sp ace"])
def test_csv_node_names_that_would_leave_the_experiment_are_refused(cli, tmp_path, node):
    work = tmp_path / "work"
    node = str(tmp_path / "victim") if node == "/abs/x" else node
    data = csv_data(work / "data", two_sites("site0", node))
    exp = work / "exp"
    before = tree(tmp_path)
    args = ["partition", "--source", "csv", "--data-dir", data, "--exp", exp, "--folds", "2"]
    result = cli(*args)
    intact = tree(tmp_path) == before and not (tmp_path / "victim").exists() and not exp.exists()
    record_case(1, f"csv node named {node!r}", args, result, intact)
    assert result.exit_code == 2 and intact
    assert "node name" in result.stderr or "site name" in result.stderr


def test_node_names_equal_after_case_folding_and_unsafe_class_names_are_refused(cli, tmp_path):
    data = csv_data(tmp_path / "fold", two_sites("Site", "site"))
    args = ["partition", "--source", "csv", "--data-dir", data, "--exp", tmp_path / "e1", "--folds", "2"]
    result = cli(*args)
    record_case(1, "csv nodes 'Site' and 'site'", args, result, not (tmp_path / "e1").exists())
    assert result.exit_code == 2 and "differ only in case" in result.stderr
    data = csv_data(tmp_path / "cls", two_sites("s0", "s1", labels=("a", "../b")))
    args = ["partition", "--source", "csv", "--data-dir", data, "--exp", tmp_path / "e2", "--folds", "2"]
    assert "class name '../b'" in cli.user_error(*args)
    assert not (tmp_path / "e2").exists()


def test_a_hand_edited_manifest_cannot_make_train_gan_delete_outside(cli, digits_exp, tmp_path):
    """The manifest's hash is recomputed after the edit, so only the name checks stand in the way."""
    exp = copy_exp(digits_exp, tmp_path)
    victim = tmp_path / "victim"
    (victim / "keep.txt").parent.mkdir()
    (victim / "keep.txt").write_text("precious")
    path = exp / "partition" / "manifest.json"
    data = json.loads(path.read_text())
    data["nodes"][0]["name"] = "../../victim"
    data["content_hash"] = content_hash(data)
    path.write_text(json.dumps(data))
    before = tree(tmp_path)
    args = ["train-gan", "--exp", exp, "--overwrite", "--iterations", "1"]
    result = cli(*args)
    record_case(1, "manifest node renamed '../../victim', hash recomputed", args, result, tree(tmp_path) == before)
    assert result.exit_code == 2 and tree(tmp_path) == before


def test_layout_paths_are_children_of_the_experiment(tmp_path):
    assert gan_dir(tmp_path, "node0") == tmp_path / "gan" / "node0"
    for bad in ("..", ".", "", "a/b", "/etc", "a\\b"):
        with pytest.raises(UserError):
            inside(tmp_path, "gan", bad)


def test_exp_that_is_a_file_is_one_line(cli, tmp_path):
    exp = tmp_path / "file"
    exp.write_text("not a folder")
    args = ["partition", "--exp", exp]
    result = cli(*args)
    record_case(7, "--exp pointing at a file", args, result, exp.read_text() == "not a folder")
    assert result.exit_code == 2 and "is a file" in result.stderr


def failing_write(monkeypatch, err: int, after: int = 0):
    """Make the (after+1)-th atomic file write fail with `err`, as a full disk or a denied folder would."""
    import fedcli.experiment.artifacts as artifacts

    real, calls = artifacts.atomic_write_bytes, []

    def write(path, data):
        calls.append(path)
        if len(calls) > after:
            raise OSError(err, os.strerror(err), str(path))
        real(path, data)
    monkeypatch.setattr(artifacts, "atomic_write_bytes", write)


def no_staging_left(exp: Path) -> bool:
    return not [p for p in exp.rglob(".*staging*")] if exp.exists() else True


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES])
def test_disk_full_or_denied_during_partition(cli, tmp_path, monkeypatch, err):
    exp = tmp_path / "exp"
    failing_write(monkeypatch, err, after=2)
    args = ["partition", "--exp", exp, "--image-size", "16"]
    result = cli(*args)
    intact = not (exp / "partition").exists() and no_staging_left(exp)
    record_case(7, f"{errno.errorcode[err]} while partition writes", args, result, intact)
    assert result.exit_code == 2 and intact
    assert os.strerror(err) in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_unwritable_exp_is_one_line_before_anything_is_written(cli, tmp_path, monkeypatch):
    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), kwargs.get("dir", "exp"))
    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    exp = tmp_path / "exp"
    args = ["partition", "--exp", exp, "--image-size", "16"]
    result = cli(*args)
    record_case(7, "unwritable --exp (EACCES) at partition", args, result, not (exp / "partition").exists())
    assert result.exit_code == 2 and "permission" in result.stderr.lower()


@pytest.fixture(scope="module")
def federated_exp(tmp_path_factory) -> Path:
    """A 16 px partition with one cheap strategy federated, for the stages after it."""
    from conftest import Cli

    exp = tmp_path_factory.mktemp("fed") / "exp"
    Cli().ok("partition", "--exp", exp, "--image-size", "16", "--nodes", "2")
    Cli().ok("federate", "--exp", exp, "--strategy", "standalone", "--rounds", "1", "--bootstrap", "10",
             "--threads", "1")
    return exp


def test_disk_full_during_federate_and_report_leaves_the_experiment_as_it_was(cli, federated_exp, tmp_path,
                                                                               monkeypatch):
    exp = copy_exp(federated_exp, tmp_path)
    failing_write(monkeypatch, errno.ENOSPC, after=1)
    args = ["federate", "--exp", exp, "--strategy", "fedavg", "--rounds", "1", "--bootstrap", "10", "--threads", "1"]
    result = cli(*args)
    intact = not (exp / "federate" / "fedavg").exists() and no_staging_left(exp)
    record_case(7, "ENOSPC while federate writes", args, result, intact)
    assert result.exit_code == 2 and intact and "No space left" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # the interrupted progress bar is gone
    before = tree(exp)
    args = ["report", exp]
    result = cli(*args)
    intact = tree(exp) == before
    record_case(7, "ENOSPC while report writes", args, result, intact)
    assert result.exit_code == 2 and intact


def test_pickled_weights_are_refused_without_torchs_unsafe_advice(cli, digits_exp, tmp_path, capfd):
    class Payload:
        def __reduce__(self):
            return (print, ("PICKLE RAN",))
    weights = tmp_path / "alexnet.pth"
    torch.save({"features.0.weight": Payload()}, weights)
    exp = copy_exp(digits_exp, tmp_path)
    before = tree(exp)
    args = ["train-gan", "--exp", exp, "--lpips-weights", weights]
    result = cli(*args)
    record_case(10, "pickled LPIPS weights file", args, result, tree(exp) == before)
    assert result.exit_code == 2 and "weights_only=False" not in result.stderr and "add_safe_globals" not in result.stderr
    assert "PICKLE RAN" not in result.output + capfd.readouterr().out


def test_a_stray_csv_label_is_noted(cli, tmp_path):
    rows = two_sites("s0", "s1") + [("stray.png", "typo", "s0")]
    data = csv_data(tmp_path / "data", rows)
    args = ["partition", "--source", "csv", "--data-dir", data, "--exp", tmp_path / "exp", "--folds", "2"]
    result = cli(*args)
    record_case(10, "a stray CSV label (one image of class 'typo')", args, result, True)
    assert result.exit_code == 0
    assert "note: class 'typo' has 1 image(s) and no test image on any node" in result.output


def test_a_class_with_one_image_is_named_as_such(cli, tmp_path):
    """The message once said 'a single class (x, y)', naming two classes."""
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 8, "y": 1}})
    args = ["partition", "--source", "folders", "--data-dir", data, "--exp", tmp_path / "exp", "--folds", "2"]
    result = cli(*args)
    record_case(10, "a node whose second class has one image", args, result, not (tmp_path / "exp").exists())
    assert result.exit_code == 2
    assert "node b has fewer than two classes with two or more images (such classes: x (8 images); y has one " \
           "image, which cannot be on both sides of the split)" in result.stderr


def test_a_site_folder_linked_to_the_root_is_refused(cli, tmp_path):
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 6, "y": 6}})
    (data / "c").symlink_to(data, target_is_directory=True)
    args = ["partition", "--source", "folders", "--data-dir", data, "--exp", tmp_path / "exp", "--folds", "2"]
    result = cli(*args)
    record_case(10, "a site folder symlinked to the data root", args, result, not (tmp_path / "exp").exists())
    assert result.exit_code == 2 and "same file" in result.stderr



def test_metrics_on_a_test_set_lacking_a_class_warn_nothing_on_stderr():
    """Bootstrap resamples of a small test set often lack a class; numpy's nanmean warned for each."""
    import warnings

    import numpy as np

    from fedcli.metrics.scores import evaluate, resample_counts

    y = np.array([0, 0, 0, 1])
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = evaluate(y, probs, resample_counts(0, "node0", 4, 200))
    stderr = "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)
    record_case(10, "metrics of a 4-image test set (resamples lacking a class)", [],
                SimpleNamespace(exit_code=0, output="", stderr=stderr), True)
    assert not caught, stderr
    assert scores["balanced_accuracy"] == (2 / 3 + 1) / 2 and scores["auroc"] == 2 / 3
    assert scores["auroc_lo"] <= scores["auroc"] <= scores["auroc_hi"]
