"""`fedcli predict`: new image files get the probabilities evaluation computes, ensembles, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from conftest import Cli, make_folders, record_case
from fedcli.data.imagefiles import BadImageError
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import load_tensors
from fedcli.federate import engine
from fedcli.federate.config import FederateConfig
from fedcli.metrics.scores import predict
from fedcli.predict import decode
from test_decoding import RAMP16, bomb_png, file_bytes, monotone

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
    fed = engine.build(federation_config(exp), manifest, manifest["seed"])
    model = fed.trainer.new_model(key)
    model.load_state_dict(load_tensors(exp / "federate" / strategy / "models" / f"{key}.safetensors", "model"))
    return predict(model, fed.data.test[node].images)


def federation_config(exp) -> FederateConfig:
    return FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=1, lr=1e-3, batch=32)


def write_test_pngs(exp, node: str, folder, mode: str = "L"):
    """A node's test images as PNG files in per-class subfolders; returns relative path -> test index."""
    manifest = Manifest.load(exp)
    test = engine.build(federation_config(exp), manifest, 0).data.test[node]
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


def bad_folder(folder, bad: tuple[str, ...], good: int = 3):
    """`good` readable PNGs plus the named bad files: corrupt.png (garbage), huge.png (a 30000^2 bomb)."""
    folder.mkdir(parents=True)
    for k in range(good):
        Image.new("L", (16, 16), 60 * k).save(folder / f"good_{k}.png")
    if "corrupt" in bad:
        (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated garbage")
    if "bomb" in bad:
        bomb_png(folder / "huge.png", 30000)
    return folder


@pytest.mark.parametrize("bad, name, why", [("corrupt", "corrupt.png", "corrupt"),
                                            ("bomb", "huge.png", "decompression bomb")])
def test_a_bad_file_stops_predict_with_one_line_suggesting_skip_bad(cli, exp, tmp_path, bad, name, why):
    images, out = bad_folder(tmp_path / "images", (bad,)), tmp_path / "out" / "p.csv"
    before = file_bytes(exp)
    args = ["predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", images, "--out", out, "--device", "cpu"]
    result = cli(*args)
    record_case(7 if bad == "bomb" else 10, f"{bad} image file at predict", args, result,
                intact=file_bytes(exp) == before and not out.parent.exists())
    line = cli.user_error(*args)
    assert name in line and why in line and "--skip-bad" in line
    assert not out.parent.exists() and file_bytes(exp) == before


def test_skip_bad_lists_bad_files_and_predicts_the_rest(cli, exp, tmp_path):
    images, out = bad_folder(tmp_path / "images", ("corrupt", "bomb")), tmp_path / "p.csv"
    before = file_bytes(exp)
    args = ["predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", images, "--out", out, "--device", "cpu",
            "--skip-bad"]
    result = cli(*args)
    record_case(10, "--skip-bad with a corrupt file and a bomb", args, result, intact=file_bytes(exp) == before)
    assert result.exit_code == 0 and result.stderr == "", result.output + result.stderr
    notes = [line for line in result.output.splitlines() if line.startswith("note: skipped")]
    assert len(notes) == 2
    assert notes[0].startswith("note: skipped corrupt.png: is unreadable or corrupt")
    assert notes[1].startswith("note: skipped huge.png: declares") and "decompression bomb" in notes[1]
    assert "predicted 3 images" in result.output and "skipped 2 unusable files" in result.output
    assert list(pd.read_csv(out)["file"]) == ["good_0.png", "good_1.png", "good_2.png"]

    only_bad = bad_folder(tmp_path / "only_bad", ("corrupt", "bomb"), good=0)
    args = ["predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", only_bad, "--out", tmp_path / "none.csv",
            "--device", "cpu", "--skip-bad"]
    result = cli(*args)
    record_case(10, "--skip-bad where every file is bad", args, result,
                intact=file_bytes(exp) == before and not (tmp_path / "none.csv").exists())
    line = cli.user_error(*args)
    assert "none of the 2 image files" in line and "corrupt.png" in line
    assert not (tmp_path / "none.csv").exists()


def test_file_names_that_look_like_formulas_are_escaped_in_the_csv(cli, exp, tmp_path):
    names = ["=1+1.png", "+cmd.png", "-2.png", "@SUM(A1).png", "\tx.png", "\rx.png", "'q.png", "plain.png"]
    images = tmp_path / "images"
    images.mkdir()
    for k, name in enumerate(names):
        Image.new("L", (16, 16), 20 * k).save(images / name)
    out, before = tmp_path / "p.csv", file_bytes(exp)
    args = ["predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", images, "--out", out, "--device", "cpu"]
    result = cli(*args)
    record_case(10, "file names starting with = + - @ tab CR in the predict CSV", args, result,
                intact=file_bytes(exp) == before)
    assert result.exit_code == 0, result.output + result.stderr
    written = list(pd.read_csv(out, keep_default_na=False)["file"])
    assert written == [name if name == "plain.png" else "'" + name for name in sorted(names)]
    assert [w[1:] if w.startswith("'") else w for w in written] == sorted(names)  # one ' undone gives the path


def test_a_16_bit_file_takes_the_array_sources_path_scaled_not_clipped(exp, tmp_path):
    """Digits is an array source: predict resizes the file as a float tensor, as training resizes arrays, on
    the partition's pixel scale (digits' 8 bits refuse a 16-bit file; a 16-bit scale reads it whole)."""
    Image.fromarray(RAMP16).save(tmp_path / "ramp16.png")
    Image.fromarray((RAMP16 / 65535).astype(np.float32), "F").save(tmp_path / "ramp.tif")
    manifest = Manifest.load(exp)
    with pytest.raises(BadImageError, match="outside the 8-bit range"):
        decode(manifest, tmp_path / "ramp16.png")
    image = decode(Manifest({**manifest.data, "bit_depth": 16}), tmp_path / "ramp16.png")
    assert image.shape == (1, 16, 16) and image.min() < 16 and image.max() > 240 and monotone(image)
    assert len(np.unique(image)) > 64  # clipped at 255, the ramp would give a few levels
    unit = Manifest({**manifest.data, "bit_depth": None, "value_range": [0.0, 1.0]})
    np.testing.assert_array_equal(image, decode(unit, tmp_path / "ramp.tif"))


def test_an_unseen_labelled_set_is_scored_as_evaluation_scores_it_and_by_class_groups(exp, tmp_path, cli):
    """Scenario 3 of FedPerl: a labelled folder no node held, scored from its folders' names; with --group the
    classes merge (digits 0-4 against 5-9 here, as ISIC's eight classes into malignant against benign)."""
    folder = tmp_path / "unseen"
    index, labels = write_test_pngs(exp, "node0", folder)
    out = tmp_path / "p.csv"
    cli.ok("predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", folder, "--out", out, "--labels-from-folders")
    scores = pd.read_csv(tmp_path / "p_scores.csv").set_index("metric")
    metrics = pd.read_csv(exp / "federate" / "fedavg" / "metrics.csv")
    row = metrics[(metrics["round"] == 1) & (metrics.model_node == "global") & (metrics.test_node == "node0")].iloc[0]
    for name in ("accuracy", "f1_macro", "auroc", "auprc", "adaptive_ece"):
        assert scores.loc[name, "value"] == pytest.approx(row[name], abs=1e-9), name
    assert (scores["lo"] <= scores["value"] + 1e-12).all() and scores.n.eq(len(labels)).all()

    grouped_folder = tmp_path / "grouped"
    names = Manifest.load(exp)["label_names"]
    for rel in index:
        label = names.index(rel.split("/")[0])
        target = grouped_folder / ("low" if label < 5 else "high") / rel.split("/")[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).rename(target)
    groups = ["--group", "low=" + "+".join(names[:5]), "--group", "high=" + "+".join(names[5:])]
    cli.ok("predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", grouped_folder, "--out", out,
           "--labels-from-folders", *groups)
    frame = pd.read_csv(out)
    class_probs = probabilities(frame[[c for c in frame.columns if not c.startswith("p_group:")]])
    low = class_probs[:, :5].sum(axis=1)
    assert np.allclose(frame["p_group:low"], low) and np.allclose(frame["p_group:low"] + frame["p_group:high"], 1)
    truth = np.array([0 if f.startswith("low/") else 1 for f in frame.file])
    predicted = np.where(low >= 1 - low, 0, 1)
    scores = pd.read_csv(tmp_path / "p_scores.csv").set_index("metric")
    assert scores.loc["accuracy", "value"] == pytest.approx(np.mean(predicted == truth))
    assert scores.loc["sensitivity", "value"] == pytest.approx(np.mean(predicted[truth == 0] == 0))  # first: positive


@pytest.mark.parametrize("args, says", [
    (["--group", "low=0+1+2+3+4"], "every class in exactly one group: 5, 6, 7, 8, 9 in none"),
    (["--group", "a=0+1+2+3+4+5", "--group", "b=5+6+7+8+9"], "5 in two"),
    (["--group", "a=0+x"], "names 'x', which is not a class"),
    (["--labels-from-folders"], "lies directly in --data-dir"),
])
def test_grouping_and_scoring_mistakes_are_one_line(exp, tmp_path, cli, args, says):
    folder = tmp_path / "flat"
    folder.mkdir()
    Image.new("L", (16, 16)).save(folder / "a.png")
    assert says in cli.user_error("predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", folder, *args)
