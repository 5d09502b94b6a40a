"""Audit figures: distance histograms (the study's Fig. 3), projection pairs (Fig. 4), the buffer's
nearest real images, and ROC curves of the membership attack."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedcli.experiment.plotting import pyplot, save_figure

LABELS = {"standard": "standard GAN (phase 1)", "control": "control (phase 2 at alpha 0)",
          "privacy": "privacy-preserving GAN (phase 2)", "reference": "reference GAN (without the members)",
          "buffer": "nearest buffer image"}  # a kind with no latent: the released buffer is attacked


def to_display(images: torch.Tensor) -> np.ndarray:
    """[-1, 1] (N, C, H, W) -> uint8 (N, H, W[, C])."""
    array = ((images.detach().cpu().clamp(-1, 1) + 1) * 127.5).round().byte().numpy()
    return array[:, 0] if array.shape[1] == 1 else array.transpose(0, 2, 3, 1)


def image_rows(path: Path, rows: list[tuple[str, np.ndarray]], title: str) -> None:
    plt = pyplot()
    columns = max(len(r) for _, r in rows)
    fig, axes = plt.subplots(len(rows), columns, figsize=(1.1 * columns + 1.5, 1.2 * len(rows) + 0.4), dpi=90,
                             squeeze=False)
    for (name, images), line in zip(rows, axes):
        for k, axis in enumerate(line):
            axis.set_axis_off()
            if k < len(images):
                axis.imshow(images[k], cmap="gray", vmin=0, vmax=255)
        line[0].set_title(name, fontsize=8, loc="left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def histogram(path: Path, frame: pd.DataFrame, node: str, network: str, effect: dict) -> None:
    """Members' projection distances under the control and privacy generators (the study's Fig. 3), the
    paired effect in the title."""
    plt = pyplot()
    members = frame[(frame.member == 1) & frame.generator.isin(["control", "privacy"])]
    fig, axis = plt.subplots(figsize=(6, 3.5), dpi=90)
    bins = np.histogram_bin_edges(members.lpips, bins=30)
    for name, group in members.groupby("generator", sort=False):
        axis.hist(group.lpips, bins=bins, alpha=0.55, label=f"{LABELS[name]} (mean {group.lpips.mean():.4f})")
    axis.set_xlabel(f"projection LPIPS [{network}] of member images")
    axis.set_ylabel("images")
    axis.set_title(f"{node}: how close each generator gets to its training images\npaired privacy/control ratio "
                   f"{effect['median_ratio']:.3f} (95% CI {effect['ci_low']:.3f}-{effect['ci_high']:.3f}, "
                   f"p = {effect['p_value']:.2g}): {effect['verdict']}", fontsize=8)
    axis.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def pairs(path: Path, members: torch.Tensor, reconstructions: dict[str, torch.Tensor], node: str, what: str,
          n: int = 8) -> None:
    rows = [("real (member)", to_display(members[:n]))]
    rows += [(LABELS[name], to_display(images[:n])) for name, images in reconstructions.items()]
    image_rows(path, rows, f"{node}: real images and their {what}")


def nearest(path: Path, buffer: torch.Tensor, reals: torch.Tensor, distances: torch.Tensor, index: torch.Tensor,
            node: str, n: int = 8) -> None:
    """The n buffer images closest to any real image, above their nearest real image."""
    order = torch.argsort(distances)[:n]
    rows = [("buffer (closest first)", to_display(buffer[order])), ("nearest real", to_display(reals[index[order]]))]
    image_rows(path, rows, f"{node}: shared buffer images nearest to real ones (LPIPS "
               + ", ".join(f"{d:.3f}" for d in distances[order].tolist()) + ")")


def roc(path: Path, frame: pd.DataFrame, node: str, score: str = "projection LPIPS") -> None:
    from sklearn.metrics import roc_auc_score, roc_curve

    plt = pyplot()
    fig, axis = plt.subplots(figsize=(4, 4), dpi=90)
    for name, group in frame.groupby("generator", sort=False):
        fpr, tpr, _ = roc_curve(group.member, -group.lpips)
        axis.plot(fpr, tpr, label=f"{LABELS[name]}: AUROC {roc_auc_score(group.member, -group.lpips):.3f}")
    axis.plot([0, 1], [0, 1], "k:", lw=1)
    axis.set_xlabel("false positive rate")
    axis.set_ylabel("true positive rate")
    axis.set_title(f"{node}: membership inference (score = -{score})", fontsize=8)
    axis.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path)
