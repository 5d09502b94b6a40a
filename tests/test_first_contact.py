"""What users meet first (issue 31): node names that are model keys, too few images for the folds, an
experiment inside its data folder, sweeps that collide or are huge, ranks that create the same folders at
once, an interrupted train-gan, and the messages of --config, unknown keys and a corrupt ledger. Each case
failed before its fix."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import shutil
from pathlib import Path

import pytest

from conftest import TINY_GAN, copy_exp, make_folders, one_clean_line, record_case
from fedcli.experiment.artifacts import sha256_bytes
from fedcli.federate.strategies import REGISTRY

SITES = {"a": 6, "b": 6}  # two classes of six images: enough for two folds


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256_bytes(p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", [*REGISTRY.reserved_names(), "Global"])
def test_a_site_named_as_a_model_key_is_refused_at_partition(cli, tmp_path, name):
    data = make_folders(tmp_path / "data", {"site0": SITES, name: SITES})
    args = ["partition", "--source", "folders", "--data-dir", data, "--exp", tmp_path / "exp", "--folds", "2"]
    result = cli(*args)
    record_case(1, f"folders site named {name!r}", args, result, not (tmp_path / "exp").exists())
    assert result.exit_code == 2 and one_clean_line(result) and not (tmp_path / "exp").exists()
    assert f"node name {name!r} is reserved" in result.stderr and "rename" in result.stderr


def test_a_partition_made_before_the_check_is_refused_by_federate_and_predict(cli, tmp_path):
    """An older fedcli let a node be called `global`: federate and predict refuse it instead of misreading it."""
    from fedcli.experiment.config import PartitionConfig
    from fedcli.data.partition import run

    data = make_folders(tmp_path / "data", {"site0": SITES, "global": SITES})
    exp = tmp_path / "exp"
    run(PartitionConfig(exp=exp, source="folders", data_dir=data, folds=2), reserved=())
    line = cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", "--rounds", "1")
    assert "'global' is reserved" in line and "partition --overwrite" in line
    assert not (exp / "federate").exists()
    line = cli.user_error("predict", "--exp", exp, "--strategy", "fedavg", "--data-dir", data / "site0" / "a")
    assert "'global' is reserved" in line


@pytest.mark.parametrize("args, largest", [
    (["--source", "digits", "--scheme", "iid", "--nodes", "60"], None),
    (["--source", "folders", "--folds", "5"], 4),
])
def test_fewer_training_images_per_class_than_folds_is_one_line(cli, tmp_path, args, largest):
    if "folders" in args:
        args = [*args, "--data-dir", make_folders(tmp_path / "data", {"s0": {"a": 5, "b": 5}, "s1": {"a": 5, "b": 5}})]
    line = cli.user_error("partition", *args, "--exp", tmp_path / "exp")
    assert "fewer than --folds" in line
    if largest is not None:
        assert f"lower --folds to {largest}" in line
    assert not (tmp_path / "exp").exists()


def test_an_experiment_inside_its_data_folder_is_refused(cli, tmp_path):
    data = make_folders(tmp_path / "data", {"s0": SITES, "s1": SITES})
    before = tree(data)
    line = cli.user_error("partition", "--source", "folders", "--data-dir", data, "--exp", data / "runs" / "e",
                          "--folds", "2")
    assert "is inside --data-dir" in line
    assert tree(data) == before and not (data / "runs").exists()


def recipe(tmp_path: Path, sweep: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(f"[partition]\nnodes = 2\nimage-size = 16\n[federate]\nstrategy = [\"fedavg\"]\n[sweep]\n{sweep}\n")
    return path


@pytest.mark.parametrize("sweep, same", [
    ("seeds = [0, 0]", "seed=0"),
    ("\"federate.lr\" = [1, 1.0]", "lr=1.0"),
    ('"partition.data-dir" = ["data/few", "data_few"]', "data-dir=data_few"),
])
def test_sweep_values_that_name_the_same_sub_experiment_are_refused(cli, tmp_path, sweep, same):
    line = cli.user_error("run", recipe(tmp_path, sweep), "--exp", tmp_path / "exp")
    assert f"make the same sub-experiment '{same}'" in line
    assert not (tmp_path / "exp").exists()


def test_an_over_long_sweep_value_is_refused_before_anything_is_made(cli, tmp_path):
    line = cli.user_error("run", recipe(tmp_path, f'"partition.data-dir" = ["{"d" * 300}"]'), "--exp", tmp_path / "exp")
    assert "bytes, over the 255 a folder name may have" in line and "shorter values" in line
    assert not (tmp_path / "exp").exists()


def test_a_huge_sweep_needs_yes(cli, tmp_path):
    from fedcli.pipeline.recipe import UNASKED_UNITS, Recipe

    path = recipe(tmp_path, f"seeds = {list(range(60))}\n\"federate.rounds\" = {list(range(1, 11))}")
    loaded = Recipe.load(path)
    assert loaded.units() == 600 * (1 + 1) + 1 > UNASKED_UNITS  # partition and fedavg: no strategy reads a buffer
    line = cli.user_error("run", path, "--exp", tmp_path / "exp")
    assert "1201 units of work (600 sub-experiments)" in line and "--yes" in line
    assert not (tmp_path / "exp").exists()
    loaded.check_size(yes=True)  # --yes lets it start


def test_every_bundled_recipe_starts_unasked():
    from fedcli.pipeline.recipe import UNASKED_UNITS, Recipe

    recipes = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.toml"))
    counts = {path.name: Recipe.load(path).units() for path in recipes}
    assert recipes and max(counts.values()) <= UNASKED_UNITS, counts


RANKS, REPEATS = 12, 40


def start_ranks(root: Path, node: str, nodes: list[str], barrier, errors) -> None:
    """What a rank of `--launch local` does with the shared folders before round 0 (lock its part, probe that
    the outputs can be written, write its log and its checkpoint part), on REPEATS fresh experiments, each
    started by every rank at once."""
    from fedcli.experiment.artifacts import atomic_write_bytes
    from fedcli.core.errors import environment_message
    from fedcli.comm.node_process import node_logger
    from fedcli.federate.config import FederateConfig
    from fedcli.federate.strategy_runs import check_outputs, checkpoint_dir, run_outputs
    from fedcli.experiment.paths import federate_dir
    from fedcli.experiment.locking import locked

    for repeat in range(REPEATS):
        exp = root / f"r{repeat}" / "exp"
        cfg, runs = FederateConfig(exp=exp, strategy=("fedavg",)), [("fedavg", None)]
        barrier.wait()
        try:
            with locked(exp, run_outputs(cfg, runs), parts=[node]):
                check_outputs(cfg, runs, nodes, local=[node])
                node_logger(exp, node)
                atomic_write_bytes(checkpoint_dir(federate_dir(exp, "fedavg")) / node / "part", b"x")
        except OSError as exc:
            errors.put(f"repeat {repeat}, {node}: {environment_message(exc)}")


def test_ranks_starting_at_once_create_their_shared_folders_without_a_race(tmp_path):
    """Many ranks start at once on a fresh experiment, again and again: none fails on a folder a sibling created
    or removed meanwhile (before the fix: `cannot use <exp>/federate (File exists)`, or `.locks`)."""
    context = multiprocessing.get_context("fork")
    nodes = [f"node{k}" for k in range(RANKS)]
    barrier, errors = context.Barrier(RANKS), context.Queue()
    ranks = [context.Process(target=start_ranks, args=(tmp_path, node, nodes, barrier, errors)) for node in nodes]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(120)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not failures and all(r.exitcode == 0 for r in ranks), failures[:3]
    for repeat in range(REPEATS):
        logs = tmp_path / f"r{repeat}" / "exp" / "logs"
        assert sorted(p.name for p in logs.iterdir()) == sorted(f"{n}.log" for n in nodes)


def test_a_shared_folder_a_sibling_removes_meanwhile_is_made_again(tmp_path, monkeypatch):
    """The two moments of the race, made to happen: the folder exists at mkdir but is gone before mkdir checks it
    is a folder; it is made but gone before the file inside it is created. Both are retried; a file standing
    where the folder goes is still the user's one line."""
    import errno
    import os
    import tempfile

    from fedcli.experiment import artifacts

    target, real_mkdir, real_mkstemp = tmp_path / "exp" / "federate", os.mkdir, tempfile.mkstemp
    left = {"mkdir": 1, "mkstemp": 1}

    def sibling_mkdir(path, mode=0o777):
        if Path(path) == target and left["mkdir"]:
            left["mkdir"] -= 1
            real_mkdir(path, mode)
            os.rmdir(path)  # a sibling made it, then released it
            raise FileExistsError(errno.EEXIST, "File exists", str(path))
        return real_mkdir(path, mode)

    def sibling_mkstemp(*args, dir=None, **kwargs):
        if Path(dir) == target and left["mkstemp"]:
            left["mkstemp"] -= 1
            os.rmdir(dir)
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(os, "mkdir", sibling_mkdir)
    monkeypatch.setattr(tempfile, "mkstemp", sibling_mkstemp)
    artifacts.atomic_write_bytes(target / "part", b"x")
    assert (target / "part").read_bytes() == b"x" and left == {"mkdir": 0, "mkstemp": 0}
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        artifacts.in_folder(tmp_path / "file")


def test_an_interrupted_train_gan_names_the_nodes_left(cli, gan3_exp, tmp_path):
    exp = copy_exp(gan3_exp, tmp_path)
    shutil.rmtree(exp / "gan" / "node2")
    line = cli.user_error("train-gan", "--exp", exp, *TINY_GAN)
    assert "gan/node0 already exists (as do those of node1)" in line
    assert "without one (node2)" in line and "--node" in line


def test_fedcli_run_keeps_the_generators_an_interrupted_train_gan_finished(gan3_exp, tmp_path):
    """The runner's train-gan keeps each node folder made by the same config and retrains only the missing
    one, which comes out as it did when every node trained together."""
    from fedcli.experiment.config import stage_values
    from fedcli.generators.config import GanConfig
    from fedcli.generators import node_training
    from fedcli.generators import stage

    exp = copy_exp(gan3_exp, tmp_path)
    (exp / "gan" / "node2").rename(tmp_path / "node2-before")
    saved = json.loads((exp / "gan" / "node0" / "config.json").read_text())["config"]
    cfg = GanConfig(exp=exp, **stage_values(GanConfig, "train_gan", {k: v for k, v in saved.items()
                                                                 if k != "exp" and v is not None},
                                            "test"))
    kept = {node: tree(exp / "gan" / node) for node in ("node0", "node1")}
    assert node_training.finished(dataclasses.replace(cfg, iterations=cfg.iterations + 1), "node0") is None
    stage.run(dataclasses.replace(cfg, overwrite=True, threads=2), keep_finished=True)
    assert {node: tree(exp / "gan" / node) for node in ("node0", "node1")} == kept
    remade = tree(exp / "gan" / "node2")
    assert {k: v for k, v in remade.items() if k.endswith(".safetensors")} == \
        {k: v for k, v in tree(tmp_path / "node2-before").items() if k.endswith(".safetensors")}


def test_config_with_a_sweep_says_the_sweep_is_not_applied(cli, tmp_path):
    path = recipe(tmp_path, "seeds = [0, 1]")
    result = cli.ok("partition", "--config", path, "--exp", tmp_path / "exp")
    assert "[sweep] apply only under fedcli run" in result.output


def test_an_unknown_recipe_key_lists_only_keys_a_recipe_may_hold(cli, tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("[train_gan]\nbogus = 1\n")
    line = cli.user_error("run", path, "--exp", tmp_path / "exp")
    assert "unknown key train_gan.bogus" in line and "iterations" in line
    assert not {"node", "sample-only", "overwrite"} & set(line.split("valid keys: ")[1].split(", "))


def test_a_corrupt_ledger_says_how_to_remake_it(cli, tmp_path):
    path = tmp_path / "plain.toml"
    path.write_text("[partition]\nnodes = 2\n")
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / ".fedcli-run.json").write_text("{not json")
    line = cli.user_error("run", path, "--exp", exp)
    assert "is not valid JSON" in line and "delete it: the next fedcli run remakes it" in line
