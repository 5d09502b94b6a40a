"""`fedcli run`: a recipe's stages in order into one experiment folder, skipping what is up to date.

Units of work: partition, train-gan, one model-selection unit per (grid point, strategy), one
federate unit per strategy, audit-privacy, and the report. A unit runs when its fingerprint
(config + upstream fingerprints, see ledger.py) is new or its outputs changed since; otherwise
it is skipped. Sub-experiments of a sweep live in `<exp>/runs/<key=value,...>/`; a unit whose
fingerprint another sub-experiment already has is not rerun but linked (relative symlink), so a
buffer-size sweep trains the GANs once; a StyleGAN train-gan whose phase 1 an earlier sub-experiment trained
(another alpha) starts from that one's (`train-gan --phase1-from`), so an alpha sweep trains phase 1 once.

A dry run (`fedcli run --dry-run`) walks the same units and says what each would do, writing nothing
and taking no lock. A federate unit after a [select] grid that would run is named without its
fingerprint: the grid point it trains with is known only once the grid has run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedcli.audit.shared_attacks import may_share
from fedcli.core import console
from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.data.partition import rules_of
from fedcli.experiment.artifacts import write_json
from fedcli.experiment.config import ATTACK_OPTIONS, LOWER_IS_BETTER, METRIC_COLUMNS, settled, to_json
from fedcli.experiment.locking import locked
from fedcli.experiment.paths import PHASE1_STATE, check_experiment_folder, gan_dir
from fedcli.experiment.subexperiments import key_values
from fedcli.federate.config import FederateConfig, inapplicable, resolved_options
from fedcli.federate.strategies import REGISTRY
from fedcli.generators.config import GAN_ENGINE_OPTIONS
from fedcli.generators.registry import generator_kind, own_options
from fedcli.generators.stylegan2.phase1_state import phase1_options
from fedcli.pipeline.ledger import Ledger, fingerprint
from fedcli.pipeline.recipe import NOT_FINGERPRINTED, SEED_OPTION, Point, Recipe, RunOptions
from fedcli.pipeline.shipped import locate

REGIME_FILE = "regime.json"  # <exp>/regime/: the [regime] sweep's readings and choice


def prepared(recipe: Path, given: RunOptions) -> tuple[Recipe, Path]:
    """The recipe (a file, or a shipped recipe's name) with `--set` and `--threads` applied, and its experiment
    folder (default: results/<recipe name>): what `fedcli run` and fedcli.api.run start from."""
    path = locate(recipe)
    exp = given.exp if given.exp is not None else Path("results") / path.stem
    check_experiment_folder(exp)
    return Recipe.load(path, list(given.set), given.threads), exp


class Runner:
    def __init__(self, recipe: Recipe, exp: Path, dry_run: bool = False):
        self.recipe, self.exp, self.dry_run = recipe, Path(exp), dry_run
        self.owners: dict[str, Path] = {}  # fingerprint -> the folder holding that unit's output
        self.statuses: Counter[str] = Counter()  # ran, skipped, shared (in a dry run: would be)
        self.fingerprints: list[str] = []
        self.pending: set[str] = set()  # a dry run's units that would run, so their outputs cannot be read yet
        self.partitioned: dict[Path, tuple[dict[str, Any], str, bool]] = {}  # folder -> Runner.partition's answer
        self.phase1_owners: dict[str, Path] = {}  # phase 1's fingerprint -> the first folder that trains it

    @property
    def report_config(self):
        return self.recipe.configs(self.recipe.points()[0], self.exp)["report"]

    def run(self) -> Counter[str]:
        """Every unit, with the whole experiment locked (a second `fedcli run` on it is refused at once)."""
        with contextlib.nullcontext() if self.dry_run else locked(self.exp, [self.exp]):
            if not self.recipe.regime and not self.dry_run:
                remove(self.exp / "regime")  # a regime the recipe no longer asks for must not linger in the report
            if self.recipe.regime and not self.choose_regime():
                return self.statuses
            points = self.recipe.points()
            for point in points:  # an infeasible sub-experiment is refused before the first one trains
                self.check_point(point)
            for point in points:
                self.run_point(point)
            if not self.dry_run:
                self.prune_points([p.name for p in points])
            report = self.report_config
            fp = fingerprint("report", plain(report), self.fingerprints)
            remade = bool(self.statuses["ran"])  # an input was remade (or would be): the report is redrawn
            self.unit(self.exp, "", "report", fp, "report", lambda: report_run(report), stale=remade)
        return self.statuses

    def point_folder(self, point: Point) -> Path:
        return self.exp / "runs" / point.name if point.name else self.exp

    def partition(self, point: Point, folder: Path) -> tuple[dict[str, Any], str, bool]:
        """The sub-experiment's partition unit, run once: its configs, its fingerprint and whether its output is
        there to read."""
        if folder in self.partitioned:
            return self.partitioned[folder]
        if not self.dry_run:
            folder.mkdir(parents=True, exist_ok=True)
            Ledger(folder).set_point([list(v) for v in point.values])
        cfgs = self.recipe.configs(point, folder)
        part = cfgs["partition"]
        p_fp = fingerprint("partition", plain(part) | rules_of(part), [])
        there = self.unit(folder, point.name, "partition", p_fp, "partition",
                          lambda: stage_run("fedcli.data.partition", part, reserved=REGISTRY.reserved_names()))
        self.partitioned[folder] = cfgs, p_fp, there
        return cfgs, p_fp, there

    def needs_generators(self, point: Point, strategies: tuple[str, ...], regime: bool) -> bool:
        return regime or self.recipe.asks_for_generators(point) or any(REGISTRY[s].needs_buffers for s in strategies)

    def check_point(self, point: Point) -> None:
        """Partition the sub-experiment and refuse what its train-gan would refuse (a DP plan no noise can meet,
        options its generator kind does not read, ...) without training."""
        from fedcli.generators.node_training import preflight

        cfgs, p_fp, there = self.partition(point, self.point_folder(point))
        if not there or not self.needs_generators(point, cfgs["federate"].strategy, False):
            return
        try:  # a dry run links no shared partition: read the one it would link
            preflight(dataclasses.replace(cfgs["train_gan"], exp=self.owners[p_fp].parent))
        except UserError as exc:
            raise UserError(f"{point.name + ': ' if point.name else ''}train-gan would refuse this (checked before "
                            f"anything trains): {exc}") from None

    def run_point(self, point: Point, folder: Path | None = None, regime: bool = False) -> bool:
        """One sub-experiment's units (`regime`: a [regime] setting's: partition, train-gan and the generator audit
        only). Returns whether the generator audit's output is there to read."""
        folder = folder or self.point_folder(point)
        cfgs, p_fp, _ = self.partition(point, folder)
        part, gan, fed, audit = (cfgs[t] for t in ("partition", "train_gan", "federate", "audit"))
        strategies = () if regime else fed.strategy
        if not self.dry_run:
            self.prune_point(folder, strategies, audit.shared and not regime)
        generators = self.needs_generators(point, strategies, regime)
        g_fp = fingerprint("train-gan", plain(gan, GAN_ENGINE_OPTIONS), [p_fp])
        if generators:
            gan = self.shared_phase1(gan, folder, p_fp)
            self.unit(folder, point.name, "train-gan", g_fp, "gan",
                      lambda: stage_run("fedcli.generators.stage", gan, keep_finished=True))
        federated: list[str] = []  # the fingerprints of the federations an attack on shared data may read
        for strategy in strategies:
            upstream = [p_fp, g_fp] if REGISTRY[strategy].needs_buffers else [p_fp]
            chosen, select_fps = self.select(folder, point.name, fed, strategy, upstream, part.folds)
            if chosen is None:
                self.statuses["ran"] += 1
                console.out.print(f"{point.name + ': ' if point.name else ''}federate {strategy}: would run, with the "
                                  "grid point model selection picks", soft_wrap=True)
                continue
            cfg = dataclasses.replace(fed, strategy=(strategy,), **chosen)
            fp = fingerprint(f"federate:{strategy}", federate_key(cfg), upstream + select_fps)
            if may_share(strategy):
                federated.append(fp)
            self.unit(folder, point.name, f"federate {strategy}", fp, f"federate/{strategy}",
                      lambda cfg=cfg: federate_run(cfg))
        if audit.shared and not regime and federated:
            fp = fingerprint("audit-privacy --shared", {k: v for k, v in plain(audit).items()
                                                        if k in ATTACK_OPTIONS | {"node", "seed", "lpips_weights"}},
                             [p_fp, *federated])
            self.unit(folder, point.name, "audit-privacy --shared", fp, "attacks", lambda: attacks_run(audit))
        if not generators:
            console.out.print(f"{point.name + ': ' if point.name else ''}train-gan and audit-privacy: not run, no "
                              "strategy reads a buffer and the recipe sets no [train_gan] or [audit]", soft_wrap=True,
                              markup=False)
            return False
        if not getattr(generator_kind(gan.generator), "projectable", True):  # audited by its buffer alone
            if regime:
                raise UserError(f"[regime] reads the alpha-0 control's membership, which a {gan.generator} generator "
                                "has none of; use train_gan.generator = \"stylegan2\" there")
            if not self.recipe.sets(point, "audit"):
                console.out.print(f"{point.name + ': ' if point.name else ''}audit-privacy: not run, a "
                                  f"{gan.generator} generator is audited by its buffer where the recipe sets [audit]",
                                  soft_wrap=True, markup=False)
                return False
        a_fp = fingerprint("audit-privacy", plain(audit, ATTACK_OPTIONS), [p_fp, g_fp])
        return self.unit(folder, point.name, "audit-privacy", a_fp, "audit",
                         lambda: stage_run("fedcli.audit.stage", dataclasses.replace(audit, shared=False)))

    def shared_phase1(self, gan, folder: Path, p_fp: str):
        """`gan`, starting from the phase 1 of the first sub-experiment that trains it with the same options up to
        phase 2 (generators/stylegan2/phase1_state.py), where that one kept it for every node."""
        if "phase1_from" not in own_options(generator_kind(gan.generator)) or gan.private or self.dry_run:
            return gan
        owner = self.phase1_owners.setdefault(fingerprint("train-gan phase 1", phase1_options(gan), [p_fp]), folder)
        if owner == folder or not all((gan_dir(owner, node) / PHASE1_STATE).is_file()
                                      for node in Manifest.load(folder).node_names):
            return gan
        return dataclasses.replace(gan, phase1_from=owner)

    def prune_point(self, folder: Path, strategies: tuple[str, ...], shared: bool) -> None:
        """Outputs of a sub-experiment that its recipe no longer makes go."""
        nodes = set(Manifest.load(folder).node_names)
        for stage_dir in ("gan", "audit"):  # a node an earlier partition had must not linger in the report
            prune(folder / stage_dir, keep=nodes)
        prune(folder / "federate", keep=set(strategies) | {"cv"})
        prune(folder / "attacks", keep=set(strategies) if shared else set())
        prune(folder / "select", keep={key_values(v.items()) for s in strategies for v in self.recipe.grid(s)}
              if self.recipe.select else set())

    def choose_regime(self) -> bool:
        """The [regime] grid's settings in order, each partitioned, trained and audited in `<exp>/regime/<name>`,
        until one meets the rule (audit/regime.py); its values then hold for every sub-experiment. Returns False when
        a dry run cannot know the choice yet; raises when no setting meets the rule, after saying so in
        `<exp>/regime/regime.json`."""
        from fedcli.audit.regime import outcome, readings

        rule, points = self.recipe.regime["rule"], self.recipe.regime_points()
        swept: list[tuple[str, list[dict]]] = []
        for point in points:
            folder = self.exp / "regime" / point.name
            if not self.run_point(point, folder, regime=True):
                console.out.print("regime: the sub-experiments wait on the regime's choice", soft_wrap=True)
                return False
            swept.append((point.name, readings(folder / "audit", Manifest.load(folder).node_names)))
            if rule.met(swept[-1][1]):
                break
        result = outcome(swept, rule, len(points))
        console.out.print(result["said"], soft_wrap=True, markup=False)
        if not self.dry_run:
            prune(self.exp / "regime", keep={p.name for p in points} | {REGIME_FILE})
            write_json(self.exp / "regime" / REGIME_FILE, result)
        if result["chosen"] is None:
            raise UserError(f"{result['said']}: the methods would be compared where nothing leaks; widen [regime] "
                            f"(fewer images per node, more iterations), see {self.exp / 'regime' / REGIME_FILE}")
        chosen = next(p for p in points if p.name == result["chosen"]).values
        self.recipe = self.recipe.with_values(tuple(v for v in chosen if v[:2] != SEED_OPTION))  # not its seed
        return True

    def select(self, folder: Path, label: str, fed: FederateConfig, strategy: str, upstream: list[str],
               partition_folds: int) -> tuple[dict[str, Any] | None, list[str]]:
        """Model selection: the grid point with the best mean validation score over K train folds (None in a dry
        run where a grid point would run first)."""
        grid = self.recipe.grid(strategy)
        if not self.recipe.select or grid == [{}]:
            return {}, []
        folds = self.recipe.select["folds"] or partition_folds
        metric = METRIC_COLUMNS[self.recipe.select["metric"]]
        best, fps, unknown = None, [], False
        for values in grid:
            name = key_values(values.items())
            sub = folder / "select" / name
            cfg = dataclasses.replace(fed, exp=sub, strategy=(strategy,), eval_every=values.get("rounds", fed.rounds),
                                      **values)
            fp = fingerprint(f"select:{strategy}", federate_key(cfg) | {"folds": folds}, upstream)
            fps.append(fp)

            def validate(cfg=cfg, sub=sub) -> None:
                for stage_dir in ("partition", "gan"):
                    link(sub / stage_dir, folder / stage_dir)
                for fold in range(folds):
                    federate_run(dataclasses.replace(cfg, fold=fold))
            if not self.unit(folder, label, f"select {strategy} {name}", fp, f"select/{name}/federate/cv/{strategy}",
                             validate):
                unknown = True
                continue
            score = validation_score(self.owners[fp], folds, metric)
            sign = -1 if metric in LOWER_IS_BETTER else 1
            if best is None or sign * score > sign * best[0] or (np.isnan(best[0]) and not np.isnan(score)):
                best = (score, values)
        if unknown:
            return None, fps
        console.out.print(f"{label + ': ' if label else ''}select {strategy}: "
                          f"{', '.join(f'{k}={v}' for k, v in best[1].items()) or 'defaults'} "
                          f"(mean validation {self.recipe.select['metric']} {best[0]:.3f} over {folds} folds)")
        return best[1], fps

    def prune_points(self, names: list[str]) -> None:
        """Sub-experiments (and a root-level experiment) that the recipe no longer makes go."""
        runs = self.exp / "runs"
        if names == [""]:
            remove(runs)
            return
        for stale in (p for p in runs.iterdir() if p.name not in names and not p.name.startswith(".")):
            console.out.print(f"removing {stale}: no longer in the recipe's sweep")
            remove(stale)
        ledger = Ledger(self.exp)
        for stage_dir in ("partition", "gan", "federate", "audit", "attacks", "select"):
            remove(self.exp / stage_dir)
        for unit in [u for u in ledger.data["units"] if u != "report"]:
            ledger.forget(unit)

    def unit(self, folder: Path, label: str, unit: str, fp: str, rel: str, action: Callable[[], Any],
             stale: bool = False) -> bool:
        """Share, skip or run one unit (`stale`: run it even if up to date); a dry run only says which. Returns
        whether its output is there to read."""
        target = folder / rel
        self.fingerprints.append(fp)
        prefix = f"{label}: " if label else ""
        would = "would be " if self.dry_run else ""
        owner = self.owners.get(fp)
        if owner is not None and owner != target:
            if not self.dry_run:
                link(target, owner)
            self.statuses["shared"] += 1
            console.out.print(f"{prefix}{unit}: same inputs as {os.path.relpath(owner, self.exp)}, {would}shared",
                              soft_wrap=True)
            return fp not in self.pending
        self.owners[fp] = target
        ledger = Ledger(folder)
        if self.dry_run:
            current = ledger.up_to_date(unit, fp, target) or adoptable(target, rel, unit, fp)
        else:
            if adopt(target, rel, unit, fp):
                ledger.record(unit, fp, target)
            current = ledger.up_to_date(unit, fp, target)
        if current and not stale:
            self.statuses["skipped"] += 1
            console.out.print(f"{prefix}{unit}: up to date, {would}skipped", soft_wrap=True)
            return True
        if self.dry_run:
            self.pending.add(fp)
            self.statuses["ran"] += 1
            console.out.print(f"{prefix}{unit}: would run", soft_wrap=True)
            return False
        ledger.forget(unit)
        if target.is_symlink():  # it was shared; a real folder is replaced by the stage only on success
            target.unlink()
        console.out.print(f"{prefix}{unit}: running")
        start = time.perf_counter()
        action()
        seconds = time.perf_counter() - start
        ledger.record(unit, fp, target)
        self.statuses["ran"] += 1
        console.out.print(f"{prefix}{unit}: done in {seconds:.1f} s")
        return True


def adoptable(target: Path, rel: str, unit: str, fp: str) -> bool:
    """Whether `target` links to another sub-experiment's up-to-date output of this very unit."""
    if not target.is_symlink() or not target.exists():
        return False
    source = target.resolve()
    return Ledger(source.parents[len(Path(rel).parts) - 1]).up_to_date(unit, fp, source)


def adopt(target: Path, rel: str, unit: str, fp: str) -> bool:
    """A link to another sub-experiment's up-to-date output of this very unit becomes this folder's own
    (the output moves here), so that dropping or reordering sweep values does not retrain it."""
    if not adoptable(target, rel, unit, fp):
        return False
    source = target.resolve()
    source_point = source.parents[len(Path(rel).parts) - 1]
    target.unlink()
    shutil.move(source, target)
    Ledger(source_point).forget(unit)
    return True


def plain(cfg, leave_out: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What a unit's fingerprint holds of its config: all but where it runs and how fast (threads), and the
    stage's `leave_out` (train-gan's engine options: both engines make the same bytes)."""
    return settled({k: v for k, v in to_json(cfg).items() if k not in NOT_FINGERPRINTED | leave_out})


def federate_key(cfg: FederateConfig) -> dict[str, Any]:
    """The options that can change one strategy's result: the shared ones and those the strategy declares,
    resolved (so an option only other strategies declare, or its default given explicitly, changes nothing)."""
    (strategy,) = cfg.strategy
    shared = plain(cfg)
    left_out = REGISTRY.options().keys() | inapplicable(shared)
    return {k: v for k, v in shared.items() if k not in left_out} | resolved_options(cfg, strategy)


def validation_score(folder: Path, folds: int, metric: str) -> float:
    """Mean over folds of the mean over nodes of each node's own model on its validation fold (NaN, e.g. an
    AUROC on a one-class fold, is left out)."""
    from fedcli.report.collect import load_metrics, own_scores

    per_fold = [list(own_scores(load_metrics(folder / f"fold{k}"), metric).values()) for k in range(folds)]
    values = [v for fold in per_fold for v in fold if not np.isnan(v)]
    return float(np.mean(values)) if values else float("nan")


def link(target: Path, source: Path) -> None:
    """Make `target` a relative symlink to `source` (replacing what was there)."""
    relative = os.path.relpath(source, target.parent)
    if target.is_symlink() and os.readlink(target) == relative:
        return
    remove(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(relative, target_is_directory=True)


def prune(folder: Path, keep: set[str]) -> None:
    if folder.is_dir() and not folder.is_symlink():
        for entry in folder.iterdir():
            if entry.name not in keep and not entry.name.startswith("."):
                remove(entry)


def remove(target: Path) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        shutil.rmtree(target)


def stage_run(module: str, cfg, **extra) -> None:
    """A stage's `run`, replacing a stale output only when it succeeds. Partition is given the names no node may
    take; train-gan keeps the nodes an interrupted run finished with the same config."""
    importlib.import_module(module).run(dataclasses.replace(cfg, overwrite=True), **extra)


def attacks_run(cfg) -> None:
    """`audit-privacy --shared`'s attacks alone (the generator audit is its own unit)."""
    from fedcli.audit.stage import attack

    attack(dataclasses.replace(cfg, overwrite=True))


def federate_run(cfg) -> None:
    """One strategy (and fold); an interrupted run of the same unit continues from its last round."""
    from fedcli.federate.checkpoint import CheckpointMismatch
    from fedcli.federate.stage import checkpoint_dir, run
    from fedcli.experiment.paths import federate_dir

    if checkpoint_dir(federate_dir(cfg.exp, cfg.strategy[0], cfg.fold)).is_dir():
        try:
            console.out.print(f"{cfg.strategy[0]}: resuming from the last completed round")
            run(dataclasses.replace(cfg, overwrite=True, resume=True))
            return
        except CheckpointMismatch:
            console.out.print(f"{cfg.strategy[0]}: the checkpoint was made with other options; starting over")
    run(dataclasses.replace(cfg, overwrite=True))


def report_run(cfg) -> None:
    from fedcli.report.build import run

    run(cfg)
