"""FedAdam, FedYogi, FedAdagrad and Scaffold: their update rules by hand (FedAdam's optional bias correction
too), their reductions to FedAvg, their state across a resume and their traffic (the distributed engine's
agreement with the in-process one: test_strategy_registry.py)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from fedcli.comm.transport import all_reduce_bytes
from fedcli.core.rng import torch_stream
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.federate import engine, stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.engine import Federation
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.scaffold import Corrected
from fedcli.federate.strategies.server_optimizers import ServerOptimizer
from fedcli.models.classifier import build_classifier
from fedcli.training.local import Batches, LocalSettings, train_local
from fedcli.training.objectives import Supervised

ONE_THREAD = ["--threads", "1"]


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    from conftest import Cli

    folder = tmp_path_factory.mktemp("server") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--exp", folder)
    return folder


def federation(exp, batch=32, init_epochs=1, rounds=2) -> Federation:
    cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=init_epochs, lr=1e-3, batch=batch,
                         bootstrap=20, rounds=rounds)
    return engine.build(cfg, Manifest.load(exp), 0)


def server_options(rule, lr, beta1, beta2, tau):
    """`rule`'s options dataclass with these server settings (FedAdagrad declares no beta2)."""
    return REGISTRY.resolved_options(rule, {"server_lr": lr, "beta1": beta1, "beta2": beta2, "tau": tau})


def global_after(exp, name, rounds=1, **options) -> dict[str, torch.Tensor]:
    fed = federation(exp)
    strategy = REGISTRY.build(name, {"server_lr": options.pop("lr", None), **options})
    strategy.setup(fed)
    for round_ in range(1, rounds + 1):
        strategy.run_round(fed, round_)
    return strategy.global_model.state_dict()


def test_fedadam_with_lr_1_beta1_0_and_a_frozen_second_moment_is_fedavg_weight_for_weight(exp):
    """Reddi et al.'s step x + lr m / (sqrt(v) + tau) is FedAvg's x + delta when m = delta (beta1 0) and the
    denominator is 1 (v stays at 0 with beta2 1, tau 1); two averages (rounds 0 and 1) with training between."""
    fedavg = global_after(exp, "fedavg")
    fedadam = global_after(exp, "fedadam", lr=1.0, beta1=0.0, beta2=1.0, tau=1.0)
    for key, value in fedavg.items():
        assert torch.allclose(fedadam[key].double(), value.double(), rtol=0, atol=1e-6), key
    moved = global_after(exp, "fedadam", lr=1.0, beta1=0.0, beta2=0.0, tau=1.0)
    assert not all(torch.allclose(moved[k], fedavg[k], atol=1e-4) for k in fedavg if fedavg[k].is_floating_point())


def test_with_both_betas_0_fedadam_takes_a_signed_step_not_fedavgs():
    """The issue's reduction (lr 1, betas 0) does not hold: m = delta, v = delta^2, so the step is
    lr delta / (|delta| + tau), nearly lr in the sign of delta, whatever delta's size."""
    x, average = torch.tensor([0.0, 1.0, -2.0]), torch.tensor([0.5, 0.9, -1.0])
    step = ServerOptimizer("fedadam", server_options("fedadam", 1.0, 0.0, 0.0, 1e-3)).step({"w": x},
                                                                                            {"w": average})
    delta = average - x
    assert torch.allclose(step["w"], x + delta / (delta.abs() + 1e-3))
    assert not torch.allclose(step["w"], average, atol=0.1)


@pytest.mark.parametrize("rule", ["fedadagrad", "fedyogi", "fedadam"])
def test_second_moment_rules_match_a_hand_computation_on_two_steps(rule):
    lr, beta1, beta2, tau = 0.1, 0.9, 0.99, 1e-3
    optimizer = ServerOptimizer(rule, server_options(rule, lr, beta1, beta2, tau))
    x0 = [0.5, -1.0, 2.0]
    averages = ([0.7, -1.2, 2.0], [0.6, -0.5, 1.0])  # the nodes' average after each round's training
    m, v, x = [0.0] * 3, [0.0] * 3, list(x0)
    current = {"w": torch.tensor(x0, dtype=torch.float64)}
    for average in averages:
        delta = [a - b for a, b in zip(average, x)]
        m = [beta1 * mi + (1 - beta1) * d for mi, d in zip(m, delta)]
        if rule == "fedadagrad":
            v = [vi + d * d for vi, d in zip(v, delta)]
        elif rule == "fedadam":
            v = [beta2 * vi + (1 - beta2) * d * d for vi, d in zip(v, delta)]
        else:  # Yogi: v - (1 - beta2) delta^2 sign(v - delta^2)
            v = [vi - (1 - beta2) * d * d * (1 if vi > d * d else -1 if vi < d * d else 0) for vi, d in zip(v, delta)]
        x = [xi + lr * mi / (vi ** 0.5 + tau) for xi, mi, vi in zip(x, m, v)]
        current = optimizer.step(current, {"w": torch.tensor(average, dtype=torch.float64)})
        assert torch.allclose(optimizer.v["w"], torch.tensor(v, dtype=torch.float64), rtol=1e-12, atol=0)
        assert torch.allclose(current["w"], torch.tensor(x, dtype=torch.float64), rtol=1e-12, atol=0)
    assert v[0] > 0 and (rule != "fedyogi" or v[2] != pytest.approx(0.0))


def test_a_scaffold_correction_moves_each_weight_by_lr_times_it_after_the_step():
    """One step: the corrected weights are the uncorrected ones minus lr (c - c_i), the paper's
    y <- y - lr (g - c_i + c) when the optimiser is SGD, applied in weight space after Adam's step."""
    source = TensorSource(torch.randint(0, 256, (8, 1, 16, 16), dtype=torch.uint8), torch.arange(8) % 2)
    settings = LocalSettings(epochs=1, lr=0.01, batch=8)
    models = [build_classifier("cnn", 1, 2, 0) for _ in range(2)]
    correction = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(1))
                  for k, v in models[1].named_parameters()}
    for model, objective in zip(models, (Supervised(), Corrected(Supervised(), correction))):
        assert train_local(model, Batches(source, None, settings, torch_stream(0, "t")), settings,
                           objective=objective) == 1
    plain, corrected = (dict(m.named_parameters()) for m in models)
    for k in correction:
        assert torch.allclose(corrected[k], plain[k] - 0.01 * correction[k], atol=1e-6), k


def test_scaffold_with_zero_control_variates_and_one_local_step_is_fedavg(exp):
    """No round 0 training (the control variates stay 0) and a batch as large as each node's train set:
    one local step per node; the global model is FedAvg's, bit for bit."""
    results = {}
    for name in ("fedavg", "scaffold"):
        fed = federation(exp, batch=4096, init_epochs=0)
        strategy = REGISTRY.build(name, {})
        strategy.setup(fed)
        trainer = fed.trainer
        assert trainer.train(trainer.new_model("x"), "node0", 1, fed.data.train["node0"], None, epochs=1) == 1
        strategy.run_round(fed, 1)
        results[name] = strategy.global_model.state_dict()
    assert all(torch.equal(results["fedavg"][k], results["scaffold"][k]) for k in results["fedavg"])


def test_scaffold_control_variates_follow_option_ii_by_hand(exp):
    """Round 2 from round 1's control variates: c_i+ = c_i - c + (x - y_i) / (K lr) for each node's K steps at a
    constant lr, and c+ the train-size-weighted mean of the c_i+."""
    fed = federation(exp, batch=64)
    scaffold = REGISTRY.build("scaffold", {})
    scaffold.setup(fed)
    scaffold.run_round(fed, 1)
    before_c = {k: v.clone() for k, v in scaffold.control.items()}
    before_ci = {n: {k: v.clone() for k, v in c.items()} for n, c in scaffold.node_control.items()}
    x = {k: v.detach().clone() for k, v in scaffold.global_model.named_parameters()}
    assert any(v.abs().sum() > 0 for v in before_c.values())
    trained, steps, original = {}, {}, fed.trainer.train

    def spy(model, key, round_, primary, replay, epochs, objective=None):
        steps[key] = original(model, key, round_, primary, replay, epochs, objective)
        trained[key] = {k: v.detach().clone() for k, v in model.named_parameters()}
        return steps[key]

    fed.trainer.train = spy
    scaffold.run_round(fed, 2)
    sizes = {node: len(fed.data.train[node]) for node in fed.nodes}
    expected = {}
    for node in fed.nodes:
        assert steps[node] == -(-sizes[node] // 64)  # ceil(n / batch) steps in one epoch
        expected[node] = {k: before_ci[node][k] - before_c[k] + (x[k] - trained[node][k]) / (steps[node] * 1e-3)
                          for k in x}
        for k in x:
            assert torch.allclose(scaffold.node_control[node][k], expected[node][k], rtol=1e-4, atol=1e-5), (node, k)
    total = sum(sizes.values())
    for k in x:
        mean = sum(sizes[n] * expected[n][k].double() for n in fed.nodes) / total
        assert torch.allclose(scaffold.control[k].double(), mean, rtol=1e-4, atol=1e-5), k


def test_scaffold_moves_its_control_variates_beside_the_model_every_round(exp):
    fed = {name: federation(exp) for name in ("fedavg", "scaffold")}
    for name, f in fed.items():
        strategy = REGISTRY.build(name, {})
        strategy.setup(f)
        strategy.run_round(f, 1)
    parameters = {k: v for k, v in fed["fedavg"].trainer.new_model("global").named_parameters()}
    per_round = {name: sum(t.bytes for t in f.transport.transfers if t.round == 1 and t.sender == "node0")
                 for name, f in fed.items()}
    assert per_round["scaffold"] == per_round["fedavg"] + all_reduce_bytes(parameters, 3)
    assert 1.9 < per_round["scaffold"] / per_round["fedavg"] < 2.0  # the model's parameters twice; its BN buffers once


def test_a_resumed_run_ends_as_an_uninterrupted_one_with_server_moments_and_control_variates(cli, exp, tmp_path):
    """The server moments (m, v) and the control variates (c, each c_i) are checkpointed with the model."""
    from conftest import copy_exp

    work, stateful = copy_exp(exp, tmp_path), ("fedyogi", "scaffold")
    args = ["--exp", work, *[a for name in stateful for a in ("--strategy", name)], "--rounds", "3", "--epochs", "1",
            "--bootstrap", "20", "--server-lr", "0.03", *ONE_THREAD]
    cli.ok("federate", *args)
    reference = {name: pd.read_csv(work / "federate" / name / "metrics.csv") for name in stateful}

    def crash(strategy, round_):
        if round_ == 2:
            raise KeyboardInterrupt

    for name in stateful:
        with pytest.raises(KeyboardInterrupt):
            stage.run(FederateConfig(exp=work, strategy=(name,), rounds=3, epochs=1, bootstrap=20, server_lr=0.03,
                                     threads=1, overwrite=True), after_round=crash)
    cli.ok("federate", *args, "--resume")
    for name in stateful:
        pd.testing.assert_frame_equal(pd.read_csv(work / "federate" / name / "metrics.csv"), reference[name])


def test_fedadam_bias_correction_scales_the_step_by_adams_factor_counting_steps_across_a_resume():
    options = REGISTRY.resolved_options("fedadam", {"server_lr": 0.1, "bias_correction": True})
    optimizer, x = ServerOptimizer("fedadam", options), torch.tensor([1.0], dtype=torch.float64)
    m = v = 0.0
    for t, target in enumerate((0.5, 0.8, 0.2), start=1):
        if t == 2:  # a resumed run continues from the checkpointed moments and step count
            state, optimizer = optimizer.state(), ServerOptimizer("fedadam", options)
            optimizer.load_state(state)
        delta = target - float(x)
        m, v = 0.9 * m + 0.1 * delta, 0.99 * v + 0.01 * delta ** 2
        lr = 0.1 * math.sqrt(1 - 0.99 ** t) / (1 - 0.9 ** t)
        expected = float(x) + lr * m / (math.sqrt(v) + 1e-3)
        x = optimizer.step({"w": x}, {"w": torch.tensor([target], dtype=torch.float64)})["w"]
        assert float(x) == pytest.approx(expected, rel=1e-12)
    plain = ServerOptimizer("fedadam", REGISTRY.resolved_options("fedadam", {"server_lr": 0.1}))
    first = plain.step({"w": torch.tensor([1.0], dtype=torch.float64)}, {"w": torch.tensor([0.5], dtype=torch.float64)})
    assert float(first["w"]) == pytest.approx(1.0 + 0.1 * (0.1 * -0.5) / (math.sqrt(0.01 * 0.25) + 1e-3), rel=1e-12)
