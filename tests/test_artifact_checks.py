"""Artifacts checked on load (issue 12, points 4-6): one registry of every file fedcli writes, what
`fedcli run` counts as a unit's output, stale results left out of the report, and buffers,
generators, models and manifests refused with one line when they are not what was written.

One small experiment made by `fedcli run` (2 nodes, FedER and FedAvg, audit, report), plus a
`--fold` run and a prediction, serves every test; tests that change it work on a copy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from conftest import Cli, copy_exp, record_case, write_png
from fedcli.data.manifest import content_hash
from fedcli.experiment.artifact_kinds import kind_of
from fedcli.experiment.artifacts import METADATA_KEY, parse_tensors, sha256_bytes, sha256_file, tensor_bytes
from fedcli.pipeline.ledger import Ledger
from test_run import recipe, statuses

FAST = [f"--set={key}" for key in ("federate.rounds=1", "train_gan.iterations=4", "train_gan.pp-iterations=2",
                                   "train_gan.fid-every=2", "train_gan.fid-images=16", "audit.steps=1")]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(experiment, recipe, folder of new images): every stage's artifacts, made once."""
    root = tmp_path_factory.mktemp("kinds")
    path, exp, images = recipe(root, strategies=("feder", "fedavg")), root / "exp", root / "images"
    cli = Cli()
    cli.ok("run", path, "--exp", exp, *FAST)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--fold", "0", "--rounds", "1", "--bootstrap", "10")
    for i in range(3):
        write_png(images / f"scan{i}.png", i)
    cli.ok("predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", images)
    return exp, path, images


def entries(exp: Path):
    """(relative path, is a symlink) of every file and link below `exp`, hidden ones included."""
    for root, dirs, files in os.walk(exp):
        for name in dirs + files:
            path = Path(root) / name
            if path.is_symlink() or name in files:
                yield path.relative_to(exp).as_posix(), path.is_symlink()


def snapshot(exp: Path) -> dict[str, str]:
    """Every file below `exp` (lock files aside) with its hash: what 'intact' is checked against."""
    return {rel: sha256_file(exp / rel) for rel, link in entries(exp) if not link and not rel.startswith(".locks/")}


def test_every_file_under_the_experiment_belongs_to_a_registered_kind_and_is_recorded(made):
    exp = made[0]
    found = dict(entries(exp))
    assert {"federate/cv/fedavg/fold0/models/global.safetensors", "predict/fedavg_global.csv", ".fedcli-run.json",
            "report/report.md", "audit/node1/summary.json", "gan/node0/buffer.safetensors"} <= set(found)
    unregistered = [rel for rel, link in found.items() if kind_of(rel, link) is None]
    assert not unregistered, f"register these in fedcli/experiment/artifact_kinds.py: {unregistered}"
    for rel, link in found.items():  # what the registry says a stage records, that stage recorded
        if kind_of(rel, link).recorded:
            config = next(p / "config.json" for p in (exp / rel).parents if (p / "config.json").is_file())
            files = json.loads(config.read_text())["files"]
            record = files[(exp / rel).relative_to(config.parent).as_posix()]
            assert record == {"bytes": (exp / rel).stat().st_size, "sha256": sha256_file(exp / rel)}, rel


@pytest.mark.parametrize("rel, link, kind", [
    ("runs/seed=1/gan/node0/buffer.safetensors", False, "buffer"),
    ("runs/seed=1/.fedcli-run.json", False, "run ledger"),
    ("runs/seed=1/gan", True, "shared output"),
    ("select/rounds=2/federate/cv/fedavg/fold1/models/global.safetensors", False, "classifier"),
    ("runs/seed=1/select/rounds=2/partition", True, "shared output"),
    ("federate/.feder.checkpoint/node0/round-3.safetensors", False, "checkpoint"),
    ("federate/cv/fedavg/.fold0.checkpoint/node1/final/global.safetensors", False, "checkpoint"),
    ("logs/node0.log", False, "node log"),
    (".locks/federate#feder@node0.lock", False, "lock"),
    ("gan/.node0.staging-x1y2/buffer.safetensors", False, "transient"),
    ("gan/node0/notes.txt", False, None),
    ("gan/node0", True, None),
])
def test_kinds_of_artifacts_the_small_experiment_does_not_make(rel, link, kind):
    found = kind_of(rel, link)
    assert (found and found.name) == kind


def test_a_truncated_buffer_or_model_makes_fedcli_run_rerun_that_unit(cli, made, tmp_path):
    exp, path = copy_exp(made[0], tmp_path), made[1]
    buffer, model = exp / "gan" / "node0" / "buffer.safetensors", exp / "federate" / "fedavg" / "models" / "global.safetensors"
    original = buffer.read_bytes()
    for damaged in (buffer, model):
        damaged.write_bytes(damaged.read_bytes()[:100])
    args = ["run", path, "--exp", exp, *FAST]
    result = cli(*args)
    intact = buffer.read_bytes() == original and model.stat().st_size > 100
    record_case(4, "truncated buffer (and model): fedcli run reruns that unit", args, result, intact)
    assert result.exit_code == 0 and intact
    # the GAN rerun gives the same buffer bytes (CPU determinism), so what read the buffer stays up to date
    assert statuses(result.stdout) == {"partition": "skipped", "train-gan": "ran", "federate feder": "skipped",
                                       "federate fedavg": "ran", "audit-privacy": "skipped", "report": "ran"}


def test_units_that_read_a_buffer_which_changed_since_are_stale(made, tmp_path):
    """As when a GAN retrained on a GPU gives other bytes: what read the old buffer reruns, nothing else."""
    exp = copy_exp(made[0], tmp_path)
    ledger = Ledger(exp)
    fps = {unit: entry["fingerprint"] for unit, entry in ledger.data["units"].items()}
    folders = {"federate feder": "federate/feder", "federate fedavg": "federate/fedavg", "audit-privacy": "audit"}
    assert all(ledger.up_to_date(unit, fps[unit], exp / rel) for unit, rel in folders.items())
    forge(exp / "gan" / "node0" / "buffer.safetensors", lambda t: t | {"images": 255 - t["images"]})
    ledger.record("train-gan", fps["train-gan"], exp / "gan")
    assert {unit: ledger.up_to_date(unit, fps[unit], exp / rel) for unit, rel in folders.items()} == {
        "federate feder": False, "federate fedavg": True, "audit-privacy": False}


def test_report_leaves_out_and_lists_results_of_another_partition(cli, made, tmp_path):
    exp = copy_exp(made[0], tmp_path)
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--seed", "7", "--exp", exp, "--overwrite")
    before = {k: v for k, v in snapshot(exp).items() if not k.startswith("report/")}
    args = ["report", exp]
    result = cli(*args)
    intact = {k: v for k, v in snapshot(exp).items() if not k.startswith("report/")} == before
    record_case(5, "report after re-partitioning with another seed (old results listed as stale)", args, result,
                intact)
    assert result.exit_code == 0 and intact
    stale = ["gan/node0", "gan/node1", "federate/feder", "federate/fedavg", "federate/cv/fedavg/fold0",
             "audit/node0", "audit/node1"]
    report = (exp / "report" / "report.md").read_text()
    missing = report.split("## Not in this report")[1]
    for folder in stale:
        assert f"left out of the report: {folder} (stale: made from another partition)" in result.output
        assert f"- {folder} (stale: made from another partition): needs a rerun of fedcli" in missing
    assert not (exp / "report" / "headline.csv").exists() and (exp / "report" / "partition_summary.csv").exists()
    assert not (exp / "report" / "figures" / "gan_node0.png").exists()


def forge(path: Path, change, rehash: bool = True) -> None:
    """Rewrite a safetensors artifact with `change(tensors)`; with `rehash`, record its new size and hash
    in its config.json as a careful forger would, so that only the content checks stand in the way."""
    tensors, metadata = parse_tensors(path.read_bytes())
    write(path, tensor_bytes(change(tensors), metadata), rehash)


def write(path: Path, data: bytes, rehash: bool) -> None:
    path.write_bytes(data)
    if rehash:
        config = next(p / "config.json" for p in path.parents if (p / "config.json").is_file())
        saved = json.loads(config.read_text())
        saved["files"][path.relative_to(config.parent).as_posix()] = {"bytes": len(data), "sha256": sha256_bytes(data)}
        if "buffer" in saved:
            saved["buffer"]["sha256"] = sha256_bytes(data)
        config.write_text(json.dumps(saved))


def edit_manifest(exp: Path, change) -> None:
    """Edit the manifest and recompute its content hash."""
    path = exp / "partition" / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    data["content_hash"] = content_hash(data)
    path.write_text(json.dumps(data))


def set_field(data: dict, key: str, value) -> None:
    data["nodes"][0]["train"][0][key] = value


def set_label(data: dict, value) -> None:
    set_field(data, "label", value)


def with_label(value):
    def change(t):
        labels = t["labels"].clone()
        labels[0] = value
        return t | {"labels": labels}
    return change


def nan(t):
    return {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in t.items()}


GAN0 = Path("gan/node0")
BUFFER0 = GAN0 / "buffer.safetensors"
FEDER = ["federate", "--strategy", "feder", "--rounds", "1", "--overwrite"]
CASES = {
    "buffer label 99": (FEDER, lambda e: forge(e / BUFFER0, with_label(99)), "has label 99, not one of"),
    "buffer label -1": (FEDER, lambda e: forge(e / BUFFER0, with_label(-1)), "has label -1, not one of"),
    "buffer float labels": (FEDER, lambda e: forge(e / BUFFER0, lambda t: t | {"labels": t["labels"].float()}),
                            "no int64 label vector"),
    "buffer of 64 images with 10 labels": (
        FEDER, lambda e: forge(e / BUFFER0, lambda t: {"images": t["images"].repeat(4, 1, 1, 1)[:64],
                                                       "labels": t["labels"][:10]}), "has 64 images but 10 labels"),
    "node1's buffer copied over node0's": (
        FEDER, lambda e: write(e / BUFFER0, (e / "gan/node1/buffer.safetensors").read_bytes(), rehash=False),
        "its sha256 differs from the one"),
    "node1's buffer over node0's, hash recomputed": (
        FEDER, lambda e: write(e / BUFFER0, (e / "gan/node1/buffer.safetensors").read_bytes(), rehash=True),
        "was made for node 'node1', not 'node0'"),
    "truncated buffer": (FEDER, lambda e: write(e / BUFFER0, (e / BUFFER0).read_bytes()[:500], rehash=False),
                         "is corrupt or was replaced after it was written: 500 bytes"),
    "buffer label 99 at audit-privacy": (["audit-privacy", "--steps", "1", "--overwrite"],
                                         lambda e: forge(e / BUFFER0, with_label(99)), "has label 99, not one of"),
    "all-NaN generator, hash recomputed, --sample-only": (
        ["train-gan", "--sample-only", "--buffer-size", "40"], lambda e: forge(e / GAN0 / "generator.safetensors", nan),
        "holds non-finite values"),
    "generator edited, --sample-only": (
        ["train-gan", "--sample-only", "--buffer-size", "40"],
        lambda e: forge(e / GAN0 / "generator.safetensors", nan, rehash=False), "its sha256 differs"),
    "generator of another architecture, hash recomputed": (
        ["train-gan", "--sample-only"], lambda e: forge(e / GAN0 / "generator.safetensors",
                                                        lambda t: {"weight": torch.zeros(3)}), "does not fit (Missing key(s)"),
    "all-NaN model, hash recomputed, predict": (
        ["predict", "--strategy", "fedavg", "--data-dir", "IMAGES"],
        lambda e: forge(e / "federate/fedavg/models/global.safetensors", nan), "holds non-finite values"),
    "manifest label 99, hash recomputed": (["federate", "--strategy", "fedavg", "--overwrite"],
                                           lambda e: edit_manifest(e, lambda d: set_label(d, 99)),
                                           "has label 99, not a class index 0..9"),
    "manifest label 1.0, hash recomputed": (["train-gan", "--sample-only"],
                                            lambda e: edit_manifest(e, lambda d: set_label(d, 1.0)),
                                            "has label 1.0, not a class index"),
    # issue 57
    "buffer metadata '[1]', hash recomputed": (
        FEDER, lambda e: write(e / BUFFER0, raw_metadata(e / BUFFER0, "[1]"), rehash=True),
        "is corrupt (its fedcli metadata is list JSON, not an object)"),
    "buffer of 0 images, hash recomputed": (
        FEDER, lambda e: forge(e / BUFFER0, lambda t: {k: v[:0] for k, v in t.items()}),
        "holds 0 images, but its config.json recorded"),
    "buffer of 10 of its images, hash recomputed": (
        FEDER, lambda e: forge(e / BUFFER0, lambda t: {k: v[:10] for k, v in t.items()}),
        "holds 10 images, but its config.json recorded"),
    "float64 model, hash recomputed, predict": (
        ["predict", "--strategy", "fedavg", "--data-dir", "IMAGES"],
        lambda e: forge(e / "federate/fedavg/models/global.safetensors",
                        lambda t: {k: v.double() if v.is_floating_point() else v for k, v in t.items()}),
        "as torch.float64, not torch.float32"),
    "manifest index 999999, hash recomputed": (["federate", "--strategy", "fedavg", "--overwrite"],
                                               lambda e: edit_manifest(e, lambda d: set_field(d, "index", 999999)),
                                               "has index 999999, but the built-in digits holds 1797 images"),
    "manifest index -1, hash recomputed": (["federate", "--strategy", "fedavg", "--overwrite"],
                                           lambda e: edit_manifest(e, lambda d: set_field(d, "index", -1)),
                                           "has index -1, not a row number 0 or more"),
    "manifest image_size 17, hash recomputed": (["federate", "--strategy", "fedavg", "--overwrite"],
                                                lambda e: edit_manifest(e, lambda d: d.update(image_size=17)),
                                                "image_size 17 is not a power of two"),
}


def raw_metadata(path: Path, text: str) -> bytes:
    """The artifact's tensors under a fedcli metadata of `text`, as a peer or a forger could write it."""
    from safetensors.torch import save

    return save(parse_tensors(path.read_bytes())[0], metadata={METADATA_KEY: text})


@pytest.mark.parametrize("case", CASES)
def test_damaged_or_forged_artifacts_are_refused_on_load_with_one_line(cli, made, tmp_path, case):
    command, damage, expected = CASES[case]
    exp = copy_exp(made[0], tmp_path)
    damage(exp)
    before = snapshot(exp)
    args = [command[0], "--exp", exp, *[made[2] if a == "IMAGES" else a for a in command[1:]]]
    result = cli(*args)
    intact = snapshot(exp) == before
    record_case(6, case, args, result, intact)
    assert result.exit_code == 2 and intact, result.output + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
