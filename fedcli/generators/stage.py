"""The `train-gan` stage: per node, train the chosen kind of generator (fedcli/generators/registry.py), sample the
buffer it shares, score the buffer's fidelity, write the node's folder.

Writes `<exp>/gan/<node>/`: the kind's generator files (generator.safetensors: the released generator;
generator_phase1.safetensors: the standard one; generator_control.safetensors: its compute-matched control;
StyleGAN adds its audit controls, fedcli/generators/stylegan2/kind.py), buffer.safetensors, metrics.csv, samples.png
and config.json (the kind's record, metric names, provenance). Each node folder is staged and renamed into
place when complete; each FID check is logged as it comes, in `<exp>/logs/train-gan/events.jsonl`.
"""

from __future__ import annotations

from fedcli.core import console
from fedcli.core.devices import with_threads
from fedcli.data.manifest import Manifest
from fedcli.experiment.locking import locked
from fedcli.experiment.paths import gan_dir
from fedcli.generators import fidelity
from fedcli.generators.config import GanConfig
from fedcli.generators.node_training import run_nodes


@with_threads
def run(cfg: GanConfig, keep_finished: bool = False) -> list[dict]:
    """Train (or, with sample_only, re-sample) the chosen nodes; return one summary per node. `keep_finished`
    (`fedcli run` after an interruption): a node whose folder this same config made, intact and from this
    partition, is kept rather than retrained (a node's training does not depend on the others')."""
    if cfg.engine == "distributed":
        from fedcli.generators import distributed  # torch.distributed's machinery only when asked for

        summaries = distributed.run(cfg, keep_finished)
    else:
        manifest = Manifest.load(cfg.exp)
        nodes = manifest.chosen(cfg.node)
        with locked(cfg.exp, [gan_dir(cfg.exp, node) for node in nodes]):
            summaries = run_nodes(cfg, manifest, nodes, keep_finished)
    warn_low_fidelity(summaries)
    return summaries


def warn_low_fidelity(summaries: list[dict]) -> None:
    """One warning line naming every node whose released buffer was flagged (fidelity.shortfalls)."""
    named = []
    for s in summaries:
        f = s.get("fidelity") or {}
        flags = f.get("flags", [])
        if fidelity.BELOW_CHANCE in flags:
            named.append(f"node {s['node']}'s fidelity ratio {f['ratio']:.3f} is at or below chance "
                         f"({f['floor']:.3f}: always answering the most frequent class)")
        if fidelity.BELOW_CONTROL in flags:
            named.append(f"node {s['node']}'s fidelity ratio {f['ratio']:.3f} is below its control's "
                         f"{f['control']['ratio']:.3f} beyond the score's 95% interval (+-{f['control_margin']:.3f})")
    if named:
        console.warn(f"released buffers that may cost accuracy when replayed: {'; '.join(named)}; look at their "
                     "samples.png, train longer (--iterations) or, below the control, lower --alpha")


