"""The Dataset later stages use: cached uint8 decode, [-1, 1] floats, keyed augmentation."""

from __future__ import annotations

import torch

from fedcli.data.dataset import NodeDataset, augment_batch
from fedcli.data.loading import load_images


def test_items_match_the_manifest(digits_manifest):
    ds = NodeDataset(digits_manifest, "node1", "test")
    records = digits_manifest.records("node1", "test")
    assert len(ds) == len(records)
    image, label = ds[5]
    assert image.shape == (1, 32, 32) and image.dtype == torch.float32
    assert -1.0 <= image.min() and image.max() <= 1.0 and image.max() > 0.5
    assert label == records[5]["label"]
    assert torch.equal(ds.images, load_images(digits_manifest, "node1", records))


def test_folds_select_train_records(digits_manifest):
    held_out = NodeDataset(digits_manifest, "node0", "train", folds=[2])
    rest = NodeDataset(digits_manifest, "node0", "train", folds=[0, 1, 3, 4])
    assert {r["fold"] for r in held_out.records} == {2}
    assert len(held_out) + len(rest) == len(digits_manifest.records("node0", "train"))


def test_disk_cache_is_reused(digits_manifest, tmp_path, monkeypatch):
    first = NodeDataset(digits_manifest, "node2", "train", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    monkeypatch.setattr("fedcli.data.dataset.load_images", lambda *a: (_ for _ in ()).throw(AssertionError))
    second = NodeDataset(digits_manifest, "node2", "train", cache_dir=tmp_path)
    assert torch.equal(first.images, second.images)


def test_batches_cover_an_epoch_once_and_repeat_with_the_same_generator(digits_manifest):
    ds = NodeDataset(digits_manifest, "node0", "train")
    run = lambda seed: list(ds.batches(64, generator=torch.Generator().manual_seed(seed)))  # noqa: E731
    a, b, c = run(1), run(1), run(2)
    assert sum(len(y) for _, y in a) == len(ds)
    assert sorted(torch.cat([y for _, y in a]).tolist()) == sorted(ds.labels.tolist())
    assert all(torch.equal(x1, x2) for (x1, _), (x2, _) in zip(a, b))
    assert not torch.equal(a[0][0], c[0][0])


def test_augmentation_flips_and_rotates_about_as_often_as_drawn():
    image = torch.arange(16.0).view(1, 1, 4, 4)
    batch = image.expand(4000, 1, 4, 4)
    flipped = augment_batch(batch, ("hflip",), torch.Generator().manual_seed(0))
    share = (flipped[:, 0, 0, 0] == 3).float().mean()
    assert 0.45 < share < 0.55
    rotated = augment_batch(batch, ("rot90",), torch.Generator().manual_seed(0))
    variants = {tuple(r.flatten().tolist()) for r in rotated}
    assert variants == {tuple(torch.rot90(image[0], k, dims=(-2, -1)).flatten().tolist()) for k in range(4)}
    assert torch.equal(augment_batch(batch, (), torch.Generator()), batch)


def test_digits_are_not_flipped(digits_manifest):
    assert digits_manifest["augment"] == []
