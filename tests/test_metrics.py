"""Sensitivity, specificity and calibration error against scikit-learn and hand computation, and the
bootstrap's pairing: every strategy is scored on the same resamples of a test set."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import confusion_matrix, recall_score

from fedcli.fl.evaluate import ECE_BINS, evaluate, metric_values, resample_counts


def hand_ece(y, probs, weights):
    """Guo et al.'s ECE by a plain loop: bins (k/15, (k+1)/15], the first closed at 0, repeated images
    counted as often as the resample holds them."""
    confidence, pred = probs.max(1), probs.argmax(1)
    total, ece = weights.sum(), 0.0
    for k in range(ECE_BINS):
        low, high = k / ECE_BINS, (k + 1) / ECE_BINS
        inside = (confidence > low) & (confidence <= high) if k else (confidence >= 0) & (confidence <= high)
        w = weights * inside
        if w.sum():
            ece += w.sum() / total * abs((w * (pred == y)).sum() / w.sum() - (w * confidence).sum() / w.sum())
    return ece


def one_vs_rest(y, pred, c):
    tn, fp, fn, tp = confusion_matrix(y == c, pred == c, labels=[False, True]).ravel()
    return (tp / (tp + fn) if tp + fn else np.nan), (tn / (tn + fp) if tn + fp else np.nan)


@pytest.mark.parametrize("classes", [2, 4])
def test_sensitivity_specificity_and_ece_match_scikit_learn_and_a_hand_computation(classes):
    rng = np.random.default_rng(classes)
    for trial in range(30):
        n = int(rng.integers(5, 40))
        y = rng.integers(0, classes, n)
        probs = rng.dirichlet(np.ones(classes), n)
        if trial % 3 == 0:  # ties: rows of equal probabilities (argmax takes the lower class), confidences on bin edges
            probs[: n // 2] = 1.0 / classes
            probs[n // 2:, 0] = 1.0 / 3 if classes == 2 else 0.2
            probs[n // 2:, 1:] = (1 - probs[n // 2:, :1]) / (classes - 1)
        pred = probs.argmax(1)
        got = {k: v[0] for k, v in metric_values(y, probs, np.ones((1, n)), positive=1).items()}
        if classes == 2:
            sens, spec = one_vs_rest(y, pred, 1)
            assert got["sensitivity"] == pytest.approx(sens, nan_ok=True)
            if not np.isnan(sens):
                assert got["sensitivity"] == pytest.approx(recall_score(y, pred, pos_label=1))
            assert got["specificity"] == pytest.approx(spec, nan_ok=True)
        else:
            per_class = [one_vs_rest(y, pred, c) for c in range(classes)]
            for c, (sens, spec) in enumerate(per_class):
                assert got[f"sensitivity:{c}"] == pytest.approx(sens, nan_ok=True)
                assert got[f"specificity:{c}"] == pytest.approx(spec, nan_ok=True)
            assert got["sensitivity"] == pytest.approx(np.nanmean([s for s, _ in per_class]))
            assert got["specificity"] == pytest.approx(np.nanmean([s for _, s in per_class]))
        assert got["ece"] == pytest.approx(hand_ece(y, probs, np.ones(n)))


def test_the_positive_class_decides_binary_sensitivity():
    y = np.array([0, 0, 0, 1, 1])
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6], [0.6, 0.4]])
    second = {k: v[0] for k, v in metric_values(y, probs, np.ones((1, 5)), positive=1).items()}
    first = {k: v[0] for k, v in metric_values(y, probs, np.ones((1, 5)), positive=0).items()}
    assert (second["sensitivity"], second["specificity"]) == (0.5, 2 / 3)
    assert (first["sensitivity"], first["specificity"]) == (2 / 3, 0.5)


def test_a_class_absent_from_a_resample_is_left_out_of_that_resample_only():
    """Resample counts as weights equal the metrics of the resampled test set, computed plainly; a class a
    resample lacks has no sensitivity there, and the macro mean is over the classes it holds."""
    y = np.array([0, 0, 1, 1, 2, 2, 2])
    probs = np.random.default_rng(0).dirichlet(np.ones(3), 7)
    counts = np.array([[2, 1, 0, 0, 1, 2, 1],   # class 1 absent
                       [1, 1, 1, 1, 1, 1, 1]], dtype=float)
    batched = metric_values(y, probs, counts)
    for b, row in enumerate(counts):
        index = np.repeat(np.arange(7), row.astype(int))
        plain = {k: v[0] for k, v in metric_values(y[index], probs[index], np.ones((1, len(index)))).items()}
        for name in ("sensitivity", "specificity", "ece", "sensitivity:0", "specificity:1"):
            assert batched[name][b] == pytest.approx(plain[name], nan_ok=True), (b, name)
        assert batched["ece"][b] == pytest.approx(hand_ece(y, probs, row))
    assert np.isnan(batched["sensitivity:1"][0]) and not np.isnan(batched["specificity:1"][0])
    pred = probs.argmax(1)
    expected = np.mean([((pred == c) & (y == c)) @ counts[0] / ((y == c) @ counts[0]) for c in (0, 2)])
    assert batched["sensitivity"][0] == pytest.approx(expected)
    scores = evaluate(y, probs, resample_counts(0, "node0", 7, 300))
    assert scores["sensitivity:1_lo"] <= scores["sensitivity:1_hi"]  # resamples without class 1 left out


def test_every_strategy_and_round_is_scored_on_the_same_resamples_of_a_test_set():
    a, b = resample_counts(3, "node1", 20, 50), resample_counts(3, "node1", 20, 50)
    assert np.array_equal(a, b) and (a.sum(1) == 20).all()
    assert not np.array_equal(a, resample_counts(3, "node2", 20, 50))
    assert not np.array_equal(a, resample_counts(4, "node1", 20, 50))
