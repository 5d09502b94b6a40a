"""`fedcli federate`: strategies' guarantees, measured communication, resume, determinism, errors."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
import torch

from conftest import copy_exp
from test_predict import write_test_pngs
from fedcli.comm.payloads import encode_buffer, encode_model
from fedcli.data.manifest import Manifest
from fedcli.data.node_data import NodeImages
from fedcli.experiment.artifacts import load_tensors
from fedcli.federate import engine, stage
from fedcli.federate.checkpoint import CheckpointMismatch
from fedcli.federate.config import FederateConfig
from fedcli.federate.evaluator import Evaluator
from fedcli.federate.strategies import REGISTRY, topology
from fedcli.federate.strategy_runs import load_buffer
from fedcli.models.classifier import batchnorm_keys
from fedcli.training.batchnorm_check import COLUMNS as BN_COLUMNS

FAST = ["--rounds", "2", "--epochs", "1", "--bootstrap", "20"]


@pytest.fixture(scope="module")
def fl_exp(gan3_exp):
    return gan3_exp


def metrics(exp, strategy):
    return pd.read_csv(exp / "federate" / strategy / "metrics.csv")


def test_fedprox_with_mu_zero_equals_fedavg_weight_for_weight(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "fedprox", "--mu", "0", *FAST)
    avg = load_tensors(exp / "federate" / "fedavg" / "models" / "global.safetensors", "m")
    prox = load_tensors(exp / "federate" / "fedprox" / "models" / "global.safetensors", "m")
    assert all(torch.equal(avg[k], prox[k]) for k in avg)
    cli.ok("federate", "--exp", exp, "--strategy", "fedprox", "--mu", "0.5", "--overwrite", *FAST)
    other = load_tensors(exp / "federate" / "fedprox" / "models" / "global.safetensors", "m")
    assert not all(torch.equal(avg[k], other[k]) for k in avg)


def federation(exp, model="cnn", init_epochs=1, **options):
    manifest = Manifest.load(exp)
    cfg = FederateConfig(exp=exp, model=(model,), epochs=1, init_epochs=init_epochs, lr=1e-3, batch=32, bootstrap=20,
                         **options)
    buffers = {node: load_buffer(exp, manifest, node, None, "test") for node in manifest.node_names}
    return engine.build(cfg, manifest, 0, buffers=buffers)


def test_fedbn_keeps_every_batchnorm_tensor_local_and_differs_from_fedavg(fl_exp):
    fed = federation(fl_exp, model="resnet18", init_epochs=0)  # round 1 alone shows what stays local
    fedbn = REGISTRY.build("fedbn", {})
    fedbn.setup(fed)
    after_local = {}
    original = fed.trainer.train

    def spy(model, key, round_, primary, replay, epochs, objective=None):
        steps = original(model, key, round_, primary, replay, epochs, objective)
        after_local[key] = {k: v.clone() for k, v in model.state_dict().items()}
        return steps

    fed.trainer.train = spy
    fedbn.run_round(fed, 1)
    bn = batchnorm_keys(fedbn.global_model)
    assert any("downsample" in k for k in bn)
    personal = {node: model.state_dict() for node, model in fedbn.models().items()}
    for node in fed.nodes:
        for key in bn:  # BN weights, biases and running statistics: exactly as local training left them
            assert torch.equal(personal[node][key], after_local[node][key]), (node, key)
    shared = [k for k in personal["node0"] if k not in bn]
    assert all(torch.equal(personal["node0"][k], personal["node1"][k]) for k in shared)
    assert not torch.equal(personal["node0"]["bn1.weight"], personal["node1"]["bn1.weight"])
    sent = {(t.kind, t.receiver) for t in fed.transport.transfers}
    assert sent == {("all-reduce", "all")}  # no server, in process as between processes
    fed.trainer.train = original
    fedavg = REGISTRY.build("fedavg", {})
    fedavg.setup(fed)
    fedavg.run_round(fed, 1)
    averaged = fedavg.global_model.state_dict()
    assert not all(torch.equal(personal["node0"][k], averaged[k]) for k in bn)


@pytest.mark.parametrize("weighting, weights", [("equal", (1, 1)), ("samples", (1, 3))])
def test_averaging_weights_nodes_equally_or_by_their_train_size(cli, tmp_path, weighting, weights):
    """Two nodes of 100 and 300 images: the global model is the plain mean of their trained models
    (equal) or their 1:3 mean (samples)."""
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=0, lr=1e-3, batch=50, bootstrap=20,
                         weighting=weighting)
    fed = engine.build(cfg, Manifest.load(exp), 0)
    for node, size in zip(fed.nodes, (100, 300)):
        source = fed.data.train[node]
        fed.data.train[node] = type(source)(source.images[:size], source.labels[:size])
    trained, original = {}, fed.trainer.train

    def keep(model, key, round_, primary, replay, epochs, objective=None):
        steps = original(model, key, round_, primary, replay, epochs, objective)
        trained[key] = {k: v.clone() for k, v in model.state_dict().items()}
        return steps

    fed.trainer.train = keep
    fedavg = REGISTRY.build("fedavg", {})
    fedavg.setup(fed)
    fedavg.run_round(fed, 1)
    a, b = (trained[node] for node in fed.nodes)
    for key, value in fedavg.global_model.state_dict().items():
        if value.is_floating_point():
            expected = (weights[0] * a[key].double() + weights[1] * b[key].double()) / sum(weights)
            assert torch.allclose(value.double(), expected, rtol=0, atol=1e-6), key


def test_averaging_strategies_train_round_0_as_feder_does(fl_exp):
    """Equal budgets: FedAvg's round 0 trains the common initial model for init_epochs on every node, as
    FedER trains its M^0, so both take init_epochs + R x E epochs of steps on the real images."""
    fed = federation(fl_exp)
    steps = {}
    original = fed.trainer.train

    def count(model, key, round_, primary, replay, epochs, objective=None):
        n = original(model, key, round_, primary, replay, epochs, objective)
        steps[(epochs, round_, key)] = n
        return n

    fed.trainer.train = count
    strategies = {name: REGISTRY.build(name, {"buffer_size": 0}) for name in ("fedavg", "feder")}
    for name, strategy in strategies.items():
        steps.clear()
        strategy.setup(fed)
        assert {(epochs, round_) for epochs, round_, _ in steps} == {(fed.trainer.init_epochs, 0)}, name
        assert {key for *_, key in steps} == set(fed.nodes)
    untrained = fed.trainer.new_model("global").state_dict()["head.weight"]
    assert not torch.equal(strategies["fedavg"].global_model.state_dict()["head.weight"], untrained)


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_a_cosine_learning_rate_falls_to_zero_over_every_strategys_whole_budget(fl_exp, monkeypatch, schedule):
    """One cosine over init-epochs + R x E, step by step across rounds (each round's fresh Adam picks it up
    where the last left off), the same for a model-passing, an averaging and a pooled strategy."""
    lrs: list[float] = []

    class Recording(torch.optim.Adam):
        def step(self, closure=None):
            lrs.append(self.param_groups[0]["lr"])
            return super().step(closure)
    monkeypatch.setattr(torch.optim, "Adam", Recording)
    fed = federation(fl_exp, init_epochs=2, rounds=2, lr_schedule=schedule)
    original, per_key = fed.trainer.train, {}

    def record(model, key, round_, primary, replay, epochs, objective=None):
        lrs.clear()
        n = original(model, key, round_, primary, replay, epochs, objective)
        per_key.setdefault(key, []).extend(lrs)
        return n
    fed.trainer.train = record
    for name, key in (("feder", "node0"), ("fedavg", "node1"), ("central", "central")):
        per_key.clear()
        strategy = REGISTRY.build(name, {})  # FedER replays its whole buffer
        strategy.setup(fed)
        for round_ in (1, 2):
            strategy.run_round(fed, round_)
        got = torch.tensor(per_key[key], dtype=torch.float64)
        steps = torch.arange(len(got), dtype=torch.float64)
        expected = 1e-3 * (0.5 * (1 + torch.cos(torch.pi * steps / len(got))) if schedule == "cosine"
                           else torch.ones_like(steps))
        assert len(got) >= 8 and torch.allclose(got, expected, rtol=1e-9, atol=0), name


def test_feder_a_never_sends_models_and_feder_sends_measured_bytes(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "feder-a", "--strategy", "feder", *FAST)
    comm_a = pd.read_csv(exp / "federate" / "feder-a" / "comm.csv")
    assert set(comm_a["kind"]) == {"buffer"} and len(comm_a) == 2 * 3
    comm = pd.read_csv(exp / "federate" / "feder" / "comm.csv")
    model_state = load_tensors(exp / "federate" / "feder" / "models" / "node0.safetensors", "m")
    assert set(comm[comm.kind == "model"]["bytes"]) == {len(encode_model(model_state))}
    manifest = Manifest.load(exp)
    for node in manifest.node_names:
        buffer = load_buffer(exp, manifest, node, None, "feder")
        sent = comm[(comm.kind == "buffer") & (comm.sender == node)]["bytes"]
        assert set(sent) == {len(encode_buffer(buffer.images, buffer.labels, "png"))}
    for round_, group in comm.groupby("round"):
        assert sorted(group[group.kind == "model"]["sender"]) == sorted(manifest.node_names)
        assert (group["sender"] != group["receiver"]).all()


def test_feder_b_never_reads_real_training_images(fl_exp, monkeypatch):
    fed = federation(fl_exp)
    original = NodeImages.get

    def guarded(self, node, split, folds):
        assert split == "test", "FedER-B read real training data"
        return original(self, node, split, folds)

    monkeypatch.setattr(NodeImages, "get", guarded)
    strategy = REGISTRY.build("feder-b", {"buffer_size": 30})
    strategy.setup(fed)
    strategy.run_round(fed, 1)
    assert not dict(fed.data.train)


def test_a_received_model_shares_no_storage_with_the_sender(fl_exp):
    fed = federation(fl_exp)
    strategy = REGISTRY.build("feder", {"buffer_size": 30})
    strategy.setup(fed)
    before = {p.data_ptr() for m in strategy.models().values() for p in m.parameters()}
    strategy.run_round(fed, 1)
    after = {p.data_ptr() for m in strategy.models().values() for p in m.parameters()}
    assert not before & after


def test_buffer_size_zero_is_feder_without_replay_and_prefixes_are_used(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "feder", "--buffer-size", "0", *FAST)
    assert set(pd.read_csv(exp / "federate" / "feder" / "comm.csv")["kind"]) == {"model"}
    line = cli.user_error("federate", "--exp", exp, "--strategy", "feder", "--buffer-size", "31", "--overwrite",
                          *FAST)
    assert "exceeds node node0's buffer of 30" in line and "--sample-only" in line


def test_same_seed_same_metrics_and_resume_continues_identically(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    args = ["--exp", exp, "--strategy", "feder", "--rounds", "3", "--epochs", "1", "--bootstrap", "20"]
    cli.ok("federate", *args)
    reference = (exp / "federate" / "feder" / "metrics.csv").read_bytes()
    diagnostic = (exp / "federate" / "feder" / "bn_statistics.csv").read_bytes()
    cli.ok("federate", *args, "--overwrite")
    assert (exp / "federate" / "feder" / "metrics.csv").read_bytes() == reference

    shutil.rmtree(exp / "federate")
    cfg = FederateConfig(exp=exp, strategy=("feder",), rounds=3, epochs=1, bootstrap=20)

    def crash(strategy, round_):
        if round_ == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage.run(cfg, after_round=crash)
    assert not (exp / "federate" / "feder").exists()
    assert completed_rounds(exp / "federate" / ".feder.checkpoint") == {1, 2}  # the two latest, for every node
    cli.ok("federate", *args, "--resume")
    assert (exp / "federate" / "feder" / "metrics.csv").read_bytes() == reference
    assert (exp / "federate" / "feder" / "bn_statistics.csv").read_bytes() == diagnostic
    assert not (exp / "federate" / ".feder.checkpoint").exists()


def test_metrics_are_long_format_with_confidence_intervals(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "standalone", *FAST)
    m = metrics(exp, "fedavg")
    assert set(m["round"]) == {0, 1, 2} and set(m["model_node"]) == {"global"}
    assert {"accuracy_lo", "accuracy_hi", "balanced_accuracy", "f1_macro", "auroc"} <= set(m.columns)
    assert ((m["accuracy_lo"] <= m["accuracy"]) & (m["accuracy"] <= m["accuracy_hi"])).all()
    s = metrics(exp, "standalone")
    assert set(s["model_node"]) == {"node0", "node1", "node2", "ensemble"}
    assert len(s[s["round"] == 2]) == 4 * 3
    bn = pd.read_csv(exp / "federate" / "standalone" / "bn_statistics.csv")
    assert tuple(bn.columns) == BN_COLUMNS and len(bn) == 4 * 3  # the final round's rows, ensemble included
    final = s[s["round"] == 2].reset_index(drop=True)
    assert bn.accuracy_stored.tolist() == final.accuracy.tolist()
    # standalone trains on the node's real images alone: as trained is refreshed, drawn from the same stream
    assert bn.accuracy_refreshed.tolist() == bn.accuracy_refreshed_as_trained.tolist()
    assert not set(BN_COLUMNS[3:]) & set(s.columns)
    local = copy_exp(fl_exp, tmp_path / "local")
    cli.ok("federate", "--exp", local, "--strategy", "fedavg", "--eval-statistics", "local", *FAST)
    stored_bn = pd.read_csv(exp / "federate" / "fedavg" / "bn_statistics.csv")
    final = metrics(local, "fedavg").query("round == 2")
    assert final.accuracy.tolist() == stored_bn.accuracy_refreshed.tolist() != stored_bn.accuracy_stored.tolist()
    pd.testing.assert_frame_equal(pd.read_csv(local / "federate" / "fedavg" / "bn_statistics.csv"), stored_bn)
    weights = [load_tensors(e / "federate" / "fedavg" / "models" / "global.safetensors", "model") for e in (exp, local)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # scoring never changes training


def test_the_batchnorm_diagnostic_tells_stale_statistics_from_the_weights(fl_exp):
    """Statistics that no longer fit the weights sink the stored accuracy; re-estimating them, weights
    untouched, recovers it. FedER's as-trained batches are its real images plus the buffer it received."""
    fed = federation(fl_exp)
    standalone = REGISTRY.build("standalone", {})
    standalone.setup(fed)
    for round_ in (1, 2, 3):  # trained long enough for its own statistics to fit its weights
        standalone.run_round(fed, round_)
    models = standalone.models()
    healthy = {r["test_node"]: r["accuracy"] for r in fed.evaluator.evaluate("standalone", 1, models)
               if r["model_node"] == r["test_node"]}
    for model in models.values():
        for layer in model.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.running_mean.add_(5.0)
    before = {key: {k: v.clone() for k, v in model.state_dict().items()} for key, model in models.items()}
    rows = [r for r in fed.evaluator.evaluate("standalone", 1, models, lambda node: standalone.trained_on(fed, node))
            if r["model_node"] == r["test_node"]]
    local = Evaluator(fed.data, fed.trainer, fed.transport, fed.local_nodes, 20, local_statistics=True)
    scored_locally = {r["test_node"]: r["accuracy"] for r in local.evaluate("standalone", 1, models)
                      if r["model_node"] == r["test_node"]}
    for r in rows:
        assert healthy[r["test_node"]] > 0.8 and r["accuracy"] < healthy[r["test_node"]] - 0.3
        assert r["accuracy_refreshed"] > healthy[r["test_node"]] - 0.1
        assert scored_locally[r["test_node"]] == r["accuracy_refreshed"]  # --eval-statistics local scores so
    assert all(torch.equal(value, before[key][name]) for key, model in models.items()
               for name, value in model.state_dict().items())  # the diagnostic never changes the models
    feder = REGISTRY.build("feder", {"buffer_size": 30})
    feder.setup(fed)
    feder.run_round(fed, 1)
    predecessor = topology.predecessors(topology.random_ring(fed.nodes, fed.seed, 1))
    for node in fed.nodes:
        primary, replay = feder.trained_on(fed, node)
        assert primary is fed.data.train[node] and torch.equal(replay.images,
                                                                fed.data.buffers[predecessor[node]].images)


def test_cross_validation_uses_train_folds_only(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "standalone", "--fold", "1", *FAST)
    m = pd.read_csv(exp / "federate" / "cv" / "standalone" / "fold1" / "metrics.csv")
    manifest = Manifest.load(exp)
    assert m[m["test_node"] == "node0"]["n_test"].iloc[0] == len(manifest.records("node0", "train", [1]))
    config = json.loads((exp / "federate" / "cv" / "standalone" / "fold1" / "config.json").read_text())
    assert "seen this validation fold" in config["note"]


def listing(exp):
    return sorted(p.relative_to(exp).as_posix() for p in exp.rglob("*"))


@pytest.mark.parametrize("args, expected", [
    (["--strategy", "fedsgd"], "unknown strategy 'fedsgd'"),
    (["--model", "vit"], "--model"),
    (["--mu", "-0.1"], "--mu"),
    (["--lam", "1.5"], "[0, 1]"),
    (["--rounds", "0"], "--rounds"),
    (["--fold", "9"], "not a fold"),
])
def test_bad_options(cli, fl_exp, tmp_path, args, expected):
    exp = copy_exp(fl_exp, tmp_path)
    before = listing(exp)
    assert expected in cli.user_error("federate", "--exp", exp, *FAST, *args)
    assert listing(exp) == before


def test_missing_manifest_missing_and_stale_buffers(cli, fl_exp, tmp_path):
    assert "run fedcli partition" in cli.user_error("federate", "--exp", tmp_path / "none", *FAST)
    exp = copy_exp(fl_exp, tmp_path)
    shutil.rmtree(exp / "gan")
    before = listing(exp)
    assert "run fedcli train-gan" in cli.user_error("federate", "--exp", exp, "--strategy", "feder", *FAST)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", *FAST)  # needs no buffers
    shutil.copytree(fl_exp / "gan", exp / "gan")
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--seed", "3", "--exp", exp, "--overwrite")
    before = listing(exp)
    assert "stale" in cli.user_error("federate", "--exp", exp, "--strategy", "central-mixed", *FAST)
    assert listing(exp) == before


def test_node_batch_sizes_set_each_node_steps(fl_exp):
    manifest = Manifest.load(fl_exp)
    cfg = FederateConfig(exp=fl_exp, model=("cnn",), epochs=1, init_epochs=1, lr=1e-3, batch=32,
                         node_batch=("node0=8",))
    fed = engine.build(cfg, manifest, 0)
    train, trainer = fed.data.train, fed.trainer
    n0, n1 = len(train["node0"]), len(train["node1"])
    assert trainer.train(trainer.new_model("node0"), "node0", 1, train["node0"], None, epochs=1) == -(-n0 // 8)
    assert trainer.train(trainer.new_model("node1"), "node1", 1, train["node1"], None, epochs=1) == -(-n1 // 32)


def test_bad_node_batch(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    assert "not a node" in cli.user_error("federate", "--exp", exp, *FAST, "--strategy", "fedavg",
                                          "--node-batch", "node7=8")
    assert "NODE=B" in cli.user_error("federate", "--exp", exp, *FAST, "--node-batch", "node0=big")


def test_cv_runs_every_fold_and_reports_mean_and_std(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    output = " ".join(cli.ok("federate", "--exp", exp, "--strategy", "standalone", "--cv", "--rounds", "1",
                             "--bootstrap", "20").output.split())
    assert "cross-validation" in output and "±" in output and "seen each validation fold" in output
    folds = Manifest.load(exp)["folds"]
    assert sorted(p.name for p in (exp / "federate" / "cv" / "standalone").iterdir()) == [f"fold{k}" for k in range(folds)]
    assert not (exp / "federate" / "standalone").exists()


def completed_rounds(work) -> set[int]:
    from fedcli.federate.checkpoint import Checkpoint

    return Checkpoint(work, ["node0", "node1", "node2"]).rounds()


def test_a_crash_between_checkpoint_files_leaves_the_previous_round_intact(tmp_path):
    from fedcli.experiment.artifacts import save_tensors
    from fedcli.federate.checkpoint import Checkpoint

    checkpoint = Checkpoint(tmp_path, ["a", "b"])
    row = {"round": 1, "model_node": "a", "test_node": "a"}
    checkpoint.save(1, {"a": {"w": torch.ones(2)}, "b": {"w": torch.zeros(2)}}, [row], [], {"k": 1}, [])
    save_tensors(tmp_path / "a" / "round-2.safetensors", {"a/w": torch.full((2,), 2.0)})  # then the crash
    assert checkpoint.rounds() == {1}
    states, rows, _, _ = checkpoint.load(1, {"k": 1})
    assert torch.equal(states["a"]["w"], torch.ones(2)) and torch.equal(states["b"]["w"], torch.zeros(2))
    assert rows == [row]


def test_checkpoints_keep_two_rounds_and_resume_from_the_latest_every_node_holds(tmp_path):
    """Nodes on separate machines can stop one round apart: node b never wrote round 3."""
    from fedcli.federate.checkpoint import Checkpoint

    config = {"k": 1}
    for node in ("a", "b"):
        part = Checkpoint(tmp_path, ["a", "b"], local=[node])
        for round_ in range(3 if node == "b" else 4):
            part.save(round_, {node: {"w": torch.full((1,), float(round_))}}, [], [], config, [])
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "round-2.json", "round-2.safetensors", "round-3.json", "round-3.safetensors"]
    everyone = Checkpoint(tmp_path, ["a", "b"])
    assert everyone.rounds() == {2}
    states, _, _, _ = everyone.load(2, config)
    assert states["a"]["w"].item() == 2.0 and states["b"]["w"].item() == 2.0
    with pytest.raises(CheckpointMismatch):
        everyone.load(2, {"k": 2})
    everyone.truncate(2)  # resuming from round 2: node a's round 3 must not be offered to a later resume
    assert everyone.rounds() == {2} and not (tmp_path / "a" / "round-3.json").exists()


def test_resume_without_a_checkpoint_does_not_overwrite_finished_output(cli, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", *FAST)
    assert "--overwrite" in cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", "--resume", *FAST)


def test_nodes_may_keep_their_own_architectures_where_models_never_move(cli, fl_exp, tmp_path):
    """FedER-A shares only synthetic images, so each hospital may keep its own network: it trains, resumes,
    predicts as an ensemble and is reported; a strategy that moves or averages models refuses."""
    exp = copy_exp(fl_exp, tmp_path)
    own = ("node0=cnn", "node1=resnet18")
    args = ["--exp", exp, "--strategy", "feder-a", "--model", own[0], "--model", own[1], "--rounds", "2",
            "--bootstrap", "20", "--lr-schedule", "cosine"]

    def crash(strategy, round_):
        if round_ == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage.run(FederateConfig(exp=exp, strategy=("feder-a",), model=own, rounds=2, bootstrap=20,
                                 lr_schedule="cosine"), after_round=crash)
    cli.ok("federate", *args, "--resume")
    models = exp / "federate" / "feder-a" / "models"
    assert "layer1.0.conv1.weight" in load_tensors(models / "node1.safetensors", "m")
    for node in ("node0", "node2"):  # node2 keeps the default architecture
        assert "features.0.weight" in load_tensors(models / f"{node}.safetensors", "m")
    index, _ = write_test_pngs(exp, "node0", tmp_path / "images")
    cli.ok("predict", "--exp", exp, "--strategy", "feder-a", "--ensemble", "--data-dir", tmp_path / "images",
           "--out", tmp_path / "ensemble.csv", "--device", "cpu")
    assert len(pd.read_csv(tmp_path / "ensemble.csv")) == len(index)
    cli.ok("report", "--exp", exp)
    report = (exp / "report" / "report.md").read_text()
    assert "feder-a: node0 cnn, node1 resnet18, node2 cnn" in report
    assert "Budget: feder-a: 1 + 2 x 1 epochs (round 0, then R x E), Adam lr 0.001 annealed to 0 along a cosine" in report
    line = cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", "--model", own[0], "--model", own[1])
    assert "different architectures" in line and "fedavg" in line
    assert not (exp / "federate" / "fedavg").exists()
