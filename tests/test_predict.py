"""`fedcli predict`: new image files get the probabilities evaluation computes, ensembles, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from conftest import Cli, make_folders
from fedcli.artifacts import load_tensors
from fedcli.data.manifest import Manifest
from fedcli.fl.engine import Federation
from fedcli.fl.evaluate import predict

TINY = ["--rounds", "1", "--epochs", "1", "--bootstrap", "20", "--device", "cpu"]


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    """16x16 digits on 3 site-shifted nodes; fedavg (one global model) and standalone (one per node)."""
    exp = tmp_path_factory.mktemp("predict") / "exp"
    cli = Cli()
    cli.ok("partition", "--source", "digits", "--nodes", "3", "--image-size", "16", "--exp", exp)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "standalone", *TINY)
    return exp


def evaluation_probs(exp, strategy: str, key: str, node: str) -> np.ndarray:
    """What federate's evaluation computes for model `key` on `node`'s test set."""
    manifest = Manifest.load(exp)
    fed = Federation(manifest, lambda n: None, seed=manifest["seed"], model="cnn", epochs=1, init_epochs=1,
                     lr=1e-3, batch=32, lam=0.5)
    model = fed.new_model(key)
    model.load_state_dict(load_tensors(exp / "federate" / strategy / "models" / f"{key}.safetensors", "model"))
    return predict(model, fed.test[node].images)


def write_test_pngs(exp, node: str, folder, mode: str = "L"):
    """A node's test images as PNG files in per-class subfolders; returns relative path -> test index."""
    manifest = Manifest.load(exp)
    fed = Federation(manifest, lambda n: None, seed=0, model="cnn", epochs=1, init_epochs=1, lr=1e-3, batch=32,
                     lam=0.5)
    test = fed.test[node]
    index = {}
    for i, (image, label) in enumerate(zip(test.images, test.labels)):
        rel = f"{manifest['label_names'][label]}/img_{i:04d}.png"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0].numpy(), "L").convert(mode).save(folder / rel)
        index[rel] = i
    return index, test.labels.numpy()


def probabilities(frame: pd.DataFrame) -> np.ndarray:
    return frame[[c for c in frame.columns if c.startswith("p_")]].to_numpy()


def final_accuracy(exp, strategy: str, model_node: str, test_node: str) -> float:
    m = pd.read_csv(exp / "federate" / strategy / "metrics.csv")
    m = m[(m["round"] == m["round"].max()) & (m["model_node"] == model_node) & (m["test_node"] == test_node)]
    return float(m["accuracy"].iloc[0])


def test_node_model_gives_evaluations_probabilities_and_accuracy(cli, exp, tmp_path):
    index, labels = write_test_pngs(exp, "node1", tmp_path / "images")
    out = tmp_path / "node1.csv"
    result = cli.ok("predict", "--exp", exp, "--strategy", "standalone", "--node", "node1",
                    "--data-dir", tmp_path / "images", "--out", out, "--device", "cpu")
    assert f"predicted {len(index)} images" in result.output and f"wrote {out}" in result.output
    frame = pd.read_csv(out, dtype={"predicted": str})
    names = Manifest.load(exp)["label_names"]
    assert list(frame.columns) == ["file", "predicted", "predicted_index"] + [f"p_{n}" for n in names]
    assert list(frame["file"]) == sorted(index)  # recursive, sorted, relative to --data-dir
    order = [index[f] for f in frame["file"]]
    probs, expected = probabilities(frame), evaluation_probs(exp, "standalone", "node1", "node1")[order]
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(probs, expected, atol=1e-6)
    assert (frame["predicted_index"].to_numpy() == expected.argmax(axis=1)).all()
    assert list(frame["predicted"]) == [names[i] for i in frame["predicted_index"]]
    accuracy = (frame["predicted_index"].to_numpy() == labels[order]).mean()
    assert accuracy == pytest.approx(final_accuracy(exp, "standalone", "node1", "node1"), abs=1e-9)
    assert accuracy > 0.3  # ten classes: chance is 0.1
    for name, batch in (("again", "64"), ("batch7", "7")):
        cli.ok("predict", "--exp", exp, "--strategy", "standalone", "--node", "node1", "--data-dir",
               tmp_path / "images", "--out", tmp_path / f"{name}.csv", "--device", "cpu", "--batch", batch)
    assert (tmp_path / "again.csv").read_bytes() == out.read_bytes()  # same input, same CSV
    np.testing.assert_allclose(probabilities(pd.read_csv(tmp_path / "batch7.csv")), probs, atol=1e-6)


def test_ensemble_is_the_mean_of_the_node_models(cli, exp, tmp_path):
    index, labels = write_test_pngs(exp, "node0", tmp_path / "images")
    frames = {}
    for key in ("node0", "node1", "node2"):
        cli.ok("predict", "--exp", exp, "--strategy", "standalone", "--node", key, "--data-dir", tmp_path / "images",
               "--out", tmp_path / f"{key}.csv", "--device", "cpu")
        frames[key] = pd.read_csv(tmp_path / f"{key}.csv")
    cli.ok("predict", "--exp", exp, "--strategy", "standalone", "--ensemble", "--data-dir", tmp_path / "images",
           "--out", tmp_path / "ensemble.csv", "--device", "cpu")
    ensemble = pd.read_csv(tmp_path / "ensemble.csv")
    mean = np.mean([probabilities(f) for f in frames.values()], axis=0)
    np.testing.assert_allclose(probabilities(ensemble), mean, atol=1e-12)
    assert (ensemble["predicted_index"].to_numpy() == mean.argmax(axis=1)).all()
    order = [index[f] for f in ensemble["file"]]
    accuracy = (ensemble["predicted_index"].to_numpy() == labels[order]).mean()
    assert accuracy == pytest.approx(final_accuracy(exp, "standalone", "ensemble", "node0"), abs=1e-9)


def test_shared_model_is_the_default_and_rgb_files_are_converted_like_training(cli, exp, tmp_path):
    gray, _ = write_test_pngs(exp, "node2", tmp_path / "gray")
    write_test_pngs(exp, "node2", tmp_path / "rgb", mode="RGB")
    (tmp_path / "rgb" / "notes.txt").write_text("not an image")
    cli.ok("predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", tmp_path / "gray", "--device", "cpu")
    default = exp / "predict" / "fedavg_global.csv"
    cli.ok("predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", tmp_path / "rgb",
           "--out", tmp_path / "rgb.csv", "--device", "cpu")
    frame, rgb = pd.read_csv(default), pd.read_csv(tmp_path / "rgb.csv")
    assert list(rgb["file"]) == list(frame["file"]) == sorted(gray)
    np.testing.assert_array_equal(probabilities(rgb), probabilities(frame))
    order = [gray[f] for f in frame["file"]]
    np.testing.assert_allclose(probabilities(frame), evaluation_probs(exp, "fedavg", "global", "node2")[order],
                               atol=1e-6)


@pytest.mark.filterwarnings("ignore:Mean of empty slice")  # federate's bootstrap on a 4-image test set
def test_image_file_sources_are_decoded_as_in_training(cli, tmp_path):
    data = make_folders(tmp_path / "data", {"a": {"x": 8, "y": 8}, "b": {"x": 8, "y": 8}}, mode="RGB")
    exp = tmp_path / "exp"
    cli.ok("partition", "--source", "folders", "--data-dir", data, "--image-size", "16", "--folds", "2",
           "--exp", exp)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", *TINY)
    cli.ok("predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", data / "a", "--out", tmp_path / "a.csv",
           "--device", "cpu")
    frame = pd.read_csv(tmp_path / "a.csv").set_index("file")
    manifest = Manifest.load(exp)
    assert manifest["channels"] == 3 and len(frame) == 16
    test = [r["path"].removeprefix("a/") for r in manifest.node("a")["test"]]
    manifest_probs = evaluation_probs(exp, "fedavg", "global", "a")
    np.testing.assert_allclose(probabilities(frame.loc[test].reset_index()), manifest_probs, atol=1e-6)


@pytest.mark.parametrize("args, expected", [
    (["--strategy", "standalone"], ["--node", "node0", "node1", "node2", "--ensemble"]),
    (["--strategy", "standalone", "--node", "node7"], ["node7", "node0, node1, node2"]),
    (["--strategy", "standalone", "--node", "node0", "--ensemble"], ["exclude"]),
    (["--strategy", "fedavg", "--ensemble"], ["--ensemble", "global"]),
    (["--strategy", "fedbn"], ["fedbn", "fedavg, standalone", "fedcli federate"]),
    (["--strategy", "nope"], ["unknown strategy", "fedavg"]),
])
def test_model_choice_errors_are_one_line_and_write_nothing(cli, exp, tmp_path, args, expected):
    write_test_pngs(exp, "node0", tmp_path / "images")
    out = tmp_path / "out" / "p.csv"
    line = cli.user_error("predict", "--exp", exp, *args, "--data-dir", tmp_path / "images", "--out", out)
    assert all(text in line for text in expected), line
    assert not out.parent.exists()


def test_data_dir_errors_are_one_line_and_write_nothing(cli, exp, tmp_path):
    out = tmp_path / "out" / "p.csv"
    base = ["predict", "--exp", exp, "--strategy", "fedavg", "--out", out, "--data-dir"]
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "readme.txt").write_text("no images here")
    assert "no image files" in cli.user_error(*base, tmp_path / "empty")
    assert "does not exist" in cli.user_error(*base, tmp_path / "missing")
    (tmp_path / "mixed").mkdir()
    Image.new("L", (16, 16), 128).save(tmp_path / "mixed" / "good.png")
    (tmp_path / "mixed" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated garbage")
    line = cli.user_error(*base, tmp_path / "mixed")
    assert "bad.png" in line and "corrupt" in line
    assert "no partition" in cli.user_error("predict", "--exp", tmp_path / "nothing", "--strategy", "fedavg",
                                            "--data-dir", tmp_path / "mixed")
    assert not out.parent.exists() and not (tmp_path / "nothing").exists()
