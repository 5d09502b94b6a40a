"""Ding et al.'s adaptive binning (metrics/adaptive_bins.py) against golden AECE and AMCE from FedPerl's shipped
`AdaptiveBinning.py` (tbdair/FedPerlV1.0 at b66b7c3^, code/utils), run on the inputs built here and pinned. On the
short-last-bin input the shipped code returns an AECE of -16.66 (its extraction uses the last bin's size for
every bin); the golden values there are the shipped code's with each bin's own size in that one place."""

from __future__ import annotations

import numpy as np
import pytest

from fedcli.metrics.adaptive_bins import adaptive_bins
from fedcli.metrics.scores import metric_values


def typical(rounded: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    confidence = 0.34 + 0.66 * rng.uniform(size=300) ** 0.5
    correct = rng.uniform(size=300) < confidence - 0.1
    return (np.round(confidence, 1) if rounded else confidence), correct


def short_last_bin() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2026)
    confidence = np.concatenate([rng.uniform(0.5, 0.58, 120), rng.uniform(0.58, 1.0, 80)])
    return confidence, rng.uniform(size=200) < confidence - 0.05


def aece_amce(confidence: np.ndarray, correct: np.ndarray) -> tuple[float, float, int]:
    bins = adaptive_bins(confidence)
    gaps = [abs(correct[bins == b].mean() - confidence[bins == b].mean()) for b in range(bins.max() + 1)]
    return sum(g * (bins == b).sum() for b, g in enumerate(gaps)) / len(bins), max(gaps), len(gaps)


@pytest.mark.parametrize("inputs, aece, amce, count", [
    (typical(), 0.06808147754137324, 0.14174340977554944, 4),
    (typical(rounded=True), 0.07366666666666608, 0.1647058823529408, 4),  # ties of confidence keep their order
    (short_last_bin(), 0.08144427291457253, 0.19130174776038378, 4),
])
def test_aece_and_amce_equal_fedperls_adaptive_binning(inputs, aece, amce, count):
    assert aece_amce(*inputs) == pytest.approx((aece, amce, count), abs=1e-12)


def test_the_bins_are_runs_of_confidence_whose_number_follows_the_data():
    confidence, _ = typical()
    bins = adaptive_bins(confidence)
    order = np.argsort(-confidence, kind="stable")
    assert (np.diff(bins[order]) >= 0).all()  # runs, the most confident first
    assert len(set(adaptive_bins(confidence[:30]).tolist())) == 1  # 40 images or fewer left: no new bin
    sizes = np.bincount(adaptive_bins(short_last_bin()[0]))
    assert sizes.min() >= 1 and sizes.sum() == 200 and sizes[-1] > 120  # the short last bin grew


def test_the_evaluators_adaptive_calibration_is_on_these_bins():
    confidence, correct = typical()
    probs = np.stack([confidence, (1 - confidence) / 2, (1 - confidence) / 2], axis=1)
    y = np.where(correct, 0, 1)
    got = {k: v[0] for k, v in metric_values(y, probs, np.ones((1, len(y)))).items()}
    assert (got["adaptive_ece"], got["adaptive_mce"]) == pytest.approx((0.06808147754137324, 0.14174340977554944))
