"""A whole recipe for `fedcli run`: the stage tables, `--set` overrides, the `[sweep]` and the
`[select]` grid, checked in full before any stage starts (a typo must not surface an hour in).

`[sweep]` holds lists of values for stage options (`"federate.buffer-size" = [0, 512]`, or the
nested form `federate.buffer-size = [...]`), `seeds`, which sets every stage's seed through
the partition's, and `variants`: named sets of options that go together (`[[sweep.variants]]` tables, each a
`name` and stage options, e.g. a lower bound's strategies with `federate.ssl = "none"`); the product of the
lists (the variants one axis) is the set of sub-experiments. `[select]` holds a grid
of federate options (rounds, epochs, lr, mu, server_lr) and `folds` K for per-strategy model selection.
`fedcli run --threads N` sets every stage's `threads`, which, like the options `fedcli run` sets
itself, is no part of a unit's fingerprint: it changes how fast a unit runs, not what it makes.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import tomllib
from pathlib import Path
from typing import Any

from fedcli.core.errors import UserError
from fedcli.experiment.config import (ATTACK_OPTIONS, MAX_THREADS, RECIPE_TABLES, AuditConfig, Metric, PartitionConfig,
                                      ReportConfig, coerce, option, ranged, read_recipe, stage_values)
from fedcli.experiment.subexperiments import key_values
from fedcli.federate.config import FederateConfig, select_keys, varies_for
from fedcli.federate.strategies import REGISTRY
from fedcli.generators.config import GanConfig

STAGE_CLASSES = {"partition": PartitionConfig, "train_gan": GanConfig, "federate": FederateConfig,
                 "audit": AuditConfig, "report": ReportConfig}
UNASKED_UNITS = 1000  # about 3x the largest bundled recipe (the study's, 314 units with [select]); more: --yes
MAX_NAME_BYTES = 255  # a folder name's limit on common file systems (ext4, APFS, NTFS)
RUN_OWNED = {"exp", "overwrite", "resume"}  # set by `fedcli run` itself, never by a recipe
NOT_FINGERPRINTED = RUN_OWNED | {"threads"}
NOT_IN_RUN = {"node": "fedcli run trains and audits every node", "sample_only": "use fedcli train-gan --sample-only",
              "strict": "use fedcli audit-privacy --strict", "fold": "use a [select] table for cross-validation",
              "cv": "use a [select] table for cross-validation"}
NOT_IN_RECIPE = frozenset(RUN_OWNED | set(NOT_IN_RUN))  # refused in a recipe, so never listed as valid keys


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """`fedcli run`'s options beside its recipe: where, what the command line overrides, and how it runs."""

    exp: Path | None = option(None, help="Experiment folder \\[default: results/<recipe name>].")
    set: tuple[str, ...] = option((), flags=("--set",), help=(
        "Repeatable table.key=value overriding the recipe, e.g. federate.rounds=3 or sweep.seeds=[0,1,2]."))
    threads: int | None = ranged(None, 1, MAX_THREADS, help=(
        "CPU threads of every stage, over the recipe's \\[default: torch's, every core]; no part of the up-to-date "
        "check."))
    yes: bool = option(False, flags=("--yes",), help=(
        "Start a recipe with more units of work than fedcli run starts unasked (a large \\[sweep]); the refusal says "
        "how many."))
    dry_run: bool = option(False, flags=("--dry-run",), help=(
        "Only say which units would run, be skipped as up to date or be shared, and the sweep's size; write nothing."))


@dataclasses.dataclass(frozen=True)
class Point:
    """One sub-experiment of a sweep: its folder name and the option values it fixes."""

    name: str
    values: tuple[tuple[str, str, Any], ...]  # (table, field name, value)

    def tables(self, base: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        tables = copy.deepcopy(base)
        for table, name, value in self.values:
            tables[table][name] = value
        return tables


@dataclasses.dataclass(frozen=True)
class Variant:
    """One value of `[sweep] variants`: its name (in the sub-experiment's) and the options it sets together."""

    name: str
    values: tuple[tuple[str, str, Any], ...]  # (table, field name, value)
    seeds: tuple[int, ...] | None = None  # the [sweep] seeds it runs on (an opt-in cost paid once); None: every one


SEED_OPTION = ("partition", "seed")  # what [sweep] seeds and [regime] seed set
VARIANTS = ("variants", "variant")  # the sweep key of the variants axis: `variant=<name>` in folder names


@dataclasses.dataclass
class Recipe:
    path: Path
    stages: dict[str, dict[str, Any]]  # table -> {field name: checked value}
    sweep: dict[tuple[str, str], list[Any]]  # (table, field name) -> values
    select: dict[str, Any]  # grid lists by field name, plus folds and metric
    regime: dict[str, Any] = dataclasses.field(default_factory=dict)  # "rule" and "grid" ((table, name) -> values)

    @classmethod
    def load(cls, path: Path, sets: list[str] = (), threads: int | None = None) -> Recipe:
        raw = read_recipe(path)
        for item in sets:
            apply_set(raw, item)
        if threads is not None:
            for table in STAGE_CLASSES:
                raw.setdefault(table, {})["threads"] = threads
        origin = f"recipe {path}"
        stages = {}
        for table, config in STAGE_CLASSES.items():
            values = stage_values(config, table, raw.get(table, {}), origin, NOT_IN_RECIPE)
            check_run_keys(table, values, origin)
            stages[table] = values
        recipe = cls(Path(path), stages, parse_sweep(raw.get("sweep", {}), origin),
                     parse_select(raw.get("select", {}), origin), parse_regime(raw.get("regime", {}), origin))
        recipe.check(origin)
        return recipe

    def check(self, origin: str) -> None:
        """Every combination must make valid configs, so that no error waits behind hours of training."""
        both = sorted({name for table, name in self.sweep if table == "federate"} & set(self.select))
        if both:
            raise UserError(f"{origin}: federate.{both[0]} is both swept and selected; keep it in one of the two")
        fixed = sorted(set(self.regime.get("grid", {})) & {(t, n) for t, n, _ in
                                                            (v for p in self.points() for v in p.values)})
        if fixed:
            raise UserError(f"{origin}: {fixed[0][0]}.{fixed[0][1].replace('_', '-')} is both in [regime] and swept; "
                            "the regime fixes it for every sub-experiment: keep it in one of the two")
        if self.regime.get("seed") in self.reported_seeds():
            raise UserError(f"{origin}: regime.seed {self.regime['seed']} is also a seed the sub-experiments report; "
                            "choose the regime on a seed no sub-experiment runs (e.g. 100)")
        for point in [*self.points(), *self.regime_points()]:
            try:
                configs = self.configs(point, Path("."))
            except UserError as exc:
                raise UserError(f"{origin}: {exc}") from exc
            gan, fed, part = configs["train_gan"], configs["federate"], configs["partition"]
            if fed.buffer_size is not None and fed.buffer_size > gan.buffer_size:
                raise UserError(f"{origin}: federate.buffer-size {fed.buffer_size} exceeds train_gan.buffer-size "
                                f"{gan.buffer_size}; raise the latter")
            if self.select:
                folds = self.select["folds"] or part.folds
                if folds > part.folds:
                    raise UserError(f"{origin}: select.folds = {folds} but the partition has {part.folds} folds; "
                                    "lower select.folds or raise partition.folds")
                for strategy in fed.strategy:
                    for values in self.grid(strategy):
                        try:
                            dataclasses.replace(fed, strategy=(strategy,), **values)
                        except UserError as exc:
                            raise UserError(f"{origin}: [select] {exc}") from exc

    def points(self) -> list[Point]:
        """The sweep's sub-experiments in a fixed order; one unnamed point without a sweep."""
        return grid_points(self.sweep)

    def regime_points(self) -> list[Point]:
        """The [regime] grid's settings in the order they are tried (the first key varies slowest), on the regime's
        own seed where it names one."""
        if not self.regime:
            return []
        seed = () if self.regime.get("seed") is None else (SEED_OPTION + (self.regime["seed"],),)
        return [dataclasses.replace(p, values=p.values + seed) for p in grid_points(self.regime["grid"])]

    def reported_seeds(self) -> set[int]:
        """The partition seeds the sub-experiments run on."""
        found = {value for p in self.points() for t, n, value in p.values if (t, n) == SEED_OPTION}
        return found or {self.stages["partition"].get("seed", 0)}

    def with_values(self, values: tuple[tuple[str, str, Any], ...]) -> Recipe:
        """This recipe with `values` set in its stage tables (the chosen regime, for every sub-experiment)."""
        return dataclasses.replace(self, stages=Point("", values).tables(self.stages))


    def asks_for_generators(self, point: Point) -> bool:
        """Whether the recipe sets a [train_gan] or [audit] option for `point` (beyond --threads and the options only
        the attacks on shared data read): it wants generators trained and audited even where no strategy reads
        their buffers."""
        return self.sets(point, "train_gan") or self.sets(point, "audit")

    def sets(self, point: Point, table: str) -> bool:
        """Whether the recipe sets an option of `table` for `point` beyond --threads and the attacks' options."""
        return any(name != "threads" and name.replace("-", "_") not in ATTACK_OPTIONS
                   for name in point.tables(self.stages)[table])

    def units(self) -> int:
        """Units of work `fedcli run` may start: per sub-experiment partition, train-gan and audit-privacy (where
        generators are wanted), the attacks on shared data (with --shared), each strategy's final run plus its
        [select] grid points times folds; the [regime] settings' partition, train-gan and audit; and the report."""
        total = 1 + 3 * len(self.regime_points())
        for point in self.points():
            configs = self.configs(point, Path("."))
            folds = (self.select["folds"] or configs["partition"].folds) if self.select else 0
            strategies = configs["federate"].strategy
            generators = self.asks_for_generators(point) or any(REGISTRY[s].needs_buffers for s in strategies)
            total += 1 + 2 * generators + configs["audit"].shared + sum(1 + len(self.grid(s)) * folds
                                                                        for s in strategies)
        return total

    def check_size(self, yes: bool) -> None:
        """A recipe of more than UNASKED_UNITS units starts only with --yes: a typo in a [sweep] (100 x 100
        values) must not start days of training, and CI has no terminal to ask."""
        units = self.units()
        if units > UNASKED_UNITS and not yes:
            raise UserError(f"recipe {self.path} makes {units} units of work ({len(self.points())} sub-experiments), "
                            f"more than the {UNASKED_UNITS} fedcli run starts unasked; check its [sweep] and [select], "
                            "then pass --yes")

    def configs(self, point: Point, exp: Path) -> dict[str, Any]:
        """Each stage's config for one sub-experiment folder; an error names the table (and sub-experiment)."""
        tables = point.tables(self.stages)
        configs = {}
        for table, config in STAGE_CLASSES.items():
            try:
                configs[table] = given(config(exp=exp, **tables[table]), table, tables, point)
            except UserError as exc:
                where = f" (sub-experiment {point.name})" if point.name else ""
                raise UserError(f"[{table}]{where} {exc}") from exc
        return configs

    def grid(self, strategy: str) -> list[dict[str, Any]]:
        """The [select] grid points that make a difference to `strategy`."""
        keys = [k for k in select_keys() if k in self.select and varies_for(k, strategy)]
        return [dict(zip(keys, combo)) for combo in itertools.product(*(self.select[k] for k in keys))]


def given(cfg: Any, table: str, tables: dict[str, dict[str, Any]], point: Point) -> Any:
    """`cfg` with its record of the options the sub-experiment's [table] gives (a config that keeps one): the
    recipe's and its point's, less those its point sets back to their default, which it gives up (so a variant of
    another generator kind can reset the base table's options that kind does not read)."""
    if not hasattr(cfg, "given"):
        return cfg
    defaults = cfg.defaults()
    reset = {name for t, name, value in point.values if t == table and value == getattr(defaults, name)}
    return dataclasses.replace(cfg, given=frozenset(set(tables[table]) - reset))


def check_point_name(point: Point, same: Point | None) -> None:
    """A sub-experiment's folder name is unique (after case folding) and short enough for any file system."""
    if same is not None:
        raise UserError(f"[sweep] values {values_text(same)} and {values_text(point)} make the same sub-experiment "
                        f"{point.name!r}; remove one of them")
    if len(point.name.encode()) > MAX_NAME_BYTES:
        raise UserError(f"[sweep] values {values_text(point)} make a sub-experiment name of {len(point.name.encode())} "
                        f"bytes, over the {MAX_NAME_BYTES} a folder name may have; sweep shorter values")


def values_text(point: Point) -> str:
    return ", ".join(f"{table}.{name}={value!r}" for table, name, value in point.values)


def check_run_keys(table: str, values: dict[str, Any], origin: str) -> None:
    for name in values:
        if name in RUN_OWNED:
            raise UserError(f"{origin}: {table}.{name} is set by fedcli run itself; remove it from the recipe")
        if name in NOT_IN_RUN:
            raise UserError(f"{origin}: {table}.{name.replace('_', '-')} does not apply to fedcli run "
                            f"({NOT_IN_RUN[name]}); remove it from the recipe")


def apply_set(raw: dict[str, Any], item: str) -> None:
    """`--set table.key=value`: the value is read as TOML (so 3, 0.5, true, [1, 2]), else as a string."""
    key, sep, text = item.partition("=")
    table, dot, name = key.strip().partition(".")
    if not sep or not dot or not name:
        raise UserError(f"--set {item!r} is not table.key=value (e.g. --set federate.rounds=3)")
    if table not in RECIPE_TABLES:
        raise UserError(f"--set {item!r}: unknown table {table}; valid tables: {', '.join(RECIPE_TABLES)}")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    except RecursionError as exc:
        raise UserError(f"--set {key.strip()}=...: the value nests deeper than Python can read; no option takes "
                        "more than a list of values") from exc
    raw.setdefault(table, {})[name] = value


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse_sweep(table: dict[str, Any], origin: str) -> dict[tuple[str, str], list[Any]]:
    sweep: dict[tuple[str, str], list[Any]] = {}
    table = dict(table)
    if "variants" in table:
        sweep[VARIANTS] = parse_variants(table.pop("variants"), origin)
    for key, values in flatten(table).items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{origin}: sweep.{key} must be a non-empty list of values")
        if key == "seeds":
            stage, name = "partition", "seed"
        else:
            stage, _, option = key.partition(".")
            if stage not in STAGE_CLASSES or not option:
                raise UserError(f"{origin}: sweep key {key!r} is not table.option or seeds (e.g. \"federate.rounds\")")
            name = option.replace("-", "_")
        if stage == "report" or name in RUN_OWNED or (stage, name) in sweep:
            raise UserError(f"{origin}: sweep key {key} cannot be swept (a report option, set by fedcli run, or "
                            "given twice)")
        check_run_keys(stage, {name: None}, origin)
        checked = [stage_values(STAGE_CLASSES[stage], stage, {name: v}, f"{origin} [sweep]", NOT_IN_RECIPE)[name]
                   for v in values]
        sweep[(stage, name)] = checked
    swept_twice = {(t, n) for v in sweep.get(VARIANTS, []) for t, n, _ in v.values} & set(sweep)
    if swept_twice:
        table, name = sorted(swept_twice)[0]
        raise UserError(f"{origin}: sweep key {table}.{name.replace('_', '-')} is both swept and set by a variant; "
                        "keep it in one of the two")
    return sweep


def parse_variants(items: Any, origin: str) -> list[Variant]:
    """`[[sweep.variants]]`: each a unique `name` and stage tables of options set together."""
    if not isinstance(items, list) or not items or not all(isinstance(item, dict) for item in items):
        raise UserError(f"{origin}: sweep.variants must be a list of tables ([[sweep.variants]]), each a name and "
                        "stage options")
    variants, names = [], set()
    for item in items:
        name = item.get("name")
        if not isinstance(name, str) or not name or name.casefold() in names:
            raise UserError(f"{origin}: every [[sweep.variants]] needs a name of its own, got {name!r}")
        names.add(name.casefold())
        values = []
        for stage, options in item.items():
            if stage in ("name", "seeds"):
                continue
            if stage not in STAGE_CLASSES or stage == "report" or not isinstance(options, dict):
                raise UserError(f"{origin}: variant {name}: {stage!r} is not a stage table (partition, train_gan, "
                                "federate, audit)")
            check_run_keys(stage, {k.replace("-", "_"): None for k in options}, origin)
            checked = stage_values(STAGE_CLASSES[stage], stage, options, f"{origin} variant {name}", NOT_IN_RECIPE)
            values += [(stage, key, value) for key, value in checked.items()]
        variants.append(Variant(name, tuple(values), variant_seeds(item.get("seeds"), f"{origin} variant {name}")))
    return variants


def variant_seeds(seeds: Any, origin: str) -> tuple[int, ...] | None:
    """A variant's `seeds`: the [sweep] seeds it runs on, a non-empty list of them."""
    if seeds is None:
        return None
    if not isinstance(seeds, list) or not seeds or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                           for v in seeds):
        raise UserError(f"{origin}: seeds must be a non-empty list of the [sweep] seeds it runs on, got {seeds!r}")
    return tuple(seeds)


def runs_on(combo: tuple, keys: list[tuple[str, str]]) -> bool:
    """Whether a grid combination keeps every variant in it to the seeds it names."""
    seed = dict(zip(keys, combo)).get(SEED_OPTION)
    return all(not isinstance(v, Variant) or v.seeds is None or seed in v.seeds for v in combo)


def parse_select(table: dict[str, Any], origin: str) -> dict[str, Any]:
    if not table:
        return {}
    select: dict[str, Any] = {"folds": None, "metric": "accuracy"}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "folds":
            select["folds"] = coerce(value, int, f"{origin}: select.folds")
            if select["folds"] < 2:
                raise UserError(f"{origin}: select.folds must be at least 2, got {select['folds']}")
        elif name == "metric":
            select["metric"] = coerce(value, Metric, f"{origin}: select.metric")
        elif name in select_keys():
            if not isinstance(value, list) or not value:
                raise UserError(f"{origin}: select.{key} must be a non-empty list (the grid's values)")
            select[name] = [stage_values(FederateConfig, "federate", {name: v}, f"{origin} [select]")[name]
                            for v in value]
        else:
            raise UserError(f"{origin}: unknown key select.{key}; valid keys: folds, metric, {', '.join(select_keys())}")
    if not any(k in select for k in select_keys()):
        raise UserError(f"{origin}: [select] needs at least one grid list ({', '.join(select_keys())})")
    return select


def grid_points(axes: dict[tuple[str, str], list[Any]]) -> list[Point]:
    """Every combination of the axes' values (the first axis varies slowest), named by its values; one unnamed
    point without axes."""
    if not axes:
        return [Point("", ())]
    keys = list(axes)
    short = [name for _, name in keys]
    points: dict[str, Point] = {}  # by case-folded name: folder names some file systems fold
    for combo in filter(lambda combo: runs_on(combo, keys), itertools.product(*(axes[k] for k in keys))):
        name = key_values((n if short.count(n) == 1 else f"{t}.{n}", v.name if isinstance(v, Variant) else v)
                          for (t, n), v in zip(keys, combo))
        point = Point(name, tuple(value for (t, n), v in zip(keys, combo)
                                  for value in (v.values if isinstance(v, Variant) else ((t, n, v),))))
        check_point_name(point, points.get(name.casefold()))
        points[name.casefold()] = point
    return list(points.values())


def parse_regime(table: dict[str, Any], origin: str) -> dict[str, Any]:
    """`[regime]`: the rule's threshold, the seed it is chosen on, and the grid of partition and train-gan settings,
    tried in order."""
    if not table:
        return {}
    from fedcli.audit.regime import THRESHOLD, Rule

    table = dict(table)
    threshold = coerce(table.pop("threshold", THRESHOLD), float, f"{origin}: regime.threshold")
    seed = table.pop("seed", None)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise UserError(f"{origin}: regime.seed must be a non-negative integer (the partition seed the regime is "
                        f"chosen on), got {seed!r}")
    if not 0.5 <= threshold < 1:
        raise UserError(f"{origin}: regime.threshold must be at least 0.5 (chance) and below 1, got {threshold}")
    grid = parse_sweep(table, f"{origin} [regime]")
    outside = sorted(f"{t}.{n.replace('_', '-')}" for t, n in grid if t not in ("partition", "train_gan"))
    if outside or not grid:
        raise UserError(f"{origin}: [regime] needs grid lists of partition and train_gan options (what the generator "
                        f"sees and how long it trains){', not ' + outside[0] if outside else ''}")
    return {"rule": Rule(threshold), "grid": grid, "seed": seed}
