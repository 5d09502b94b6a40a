"""`fedcli run`: a recipe end to end, skipping what is up to date and rerunning what changed downstream."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

import fedcli.core.environment
from fedcli.core.environment import environment
from fedcli.core.errors import UserError
from fedcli.experiment.paths import check_experiment_folder
from fedcli.pipeline.recipe import Recipe

TINY = """
[partition]
nodes = 2
image-size = 16

[train_gan]
iterations = 12
patience = 100
pp-iterations = 4
fid-every = 6
fid-images = 32
batch = 8
channel-base = 128
channel-max = 16
z-dim = 16
w-dim = 16
buffer-size = 20
fidelity-epochs = 1
fidelity-seeds = 1

[federate]
strategy = [{strategies}]
rounds = 2
bootstrap = 10

[audit]
steps = 3
max-images = 10
batch-size = 10
"""


def recipe(tmp_path: Path, strategies=("feder", "fedavg", "standalone"), extra: str = "") -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(strategies=", ".join(f'"{s}"' for s in strategies)) + extra)
    return path


def unit_lines(output: str, words: dict[str, str], shared: tuple[str, str]) -> dict[str, str]:
    """unit -> its status word, from `[<sub>: ]<unit>: <status>` lines (`words`: status start -> word) and
    `<unit>: same inputs as <path>, <ending>` lines (`shared`: ending, word)."""
    out = {}
    for line in output.splitlines():
        unit, _, status = line.rpartition(": ")
        if line.endswith(", " + shared[0]):
            out[line.split(": same inputs")[0]] = shared[1]
        elif word := next((w for start, w in words.items() if status.startswith(start)), None):
            out[unit] = word
    return out


def statuses(output: str) -> dict[str, str]:
    """unit -> 'ran' / 'skipped' / 'shared' from the run's lines on stdout (progress lines go to stderr)."""
    return unit_lines(output, {"done in": "ran", "up to date, skipped": "skipped"}, ("shared", "shared"))


def plan(output: str) -> dict[str, str]:
    """unit -> 'run' / 'skip' / 'share' from a dry run's lines."""
    return unit_lines(output, {"would run": "run", "up to date, would be skipped": "skip"}, ("would be shared", "share"))


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def fresh_environment():
    """environment() is computed once per process; a test that changes what it reads recomputes it."""
    environment.cache_clear()
    yield
    environment.cache_clear()


def test_second_run_skips_everything_and_a_change_reruns_only_downstream(cli, tmp_path, monkeypatch,
                                                                         fresh_environment):
    path, exp = recipe(tmp_path), tmp_path / "exp"
    first = statuses(cli.ok("run", path, "--exp", exp).stdout)
    units = ["partition", "train-gan", "federate feder", "federate fedavg", "federate standalone", "audit-privacy",
             "report"]
    assert first == {u: "ran" for u in units}
    report = (exp / "report" / "report.md").read_text()
    assert "Table 2" in report and "Table 4" in report and "Privacy summary" in report
    gan_config = (exp / "gan" / "node0" / "config.json").read_bytes()
    configs = [json.loads(p.read_text()) for p in sorted(exp.glob("**/config.json"))]
    assert {c["stage"] for c in configs} == {"partition", "train-gan", "federate", "audit-privacy"}
    assert all(c["environment"] == environment() and "environment" not in c["config"] for c in configs)
    assert environment()["torch"] == torch.__version__ and environment()["cpu_capability"]

    assert statuses(cli.ok("run", path, "--exp", exp).stdout) == {u: "skipped" for u in units}

    # another torch may compute other numbers: every unit is stale (a dry run says so and writes nothing)
    before = files(exp)
    environment.cache_clear()
    monkeypatch.setattr(torch, "__version__", "0.0.0-another")
    assert plan(cli.ok("run", path, "--exp", exp, "--dry-run").stdout) == {u: "run" for u in units}
    monkeypatch.undo()
    environment.cache_clear()
    assert files(exp) == before

    third = statuses(cli.ok("run", path, "--exp", exp, "--set", "federate.rounds=3").stdout)
    assert third == {u: "ran" if u.startswith("federate") or u == "report" else "skipped" for u in units}
    assert pd.read_csv(exp / "federate" / "feder" / "metrics.csv")["round"].max() == 3
    assert (exp / "gan" / "node0" / "config.json").read_bytes() == gan_config

    # mu is FedProx's alone, so no unit here changes; a GAN option reruns the GANs and what reads them
    assert set(statuses(cli.ok("run", path, "--exp", exp, "--set", "federate.rounds=3", "--set",
                               "federate.mu=0.5").stdout).values()) == {"skipped"}
    fifth = statuses(cli.ok("run", path, "--exp", exp, "--set", "federate.rounds=3", "--set",
                            "train_gan.alpha=0.5").stdout)
    assert fifth == {"partition": "skipped", "train-gan": "ran", "federate feder": "ran", "federate fedavg": "skipped",
                     "federate standalone": "skipped", "audit-privacy": "ran", "report": "ran"}


def test_a_stage_rerun_by_hand_is_stale_for_the_next_run(cli, tmp_path):
    path, exp = recipe(tmp_path, strategies=("standalone",)), tmp_path / "exp"
    cli.ok("run", path, "--exp", exp)
    cli.ok("federate", "--exp", exp, "--strategy", "standalone", "--rounds", "1", "--overwrite")
    again = statuses(cli.ok("run", path, "--exp", exp).stdout)
    assert again["federate standalone"] == "ran" and again["train-gan"] == "skipped"
    assert pd.read_csv(exp / "federate" / "standalone" / "metrics.csv")["round"].max() == 2


def test_an_interrupted_federate_unit_continues_from_its_last_round(cli, tmp_path, monkeypatch, fresh_environment):
    from fedcli.federate.progress import RoundProgress

    path = recipe(tmp_path, strategies=("feder",))
    reference = tmp_path / "reference"
    cli.ok("run", path, "--exp", reference, "--set", "federate.rounds=3")

    def power_cut(self, round_):
        if round_ == 2:
            raise RuntimeError("power cut")
    exp = tmp_path / "exp"
    monkeypatch.setattr(RoundProgress, "update", power_cut)
    assert isinstance(cli("run", path, "--exp", exp, "--set", "federate.rounds=3").exception, RuntimeError)
    monkeypatch.undo()
    assert (exp / "federate" / ".feder.checkpoint" / "node0" / "round-2.json").is_file()
    assert not (exp / "federate" / "feder").exists()

    # resumed after a code change on another CPU: the environment is recorded, never compared
    environment.cache_clear()
    monkeypatch.setattr(fedcli.core.environment, "git_commit", lambda: "another commit")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "another CPU")
    output = cli.ok("run", path, "--exp", exp, "--set", "federate.rounds=3").stdout
    assert "feder: resuming from the last completed round" in output and "starting over" not in output
    assert statuses(output)["train-gan"] == "skipped"
    recorded = json.loads((exp / "federate" / "feder" / "config.json").read_text())["environment"]
    assert recorded["git_commit"] == "another commit" and recorded["cpu_capability"] == "another CPU"
    pd.testing.assert_frame_equal(pd.read_csv(exp / "federate" / "feder" / "metrics.csv"),
                                  pd.read_csv(reference / "federate" / "feder" / "metrics.csv"))

    # a checkpoint left by other options is not resumed: the unit starts over
    monkeypatch.setattr(RoundProgress, "update", power_cut)
    cli("run", path, "--exp", exp, "--set", "federate.rounds=4")
    monkeypatch.undo()
    output = cli.ok("run", path, "--exp", exp, "--set", "federate.rounds=3").stdout
    assert "starting over" in output
    pd.testing.assert_frame_equal(pd.read_csv(exp / "federate" / "feder" / "metrics.csv"),
                                  pd.read_csv(reference / "federate" / "feder" / "metrics.csv"))


def test_sweep_makes_sub_experiments_that_share_upstream_stages(cli, tmp_path):
    path = recipe(tmp_path, strategies=("feder",), extra='\n[sweep]\n"federate.buffer-size" = [0, 10]\n')
    exp = tmp_path / "exp"
    out = cli.ok("run", path, "--exp", exp).stdout
    a, b = exp / "runs" / "buffer-size=0", exp / "runs" / "buffer-size=10"
    for stage in ("partition", "gan", "audit"):
        assert (b / stage).is_symlink() and (b / stage).resolve() == (a / stage).resolve()
    assert not (b / "federate" / "feder").is_symlink()
    assert json.loads((b / "federate" / "feder" / "config.json").read_text())["config"]["buffer_size"] == 10
    assert json.loads((a / "federate" / "feder" / "config.json").read_text())["config"]["buffer_size"] == 0
    assert sum("train-gan: done" in line for line in out.splitlines()) == 1
    report = (exp / "report" / "report.md").read_text()
    assert "Table 6" in report and "buffer 0" in report and "buffer 10" in report
    assert set(statuses(cli.ok("run", path, "--exp", exp).stdout).values()) <= {"skipped", "shared"}

    planned = cli.ok("run", path, "--exp", exp, "--dry-run", "--set", "sweep.federate.buffer-size=[0, 10, 20]").stdout
    steps = plan(planned)
    assert steps["buffer-size=20: train-gan"] == "share" and steps["buffer-size=20: federate feder"] == "run"
    assert steps["buffer-size=0: federate feder"] == "skip" and steps["report"] == "run"
    assert "dry run: 3 sub-experiment(s), 13 units: 2 would run, 5 up to date, 6 would be shared" in planned
    assert not (exp / "runs" / "buffer-size=20").exists()

    # a sweep value dropped from the recipe leaves nothing behind for the report to count
    again = statuses(cli.ok("run", path, "--exp", exp, "--set", "sweep.federate.buffer-size=[10]").stdout)
    assert not a.exists() and sorted(p.name for p in (exp / "runs").iterdir()) == ["buffer-size=10"]
    # the GANs it shared with the dropped point moved here instead of being trained again
    assert again["buffer-size=10: train-gan"] == "skipped" and again["buffer-size=10: federate feder"] == "skipped"
    assert not (b / "gan").is_symlink() and (b / "gan" / "node0" / "buffer.safetensors").is_file()
    assert "Table 6" not in (exp / "report" / "report.md").read_text().split("## Not in this report")[0]


def test_select_picks_the_grid_point_with_the_best_mean_validation_score(cli, tmp_path):
    path = recipe(tmp_path, strategies=("fedavg", "fedprox"),
                  extra="\n[select]\nrounds = [1, 2]\nmu = [0.01, 1.0]\nfolds = 2\n")
    exp = tmp_path / "exp"
    planned = cli.ok("run", path, "--exp", exp, "--dry-run").stdout
    assert "federate fedprox: would run, with the grid point model selection picks" in planned
    assert plan(planned)["select fedprox rounds=2,mu=1.0"] == "run" and not exp.exists()
    cli.ok("run", path, "--exp", exp)
    assert sorted(p.name for p in (exp / "select").iterdir()) == [
        "rounds=1", "rounds=1,mu=0.01", "rounds=1,mu=1.0", "rounds=2", "rounds=2,mu=0.01", "rounds=2,mu=1.0"]
    for strategy, keys in (("fedavg", ["rounds"]), ("fedprox", ["rounds", "mu"])):
        scores = {}
        for point in (exp / "select").iterdir():
            folds = point / "federate" / "cv" / strategy
            if not folds.is_dir():
                continue
            assert sorted(p.name for p in folds.iterdir()) == ["fold0", "fold1"]
            per_fold = []
            for fold in sorted(folds.iterdir()):
                m = pd.read_csv(fold / "metrics.csv")
                last = m[(m["round"] == m["round"].max()) & (m.model_node.isin(["global"]))]
                per_fold.append(last.accuracy.mean())
            config = json.loads((folds / "fold0" / "config.json").read_text())["config"]
            scores[tuple(config[k] for k in keys)] = sum(per_fold) / len(per_fold)
        assert len(scores) == (2 if strategy == "fedavg" else 4)
        chosen = json.loads((exp / "federate" / strategy / "config.json").read_text())["config"]
        assert chosen["fold"] is None
        assert scores[tuple(chosen[k] for k in keys)] == max(scores.values())
    report = (exp / "report" / "report.md").read_text()
    assert "Table 1" in report and "yes" in report


@pytest.mark.parametrize("args, expected", [
    (["--set", "federate.rounds=many"], "federate.rounds"),
    (["--set", "federate.cv=true"], "[select]"),
    (["--set", "train_gan.node=node0"], "every node"),
    (["--set", "federate.buffer-size=50"], "train_gan.buffer-size"),
    (["--set", "select.rounds=[1, 0]", "--set", "select.folds=2"], "--rounds"),
    (["--set", "select.rounds=[1]", "--set", "select.folds=9"], "select.folds"),
    (["--set", "sweep.report.metric=['f1']"], "cannot be swept"),
    (["--set", "federate.roundz=3"], "valid keys"),
    (["--set", "rounds=3"], "table.key=value"),
    (["--set", "sweep.federate.colour=[1, 2]"], "federate.colour"),
])
def test_bad_overrides_are_one_line_errors_before_anything_runs(cli, tmp_path, args, expected):
    line = cli.user_error("run", recipe(tmp_path), "--exp", tmp_path / "exp", *args)
    assert expected in line
    assert not (tmp_path / "exp").exists()


def test_unknown_recipe_key_names_it_and_lists_the_valid_ones(cli, tmp_path):
    path = recipe(tmp_path, extra="\n[select]\nrounds = [1]\nwarmup = [2]\n")
    line = cli.user_error("run", path, "--exp", tmp_path / "exp")
    assert "select.warmup" in line and "rounds" in line and "mu" in line
    path.write_text(TINY.format(strategies='"feder"').replace("rounds = 2", "rounds = 2\noverwrite = true"))
    assert "set by fedcli run" in cli.user_error("run", path, "--exp", tmp_path / "exp")


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[1] / "recipes").glob("*.toml")))
def test_every_shipped_recipe_parses_and_resolves(name, tmp_path):
    path = Path(__file__).parents[1] / "recipes" / name
    text = path.read_text()
    assert text.startswith("#") and ("cost" in text.lower()), "each recipe opens with what it reproduces and its cost"
    recipe_ = Recipe.load(path)
    for point in recipe_.points():
        configs = recipe_.configs(point, tmp_path)
        assert configs["federate"].strategy and configs["partition"].exp == tmp_path
    if recipe_.select:
        assert all(recipe_.grid(s) for s in recipe_.stages["federate"]["strategy"])


def test_sweep_points_are_the_product_and_mu_collapses_for_other_strategies(tmp_path):
    path = recipe(tmp_path, extra='\n[sweep]\nseeds = [0, 1]\nfederate.lr = [0.1, 0.01]\n[select]\nmu = [0.1, 1.0]\n'
                                  'rounds = [1, 2]\n')
    r = Recipe.load(path, ["federate.epochs=2"])
    assert [p.name for p in r.points()] == ["seed=0,lr=0.1", "seed=0,lr=0.01", "seed=1,lr=0.1", "seed=1,lr=0.01"]
    configs = r.configs(r.points()[3], tmp_path)
    assert configs["partition"].seed == 1 and configs["federate"].lr == 0.01 and configs["federate"].epochs == 2
    assert r.grid("fedavg") == [{"rounds": 1}, {"rounds": 2}]
    assert len(r.grid("fedprox")) == 4


def test_run_writes_nothing_outside_its_experiment_folder(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = cli.user_error("run", "missing.toml")
    assert "missing.toml" in line and not os.path.exists("results")


def test_a_shipped_recipe_runs_by_name_from_any_folder(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    planned = cli.ok("run", "quickstart", "--dry-run").stdout
    steps = plan(planned)
    assert steps["partition"] == steps["federate feder"] == steps["report"] == "run"
    assert f"dry run: 1 sub-experiment(s), {len(steps)} units: {len(steps)} would run" in planned
    assert sorted(tmp_path.iterdir()) == []  # results/quickstart is not made by a dry run
    assert "quickstart" in cli.user_error("run", "quickstrat", "--dry-run")  # names the shipped recipes


def test_the_file_system_root_or_the_home_folder_is_refused_as_experiment_folder(cli, tmp_path, monkeypatch):
    for root in ("/", "/tmp/..", "//"):
        with pytest.raises(UserError, match="file system's root"):
            check_experiment_folder(Path(root))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert "home folder" in cli.user_error("partition", "--exp", home)
    assert "home folder" in cli.user_error("run", "quickstart", "--exp", f"{home}/.")
    assert sorted(home.iterdir()) == []


def test_sweep_variants_set_options_together_and_skip_generators_nobody_reads(cli, tmp_path):
    """[[sweep.variants]]: each variant's options go together into one sub-experiment per seed, named by the
    variant; with no strategy reading a buffer and no [train_gan] or [audit], no GAN is trained or audited."""
    recipe = tmp_path / "variants.toml"
    recipe.write_text("""
[partition]
nodes = 3
image-size = 16
labeled-fraction = 0.2

[federate]
rounds = 1
epochs = 1
init-epochs = 0
steps-per-round = 2
bootstrap = 10

[[sweep.variants]]
name = "lower"
federate.strategy = ["fedavg"]

[[sweep.variants]]
name = "ssl"
federate.strategy = ["fedavg"]
federate.ssl = "fixmatch"
federate.unlabeled-ratio = 1
""")
    exp = tmp_path / "exp"
    out = cli.ok("run", recipe, "--exp", exp, "--threads", "1").stdout
    assert sorted(p.name for p in (exp / "runs").iterdir()) == ["variant=lower", "variant=ssl"]
    configs = {p.name: json.loads((p / "federate" / "fedavg" / "config.json").read_text())["config"]
               for p in (exp / "runs").iterdir()}
    assert configs["variant=lower"]["ssl"] == "none" and configs["variant=ssl"]["ssl"] == "fixmatch"
    assert configs["variant=ssl"]["unlabeled_ratio"] == 1
    assert not any((exp / "runs" / name / "gan").exists() for name in configs)
    assert "train-gan and audit-privacy: not run" in out
    bad = tmp_path / "bad.toml"
    bad.write_text(recipe.read_text() + '\n[sweep]\n"federate.ssl" = ["none"]\n')
    assert "both swept and set by a variant" in cli.user_error("run", bad, "--exp", tmp_path / "other")
    unnamed = tmp_path / "unnamed.toml"
    unnamed.write_text(recipe.read_text().replace('name = "ssl"', 'name = "lower"'))
    assert "needs a name of its own" in cli.user_error("run", unnamed, "--exp", tmp_path / "third")


def test_a_variant_that_names_its_seeds_runs_on_those_alone(cli, tmp_path):
    """An opt-in cost paid on one seed: the variant crosses only the [sweep] seeds it names; the others every one."""
    path = recipe(tmp_path, strategies=("feder",), extra="""
[[sweep.variants]]
name = "game"
seeds = [0]
train_gan.alpha = 4.0

[[sweep.variants]]
name = "plain"
train_gan.alpha = 1.0

[sweep]
seeds = [0, 1]
""")
    names = [p.name for p in Recipe.load(path).points()]
    assert names == ["variant=game,seed=0", "variant=plain,seed=0", "variant=plain,seed=1"]
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace("seeds = [0]\n", "seeds = []\n", 1))
    assert "seeds must be a non-empty list" in cli.user_error("run", bad, "--exp", tmp_path / "exp", "--dry-run")


def test_what_a_sub_experiments_train_gan_would_refuse_is_refused_before_any_trains(cli, tmp_path):
    """A DP plan no noise can meet, in the second variant: `fedcli run` says so in one line after partitioning,
    before the first variant's GANs train (they would have run for nothing)."""
    path = recipe(tmp_path, strategies=("feder",), extra="""
[[sweep.variants]]
name = "open"
train_gan.alpha = 1.0

[[sweep.variants]]
name = "dp"
train_gan.dp-epsilon = 0.01
train_gan.pp-iterations = 0
""")
    exp = tmp_path / "exp"
    line = cli.user_error("run", path, "--exp", exp, "--threads", "1")
    assert line.startswith("error: variant=dp: train-gan would refuse this (checked before anything trains):"), line
    assert "--dp-epsilon" in line
    assert sorted(p.name for p in (exp / "runs").iterdir()) == ["variant=dp", "variant=open"]
    assert all((p / "partition").is_dir() and not (p / "gan").exists() for p in (exp / "runs").iterdir())


def test_a_sub_experiment_starts_from_an_earlier_ones_phase1_where_only_later_options_differ(tmp_path, digits_exp):
    """Runner.shared_phase1: a StyleGAN train-gan whose options up to phase 2 and partition equal an earlier
    sub-experiment's gets --phase1-from that one (where it kept every node's state); another phase 1, another
    partition, DP or a dry run trains its own."""
    from fedcli.generators.config import GanConfig
    from fedcli.pipeline.runner import Runner

    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "partition").symlink_to(digits_exp / "partition", target_is_directory=True)
    runner = Runner(Recipe.load(recipe(tmp_path)), tmp_path)
    base = GanConfig(exp=first, iterations=12)
    assert runner.shared_phase1(base, first, "p") == base  # the first trains it
    other = GanConfig(exp=second, iterations=12, alpha=4.0, privacy_loss="nearest", pp_iterations=7)
    assert runner.shared_phase1(other, second, "p") == other  # the first kept no state
    for node in ("node0", "node1", "node2"):
        (first / "gan" / node).mkdir(parents=True)
        (first / "gan" / node / "phase1_state.safetensors").write_bytes(b"")
    assert runner.shared_phase1(other, second, "p").phase1_from == first
    for differs in (GanConfig(exp=second, iterations=13), GanConfig(exp=second, iterations=12, dp_epsilon=10.0,
                                                                     pp_iterations=0)):
        assert runner.shared_phase1(differs, second, "p").phase1_from is None
    assert runner.shared_phase1(other, second, "another partition").phase1_from is None
    assert Runner(Recipe.load(recipe(tmp_path)), tmp_path, dry_run=True).shared_phase1(other, second, "p") == other
