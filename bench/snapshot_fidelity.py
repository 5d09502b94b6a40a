"""Phase-1 snapshot selection against the fidelity every snapshot would have given (issue 31, point 10).

Per node of a partitioned experiment: phase 1 exactly as train-gan trains it (the recipe's [train_gan]
table, the same keyed streams and FID checks), run to its iteration cap; every checked snapshot's buffer
is sampled and scored as train-gan scores the standard generator's (gan/fidelity.py, the same
classifier seeds, so the kept snapshot's number is train-gan's `ratio 1`). The FID trace is then read by
the rule before issue 31 (the lowest single FID, patience counted from it) and by each rule of
fedcli/gan/selection.py, at the recipe's patience and (`RULE-to-cap`) with no early stop: training until a
rule stops is the same for every rule, so each rule's kept snapshot is one of these. Prints per node the kept
iteration and fidelity ratio of each rule and the best ratio in hindsight; `--json` writes them with the whole trace.

Run after `fedcli partition --config RECIPE --exp EXP --seed S`:
    .venv/bin/python bench/snapshot_fidelity.py recipes/pneumonia.toml EXP --threads 1 --json out.jsonl
and read the rules again from the saved traces (no training) with
    .venv/bin/python bench/snapshot_fidelity.py --summarize out.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.gan import fidelity
from fedcli.gan.networks import Generator
from fedcli.gan.selection import SELECT_RULES, SnapshotSelection
from fedcli.gan.stylegan2 import StyleGan2, architecture, node_feature_space, settings
from fedcli.gan.train import GanTrainer, standard_phase
from fedcli.pipeline.recipe import Point, Recipe
from fedcli.replay.buffer import sample_buffer
from fedcli.rng import stream_seed, torch_stream


def lowest_single_fid(trace: list[tuple[int, float]], patience: int, every: int) -> tuple[int, int]:
    """The rule before issue 31: the lowest FID of any one check; stop after `patience` iterations without
    a lower one. Returns (kept iteration, last iteration trained)."""
    best, kept, since = math.inf, 0, 0
    for iteration, value in trace:
        if value < best:
            best, kept, since = value, iteration, 0
        else:
            since += every
        if since >= patience:
            return kept, iteration
    return kept, trace[-1][0]


def by_rule(rule: str, trace: list[tuple[int, float]], patience: int, every: int) -> tuple[int, int]:
    selection = SnapshotSelection(rule, patience, every)
    for iteration, value in trace:
        selection.check(iteration, value)
        if selection.exhausted:
            return selection.kept_iteration, iteration
    return selection.kept_iteration, trace[-1][0]


def node_trace(cfg, manifest: Manifest, node: str, seed: int) -> dict:
    """Phase 1 to its cap with every check's EMA generator; each one's buffer fidelity."""
    started = time.perf_counter()
    arch = architecture(cfg, manifest)
    shared = StyleGan2().trainer(cfg, manifest, [node], seed, "cpu")
    data = NodeDataset(manifest, node, "train")
    train = TensorSource(data.images, data.labels)
    features = shared.inception or node_feature_space(cfg, manifest, node, seed, train, "cpu")
    full = dataclasses.replace(settings(cfg, arch.resolution), select="last")
    trainer = GanTrainer(arch, full, to_float(data.images), data.labels, shared.perceptual, features,
                         torch_stream(seed, node, "train-gan"), init_seed=stream_seed(seed, node, "gan-init"))
    snapshots: dict[int, dict] = {}
    trace: list[tuple[int, float]] = []

    def log(row: dict) -> None:
        if "fid" in row:
            trace.append((row["iteration"], row["fid"]))
            snapshots[row["iteration"]] = {k: v.clone() for k, v in trainer.G_ema.state_dict().items()}

    standard_phase(trainer, log)
    trained = time.perf_counter() - started
    classes = sorted({r["label"] for r in manifest.records(node, "train")})
    buffers = {}
    for iteration, state in snapshots.items():
        generator = Generator(arch)
        generator.load_state_dict(state)
        buffers[str(iteration)] = TensorSource(*sample_buffer(generator, classes, cfg.buffer_size, seed, node, "cpu",
                                                              cfg.truncation))
    test = NodeDataset(manifest, node, "test")
    scores = fidelity.score(buffers, train, TensorSource(test.images, test.labels),
                            fidelity.config_budget(cfg, manifest), in_channels=manifest["channels"],
                            num_classes=manifest.num_classes, seed=seed, node=node)
    ratio = {int(k): v["ratio"] for k, v in scores.items()}
    best = max(ratio, key=ratio.get)
    return {"node": node, "seed": seed, "patience": full.patience, "every": full.fid_every, "trace": trace,
            "ratio": ratio, "real_accuracy": scores[str(best)]["real_accuracy"], "best": [best, ratio[best]],
            "rules": rule_outcomes(trace, ratio, full.patience, full.fid_every),
            "seconds": {"phase1": round(trained, 1), "total": round(time.perf_counter() - started, 1)}}


def rule_outcomes(trace: list[tuple[int, float]], ratio: dict[int, float], patience: int, every: int) -> dict:
    """Per rule: the kept iteration, the iterations it trained, and the kept snapshot's fidelity ratio."""
    rules = {"lowest-single": lowest_single_fid(trace, patience, every)}
    rules |= {rule: by_rule(rule, trace, patience, every) for rule in SELECT_RULES}
    rules |= {f"{rule}-to-cap": by_rule(rule, trace, math.inf, every) for rule in SELECT_RULES if rule != "last"}
    return {name: {"kept": kept, "trained": last, "ratio": ratio[kept]} for name, (kept, last) in rules.items()}


def report(out: dict) -> str:
    rules = "  ".join(f"{name} {r['kept']}/{r['trained']} {r['ratio']:.3f}" for name, r in out["rules"].items())
    trace = " ".join(f"{i}:{f:.0f}/{out['ratio'][i]:.2f}" for i, f in out["trace"])
    return (f"{out['recipe']} seed {out['seed']} {out['node']}: {rules}  best {out['best'][0]} {out['best'][1]:.3f}"
            f"\n  trace (iteration:FID/ratio) {trace}")


def summarize(path: Path) -> None:
    """Each saved node with the rules applied again to its trace (as selection.py reads it now)."""
    for line in path.read_text().splitlines():
        out = json.loads(line)
        out["ratio"] = {int(k): v for k, v in out["ratio"].items()}
        out["rules"] = rule_outcomes(out["trace"], out["ratio"], out["patience"], out["every"])
        print(report(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path, nargs="?")
    parser.add_argument("exp", type=Path, nargs="?", help="a partitioned experiment folder (its seed is the GAN's)")
    parser.add_argument("--summarize", type=Path, help="only print the rules' choices from this --json file")
    parser.add_argument("--node", action="append", help="only these nodes (default: every node)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="append one line per node here")
    args = parser.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    torch.set_num_threads(args.threads)
    cfg = Recipe.load(args.recipe).configs(Point("", ()), args.exp)["train_gan"]
    manifest = Manifest.load(args.exp)
    seed = manifest.stage_seed(cfg.seed)
    for node in args.node or manifest.node_names:
        out = {"recipe": args.recipe.stem} | node_trace(cfg, manifest, node, seed)
        print(report(out) + f"  ({out['seconds']['total']:.0f} s)", flush=True)
        if args.json:
            with args.json.open("a") as handle:
                handle.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
