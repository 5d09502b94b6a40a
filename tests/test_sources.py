"""The data sources against their real layouts: tuberculosis, ISIC 2019 (real tables), MedMNIST
(real chest X-rays), folders and CSV tables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import copy_pneumonia, make_folders, make_isic, make_tuberculosis, write_png
from fedcli.data.dataset import NodeDataset
from fedcli.data.manifest import Manifest
from fedcli.data.partition import make_manifest
from fedcli.data.sources import isic2019, medmnist, tuberculosis
from fedcli.experiment.config import PartitionConfig


def balanced(records) -> bool:
    return len(set(Counter(r["label"] for r in records).values())) == 1


def test_tuberculosis_one_node_per_set_labels_from_the_file_name(cli, tmp_path):
    data = make_tuberculosis(tmp_path / "cxr", montgomery=(10, 8), shenzhen=(14, 16))
    source = tuberculosis.read(data)
    assert Counter(s.site for s in source.samples) == {"montgomery": 18, "shenzhen": 30}
    assert Counter((s.site, s.label) for s in source.samples)[("montgomery", 1)] == 8
    assert all(s.label == int(s.id[-1]) for s in source.samples)
    cli.ok("partition", "--source", "tuberculosis", "--data-dir", data, "--exp", tmp_path / "exp", "--folds", "3")
    m = Manifest.load(tmp_path / "exp")
    assert m.node_names == ["montgomery", "shenzhen"] and m["label_names"] == ["normal", "tuberculosis"]
    for node in m["nodes"]:
        assert balanced(node["test"])
    # Montgomery: round(0.2 * 18 / 2) = 2 per class
    assert Counter(r["label"] for r in m.node("montgomery")["test"]) == {0: 2, 1: 2}


def test_tuberculosis_site_keeps_one_set_for_an_iid_split(tmp_path):
    data = make_tuberculosis(tmp_path / "cxr", shenzhen=(20, 22))
    m, cfg = make_manifest(PartitionConfig(exp=tmp_path / "e", source="tuberculosis", data_dir=data,
                                           scheme="iid", site="shenzhen", nodes=3, folds=2))
    assert cfg.nodes == 3 and {n["site"] for n in m["nodes"]} == {"shenzhen"}
    assert sum(len(n["train"]) + len(n["test"]) for n in m["nodes"]) == 42


def test_isic_counts_match_the_real_table(isic_full):
    source = isic2019.read(isic_full, "melanoma")
    assert Counter(s.site for s in source.samples) == {"bcn": 12413, "ham": 10015, "msk4": 819}
    assert source.dropped["no lesion_id"] == 2084
    assert Counter(s.site for s in source.samples if s.label == 1) == {"bcn": 2857, "ham": 1113, "msk4": 215}


def test_isic_partition_keeps_each_lesion_on_one_side(isic_full, tmp_path):
    m, _ = make_manifest(PartitionConfig(exp=tmp_path / "e", source="isic2019", data_dir=isic_full))
    assert m.node_names == ["bcn", "ham", "msk4"] and m["label_names"] == ["other", "melanoma"]
    assert m["augment"] == ["hflip", "rot90"]
    for node in m["nodes"]:
        assert balanced(node["test"]), node["name"]
        train_lesions = {r["group"] for r in node["train"]}
        assert not train_lesions & {r["group"] for r in node["test"]}, node["name"]
        fold_of = {}
        for r in node["train"]:
            assert fold_of.setdefault(r["group"], r["fold"]) == r["fold"]
    # the rarest class caps the balanced test set: HAM has 1,113 melanomas, so 556 per class
    assert Counter(r["label"] for r in m.node("ham")["test"]) == {0: 556, 1: 556}


def test_isic_multiclass_and_gender_column(tmp_path):
    data = make_isic(tmp_path / "isic", rows=900, metadata_sex_column="gender")
    source = isic2019.read(data, "multiclass")
    assert source.label_names == isic2019.CLASSES
    assert source.dropped["no lesion_id"] == 5
    assert len(set(s.label for s in source.samples)) > 2


def test_isic_missing_image_is_named(cli, tmp_path):
    data = make_isic(tmp_path / "isic", rows=300)
    victim = sorted((data / "ISIC_2019_Training_Input").iterdir())[10]
    victim.unlink()
    line = cli.user_error("partition", "--source", "isic2019", "--data-dir", data, "--exp", tmp_path / "exp")
    assert victim.name in line and "missing" in line


def test_medmnist_pools_all_splits_of_the_real_file(tmp_path):
    npz = copy_pneumonia(tmp_path / "data")
    source = medmnist.read(npz)
    assert len(source.samples) == 2428 + 270 + 468
    assert source.label_names == ["normal", "pneumonia"] and source.channels == 1
    m, cfg = make_manifest(PartitionConfig(exp=tmp_path / "e", source="medmnist", data_dir=tmp_path / "data"))
    assert cfg.scheme == "iid" and len(m.node_names) == 3
    test = NodeDataset(m, "node1", "test")
    assert test.images.shape[1:] == (1, 32, 32) and test.images.dtype == torch.uint8


def test_medmnist_refuses_ambiguous_folders_and_multilabel(tmp_path):
    from fedcli.core.errors import UserError

    np.savez(tmp_path / "a.npz", train_images=np.zeros((4, 28, 28), np.uint8), train_labels=np.zeros((4, 3)))
    with pytest.raises(UserError, match="multi-label"):
        medmnist.read(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", train_images=np.zeros((4, 28, 28), np.uint8), train_labels=np.zeros((4, 1)))
    with pytest.raises(UserError, match="2 .npz files"):
        medmnist.read(tmp_path)


def test_folders_source_sites_classes_and_rgb(tmp_path):
    data = make_folders(tmp_path / "data", {"north": {"benign": 6, "malign": 5}, "south": {"benign": 7, "malign": 6}},
                        mode="RGB")
    m, cfg = make_manifest(PartitionConfig(exp=tmp_path / "e", source="folders", data_dir=data, folds=2))
    assert m.node_names == ["north", "south"] and m["label_names"] == ["benign", "malign"]
    assert m["channels"] == 3
    assert NodeDataset(m, "south", "train").images.shape[1:] == (3, 32, 32)
    gray, _ = make_manifest(PartitionConfig(exp=tmp_path / "g", source="folders", data_dir=data, folds=2, channels=1))
    assert NodeDataset(gray, "south", "train").images.shape[1:] == (1, 32, 32)


def test_csv_groups_stay_on_one_side_of_split_and_folds(tmp_path):
    data = tmp_path / "table"
    rows = ["path,label,node,group"]
    for i in range(120):
        patient = f"p{i // 3}"  # three images per patient, same label
        label = "tb" if (i // 3) % 2 else "normal"
        write_png(data / "img" / f"{i}.png", i)
        rows.append(f"img/{i}.png,{label},{'east' if i < 60 else 'west'},{patient}")
    (data / "labels.csv").write_text("\n".join(rows) + "\n")
    m, _ = make_manifest(PartitionConfig(exp=tmp_path / "e", source="csv", data_dir=data / "labels.csv", folds=3))
    assert m.node_names == ["east", "west"] and m["label_names"] == ["normal", "tb"]
    for node in m["nodes"]:
        assert not {r["group"] for r in node["train"]} & {r["group"] for r in node["test"]}
        folds = {}
        for r in node["train"]:
            assert folds.setdefault(r["group"], r["fold"]) == r["fold"]
        assert balanced(node["test"])


def test_csv_missing_columns_and_paths(cli, tmp_path):
    data = tmp_path / "t"
    data.mkdir()
    (data / "labels.csv").write_text("file,label\na.png,0\n")
    assert "lacks column(s) path" in cli.user_error("partition", "--source", "csv", "--data-dir", data,
                                                    "--exp", tmp_path / "e")
    (data / "labels.csv").write_text("path,label\na.png,0\nb.png,1\n")
    assert "a.png is missing" in cli.user_error("partition", "--source", "csv", "--data-dir", data,
                                                "--exp", tmp_path / "e")


def test_content_hash_covers_file_sizes(tmp_path):
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 6, "y": 6}})
    first, _ = make_manifest(PartitionConfig(exp=tmp_path / "e", source="folders", data_dir=data, folds=2))
    write_png(data / "a" / "x" / "img_0.png", 999, size=20)
    second, _ = make_manifest(PartitionConfig(exp=tmp_path / "e", source="folders", data_dir=data, folds=2))
    assert first.content_hash != second.content_hash
    assert Path(first["data_root"]) == data.resolve()
