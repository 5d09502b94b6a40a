"""Phase-1 snapshot selection against the fidelity every snapshot would have given (issue 31, point 10).

Per node of a partitioned experiment: phase 1 exactly as train-gan trains it (the recipe's [train_gan]
table, the same keyed streams and FID checks), run to its iteration cap; every checked snapshot's buffer
is sampled and scored as train-gan scores the standard generator's (generators/fidelity.py, the same
classifier seeds, so the kept snapshot's number is train-gan's `ratio 1`), and read by `--select
fidelity`'s judge (its classifier on the node's training images, per class: `recalls`). The trace is then
read by the rule before issue 31 (the lowest single FID, patience counted from it) and by each rule of
fedcli/generators/stylegan2/selection.py, at the recipe's patience and (`RULE-to-cap`) with no early stop: training
until a
rule stops is the same for every rule, so each rule's kept snapshot is one of these. Prints per node the
kept iteration and fidelity ratio of each rule and the best ratio in hindsight; `--json` writes them with the
whole trace. `--reuse` takes the ratios from an earlier `--json` file instead of scoring them again (phase 1
is retrained, and its FID trace must equal the saved one), for the judge's readings alone.

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

from fedcli.core.rng import stream_seed, torch_stream
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.generators import fidelity
from fedcli.generators.stylegan2.kind import StyleGan2, architecture, node_feature_space, settings
from fedcli.generators.stylegan2.networks import Generator
from fedcli.generators.stylegan2.selection import SELECT_RULES, SnapshotSelection
from fedcli.generators.stylegan2.train import GanTrainer, standard_phase
from fedcli.pipeline.recipe import Point, Recipe


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


def by_rule(rule: str, trace: list[tuple[int, float]], patience: int, every: int,
            readings: dict[int, float]) -> tuple[int, int]:
    selection = SnapshotSelection(rule, patience, every)
    for iteration, value in trace:
        selection.check(iteration, value, readings.get(iteration, math.nan))
        if selection.exhausted:
            return selection.kept_iteration, iteration
    return selection.kept_iteration, trace[-1][0]


def node_trace(cfg, manifest: Manifest, node: str, seed: int, saved: dict | None = None) -> dict:
    """Phase 1 to its cap with every check's EMA generator; each one's buffer fidelity (from `saved`, an
    earlier output for this node, when given) and selection reading."""
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
    if saved is not None and [tuple(check) for check in saved["trace"]] != trace:
        raise SystemExit(f"seed {seed} {node}: phase 1's FID trace differs from the saved one; score it anew")
    judge = fidelity.selection_judge(cfg, manifest, node, seed, train, "cpu")
    buffers = {}
    for iteration, state in snapshots.items():
        generator = Generator(arch)
        generator.load_state_dict(state)
        buffers[iteration] = judge.buffer(generator)
    recalls = {iteration: judge.recalls(buffer) for iteration, buffer in buffers.items()}
    readings = {iteration: judge.reading(recall) for iteration, recall in recalls.items()}
    if saved is None:
        ratio, real_accuracy = scored(cfg, manifest, node, seed, train, buffers)
    else:
        ratio, real_accuracy = {int(k): v for k, v in saved["ratio"].items()}, saved["real_accuracy"]
    best = max(ratio, key=ratio.get)
    return {"node": node, "seed": seed, "patience": full.patience, "every": full.fid_every, "trace": trace,
            "ratio": ratio, "selection": readings, "recalls": recalls, "real_accuracy": real_accuracy,
            "best": [best, ratio[best]], "rules": rule_outcomes(trace, ratio, readings, full.patience, full.fid_every),
            "seconds": {"phase1": round(trained, 1), "total": round(time.perf_counter() - started, 1)}}


def scored(cfg, manifest: Manifest, node: str, seed: int, train: TensorSource,
           buffers: dict[int, TensorSource]) -> tuple[dict[int, float], float]:
    """Each snapshot's fidelity ratio as train-gan scores a buffer, and the real classifiers' accuracy."""
    test = NodeDataset(manifest, node, "test")
    scores = fidelity.score({str(k): v for k, v in buffers.items()}, train, TensorSource(test.images, test.labels),
                            fidelity.config_budget(cfg, manifest), in_channels=manifest["channels"],
                            num_classes=manifest.num_classes, seed=seed, node=node)
    return {int(k): v["ratio"] for k, v in scores.items()}, next(iter(scores.values()))["real_accuracy"]


def rule_outcomes(trace: list[tuple[int, float]], ratio: dict[int, float], readings: dict[int, float],
                  patience: int, every: int) -> dict:
    """Per rule: the kept iteration, the iterations it trained, and the kept snapshot's fidelity ratio (the
    `fidelity` rule only where the trace has the judge's readings)."""
    rules = [rule for rule in SELECT_RULES if rule != "fidelity" or readings]
    outcomes = {"lowest-single": lowest_single_fid(trace, patience, every)}
    outcomes |= {rule: by_rule(rule, trace, patience, every, readings) for rule in rules}
    outcomes |= {f"{rule}-to-cap": by_rule(rule, trace, math.inf, every, readings) for rule in rules if rule != "last"}
    return {name: {"kept": kept, "trained": last, "ratio": ratio[kept]} for name, (kept, last) in outcomes.items()}


def report(out: dict) -> str:
    rules = "  ".join(f"{name} {r['kept']}/{r['trained']} {r['ratio']:.3f}" for name, r in out["rules"].items())
    readings = {int(k): v for k, v in out.get("selection", {}).items()}
    trace = " ".join(f"{i}:{f:.0f}/{out['ratio'][i]:.2f}" + (f"/{readings[i]:.2f}" if readings else "")
                     for i, f in out["trace"])
    return (f"{out['recipe']} seed {out['seed']} {out['node']}: {rules}  best {out['best'][0]} {out['best'][1]:.3f}"
            f"\n  trace (iteration:FID/ratio{'/reading' if readings else ''}) {trace}")


def summarize(path: Path) -> None:
    """Each saved node with the rules applied again to its trace (as selection.py reads it now)."""
    for line in path.read_text().splitlines():
        out = json.loads(line)
        out["ratio"] = {int(k): v for k, v in out["ratio"].items()}
        readings = {int(k): v for k, v in out.get("selection", {}).items()}
        out["rules"] = rule_outcomes(out["trace"], out["ratio"], readings, out["patience"], out["every"])
        print(report(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path, nargs="?")
    parser.add_argument("exp", type=Path, nargs="?", help="a partitioned experiment folder (its seed is the GAN's)")
    parser.add_argument("--summarize", type=Path, help="only print the rules' choices from this --json file")
    parser.add_argument("--node", action="append", help="only these nodes (default: every node)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="append one line per node here")
    parser.add_argument("--reuse", type=Path, help="an earlier --json file of this experiment: its ratios")
    args = parser.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    torch.set_num_threads(args.threads)
    cfg = Recipe.load(args.recipe).configs(Point("", ()), args.exp)["train_gan"]
    manifest = Manifest.load(args.exp)
    seed = manifest.stage_seed(cfg.seed)
    saved = {}
    if args.reuse:
        saved = {(o["seed"], o["node"]): o for o in map(json.loads, args.reuse.read_text().splitlines())}
    for node in args.node or manifest.node_names:
        out = {"recipe": args.recipe.stem} | node_trace(cfg, manifest, node, seed, saved.get((seed, node)))
        print(report(out) + f"  ({out['seconds']['total']:.0f} s)", flush=True)
        if args.json:
            with args.json.open("a") as handle:
                handle.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
