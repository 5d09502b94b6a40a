"""Hostile inputs, fourth round (issue 57): what a peer or an edited record could still crash or slip past,
and the small lies in messages. The forged artifacts on disk (a buffer's metadata and size, a float64 model,
the manifest's indices and shape) are cases of test_artifact_checks.CASES; each case here is recorded for
the closing note's table (conftest's `record_case`)."""

from __future__ import annotations

import errno
import json
import os
import pickle
import warnings
from pathlib import Path

import pytest
import safetensors.torch
import torch
from PIL import Image

from conftest import copy_exp, make_folders, one_clean_line, record_case, write_png
from fedcli.comm.payloads import PayloadError, decode_buffer, encode_buffer
from fedcli.core.errors import UserError
from fedcli.data.imagefiles import BadImageError, native_pixels
from fedcli.data.manifest import Manifest, content_hash
from fedcli.data.pixelscale import Scale
from fedcli.experiment.artifacts import METADATA_KEY
from fedcli.generators.vqvae2.codes import decode_codes
from test_hostile_inputs import csv_data, tree, two_sites


def refused(cli, point: int, case: str, *args, intact=lambda: True) -> str:
    """The one error line of a refused command, recorded for the note."""
    result = cli(*args)
    record_case(point, case, args, result, intact())
    assert result.exit_code == 2 and one_clean_line(result) and intact(), result.output + result.stderr
    return result.stderr.strip()


@pytest.mark.parametrize("metadata", ["[1]", "5"])
def test_a_peers_payload_whose_metadata_is_not_an_object_is_refused(metadata):
    """Point 1: the decoders looked keys up in it (TypeError / AttributeError, the receiving process died)."""
    payload = safetensors.torch.save({"labels": torch.zeros(2, dtype=torch.int64)}, metadata={METADATA_KEY: metadata})
    with pytest.raises(PayloadError, match="metadata is (list|int) JSON, not an object"):
        decode_buffer(payload, (1, 8, 8), 2)
    with pytest.raises(PayloadError, match="metadata is (list|int) JSON, not an object"):
        decode_codes(payload, None, ["node0"])
    good = encode_buffer(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), torch.tensor([0, 1]))
    assert decode_buffer(good, (1, 8, 8), 2)[1].tolist() == [0, 1]


def edited(exp, change) -> Manifest:
    """Manifest.load of `exp`'s manifest after `change`, its content hash recomputed."""
    path = exp / "partition" / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    data["content_hash"] = content_hash(data)
    path.write_text(json.dumps(data))
    return Manifest.load(exp)


def first_train(data: dict) -> dict:
    return data["nodes"][0]["train"][0]


@pytest.fixture(scope="module")
def csv_exp(tmp_path_factory):
    """A 16 px csv partition (records name files) and a PNG outside its data folder."""
    root = tmp_path_factory.mktemp("csv")
    data = csv_data(root / "data", two_sites("s0", "s1"))
    write_png(root / "elsewhere" / "secret.png", 99)
    from conftest import Cli
    Cli().ok("partition", "--source", "csv", "--data-dir", data, "--exp", root / "exp", "--folds", "2",
             "--image-size", "16")
    return root


@pytest.mark.parametrize("path", ["ABSOLUTE", "../elsewhere/secret.png", "a/../../elsewhere/secret.png",
                                  "C:/secret.png", "a\\b.png"])
def test_a_record_whose_path_leaves_the_data_folder_is_refused(csv_exp, tmp_path, path):
    """Point 3: an absolute path was read and trained on without a word."""
    exp = copy_exp(csv_exp / "exp", tmp_path)
    value = str(csv_exp / "elsewhere" / "secret.png") if path == "ABSOLUTE" else path
    with pytest.raises(UserError, match="record .* has path .*, not a file inside the data folder; re-run fedcli "
                                        "partition"):
        edited(exp, lambda d: first_train(d).__setitem__("path", value))


@pytest.mark.parametrize("change, message", [
    (lambda d: first_train(d).__setitem__("index", -1), "has index -1, not a row number 0 or more"),
    (lambda d: first_train(d).__setitem__("index", "3"), "has index '3', not a row number"),
    (lambda d: d["global_test"][0].__setitem__("index", -2) if d.get("global_test") else
     d["nodes"][1]["test"][0].__setitem__("index", -2), "has index -2"),
    (lambda d: d.__setitem__("image_size", 17), "image_size 17 is not a power of two in 16.."),
    (lambda d: d.__setitem__("image_size", 8), "image_size 8 is not a power of two in 16.."),
    (lambda d: d.__setitem__("channels", 2), "channels 2 is neither 1 nor 3"),
    (lambda d: d["nodes"][0].__setitem__("train", []), "node node0 holds no training image"),
])
def test_the_manifest_content_check_covers_indices_the_image_shape_and_training_records(digits_exp, tmp_path,
                                                                                        change, message):
    """Points 2 and 6: a negative index read another image (Python's negative indexing), and an edited
    image_size, channels or an empty node were accepted and federate ran."""
    exp = copy_exp(digits_exp, tmp_path)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        edited(exp, change)


def test_a_node_manifest_is_checked_like_the_partitions(digits_exp, tmp_path):
    """The manifest a hospital holds alone (its own records, the others' counts) gets the same content check,
    its hash recomputed after the edit."""
    from fedcli.data.node_manifest import load_node_manifest

    exp = copy_exp(digits_exp, tmp_path)
    path = exp / "partition" / "nodes" / "node1.json"
    data = json.loads(path.read_text())
    next(n for n in data["nodes"] if n["name"] == "node1")["train"][0]["index"] = -1
    data["content_hash"] = content_hash(data)
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="has index -1"):
        load_node_manifest(exp, "node1", 1)


def nested_recipe(path, depth: int = 5000):
    path.write_text("[partition]\nnodes = " + "[" * depth + "]" * depth + "\n")
    return path


def test_a_recipe_nesting_5000_arrays_is_one_line(cli, tmp_path):
    """Point 4: tomllib's RecursionError printed a 2,997-line traceback."""
    exp = tmp_path / "exp"
    line = refused(cli, 4, "a recipe with 5,000 nested arrays", "run", nested_recipe(tmp_path / "deep.toml"),
                   "--exp", exp, intact=lambda: not exp.exists())
    assert "nests arrays or tables deeper than Python can read" in line
    value = "[" * 5000 + "]" * 5000
    line = refused(cli, 4, "--set with 5,000 nested arrays", "run", nested_recipe(tmp_path / "ok.toml", 1),
                   "--exp", exp, f"--set=partition.nodes={value}", intact=lambda: not exp.exists())
    assert "--set partition.nodes=...: the value nests deeper than Python can read" in line


def frames(path, kind: str, count: int = 2):
    first, rest = Image.new("L", (12, 12), 10), [Image.new("L", (12, 12), 200 + k) for k in range(count - 1)]
    if kind == "MPO":
        first, rest = first.convert("RGB"), [r.convert("RGB") for r in rest]
    path.parent.mkdir(parents=True, exist_ok=True)
    first.save(path, kind, save_all=True, append_images=rest)
    return path


@pytest.mark.parametrize("kind, suffix", [("GIF", ".gif"), ("PNG", ".png"), ("WEBP", ".webp")])
def test_an_animated_image_is_refused_like_a_multi_page_tiff(tmp_path, kind, suffix):
    """Point 5: an animated GIF was read at its first frame."""
    path = frames(tmp_path / f"cine{suffix}", kind)
    with pytest.raises(BadImageError, match=f"cine{suffix} holds 2 frames; fedcli reads one image per file"):
        native_pixels(path, Scale(bit_depth=8))
    assert native_pixels(frames(tmp_path / f"still{suffix}", kind, count=1), Scale(bit_depth=8)).shape[1:] == (12, 12)


def test_an_animated_gif_in_a_data_folder_is_refused_at_partition_and_an_mpo_is_read(cli, tmp_path):
    """An MPO (a camera's JPEG with a preview appended) is one picture as every viewer shows it."""
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 6, "y": 6}})
    frames(data / "a" / "x" / "camera.jpg", "MPO")
    exp = tmp_path / "exp"
    cli.ok("partition", "--source", "folders", "--data-dir", data, "--exp", exp, "--folds", "2", "--image-size", "16")
    frames(data / "b" / "y" / "cine.gif", "GIF")
    line = refused(cli, 5, "an animated GIF in a class folder", "partition", "--source", "folders", "--data-dir",
                   data, "--exp", tmp_path / "exp2", "--folds", "2", "--image-size", "16",
                   intact=lambda: not (tmp_path / "exp2").exists())
    assert "cine.gif holds 2 frames" in line


@pytest.mark.parametrize("peers, default", [("5", False), (None, True)])
def test_more_peers_than_other_nodes_is_refused(cli, gan3_exp, tmp_path, peers, default):
    """Point 8: --peers 5 on 3 nodes ran with 2 while config.json recorded 5."""
    exp = copy_exp(gan3_exp, tmp_path)
    if default:  # two nodes' worth of experiment: the default T = 2 exceeds its one other node
        cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp, "--overwrite")
    before = tree(exp)
    args = ["federate", "--exp", exp, "--strategy", "fedperl", "--rounds", "1", *(["--peers", peers] if peers else [])]
    line = refused(cli, 8, f"fedperl {'--peers 5 on 3' if peers else 'default --peers 2 on 2'} nodes", *args,
                   intact=lambda: tree(exp) == before)
    if default:
        assert "fedperl --peers 2 (its default): with 2 nodes each node has 1 other to learn from; pass --peers 1" \
               in line
    else:
        assert "fedperl --peers 5: with 3 nodes each node has 2 others to learn from; pass --peers 2 or fewer" in line


@pytest.mark.parametrize("args", [[], ["weights"]])
def test_a_bare_command_prints_its_help_and_exits_0(cli, args):
    """Point 9: the help came with `error:` and an empty message, exit 2."""
    result = cli(*args)
    assert result.exit_code == 0 and "Usage:" in result.output and "error" not in result.stderr


def test_a_list_after_one_option_says_to_repeat_the_option(cli, tmp_path):
    """Point 10: `--communities 2 1 1` failed with the parser's bare message, and the docs showed that form."""
    exp = tmp_path / "exp"
    line = refused(cli, 10, "--communities 2 1 1", "partition", "--exp", exp, "--scheme", "site-shift", "--nodes",
                   "4", "--communities", "2", "1", "1", intact=lambda: not exp.exists())
    assert "Got unexpected extra argument(s) (1 1): an option takes one value, so repeat a repeatable option before " \
           "each of its values (e.g. --communities 5 --communities 3)" in line
    cli.ok("partition", "--exp", exp, "--scheme", "site-shift", "--nodes", "4", "--image-size", "16",
           *[a for n in ("2", "1", "1") for a in ("--communities", n)])
    for doc in ("partition.md", "report.md"):
        text = (Path(__file__).parents[1] / "docs" / doc).read_text()
        assert "--communities 5 3" not in text and "--communities 2 1 1" not in text


def test_a_pickle_given_as_weights_prints_no_torch_warning(cli, digits_exp, tmp_path):
    """Point 12: torch's two-line `UserWarning: Detected pickle protocol` printed before the error line."""
    weights = tmp_path / "alexnet.pth"
    with weights.open("wb") as handle:
        pickle.dump({"features.0.weight": [1.0, 2.0]}, handle, protocol=4)
    exp = copy_exp(digits_exp, tmp_path)
    before = tree(exp)
    with warnings.catch_warnings(record=True) as shown:  # what Python would print on stderr, outside pytest
        warnings.simplefilter("always")
        line = refused(cli, 12, "a plain pickle as --lpips-weights", "train-gan", "--exp", exp, "--lpips-weights",
                       weights, intact=lambda: tree(exp) == before)
    assert "is not a plain PyTorch state dict of tensors" in line and not [str(w.message) for w in shown]


def full_disk_at(monkeypatch, suffix: str):
    """The first atomic write of a file ending in `suffix` fails as on a full disk: os.write's OSError names
    no file."""
    import fedcli.experiment.artifacts as artifacts

    real = artifacts.os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real(fd, mode, *args, **kwargs)
        if "w" in mode and f"{suffix}." in os.path.basename(os.readlink(f"/proc/self/fd/{fd}")):
            def write(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            handle.write = write
        return handle
    monkeypatch.setattr(artifacts.os, "fdopen", fdopen)


@pytest.mark.parametrize("suffix", ["manifest.json", ".png"])
def test_a_full_disk_names_the_file_it_could_not_write(cli, tmp_path, monkeypatch, suffix):
    """Point 13: the line read `cannot use (No space left on device)`; a figure was written by matplotlib in
    place, not atomically (so a full disk could leave half of one)."""
    full_disk_at(monkeypatch, suffix)
    exp = tmp_path / "exp"
    line = refused(cli, 13, f"ENOSPC writing {suffix} at partition", "partition", "--exp", exp, "--image-size", "16",
                   intact=lambda: not (exp / "partition").exists())
    assert f"error: cannot use {exp}" in line and f"{suffix} (No space left on device)" in line


@pytest.mark.parametrize("scheme, layout, advice", [
    ("source", {"a": {"x": 6, "y": 6}, "b": {"x": 8, "y": 1}},
     "its site is the data's own: add images of a second class there, or use --scheme iid or dirichlet"),
    ("iid", {"a": {"x": 30, "y": 3}}, "so it cannot be tested; use fewer --nodes"),
])
def test_an_untestable_node_gets_advice_for_its_scheme(cli, tmp_path, scheme, layout, advice):
    """Point 14: every scheme was told to use fewer --nodes or a larger --alpha, which only Dirichlet has."""
    data = make_folders(tmp_path / "data", layout)
    exp = tmp_path / "exp"
    args = ["partition", "--source", "folders", "--data-dir", data, "--exp", exp, "--folds", "2", "--scheme", scheme]
    line = refused(cli, 14, f"an untestable node under --scheme {scheme}",
                   *args, *(["--nodes", "3"] if scheme == "iid" else []), intact=lambda: not exp.exists())
    assert advice in line and "--alpha" not in line


@pytest.mark.parametrize("scheme", ["skew", "iid", "dirichlet"])
def test_data_of_one_class_is_refused_before_any_scheme(cli, tmp_path, scheme):
    """Point 14: skew on one-class data said "lower --ks" with a maximum skew of 0.000."""
    data = make_folders(tmp_path / "data", {"a": {"x": 12, "y": 1}})
    exp = tmp_path / "exp"
    line = refused(cli, 14, f"one-class data under --scheme {scheme}", "partition", "--source", "folders",
                   "--data-dir", data, "--exp", exp, "--folds", "2", "--scheme", scheme, "--nodes", "2",
                   *(["--ks", "0.3"] if scheme == "skew" else []), intact=lambda: not exp.exists())
    assert "the data has fewer than two classes with two or more images (such classes: x (12 images)), and every " \
           "node is tested on two classes or more; add images of another class" in line
