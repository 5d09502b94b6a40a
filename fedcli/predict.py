"""`fedcli predict`: apply a federated model to a folder of new images, one CSV row per image.

New files go through the pixels path their experiment's training images took (the manifest's
size and channels; file sources through `decode_image`, array sources through the tensor resize
and channel conversion), then the evaluation code's `predict`, so a test image saved as a file
gets exactly the probabilities its metrics were computed from. A node's simulated scanner
transform is not applied: it stands in for a real scanner, and new images come from real ones.
With `skip_bad`, files that are not usable images are listed instead of ending the run. File names
that a spreadsheet would run as a formula are escaped in the CSV (`csv_text`).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedcli.core.devices import resolve_device
from fedcli.core.errors import UserError
from fedcli.data.imagefiles import IMAGE_SUFFIXES, BadImageError, decode_image, is_image_file, native_pixels
from fedcli.data.loading import CHUNK, resize, to_channels
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifact_kinds import load_module
from fedcli.experiment.artifacts import read_json, write_csv
from fedcli.experiment.config import architectures
from fedcli.experiment.paths import federate_dir
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.base import ENSEMBLE
from fedcli.federate.strategy_runs import check_node_names
from fedcli.metrics.scores import predict
from fedcli.models.classifier import build_classifier
from fedcli.predict_scoring import class_groups, folder_labels, grouped, scores

GROUP_PREFIX = "p_group:"  # --group: a group's probability column
ARRAY_SOURCES = {"digits", "medmnist"}  # trained from in-memory arrays, resized as float tensors
# OWASP's CSV injection list, plus the escape itself so that dropping one leading ' always undoes it
ESCAPED_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")


@dataclasses.dataclass
class Prediction:
    out: Path
    strategy: str
    model: str  # a node name, "ensemble", "global" or "central"
    frame: pd.DataFrame
    skipped: list[tuple[str, str]]  # (file relative to --data-dir, why), with --skip-bad

    scores: pd.DataFrame | None = None  # --labels-from-folders: the metrics against the folders' labels
    scores_out: Path | None = None

    def summary(self) -> str:
        grouped = "group_predicted" in self.frame
        counts = Counter(self.frame["group_predicted" if grouped else "predicted"])
        labels = [c[len(GROUP_PREFIX if grouped else "p_"):] for c in self.frame.columns
                  if c.startswith(GROUP_PREFIX if grouped else "p_") and (grouped or not c.startswith(GROUP_PREFIX))]
        per_label = ", ".join(f"{name}: {counts[name]}" for name in labels if counts[name])
        skipped = f"; skipped {len(self.skipped)} unusable files" if self.skipped else ""
        scored = ""
        if self.scores is not None:
            shown = self.scores.set_index("metric").loc[["accuracy", "f1_macro", "auroc"]]
            scored = "; " + ", ".join(f"{m} {r.value:.3f} [{r.lo:.3f}, {r.hi:.3f}]" for m, r in shown.iterrows())
        return (f"predicted {len(self.frame)} images with {self.strategy} ({self.model}): {per_label}{skipped}"
                f"{scored}")


def run(exp: Path, strategy: str, data_dir: Path, node: str | None = None, ensemble: bool = False,
        out: Path | None = None, device: str = "auto", batch: int = 64, skip_bad: bool = False,
        groups: list[str] = (), labels_from_folders: bool = False) -> Prediction:
    """`groups`, `labels_from_folders`: an unseen labelled set scored, its classes merged (predict_scoring.py)."""
    if node is not None and ensemble:
        raise UserError("--node and --ensemble exclude each other; pass one of them")
    REGISTRY[strategy]  # an unknown name is refused here
    exp = Path(exp)
    manifest = Manifest.load(exp)
    check_node_names(exp, manifest)
    folder = federate_dir(exp, strategy)
    default, own = architectures(federate_model(exp, folder, strategy, manifest))
    tag, keys = choose_models(folder, strategy, manifest, node, ensemble)
    merged = class_groups(list(groups), manifest["label_names"])
    root, files = image_files(data_dir)
    if labels_from_folders:  # a misplaced file is named before any image is classified
        folder_labels([f.relative_to(root).as_posix() for f in files], list(merged) or manifest["label_names"])
    device = resolve_device(device)
    models = [load_model(folder / "models" / f"{key}.safetensors", f"model {key} of {strategy}",
                         own.get(key, default), manifest, device) for key in keys]
    names, probs, skipped = classify(models, manifest, root, files, device, batch, skip_bad)
    frame = table(names, probs, manifest["label_names"])
    scored_probs, scored_names = (grouped(probs, merged), list(merged)) if merged else (probs, manifest["label_names"])
    if merged:
        frame["group_predicted"] = [scored_names[i] for i in scored_probs.argmax(axis=1)]
        for g, name in enumerate(scored_names):
            frame[f"{GROUP_PREFIX}{name}"] = scored_probs[:, g]
    found = scores(names, scored_probs, scored_names, root.name) if labels_from_folders else None
    out = Path(out) if out is not None else exp / "predict" / f"{strategy}_{tag}.csv"
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give a file name such as {out / 'predictions.csv'}")
    scores_out = out.with_name(f"{out.stem}_scores.csv") if found is not None else None
    try:
        write_csv(out, frame)
        if found is not None:
            write_csv(scores_out, found)
    except OSError as exc:
        raise UserError(f"cannot write {out} ({exc.strerror or exc}); choose another --out") from exc
    return Prediction(out, strategy, tag, frame, skipped, found, scores_out)


def federate_model(exp: Path, folder: Path, strategy: str, manifest: Manifest) -> list[str] | str:
    """The --model entries the strategy was trained with, after checking it was trained on this partition."""
    if not (folder / "config.json").is_file():
        done = sorted(p.name for p in folder.parent.glob("*") if (p / "config.json").is_file())
        have = f"federated strategies: {', '.join(done)}" if done else "no strategy has been federated yet"
        raise UserError(f"no federate results for strategy {strategy} in {exp} ({have}); run fedcli federate "
                        f"--exp {exp} --strategy {strategy} first")
    meta = read_json(folder / "config.json", f"config of strategy {strategy}")
    meta = meta if isinstance(meta, dict) else {}
    config = meta.get("config")
    if meta.get("stage") != "federate" or not isinstance(config, dict) or "model" not in config:
        raise UserError(f"{folder / 'config.json'} is not a federate config; re-run fedcli federate --strategy "
                        f"{strategy} --overwrite")
    if (meta.get("inputs") or {}).get("manifest") != manifest.content_hash:
        raise UserError(f"strategy {strategy} was trained on an earlier partition of {exp}; re-run fedcli federate "
                        f"--exp {exp} --strategy {strategy} --overwrite")
    return config["model"]


def choose_models(folder: Path, strategy: str, manifest: Manifest, node: str | None,
                  ensemble: bool) -> tuple[str, list[str]]:
    """(output tag, model keys): the shared model by default; a node's, or every node's for the ensemble."""
    keys = sorted(p.name.removesuffix(".safetensors") for p in (folder / "models").glob("*.safetensors")
                  if not p.name.startswith("."))
    if not keys:
        raise UserError(f"no models in {folder / 'models'}; re-run fedcli federate --strategy {strategy} --overwrite")
    node_keys = [n for n in manifest.node_names if n in keys]  # partition order, as evaluation averages
    if ensemble:
        if len(node_keys) < 2:
            raise UserError(f"--ensemble averages node models, but {strategy} has only {', '.join(keys)}; "
                            "drop --ensemble")
        return ENSEMBLE, node_keys
    if node is not None:
        if node not in keys:
            raise UserError(f"{strategy} has no model {node!r}; choose --node from {', '.join(keys)}")
        return node, [node]
    shared = [k for k in REGISTRY.shared_model_keys() if k in keys]
    if shared or len(keys) == 1:
        return (shared or keys)[0], [(shared or keys)[0]]
    raise UserError(f"{strategy} has one model per node; pass --node with one of {', '.join(keys)}, or --ensemble")


def image_files(data_dir: Path) -> tuple[Path, list[Path]]:
    """Every image under the folder (the suffixes partition reads), sorted by relative path."""
    root = Path(data_dir)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise UserError(f"--data-dir {root} {what}; point it at a folder of images")
    files = sorted((p for p in root.rglob("*") if is_image_file(p)), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise UserError(f"no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) under {root}; point --data-dir at "
                        "a folder of images")
    return root, files


def load_model(path: Path, what: str, name: str, manifest: Manifest, device: str) -> nn.Module:
    """A trained classifier in eval mode; the weights come only from safetensors (no pickle), checked as
    their artifact kind says (recorded bytes and sha256, finite values, the classifier's shapes)."""
    model = build_classifier(name, manifest["channels"], manifest.num_classes, init_seed=0)
    load_module(model, path, what, "re-run fedcli federate --overwrite", unfit=f"it is not a {name} with "
                f"{manifest['channels']} channels and {manifest.num_classes} classes")
    return model.to(device).eval()


def mean_probs(models: list[nn.Module], images: torch.Tensor, device: str, batch: int) -> np.ndarray:
    """Softmax probabilities; for several models their mean, as evaluation computes the ensemble."""
    probs = [predict(model, images, device, batch) for model in models]
    return probs[0] if len(probs) == 1 else np.mean(probs, axis=0)


def classify(models: list[nn.Module], manifest: Manifest, root: Path, files: list[Path], device: str, batch: int,
             skip_bad: bool) -> tuple[list[str], np.ndarray, list[tuple[str, str]]]:
    """(names of the files classified, their probabilities, (name, why) of the files skipped).

    A file that is not a usable image ends the run, or with `skip_bad` is skipped.
    """
    names, probs, skipped = [], [], []
    for start in range(0, len(files), CHUNK):
        chunk, images = files[start:start + CHUNK], []
        for path, image in zip(chunk, load_batch(manifest, chunk)):
            name = path.relative_to(root).as_posix()
            if not isinstance(image, BadImageError):
                names.append(name)
                images.append(image)
            elif skip_bad:
                skipped.append((name, image.reason))
            else:
                raise UserError(f"image {path} {image.reason}; replace or delete it, or pass --skip-bad to list "
                                "such files and go on") from image
        if images:
            probs.append(mean_probs(models, torch.from_numpy(np.stack(images)), device, batch))
    if not names:
        first, why = skipped[0]
        raise UserError(f"none of the {len(files)} image files under {root} is usable (first: {first} {why}); "
                        "fix them or point --data-dir elsewhere")
    return names, np.concatenate(probs), skipped


def load_batch(manifest: Manifest, paths: list[Path]) -> list[np.ndarray | BadImageError]:
    """Each file as a (C, S, S) uint8 image, or the reason it is not one; decoded in threads (PIL
    releases the GIL), in order."""
    def attempt(path: Path) -> np.ndarray | BadImageError:
        try:
            return decode(manifest, path)
        except BadImageError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(attempt, paths))


def decode(manifest: Manifest, path: Path) -> np.ndarray:
    """(C, S, S) uint8, as `fedcli.data.loading` makes a training image of this experiment's source."""
    size, channels = manifest["image_size"], manifest["channels"]
    if manifest["source"] not in ARRAY_SOURCES:
        return decode_image(path, size, channels, manifest.scale, manifest.data.get("preprocess", "none"))
    native = torch.tensor(native_pixels(path, manifest.scale))
    native = (native.float().div(255) if native.dtype == torch.uint8 else native).unsqueeze(0)
    images = to_channels(resize(native, size), channels)
    return images[0].mul(255).round_().clamp_(0, 255).to(torch.uint8).numpy()


def csv_text(value: str) -> str:
    """A cell a spreadsheet shows as text: one starting like a formula gets a leading `'` (OWASP)."""
    return "'" + value if value.startswith(ESCAPED_STARTS) else value


def table(files: list[str], probs: np.ndarray, label_names: list[str]) -> pd.DataFrame:
    pred = probs.argmax(axis=1)
    columns = {"file": [csv_text(f) for f in files], "predicted": [label_names[i] for i in pred],
               "predicted_index": pred}
    columns |= {f"p_{name}": probs[:, c] for c, name in enumerate(label_names)}
    return pd.DataFrame(columns)
