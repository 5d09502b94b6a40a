"""`fedcli partition` on the built-in digits, and every bad input it must refuse cleanly."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from conftest import make_folders, write_png
from fedcli.data.manifest import Manifest


def all_ids(manifest: Manifest) -> list[str]:
    return [r["id"] for node in manifest["nodes"] for split in ("train", "test") for r in node[split]]


def test_digits_partition_is_a_valid_disjoint_complete_manifest(digits_exp, digits_manifest):
    m = digits_manifest
    assert m.node_names == ["node0", "node1", "node2"]
    assert m["scheme"] == "site-shift" and m["image_size"] == 32 and m["channels"] == 1
    ids = all_ids(m)
    assert len(ids) == len(set(ids)) == 1797  # disjoint, and nothing dropped
    for node in m["nodes"]:
        assert not {r["id"] for r in node["train"]} & {r["id"] for r in node["test"]}
        assert {r["fold"] for r in node["train"]} == set(range(5))
        assert all("fold" not in r for r in node["test"])
    acquisitions = [n["acquisition"]["name"] for n in m["nodes"]]
    assert len(set(acquisitions)) == 3
    files = {p.name for p in (digits_exp / "partition").iterdir()}
    assert files == {"manifest.json", "nodes", "summary.csv", "summary.png", "config.json"}


def test_every_test_set_is_class_balanced(digits_manifest):
    for node in digits_manifest["nodes"]:
        counts = Counter(r["label"] for r in node["test"])
        assert len(counts) == 10 and len(set(counts.values())) == 1
        total = len(node["train"]) + len(node["test"])
        assert abs(len(node["test"]) / total - 0.2) < 0.02


def test_summary_csv_matches_the_manifest(digits_exp, digits_manifest):
    summary = pd.read_csv(digits_exp / "partition" / "summary.csv")
    for node in digits_manifest["nodes"]:
        for split in ("train", "test"):
            row = summary[(summary["node"] == node["name"]) & (summary["split"] == split)].iloc[0]
            assert row["total"] == len(node[split])
            assert row["3"] == sum(r["label"] == 3 for r in node[split])


def test_config_json_carries_provenance(digits_exp, digits_manifest):
    config = json.loads((digits_exp / "partition" / "config.json").read_text())
    assert config["stage"] == "partition" and config["seed"] == 0
    assert config["inputs"]["data"] == digits_manifest.content_hash
    assert config["config"]["source"] == "digits" and config["config"]["nodes"] == 3


def test_same_seed_same_manifest_other_seed_other_split(cli, tmp_path, digits_exp):
    cli.ok("partition", "--source", "digits", "--nodes", "3", "--exp", tmp_path / "again")
    first = (digits_exp / "partition" / "manifest.json").read_bytes()
    assert (tmp_path / "again" / "partition" / "manifest.json").read_bytes() == first
    cli.ok("partition", "--nodes", "3", "--seed", "1", "--exp", tmp_path / "other")
    assert (tmp_path / "other" / "partition" / "manifest.json").read_bytes() != first


def test_table_is_printed_with_the_skew_statistic(cli, tmp_path):
    output = cli.ok("partition", "--nodes", "3", "--exp", tmp_path / "exp").output
    assert "Jensen-Shannon" in output and "node2" in output and "invert" in output


def test_existing_output_needs_overwrite_and_is_left_intact(cli, tmp_path):
    cli.ok("partition", "--nodes", "3", "--exp", tmp_path)
    before = (tmp_path / "partition" / "manifest.json").read_bytes()
    assert "--overwrite" in cli.user_error("partition", "--nodes", "2", "--exp", tmp_path)
    assert (tmp_path / "partition" / "manifest.json").read_bytes() == before
    cli.ok("partition", "--nodes", "2", "--exp", tmp_path, "--overwrite")
    assert len(Manifest.load(tmp_path).node_names) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partition"]  # no staging debris


def assert_nothing_written(exp):
    assert not exp.exists() or not any(exp.iterdir()), list(exp.iterdir())


@pytest.mark.parametrize("args, expected", [
    (["--image-size", "24"], "power of two"),
    (["--image-size", "8"], "power of two"),
    (["--test-fraction", "0"], "--test-fraction"),
    (["--test-fraction", "1"], "--test-fraction"),
    (["--test-fraction", "1.5"], "--test-fraction"),
    (["--nodes", "2000"], "more than the 1797 samples"),
    (["--folds", "1"], "--folds"),
    (["--alpha", "0", "--scheme", "dirichlet"], "--alpha"),
    (["--data-dir", "."], "not used by --source digits"),
    (["--site", "x", "--scheme", "source"], "--site"),
])
def test_bad_options(cli, tmp_path, args, expected):
    exp = tmp_path / "exp"
    assert expected in cli.user_error("partition", *args, "--exp", exp)
    assert_nothing_written(exp)


def test_missing_and_empty_data_folders(cli, tmp_path):
    exp = tmp_path / "exp"
    assert "does not exist" in cli.user_error("partition", "--source", "folders", "--data-dir",
                                              tmp_path / "nowhere", "--exp", exp)
    (tmp_path / "empty").mkdir()
    assert "is empty" in cli.user_error("partition", "--source", "tuberculosis", "--data-dir",
                                        tmp_path / "empty", "--exp", exp)
    assert "--data-dir" in cli.user_error("partition", "--source", "isic2019", "--exp", exp)
    assert_nothing_written(exp)


def test_folder_without_recognised_images(cli, tmp_path):
    data = tmp_path / "data"
    (data / "siteA" / "cats").mkdir(parents=True)
    (data / "siteA" / "cats" / "notes.txt").write_text("no images here")
    exp = tmp_path / "exp"
    assert "no images found" in cli.user_error("partition", "--source", "folders", "--data-dir", data, "--exp", exp)
    assert "no Montgomery" in cli.user_error("partition", "--source", "tuberculosis", "--data-dir", data,
                                             "--exp", exp)
    assert_nothing_written(exp)


def test_corrupt_image_is_named(cli, tmp_path):
    data = make_folders(tmp_path / "data", {"a": {"x": 3, "y": 3}, "b": {"x": 3, "y": 3}})
    (data / "b" / "y" / "img_1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated garbage")
    exp = tmp_path / "exp"
    line = cli.user_error("partition", "--source", "folders", "--data-dir", data, "--exp", exp)
    assert "img_1.png" in line and "corrupt" in line
    assert_nothing_written(exp)


def test_single_class_node_is_refused_but_a_missing_class_is_not(cli, tmp_path):
    data = make_folders(tmp_path / "one", {"a": {"x": 6, "y": 6}, "b": {"x": 8}})
    exp = tmp_path / "exp"
    line = cli.user_error("partition", "--source", "folders", "--data-dir", data, "--exp", exp, "--folds", "2")
    assert "node b has fewer than two classes with two or more images (such classes: x (8 images))" in line
    assert_nothing_written(exp)
    ok = make_folders(tmp_path / "two", {"a": {"x": 8, "y": 8, "z": 8}, "b": {"x": 8, "y": 8}})
    cli.ok("partition", "--source", "folders", "--data-dir", ok, "--exp", exp, "--folds", "2")
    b = Manifest.load(exp).node("b")
    assert Counter(r["label"] for r in b["test"]) == {0: 2, 1: 2}


def test_more_nodes_than_samples(cli, tmp_path):
    data = tmp_path / "table"
    for i in range(4):
        write_png(data / f"im{i}.png", i)
    (data / "labels.csv").write_text("path,label\n" + "".join(f"im{i}.png,{i % 2}\n" for i in range(4)))
    exp = tmp_path / "exp"
    assert "more than the 4 samples" in cli.user_error("partition", "--source", "csv", "--data-dir", data,
                                                       "--nodes", "5", "--exp", exp)
    assert_nothing_written(exp)


def test_a_positive_class_is_refused_for_ten_classes_and_written_nowhere(cli, tmp_path):
    line = cli.user_error("partition", "--exp", tmp_path / "exp", "--nodes", "2", "--image-size", "16",
                          "--positive-class", "3")
    assert "--positive-class applies to a task of two classes" in line
    assert not (tmp_path / "exp").exists()


def test_communities_give_consecutive_nodes_one_scanner(cli, tmp_path):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "6", "--image-size", "16", "--exp", exp,
           *[a for size in (3, 2, 1) for a in ("--communities", str(size))])
    scanners = [json.dumps(node["acquisition"]) for node in Manifest.load(exp)["nodes"]]
    assert scanners[0] == scanners[1] == scanners[2] != scanners[3] == scanners[4] != scanners[5] != scanners[0]
    assert "adds up to 6 nodes, and there are 5" in cli.user_error(
        "partition", "--nodes", "5", "--communities", "3", "--communities", "3", "--exp", tmp_path / "b")
    assert "only --scheme site-shift has" in cli.user_error(
        "partition", "--nodes", "2", "--scheme", "iid", "--communities", "2", "--exp", tmp_path / "c")


def test_scanners_name_the_simulated_scanners_communities_take_in_order(cli, tmp_path):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "4", "--image-size", "16", "--exp", exp, "--communities", "2", "--communities", "2",
           "--scanners", "noise", "--scanners", "gamma2")
    assert [node["acquisition"] for node in Manifest.load(exp)["nodes"]] == [
        {"name": "noise", "std": 0.15}] * 2 + [{"name": "gamma", "gamma": 2.0}] * 2
    assert "--scanners sepia is not a simulated scanner; choose from gamma0.5, blur, invert" in cli.user_error(
        "partition", "--scanners", "sepia", "--exp", tmp_path / "b")
    assert "gives 3 groups, and site-shift has 2 scanners" in cli.user_error(
        "partition", "--nodes", "3", *[a for _ in range(3) for a in ("--communities", "1")],
        "--scanners", "blur", "--scanners", "noise", "--exp", tmp_path / "c")
    assert "not of iid" in cli.user_error("partition", "--scheme", "iid", "--scanners", "blur", "--exp", tmp_path / "d")
    assert not any((tmp_path / name).exists() for name in "bcd")


def test_class_mix_draws_one_node_to_its_share_and_leaves_the_others(cli, tmp_path):
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--exp", tmp_path / "plain")
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--exp", tmp_path / "mixed", "--class-mix", "node1=3:0.5")
    plain, mixed = Manifest.load(tmp_path / "plain"), Manifest.load(tmp_path / "mixed")
    records = {m: {node["name"]: node["train"] + node["test"] for node in manifest["nodes"]}
               for m, manifest in (("plain", plain), ("mixed", mixed))}
    node1 = Counter(r["label"] for r in records["mixed"]["node1"])
    assert abs(node1[3] / sum(node1.values()) - 0.5) < 0.01 and len(node1) == 10
    assert node1[3] == Counter(r["label"] for r in records["plain"]["node1"])[3]  # every image of the class kept
    assert {r["id"] for r in records["mixed"]["node1"]} < {r["id"] for r in records["plain"]["node1"]}
    for node in ("node0", "node2"):
        assert records["mixed"][node] == records["plain"][node]
    for value, message in (("node7=3:0.5", "names node7, not a node of the partition"),
                           ("node1=ten:0.5", "names class ten, not a class of the data"),
                           ("node1=3:1", "must lie strictly between 0 and 1"), ("node1", "is not NODE=CLASS:SHARE")):
        assert message in cli.user_error("partition", "--nodes", "3", "--class-mix", value, "--exp", tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
