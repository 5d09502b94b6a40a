"""A node's train-gan record (`gan/<node>/config.json`): which generator kind made its generators and
buffer, from which partition, and the kind's own description of them."""

from __future__ import annotations

from pathlib import Path

from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import read_json
from fedcli.experiment.paths import gan_dir

DEFAULT_KIND = "stylegan2"  # the kind of a record written before train-gan had --generator


def read_gan_config(exp: Path, manifest: Manifest, node: str) -> dict:
    """A node's GAN config.json, refused when its generators came from another partition."""
    saved = read_json(gan_dir(exp, node) / "config.json", f"GAN config of node {node} (run fedcli train-gan first)")
    if saved.get("inputs", {}).get("manifest") != manifest.content_hash:
        raise UserError(f"node {node}'s generators and buffer were made from another partition (stale manifest "
                        "hash); re-run fedcli train-gan --overwrite")
    return saved


def kind_name(saved: dict) -> str:
    """The generator kind a record's generators are."""
    return saved.get("config", {}).get("generator", DEFAULT_KIND)
