"""The strategy registry: every registered strategy resumes to its uninterrupted numbers, ignores the
options it does not declare, and gives the in-process numbers on the distributed engine. A strategy
added to the registry joins these tests with no edit here."""

from __future__ import annotations

import dataclasses
import json
import os
import typing

import pandas as pd
import pytest
import torch

from conftest import Cli, copy_exp
from fedcli.core.errors import UserError
from fedcli.experiment.artifacts import load_tensors, read_json
from fedcli.federate import stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import REGISTRY, Registry
from fedcli.federate.strategies.base import ENSEMBLE, GLOBAL_TEST, LABELS, Declaration, option
from fedcli.pipeline.runner import federate_key
from fedcli.report import feder_study
from fedcli.report.collect import load_experiment

NAMES = REGISTRY.names()
DISTRIBUTED = [name for name in NAMES if REGISTRY[name].distributed]
# one thread: CPU numbers depend on the count; no initial epoch and two batches an epoch (96 images per node, below)
# keep some 90 runs cheap
RUN = dict(rounds=2, epochs=1, init_epochs=0, batch=64, bootstrap=20, threads=1)
FILES = ("metrics.csv", "bn_statistics.csv", "comm.csv")


@pytest.fixture(scope="module")
def fl_exp(tmp_path_factory):
    """Three nodes of 96 training images with a globally shared set and a tiny VQ-VAE-2 trained serially across
    them (its codes, and a prior's samples as every node's buffer), so that every strategy has what it reads; two
    batches an epoch still make the batch order, which a resume must restore, matter."""
    exp = tmp_path_factory.mktemp("registry") / "exp"
    cli = Cli()
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--exp", exp, "--shared-fraction", "0.05",
           "--train-size", "96")
    cli.ok("train-gan", "--exp", exp, "--generator", "vqvae2", "--iterations", "10", "--batch", "16",
           "--vq-channels", "8", "--vq-codebook", "8", "--vq-dim", "4", "--prior-iterations", "4", "--prior-channels",
           "4", "--prior-layers", "1", "--buffer-size", "30", "--fidelity-seeds", "0", "--threads", "1")
    return exp


@pytest.fixture(scope="module")
def reference(fl_exp, tmp_path_factory):
    """Every registered strategy, run uninterrupted in process."""
    exp = copy_exp(fl_exp, tmp_path_factory.mktemp("reference"))
    stage.run(FederateConfig(exp=exp, strategy=NAMES, **RUN))
    return exp


def models(exp, name) -> dict[str, dict[str, torch.Tensor]]:
    folder = exp / "federate" / name / "models"
    return {p.stem: load_tensors(p, "model") for p in sorted(folder.glob("*.safetensors"))}


@pytest.mark.parametrize("name", NAMES)
def test_a_run_resumed_after_round_1_equals_the_uninterrupted_run(name, reference, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)

    def crash(strategy, round_):
        if round_ == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage.run(FederateConfig(exp=exp, strategy=(name,), **RUN), after_round=crash)
    assert not (exp / "federate" / name).exists()
    stage.run(FederateConfig(exp=exp, strategy=(name,), resume=True, **RUN))
    for file in FILES:
        assert (exp / "federate" / name / file).read_bytes() == (reference / "federate" / name / file).read_bytes()
    expected, got = models(reference, name), models(exp, name)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[key][k], expected[key][k]) for key in expected for k in expected[key])
    assert kept(exp, name) == kept(reference, name)  # what it sent, kept for an audit, across the resume


def kept(exp, name) -> dict[str, bytes]:
    folder = exp / "federate" / name / "shared"
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.safetensors"))}


def another_value(field: dataclasses.Field, annotation) -> object:
    """A valid value of a strategy option other than its default."""
    if typing.get_origin(annotation) is not typing.Literal:  # int | None: int
        annotation = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
    kind = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else annotation
    if kind is bool:
        return not field.default
    if kind is str:  # an option naming a node
        return "node1"
    if isinstance(kind, tuple):  # a Literal's values
        return next(v for v in kind if v != field.default)
    bounds = field.metadata["range"]
    value = bounds.low + (bounds.high - bounds.low) / 3 if not field.default else field.default / 2  # None, 0
    return round(value) if kind is int else value


@pytest.mark.parametrize("name", NAMES)
def test_an_option_changes_the_fingerprint_only_of_the_strategies_that_declare_it(name, tmp_path):
    base = FederateConfig(exp=tmp_path, strategy=(name,))
    declared = {f.name for f in REGISTRY[name].option_fields()}
    for option_name, field in REGISTRY.options().items():
        value = another_value(field, REGISTRY.option_type(option_name))
        changed = dataclasses.replace(base, **{option_name: value})
        if option_name in declared:
            assert federate_key(changed) != federate_key(base), option_name
        else:
            assert federate_key(changed) == federate_key(base), option_name
    default = {f.name: getattr(REGISTRY[name].options(), f.name) for f in REGISTRY[name].option_fields()}
    assert federate_key(dataclasses.replace(base, **default)) == federate_key(base)  # a default given is no change


def assert_in_process_numbers(exp, reference, name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`name`'s metrics, BatchNorm diagnostic, training transfers (their payload bytes) and models on `exp` are the
    in-process reference's; (its comm.csv, its training rows)."""
    for file in ("metrics.csv", "bn_statistics.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(exp / "federate" / name / file),
                                      pd.read_csv(reference / "federate" / name / file),
                                      check_exact=False, rtol=0, atol=1e-6)
    comm = pd.read_csv(exp / "federate" / name / "comm.csv")
    training = comm[comm.kind != "eval"].drop(columns="sealed_bytes", errors="ignore").reset_index(drop=True)
    expected_comm = pd.read_csv(reference / "federate" / name / "comm.csv")
    assert training.to_dict("records") == expected_comm.to_dict("records"), name  # standalone's: none
    expected, got = models(reference, name), models(exp, name)
    assert got.keys() == expected.keys(), name
    assert all(torch.equal(got[key][k], expected[key][k]) for key in expected for k in expected[key]), name
    return comm, training


def test_every_strategy_that_runs_on_both_engines_gives_the_in_process_numbers_distributed(cli, reference, fl_exp,
                                                                                          tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    cli.ok("federate", "--exp", exp, *[a for name in DISTRIBUTED for a in ("--strategy", name)], "--rounds", "2",
           "--epochs", "1", "--init-epochs", "0", "--batch", "64", "--bootstrap", "20", "--threads", "1",
           "--engine", "distributed", "--launch", "local",
           "--cross-eval")
    for name in DISTRIBUTED:
        comm, training = assert_in_process_numbers(exp, reference, name)
        samples = [{p: load_tensors(exp_ / "federate" / name / "shared" / p, "kept") for p in kept(exp_, name)}
                   for exp_ in (reference, exp)]
        assert samples[0].keys() == samples[1].keys(), name  # each rank's samples, gathered
        assert all(torch.equal(samples[0][p][k], samples[1][p][k]) for p in samples[0] for k in samples[0][p]), name
        # cross-evaluation moves node models, each to every other node, every evaluated round (0, 1, 2); a shared
        # model that one node holds is broadcast to the other two after each trained round (1, 2; FedReplay's
        # encoder trains in round 0 whatever init-epochs, so 0 too)
        evals = comm[comm.kind == "eval"]
        node_models = REGISTRY[name].model_key == "nodes"
        published = 3 if name == "fedreplay" else 2
        assert len(evals) == (3 * 3 * 2 if node_models else 2 * published if REGISTRY[name].published else 0), name
        assert set(training.kind) <= set(REGISTRY[name].transfers), name  # what it declares it sends
        inputs = [read_json(e / "federate" / name / "config.json", "config")["inputs"] for e in (reference, exp)]
        assert inputs[1] == inputs[0], name
    logged = [[json.loads(line) for line in (e / "logs" / "federate" / "events.jsonl").read_text().splitlines()]
              for e in (exp, reference)]
    rounds = [[{k: v for k, v in line.items() if k != "time"} for line in lines
               if line["event"] == "round" and line["strategy"] in DISTRIBUTED] for lines in logged]
    assert len(rounds[0]) == 3 * len(DISTRIBUTED)  # rounds 0, 1 and 2
    for got, expected in zip(*rounds, strict=True):  # rank 0 logs the in-process lines (metrics up to float sums)
        assert got | {"metrics": None} == expected | {"metrics": None}
        assert got["metrics"] == [pytest.approx(row, abs=1e-6) for row in expected["metrics"]]
    for node in ("node0", "node1", "node2"):
        assert (exp / "logs" / f"{node}.log").is_file()
    assert not list((exp / "federate").glob(".*checkpoint"))
    tables = [feder_study.table8(load_experiment(e), "accuracy").frame for e in (reference, exp)]
    training_columns = [c for c in tables[1].columns if not c.startswith("eval")]
    assert tables[0].loc[DISTRIBUTED, training_columns].astype(str).equals(tables[1][training_columns].astype(str))
    assert "eval (MB)" in tables[1].columns and "eval (MB)" not in tables[0].columns
    cli.ok("report", exp)
    moved = ", ".join(name for name in DISTRIBUTED if REGISTRY[name].model_key == "nodes")
    report = (exp / "report" / "report.md").read_text()
    assert f"Cross-evaluation was on for {moved}:" in report
    for name in DISTRIBUTED:  # who saw what a strategy computes from the nodes' images
        for kind in REGISTRY[name].discloses:
            receivers = ", ".join(sorted(set(pd.read_csv(exp / "federate" / name / "comm.csv").query("kind == @kind")
                                             .receiver)))
            assert f"In {name}, {receivers} received from " in report, name
    published = ", ".join(name for name in DISTRIBUTED if REGISTRY[name].published)
    assert not published or f"The model of {published}, which one node holds after each round," in report


def test_an_option_name_declared_with_another_meaning_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Prox:
        mu: float = option(0.01, 0, 1000, help="FedProx proximal weight.", select=True)

    @dataclasses.dataclass(frozen=True)
    class OtherMu:
        mu: float = option(0.5, 0, 1, help="FixMatch's unlabelled ratio.")

    @dataclasses.dataclass(frozen=True)
    class SameMeaning:
        mu: float = option(0.1, 0, 1000, help="FedProx proximal weight.", select=True)

    registry = Registry(order=("a", "b", "c"))
    registry.add(Declaration("a", "a", lambda o: None, options=Prox))
    registry.add(Declaration("b", "b", lambda o: None, options=SameMeaning))  # another default is allowed
    with pytest.raises(ValueError, match="another meaning"):
        registry.add(Declaration("c", "c", lambda o: None, options=OtherMu))
    assert registry.names() == ("a", "b")
    assert registry.resolved_options("b", {}).mu == 0.1 and registry.resolved_options("a", {"mu": 3}).mu == 3
    with pytest.raises(UserError, match="must lie in"):
        registry.resolved_options("a", {"mu": 1001})


def test_no_node_may_take_a_model_key_that_a_strategy_produces():
    assert {"global", "central", "ensemble", "labels", "global-test"} <= set(REGISTRY.reserved_names())
    produced = {d.model_key for d in REGISTRY if d.model_key != "nodes"}
    assert set(REGISTRY.reserved_names()) == produced | {ENSEMBLE, LABELS, GLOBAL_TEST}


def test_strategies_are_listed_in_the_registrys_one_order_and_an_unlisted_one_follows():
    """The order was an integer in each module, with three collisions decided by file names."""
    from fedcli.federate.strategies import ORDER

    assert REGISTRY.names() == (*ORDER, "fedavg-step")  # the tests' strategy plugin (tests/plugins) follows
    registry = Registry(order=("b", "a"))
    for name in ("z", "a", "b"):
        registry.add(Declaration(name, name, lambda o: None))
    assert registry.names() == ("b", "a", "z")


RELAYED = ("cwt", "splitnn", "fedperl")  # beside fedavg and feder (tests/test_flower.py): a model passed on, per-batch
                                        # activations and gradients, peers and the anonymising server


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FEDCLI_FLOWER_BIN"), reason="Flower's environment is not given")
def test_cwt_splitnn_and_fedperl_over_flower_give_the_in_process_numbers(cli, reference, fl_exp, tmp_path):
    exp = copy_exp(fl_exp, tmp_path)
    cli.ok("federate", "--exp", exp, *[a for name in RELAYED for a in ("--strategy", name)], "--rounds", "2",
           "--epochs", "1", "--init-epochs", "0", "--batch", "64", "--bootstrap", "20", "--threads", "1",
           "--engine", "flower", "--launch", "local", "--cross-eval", "--timeout", "120")
    for name in RELAYED:
        comm, _ = assert_in_process_numbers(exp, reference, name)
        assert (comm.sealed_bytes > comm.bytes).all(), name
