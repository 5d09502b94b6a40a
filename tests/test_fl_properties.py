"""Federated building blocks as properties: routing, aggregation, proximal term, payloads, losses."""

from __future__ import annotations

import math
from itertools import permutations

import pytest
import torch
import torch.nn.functional as F

from fedcli.comm.exact_average import weighted_average
from fedcli.comm.payloads import PayloadError, decode_buffer, decode_model, encode_buffer, encode_model
from fedcli.data.tensor_source import TensorSource
from fedcli.federate.strategies import topology
from fedcli.federate.strategies.fedprox import proximal_term
from fedcli.models.classifier import SmallCNN, batchnorm_keys, build_classifier
from fedcli.training.batchnorm_check import reestimated
from fedcli.training.local import Batches, LocalSettings, train_local
from fedcli.training.objectives import Batch, Supervised, replay_loss


def is_single_cycle(successor: dict[str, str]) -> bool:
    start, seen, node = next(iter(successor)), set(), next(iter(successor))
    while node not in seen:
        seen.add(node)
        node = successor[node]
    return node == start and len(seen) == len(successor)


def test_every_ring_is_one_cycle_seed_determined_and_all_cycles_occur():
    nodes = ["a", "b", "c", "d"]
    seen = set()
    for seed in range(300):
        ring = topology.random_ring(nodes, seed, round_=1)
        assert is_single_cycle(ring) and all(ring[n] != n for n in nodes)
        assert ring == topology.random_ring(nodes, seed, round_=1)
        seen.add(tuple(ring[n] for n in nodes))
    cycles = {p for p in permutations(nodes) if is_single_cycle(dict(zip(nodes, p)))}
    assert len(cycles) == math.factorial(3) and seen == cycles
    assert topology.random_ring(nodes, 0, 1) != topology.random_ring(nodes, 0, 2) or \
        topology.random_ring(nodes, 0, 2) != topology.random_ring(nodes, 0, 3)


def test_fedavg_aggregation_matches_a_hand_computation():
    states = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}, {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(6)}]
    out = weighted_average(states, [1, 2])
    assert torch.allclose(out["w"], torch.tensor([(1 + 2 * 4) / 3, (2 + 2 * 8) / 3]))
    assert out["n"].dtype == torch.int64 and out["n"].item() == 5


def test_proximal_gradient_is_mu_times_the_distance_to_the_global_model():
    torch.manual_seed(0)
    model = SmallCNN(1, 3)
    anchor = {k: v.detach() + torch.randn_like(v) for k, v in model.named_parameters()}
    proximal_term(model, anchor, mu=0.3).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, 0.3 * (p.detach() - anchor[name]), atol=1e-6)


def test_replay_batches_hold_b_real_and_b_buffer_images_and_the_loss_is_the_lambda_mix():
    real = TensorSource(torch.randint(0, 256, (50, 1, 16, 16), dtype=torch.uint8), torch.randint(0, 3, (50,)))
    buffer = TensorSource(torch.randint(0, 256, (12, 1, 16, 16), dtype=torch.uint8), torch.randint(0, 3, (12,)))
    seen = []
    torch.manual_seed(0)
    model = SmallCNN(1, 3)
    settings = LocalSettings(epochs=2, lr=1e-3, batch=8)
    steps = train_local(model, Batches(real, buffer, settings, torch.Generator().manual_seed(0)), settings,
                        on_batch=lambda x, y, n: seen.append((len(y), n)))
    assert steps == 2 * math.ceil(50 / 8)  # as many steps as training without replay
    assert all(n_total == 2 * n for n_total, n in seen)
    assert seen[0] == (16, 8)
    logits, labels = torch.randn(16, 3), torch.randint(0, 3, (16,))
    expected = 0.3 * F.cross_entropy(logits[:8], labels[:8]) + 0.7 * F.cross_entropy(logits[8:], labels[8:])
    assert torch.allclose(replay_loss(logits, labels, 8, 0.3), expected)
    linear = torch.nn.Linear(3, 3)  # identity: the supervised objective (the local loop's default) is that mix
    with torch.no_grad():
        linear.weight.copy_(torch.eye(3)), linear.bias.zero_()
    assert torch.allclose(Supervised(0.3).loss(linear, Batch(logits, labels, 8)), expected)


def test_buffer_is_cycled_without_replacement():
    real = TensorSource(torch.zeros((40, 1, 8, 8), dtype=torch.uint8), torch.zeros(40, dtype=torch.long))
    buffer = TensorSource(torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 1, 8, 8).clone(),
                          torch.zeros(10, dtype=torch.long))
    drawn = []

    def record(x, y, n):
        drawn.extend(((x[n:, 0, 0, 0] + 1) * 127.5).round().long().tolist())

    settings = LocalSettings(epochs=1, lr=1e-3, batch=5)
    train_local(SmallCNN(1, 1), Batches(real, buffer, settings, torch.Generator().manual_seed(1)), settings,
                on_batch=record)
    assert sorted(drawn[:10]) == list(range(10)) and sorted(drawn[10:20]) == list(range(10))


def test_payload_round_trip_shares_no_storage():
    model = SmallCNN(1, 4)
    state = model.state_dict()
    received = decode_model(encode_model(state), state)
    for name, tensor in received.items():
        assert torch.equal(tensor, state[name]) and tensor.data_ptr() != state[name].data_ptr()
    received["head.bias"].add_(1)
    assert not torch.equal(received["head.bias"], state["head.bias"])


def test_corrupt_wrong_shape_and_non_finite_payloads_are_rejected():
    state = SmallCNN(1, 4).state_dict()
    data = encode_model(state)
    with pytest.raises(PayloadError, match="not a valid safetensors"):
        decode_model(data[: len(data) // 2], state)
    with pytest.raises(PayloadError, match="expected"):
        decode_model(encode_model(SmallCNN(1, 5).state_dict()), state)
    bad = dict(state)
    bad["head.bias"] = torch.full_like(state["head.bias"], float("nan"))
    with pytest.raises(PayloadError, match="non-finite"):
        decode_model(encode_model(bad), state)
    images = torch.randint(0, 256, (6, 1, 8, 8), dtype=torch.uint8)
    labels = torch.arange(6) % 3
    for codec in ("png", "raw"):
        got_images, got_labels = decode_buffer(encode_buffer(images, labels, codec), (1, 8, 8), 3)
        assert torch.equal(got_images, images) and torch.equal(got_labels, labels)
    with pytest.raises(PayloadError, match="expected 8-bit L 16x16"):
        decode_buffer(encode_buffer(images, labels), (1, 16, 16), 3)
    with pytest.raises(PayloadError, match="expected uint8"):
        decode_buffer(encode_buffer(images, labels, "raw"), (1, 16, 16), 3)
    with pytest.raises(PayloadError, match="outside"):
        decode_buffer(encode_buffer(images, labels), (1, 8, 8), 2)


def test_png_buffers_are_smaller_than_raw_for_image_like_data():
    ramp = torch.linspace(0, 255, 32).round().to(torch.uint8)
    images = (ramp.view(1, 1, 1, 32) + ramp.view(1, 1, 32, 1) * 0).expand(64, 1, 32, 32).clone()
    labels = torch.zeros(64, dtype=torch.long)
    assert len(encode_buffer(images, labels, "png")) < 0.5 * len(encode_buffer(images, labels, "raw"))


def test_batchnorm_keys_include_resnet_downsample_layers():
    keys = batchnorm_keys(build_classifier("resnet18", 1, 2, init_seed=0))
    assert "layer2.0.downsample.1.running_mean" in keys and "bn1.weight" in keys
    assert "layer2.0.downsample.0.weight" not in keys and "conv1.weight" not in keys


def test_grayscale_torchvision_models_take_one_channel():
    model = build_classifier("resnet18", 1, 3, init_seed=0)
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 3)
    a, b = build_classifier("cnn", 1, 3, init_seed=5), build_classifier("cnn", 1, 3, init_seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_metrics_match_scikit_learn_including_absent_and_predicted_only_classes():
    import numpy as np
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, f1_score

    from fedcli.metrics.scores import metric_values

    rng = np.random.default_rng(3)
    for _ in range(20):
        y = rng.integers(0, 3, 30)  # class 3 never occurs but may be predicted
        probs = rng.dirichlet(np.ones(4), 30)
        pred = probs.argmax(1)
        got = {k: v[0] for k, v in metric_values(y, probs, np.ones((1, 30))).items()}
        assert got["accuracy"] == pytest.approx(accuracy_score(y, pred))
        assert got["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, pred))
        assert got["f1_macro"] == pytest.approx(f1_score(y, pred, average="macro"))


def test_a_last_batch_of_one_joins_the_previous_batch():
    from fedcli.training.local import batch_bounds

    assert batch_bounds(33, 8)[-1] == (24, 33) and len(batch_bounds(33, 8)) == 4
    assert batch_bounds(34, 8)[-1] == (32, 34)
    for n in range(1, 40):
        bounds = batch_bounds(n, 8)
        assert bounds[0][0] == 0 and bounds[-1][1] == n and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert n == 1 or all(end - start >= 2 for start, end in bounds)


def test_buffer_pngs_of_another_mode_or_size_are_rejected():
    import io

    import numpy as np
    from PIL import Image

    from fedcli.experiment.artifacts import tensor_bytes

    handle = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), dtype=np.uint16) + 300).save(handle, "PNG")  # 16-bit gray
    blob = np.frombuffer(handle.getvalue(), dtype=np.uint8)
    payload = tensor_bytes({"png": torch.from_numpy(blob.copy()), "offsets": torch.tensor([0, len(blob)]),
                            "labels": torch.tensor([0])}, {"codec": "png", "shape": [1, 1, 8, 8]})
    with pytest.raises(PayloadError, match="expected 8-bit L"):
        decode_buffer(payload, (1, 8, 8), 2)


def test_reestimated_statistics_are_the_exact_average_over_the_batches_and_leave_the_model_alone():
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(2))
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(4, 2, 3, 3, generator=generator) * (1 + i) + i for i in range(3)]
    refreshed = reestimated(model, batches, "cpu")
    layer = refreshed[0]
    assert torch.allclose(layer.running_mean, torch.stack([b.mean(dim=(0, 2, 3)) for b in batches]).mean(0))
    assert torch.allclose(layer.running_var, torch.stack([b.var(dim=(0, 2, 3)) for b in batches]).mean(0))
    assert not refreshed.training and layer.momentum == model[0].momentum
    assert torch.equal(model[0].running_mean, torch.zeros(2)) and torch.equal(model[0].running_var, torch.ones(2))
