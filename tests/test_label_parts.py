"""Few labels at partition time: each node's labelled, unlabelled and validation parts, class-stratified, a
labelled set held apart at a named node, and hidden labels that no split hands out."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from fedcli.data.dataset import UNSEEN, NodeDataset
from fedcli.data.manifest import Manifest

PARTS = ("train", "unlabeled", "validation")


def key(record: dict) -> str:
    return record["id"]


def hidden(manifest: Manifest) -> dict[str, list[int]]:
    return json.loads((manifest.path.parent / "hidden_labels.json").read_text())["labels"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from conftest import Cli

    root = tmp_path_factory.mktemp("parts")
    full, few = root / "full", root / "few"
    Cli().ok("partition", "--nodes", "4", "--image-size", "16", "--exp", full)
    Cli().ok("partition", "--nodes", "4", "--image-size", "16", "--labeled-fraction", "0.1", "--validation-fraction",
             "0.1", "--labeled-nodes", "node0", "--labeled-nodes", "node2", "--held-apart-fraction", "0.05",
             "--held-apart-node", "node3", "--exp", few)
    return Manifest.load(full), Manifest.load(few)


def test_every_training_image_lands_in_exactly_one_part(parts):
    full, few = parts
    for name in full.node_names:
        node = few.node(name)
        ids = [key(r) for part in PARTS for r in node.get(part, [])]
        assert len(ids) == len(set(ids))
        held = {key(r) for r in few.node("node3")["held_apart"] if r["origin"] == name}
        assert set(map(key, full.node(name)["train"])) == set(ids) | held and not set(ids) & held
        assert [key(r) for r in few.node(name)["test"]] == [key(r) for r in full.node(name)["test"]]


def test_labelled_nodes_keep_a_stratified_share_and_every_class_they_hold(parts):
    _, few = parts
    for name in ("node0", "node2"):
        node = few.node(name)
        labelled, validation = Counter(r["label"] for r in node["train"]), Counter(r["label"] for r in node["validation"])
        hidden_counts = Counter(hidden(few)[name])
        for label in set(labelled) | set(hidden_counts) | set(validation):
            rest = labelled[label] + hidden_counts[label]
            assert labelled[label] == max(1, round(0.1 * rest))  # the stated rule, at least one per class
        assert sum(validation.values()) > 0
    for name in ("node1", "node3"):  # outside --labeled-nodes: no label at all
        node = few.node(name)
        assert node["train"] == [] and node["validation"] == [] and node["unlabeled"]
    assert few["labels"] == {"fraction": 0.1, "validation_fraction": 0.1, "labeled_nodes": ["node0", "node2"],
                             "held_apart": {"fraction": 0.05, "holder": "node3"}}


def test_the_held_apart_set_is_class_balanced_at_its_holder_only(parts):
    _, few = parts
    held = few.node("node3")["held_apart"]
    counts = Counter(r["label"] for r in held)
    assert len(counts) == 10 and len(set(counts.values())) == 1
    assert {r["origin"] for r in held} == set(few.node_names)  # drawn from every node, each image's own
    assert all("held_apart" not in few.node(n) for n in ("node0", "node1", "node2"))
    exp = few.path.parent.parent
    views = {n: json.loads((exp / "partition" / "nodes" / f"{n}.json").read_text()) for n in few.node_names}
    holders = {n for n, view in views.items() for entry in view["nodes"] if "held_apart" in entry}
    assert holders == {"node3"}


def test_a_held_apart_image_keeps_its_own_nodes_scanner(parts):
    from fedcli.data.loading import load_images

    _, few = parts
    held = few.node("node3")["held_apart"]
    for origin in ("node0", "node2"):  # site-shift: another scanner than node3's
        records = [r for r in held if r["origin"] == origin][:3]
        at_origin = load_images(few, origin, [{k: v for k, v in r.items() if k not in ("origin", "acquisition")}
                                             for r in records])
        assert torch.equal(load_images(few, "node3", records), at_origin)


def test_an_unlabelled_split_hands_out_no_label(parts):
    _, few = parts
    exp = few.path.parent.parent
    for name in few.node_names:
        node = few.node(name)
        assert all(r["label"] is None for r in node["unlabeled"])
        assert len(hidden(few)[name]) == len(node["unlabeled"])
        data = NodeDataset(few, name, "unlabeled")
        assert len(data) == len(node["unlabeled"]) and bool((data.labels == UNSEEN).all())
        assert "hidden" not in (exp / "partition" / "nodes" / f"{name}.json").read_text()
    assert "hidden" not in few.path.read_text()  # neither the manifest nor its hash holds them
    assert json.loads((few.path.parent / "hidden_labels.json").read_text())["partition"] == few.content_hash


def test_the_few_labels_options_leave_a_full_partition_unchanged(parts, tmp_path):
    full, _ = parts
    config = json.loads((full.path.parent / "config.json").read_text())
    assert "labels" not in full.data and all("unlabeled" not in full.node(n) for n in full.node_names)
    assert "labeled_fraction" in config["config"]  # recorded, at its default


@pytest.mark.parametrize("args, says", [
    (["--labeled-nodes", "none"], "no node has a labelled image"),
    (["--labeled-nodes", "node9"], "--labeled-nodes names node9"),
    (["--held-apart-node", "node1"], "give both"),
    (["--held-apart-fraction", "0.1", "--held-apart-node", "node7"], "--held-apart-node node7 is not a node"),
    (["--labeled-fraction", "0"], "--labeled-fraction must"),
    (["--labeled-nodes", "none", "--labeled-nodes", "node0"], "it takes no node name beside it"),
    (["--labeled-nodes", "node0", "--labeled-nodes", "node0"], "names node0 twice"),
    (["--labeled-fraction", "0.5", "--shared-fraction", "0.05"], "use one or the other"),
])
def test_bad_few_label_settings_are_one_line(cli, tmp_path, args, says):
    line = cli.user_error("partition", "--nodes", "3", "--image-size", "16", *args, "--exp", tmp_path / "x")
    assert says in line
    assert not (tmp_path / "x" / "partition").exists()


def rewrite_hidden_labels(exp, change) -> None:
    """The partition's hidden labels changed by `change`, node by node."""
    path = exp / "partition" / "hidden_labels.json"
    data = json.loads(path.read_text())
    data["labels"] = {node: change(labels) for node, labels in data["labels"].items()}
    path.write_text(json.dumps(data))


def test_permuting_the_hidden_labels_changes_no_model_metric_or_prediction(cli, tmp_path):
    runs = {}
    for name, change in (("as drawn", list), ("permuted", lambda labels: [(y + 1) % 10 for y in labels])):
        exp = tmp_path / name.replace(" ", "-")
        cli.ok("partition", "--nodes", "3", "--image-size", "16", "--labeled-fraction", "0.2", "--exp", exp)
        rewrite_hidden_labels(exp, change)
        cli.ok("train-gan", "--exp", exp, "--iterations", "10", "--pp-iterations", "0", "--fid-every", "10",
               "--fid-images", "16", "--fidelity-seeds", "0", "--buffer-size", "20", "--threads", "1")
        cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "feder", "--strategy", "fedperl",
               "--ssl", "fixmatch", "--unlabeled-ratio", "1", "--rounds", "2", "--epochs", "1", "--init-epochs", "0",
               "--batch", "32", "--buffer-size", "20", "--bootstrap", "10", "--threads", "1", "--steps-per-round", "3")
        cli.ok("federate", "--exp", exp, "--strategy", "standalone", "--labels", "all", "--rounds", "1", "--epochs",
               "1", "--init-epochs", "0", "--batch", "32", "--bootstrap", "10", "--threads", "1", "--steps-per-round",
               "3")  # the oracle
        runs[name] = exp
    for node in ("node0", "node1", "node2"):
        buffers = [runs[name] / "gan" / node / "buffer.safetensors" for name in runs]
        assert buffers[0].read_bytes() == buffers[1].read_bytes()
    runs = {name: exp / "federate" for name, exp in runs.items()}
    oracles = [(runs[name] / "standalone" / "models" / "node0.safetensors").read_bytes() for name in runs]
    assert oracles[0] != oracles[1]  # --labels all reads them, and only it
    for strategy in ("fedavg", "feder", "fedperl"):  # with FixMatch on the unlabelled images, and peers
        folders = [runs[name] / strategy for name in runs]
        assert (folders[0] / "metrics.csv").read_text() == (folders[1] / "metrics.csv").read_text()
        assert (folders[0] / "predictions.safetensors").read_bytes() == (folders[1] / "predictions.safetensors").read_bytes()
        models = sorted(p.name for p in (folders[0] / "models").iterdir())
        assert models and all((folders[0] / "models" / m).read_bytes() == (folders[1] / "models" / m).read_bytes()
                              for m in models)


def test_a_node_without_labels_is_refused_by_what_needs_labels_everywhere_in_one_line(parts, cli, tmp_path):
    from conftest import copy_exp

    _, few = parts
    exp = copy_exp(few.path.parent.parent, tmp_path)
    assert "node node1 holds no labelled image" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "scaffold", "--rounds", "1", "--threads", "1")
    assert "node node1 holds no labelled training image" in cli.user_error(
        "train-gan", "--exp", exp, "--node", "node1", "--threads", "1")


def test_the_few_labels_options_at_their_defaults_leave_a_partition_units_fingerprint_unchanged(tmp_path):
    from fedcli.experiment.config import PartitionConfig
    from fedcli.pipeline.runner import plain

    keys = set(plain(PartitionConfig(exp=tmp_path)))
    assert not keys & {"labeled_fraction", "validation_fraction", "labeled_nodes", "held_apart_fraction",
                       "held_apart_node"}
    assert "labeled_fraction" in plain(PartitionConfig(exp=tmp_path, labeled_fraction=0.5))


def test_the_oracle_gives_every_unlabelled_image_its_hidden_label(parts, tmp_path, cli):
    from fedcli.federate import engine
    from fedcli.federate.config import FederateConfig

    _, few = parts
    exp = few.path.parent.parent
    oracle = engine.build(FederateConfig(exp=exp, strategy=("standalone",), labels="all"), few, 0).data
    plain = engine.build(FederateConfig(exp=exp, strategy=("standalone",)), few, 0).data
    for node in ("node0", "node2"):
        labelled, unlabelled = plain.train[node], plain.unlabeled[node]
        assert torch.equal(oracle.train[node].images, torch.cat([labelled.images, unlabelled.images]))
        assert oracle.train[node].labels.tolist() == labelled.labels.tolist() + hidden(few)[node]
        assert len(oracle.unlabeled[node]) == 0 and len(unlabelled) > 0
    copy = tmp_path / "exp"
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--labeled-fraction", "0.2", "--exp", copy)
    rewrite_hidden_labels(copy, lambda labels: labels[:-1])
    assert "does not hold" in cli.user_error("federate", "--exp", copy, "--strategy", "fedavg", "--labels", "all",
                                             "--rounds", "1", "--threads", "1")
    assert "leaves none for --ssl" in cli.user_error("federate", "--exp", copy, "--strategy", "fedavg", "--labels",
                                                     "all", "--ssl", "fixmatch", "--rounds", "1", "--threads", "1")
    full = parts[0].path.parent.parent
    assert "this partition hides none" in cli.user_error("federate", "--exp", full, "--strategy", "fedavg", "--labels",
                                                         "all", "--rounds", "1", "--threads", "1")
