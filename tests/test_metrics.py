"""Sensitivity, specificity and calibration error against scikit-learn and hand computation, the
bootstrap's pairing: every strategy is scored on the same resamples of a test set, and the audit's SSIM
against scikit-image and a hand computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from skimage.metrics import structural_similarity
from sklearn.metrics import (average_precision_score, confusion_matrix, precision_recall_fscore_support, recall_score,
                             roc_auc_score)

from fedcli.audit import scores
from fedcli.metrics.scores import ECE_BINS, evaluate, metric_values, resample_counts


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


@pytest.mark.parametrize("classes", [2, 5])
def test_precision_recall_f1_and_auprc_equal_scikit_learn_also_on_resamples(classes):
    """Macro (classes present or predicted, undefined counting 0) and weighted by support, per class, and average
    precision one vs rest (binary: class 1), with a resample's counts as scikit-learn's sample weights."""
    rng = np.random.default_rng(classes)
    for trial in range(20):
        n = int(rng.integers(6, 40))
        y = rng.integers(0, classes, n)
        probs = rng.dirichlet(np.ones(classes) * (0.3 if trial % 2 else 3), n)
        if trial % 4 == 0:
            probs = np.round(probs, 1) + 1e-9 * np.arange(classes)  # tied scores
        counts = np.vstack([np.ones(n), rng.multinomial(n, np.full(n, 1 / n))])
        got = metric_values(y, probs, counts)
        for b, w in enumerate(counts):
            pred = probs.argmax(1)
            for average in ("macro", "weighted"):
                p, r, f, _ = precision_recall_fscore_support(y, pred, average=average, sample_weight=w, zero_division=0,
                                                             labels=np.unique(np.r_[y[w > 0], pred[w > 0]]))
                assert (got[f"precision_{average}"][b], got[f"recall_{average}"][b], got[f"f1_{average}"][b]) == \
                    pytest.approx((p, r, f)), (trial, b, average)
            present = [c for c in range(classes) if ((y == c) * w).sum() > 0]
            expected = [average_precision_score(y == c, probs[:, c], sample_weight=w) for c in present]
            assert got["auprc"][b] == pytest.approx(expected[-1] if classes == 2 else np.mean(expected)), (trial, b)
            if classes > 2:
                p, _, f, _ = precision_recall_fscore_support(y, pred, labels=range(classes), sample_weight=w,
                                                             zero_division=0)
                for c in range(classes):
                    if c in present:  # FedPerl's Tables 6-7: per-class AUPRC and AUROC, one vs rest
                        assert got[f"auprc:{c}"][b] == pytest.approx(expected[present.index(c)])
                        if len(present) > 1:
                            assert got[f"auroc:{c}"][b] == pytest.approx(roc_auc_score(y == c, probs[:, c],
                                                                                       sample_weight=w))
                    else:
                        assert np.isnan(got[f"auprc:{c}"][b]) and np.isnan(got[f"auroc:{c}"][b])
                    if ((pred == c) * w).sum():
                        assert got[f"precision:{c}"][b] == pytest.approx(p[c])
                    if ((pred == c) * w).sum() + ((y == c) * w).sum():
                        assert got[f"f1:{c}"][b] == pytest.approx(f[c])


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


def hand_ssim(a: np.ndarray, b: np.ndarray, size: int) -> float:
    """SSIM of two (C, H, W) images in [-1, 1] by a plain loop over every size x size window inside them:
    Gaussian weights of sigma 1.5 cut to the window, weighted population moments, data range 2."""
    g = np.exp(-0.5 * ((np.arange(size) - size // 2) / 1.5) ** 2)
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * 2) ** 2, (0.03 * 2) ** 2
    values = []
    for x_channel, y_channel in zip(a.astype(np.float64), b.astype(np.float64)):
        for i in range(a.shape[1] - size + 1):
            for j in range(a.shape[2] - size + 1):
                x, y = x_channel[i:i + size, j:j + size], y_channel[i:i + size, j:j + size]
                mx, my = (w * x).sum(), (w * y).sum()
                vx, vy, cxy = (w * (x - mx) ** 2).sum(), (w * (y - my) ** 2).sum(), (w * (x - mx) * (y - my)).sum()
                values.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
    return float(np.mean(values))


def image_pairs(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Smooth random images and copies under noise from none to pure: SSIMs from 1 down to about 0."""
    generator = torch.Generator().manual_seed(seed)
    a = F.avg_pool2d(torch.rand(shape, generator=generator) * 2 - 1, 3, stride=1, padding=1)
    levels = torch.linspace(0, 1, len(a)).view(-1, 1, 1, 1)
    b = ((1 - levels) * a + levels * (torch.rand(shape, generator=generator) * 2 - 1)).clamp(-1, 1)
    return a, b


@pytest.mark.parametrize("shape", [(6, 1, 24, 20), (4, 3, 16, 16)], ids=["grey", "rgb"])
def test_ssim_is_wang_et_al_as_scikit_image_computes_it(shape):
    a, b = image_pairs(shape, seed=shape[1])
    got = scores.ssim(a, b)
    assert got.dtype == torch.float32 and torch.allclose(scores.ssim(a, a), torch.ones(len(a)), atol=1e-6)
    expected = [structural_similarity(x.double().numpy(), y.double().numpy(), gaussian_weights=True, sigma=1.5,
                                      use_sample_covariance=False, data_range=2.0, channel_axis=0)
                for x, y in zip(a, b)]
    assert got.tolist() == pytest.approx(expected, abs=1e-4)
    assert expected[0] > 0.999 and expected[-1] < 0.2  # the pairs span the scale
    assert hand_ssim(a[1].numpy(), b[1].numpy(), 11) == pytest.approx(expected[1], abs=1e-9)


@pytest.mark.parametrize("height, width, window", [(9, 7, 7), (6, 10, 5), (12, 3, 3), (1, 4, 1)])
def test_an_image_smaller_than_the_window_gets_the_largest_odd_window_that_fits(height, width, window):
    a, b = image_pairs((3, 2, height, width), seed=height)
    got = scores.ssim(a, b)
    assert got.tolist() == pytest.approx([hand_ssim(x.numpy(), y.numpy(), window) for x, y in zip(a, b)], abs=1e-6)
    assert torch.allclose(scores.ssim(a, a), torch.ones(3), atol=1e-6)


@pytest.mark.parametrize("classes", [2, 7])
def test_average_precision_by_pairs_equals_it_by_sorting_with_ties_and_absent_classes(classes):
    """The two computations average_precision chooses between by size (the scikit-learn test above reads the
    pairs at its sizes)."""
    from fedcli.metrics.scores import average_precision_by_pairs, average_precision_by_sorting

    rng = np.random.default_rng(classes)
    for trial in range(10):
        n = int(rng.integers(5, 300))
        y = rng.integers(0, classes - (trial % 3 == 0), n)  # every third trial lacks the last class
        probs = rng.dirichlet(np.ones(classes), n)
        if trial % 2:
            probs = np.round(probs, 1)  # ties
        counts = np.vstack([np.ones(n), rng.multinomial(n, np.full(n, 1 / n), size=50)])
        by_pairs, by_sorting = average_precision_by_pairs(y, probs, counts), average_precision_by_sorting(y, probs, counts)
        assert by_pairs.keys() == by_sorting.keys()
        for c in by_pairs:
            np.testing.assert_allclose(by_pairs[c], by_sorting[c], rtol=0, atol=1e-12)
