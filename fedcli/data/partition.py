"""The `partition` stage: a dataset becomes federated nodes with train/test splits and folds."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Collection
from pathlib import Path

from fedcli.core.devices import with_threads
from fedcli.core.errors import UserError
from fedcli.data import acquisition, class_mix, global_test, label_parts, pixelscale, schemes, shared_set
from fedcli.data.manifest import SCHEMA, Manifest, content_hash
from fedcli.data.node_manifest import node_view
from fedcli.data.records import Sample, SourceData
from fedcli.data.sources import read_source
from fedcli.data.splits import NodeError, split_node, test_classes
from fedcli.data.summary import skew_of, skew_statistics, summary_frame, write_summary_png
from fedcli.experiment.artifacts import check_output_free, provenance, staged_output, write_csv, write_json
from fedcli.experiment.config import PartitionConfig, to_json
from fedcli.experiment.locking import locked
from fedcli.experiment.names import check_names, check_not_reserved
from fedcli.experiment.paths import HIDDEN_LABELS, inside, partition_dir

DEFAULT_NODES = 3
DIRICHLET_DRAWS = 100  # fresh draws tried before a too-skewed setting is reported


def restrict_to_site(source: SourceData, site: str | None) -> list[Sample]:
    if site is None:
        return source.samples
    if site not in source.sites:
        raise UserError(f"--site {site} is not in the data; sites: {', '.join(source.sites)}")
    return [s for s in source.samples if s.site == site]


def node_site(samples: list[Sample]) -> str:
    sites = {s.site for s in samples}
    return sites.pop() if len(sites) == 1 else "mixed"


def build_nodes(cfg: PartitionConfig, source: SourceData, scheme: str, samples: list[Sample]) -> list[dict]:
    """Assign samples to nodes, then split each node; a Dirichlet draw that leaves an untestable
    node is redrawn (keyed by attempt, so the result stays a function of the seed)."""
    names = source.label_names
    if scheme == "source":
        sites = source.sites
        if len(sites) < 2:
            raise UserError(f"--scheme source needs several sites, but the data has one ({sites[0]}); "
                            "use --scheme iid or dirichlet with --nodes N")
        draws = [schemes.by_site(samples)]
    elif scheme in ("iid", "site-shift"):
        draws = [schemes.iid(samples, cfg.nodes, cfg.seed)]
    elif scheme == "skew":
        return skew_nodes(cfg, source, samples)
    else:
        draws = (schemes.dirichlet(samples, cfg.nodes, cfg.alpha, cfg.seed, a) for a in range(DIRICHLET_DRAWS))
    error: NodeError | None = None
    for assignment in draws:
        try:
            return [node_entry(cfg, scheme, i, name, members, names) for i, (name, members) in enumerate(assignment)]
        except NodeError as exc:
            error = exc
    raise UserError(f"{error} (every one of {DIRICHLET_DRAWS} Dirichlet draws with --alpha {cfg.alpha} "
                    f"left such a node)") if scheme == "dirichlet" else error


SKEW_SEARCH_STEPS = 24  # bisection halvings of the assignment's target: far below one image's effect on the skew
SKEW_CLOSE_ENOUGH = 5e-4  # the search stops once the training splits are this near --ks


def skew_nodes(cfg: PartitionConfig, source: SourceData, samples: list[Sample]) -> list[dict]:
    """--scheme skew: nodes whose training splits reach --ks. Each node's class-balanced test set and the shared
    set (or the few-labels parts) leave a training mix more skewed than the one assigned, so the assignment's own target
    is searched by
    bisection (the training skew grows with it) for the one whose training splits come nearest --ks."""
    names = source.label_names

    def built(target: float) -> list[dict]:
        assignment = schemes.skew(samples, cfg.nodes, target, cfg.seed)
        return [node_entry(cfg, "skew", i, name, members, names) for i, (name, members) in enumerate(assignment)]

    def reached(nodes: list[dict]) -> float:
        """The training splits' skew once the shared set, or the few-labels parts, are taken out, as make_manifest
        takes them."""
        trial, hidden = copy.deepcopy(nodes), {}
        if cfg.shared_fraction:
            shared_set.set_apart(trial, cfg.shared_fraction, names, cfg.seed)
        elif semi_supervised(cfg):
            _, hidden = label_parts.make_parts(trial, cfg.labeled_fraction, cfg.validation_fraction,
                                               cfg.labeled_nodes, cfg.held_apart_fraction, cfg.held_apart_node, names,
                                               cfg.seed)
        return skew_of([label_parts.training_labels(node, hidden) for node in trial], len(names))["label_skew_tv"]

    def attempt(target: float) -> tuple[list[dict], float] | None:
        try:
            nodes = built(target)
        except NodeError:
            return None
        return nodes, reached(nodes)

    best = attempt(0.0) if cfg.ks == 0 else None
    low, high = 0.0, schemes.most_skew(samples, cfg.nodes)
    untestable = False  # some assignment left a node without two testable classes
    for _ in range(0 if best else SKEW_SEARCH_STEPS):
        middle = (low + high) / 2
        found = attempt(middle)
        untestable |= found is None
        if found is not None and (best is None or abs(found[1] - cfg.ks) < abs(best[1] - cfg.ks)):
            best = found
        if found is None or found[1] > cfg.ks:
            high = middle
        else:
            low = middle
        if best is not None and abs(best[1] - cfg.ks) < SKEW_CLOSE_ENOUGH:
            break
    if best is None or best[1] < cfg.ks - SKEW_TOLERANCE:
        if untestable or best is None:
            raise UserError(f"--ks {cfg.ks} leaves a node that cannot be tested (each node needs two classes with two "
                            "or more images); lower --ks or use fewer --nodes")
        measure = "KS" if len(names) == 2 else "total variation"
        raise UserError(f"--ks {cfg.ks} is beyond the most skewed training splits this scheme makes of this data into "
                        f"{cfg.nodes} equal nodes (mean pairwise {measure} {best[1]:.3f}); lower --ks or change --nodes")
    return best[0]


def check_two_classes(samples: list[Sample], label_names: list[str]) -> None:
    """Every node is tested on two classes or more, so the data must hold two with two images or more,
    whatever the scheme (else each scheme would blame its own options)."""
    present = test_classes(samples)
    if len(present) < 2:
        held = ", ".join(f"{label_names[c]} ({n} images)" for c, n in present.items()) or "none"
        raise UserError(f"the data has fewer than two classes with two or more images (such classes: {held}), and "
                        "every node is tested on two classes or more; add images of another class")


def check_communities(cfg: PartitionConfig) -> None:
    if not cfg.communities:
        return
    if cfg.scheme != "site-shift":
        raise UserError(f"--communities groups nodes that share a simulated scanner, which only --scheme site-shift "
                        f"has, not {cfg.scheme}")
    if sum(cfg.communities) != cfg.nodes:
        raise UserError(f"--communities {' '.join(map(str, cfg.communities))} adds up to {sum(cfg.communities)} nodes, "
                        f"and there are {cfg.nodes}; make the group sizes add up to --nodes")
    available = len(cfg.scanners or acquisition.ACQUISITIONS)
    if len(cfg.communities) > available:
        raise UserError(f"--communities gives {len(cfg.communities)} groups, and site-shift has "
                        f"{available} scanners; give at most that many groups")


def check_scanners(cfg: PartitionConfig) -> None:
    if not cfg.scanners:
        return
    if cfg.scheme != "site-shift":
        raise UserError(f"--scanners names the simulated scanners of --scheme site-shift, not of {cfg.scheme}; drop it")
    unknown = [name for name in cfg.scanners if name not in acquisition.NAMES]
    if unknown:
        raise UserError(f"--scanners {unknown[0]} is not a simulated scanner; choose from {', '.join(acquisition.NAMES)}")
    if len(set(cfg.scanners)) < len(cfg.scanners):
        raise UserError(f"--scanners {' '.join(cfg.scanners)} names a scanner twice; name each once")


def scanner_of(cfg: PartitionConfig, index: int) -> int:
    """Node `index`'s scanner: its own, or with --communities its group's (groups of consecutive nodes)."""
    if not cfg.communities:
        return index
    ends = list(itertools.accumulate(cfg.communities))
    return next(group for group, end in enumerate(ends) if index < end)


NODE_ADVICE = {  # what changes an untestable node, per scheme: a source's sites are the data's own
    "source": "its site is the data's own: add images of a second class there, or use --scheme iid or dirichlet "
              "with --nodes N",
    "iid": "use fewer --nodes",
    "site-shift": "use fewer --nodes",
    "dirichlet": "use fewer --nodes or a larger --alpha",
    "skew": "lower --ks or use fewer --nodes",
}


def node_entry(cfg: PartitionConfig, scheme: str, index: int, name: str, members: list[Sample],
               label_names: list[str]) -> dict:
    mix = class_mix.parse(cfg.class_mix, label_names).get(name)
    if mix is not None:
        members = class_mix.mixed(name, members, *mix, cfg.seed, label_names)
    train, test = split_node(name, members, label_names, cfg.test_fraction, cfg.folds, cfg.seed, cfg.train_size,
                             NODE_ADVICE[scheme])
    spec = acquisition.for_node(scanner_of(cfg, index), cfg.scanners) if scheme == "site-shift" else None
    return {"name": name, "site": node_site(members), "acquisition": spec, "train": train, "test": test}


def make_manifest(cfg: PartitionConfig, reserved: Collection[str] = ()) -> tuple[Manifest, PartitionConfig]:
    """The manifest, and the config with every automatic choice (scheme, nodes, channels) resolved;
    `reserved`: names no node may take (the stage is given the strategy registry's model keys)."""
    check_exp_outside_data(cfg)
    source = read_source(cfg)
    check_source_names(source, cfg)
    samples = restrict_to_site(source, cfg.site)
    kept_files = {s.path: source.pixels[s.path] for s in samples if s.path in source.pixels}
    scale = pixelscale.decide(cfg.bit_depth, kept_files, source.root)  # one scale for every later decode
    held_out, samples = global_test.set_apart(samples, cfg.global_test, source.label_names) if cfg.global_test \
        else ([], samples)
    scheme = cfg.scheme or source.default_scheme
    n_nodes = None if scheme == "source" else cfg.nodes or DEFAULT_NODES
    cfg = dataclasses.replace(cfg, scheme=scheme, nodes=n_nodes, channels=cfg.channels or source.channels)
    check_scanners(cfg)
    check_communities(cfg)
    check_two_classes(samples, source.label_names)
    if n_nodes is not None and n_nodes > len(samples):
        raise UserError(f"--nodes {n_nodes} is more than the {len(samples)} samples; lower --nodes")
    mixes = class_mix.parse(cfg.class_mix, source.label_names)
    nodes = build_nodes(cfg, source, scheme, samples)
    class_mix.check_nodes(mixes, [node["name"] for node in nodes])
    if cfg.shared_fraction:
        shared_set.set_apart(nodes, cfg.shared_fraction, source.label_names, cfg.seed)
    labels, hidden = None, {}
    if semi_supervised(cfg):
        if cfg.shared_fraction:
            raise UserError("--shared-fraction with few labels would hand every node a set of labelled images; "
                            "use one or the other")
        labels, hidden = label_parts.make_parts(nodes, cfg.labeled_fraction, cfg.validation_fraction,
                                                cfg.labeled_nodes, cfg.held_apart_fraction, cfg.held_apart_node,
                                                source.label_names, cfg.seed)
    check_names("node", [node["name"] for node in nodes], f"--source {cfg.source}")
    check_not_reserved([node["name"] for node in nodes], reserved, f"--source {cfg.source}",
                       "rename that site in the data")
    data = {
        "schema": SCHEMA,
        "source": source.name,
        "scheme": scheme,
        "seed": cfg.seed,
        "image_size": cfg.image_size,
        "channels": cfg.channels,
        "label_names": source.label_names,
        "augment": list(source.augment),
        "data_root": str(source.root) if source.root else None,
        "data_file": source.data_file,
        "site": cfg.site,
        "task": cfg.task if source.name == "isic2019" else None,
        **({"preprocess": cfg.retina_preprocess} if cfg.retina_preprocess != "none" else {}),
        "test_fraction": cfg.test_fraction,
        **({"train_size": cfg.train_size} if cfg.train_size is not None else {}),
        **({"class_mix": list(cfg.class_mix)} if cfg.class_mix else {}),
        "folds": cfg.folds,
        "alpha": cfg.alpha if scheme == "dirichlet" else None,
        **({"ks": cfg.ks, "skew_measured_on": SKEW_MEASURED_ON} if scheme == "skew" else {}),
        **({"shared_fraction": cfg.shared_fraction} if cfg.shared_fraction else {}),
        **({"labels": labels} if labels else {}),
        "dropped": source.dropped,
        **({"global_test": [s.record() for s in held_out]} if held_out else {}),
        "nodes": nodes,
        "positive_class": positive_class(cfg, source.label_names),
        **scale.manifest_fields(),
    }
    data["content_hash"] = content_hash(data)
    manifest = Manifest(data)
    manifest.hidden = hidden
    data["statistics"] = skew_statistics(manifest)
    check_skew_reached(cfg, data["statistics"])
    return manifest, cfg


def semi_supervised(cfg: PartitionConfig) -> bool:
    """Whether any label is hidden or set apart (the few-labels setting, data/label_parts.py)."""
    return (cfg.labeled_fraction < 1 or cfg.validation_fraction > 0 or cfg.labeled_nodes is not None
            or cfg.held_apart_fraction > 0)


SKEW_TOLERANCE = 0.02
SKEW_MEASURED_ON = "training splits"  # since issue 54; before, every split of a node, its test split included


def rules_of(cfg: PartitionConfig) -> dict[str, str]:
    """What decides a partition beside its options: the rule --ks is met by, so that a `fedcli run` remakes a
    skew partition made by the earlier rule instead of reusing it."""
    return {"skew_measured_on": SKEW_MEASURED_ON} if cfg.scheme == "skew" else {}


def check_skew_reached(cfg: PartitionConfig, statistics: dict) -> None:
    """The training splits' skew against --ks: nodes are counted in patient groups, and groups of several images,
    the test sets or the most skewed split this data allows can keep it off target. --ks 0 is the even assignment
    (every node the pool's class mix), the least skew there is: what rounding and the shared set's draw leave of
    skew in its training splits is reported, not refused (digits' ten classes over four nodes: 0.021)."""
    if cfg.scheme == "skew" and cfg.ks > 0 and abs(statistics["label_skew_tv"] - cfg.ks) > SKEW_TOLERANCE:
        raise UserError(f"--ks {cfg.ks}: the nodes' training splits reach {statistics['label_skew_tv']:.3f}, not "
                        f"within {SKEW_TOLERANCE} of it; use fewer --nodes or more data")


def positive_class(cfg: PartitionConfig, names: list[str]) -> str | None:
    """A binary task's positive class (sensitivity's): --positive-class, else the second class, which every
    built-in binary source makes the finding (tuberculosis, melanoma, pneumonia)."""
    if len(names) != 2:
        if cfg.positive_class is not None:
            raise UserError(f"--positive-class applies to a task of two classes; this one has {len(names)} "
                            "(sensitivity and specificity are reported per class): drop it")
        return None
    if cfg.positive_class is None:
        return names[1]
    if cfg.positive_class not in names:
        raise UserError(f"--positive-class {cfg.positive_class} is not a class of the data; classes: "
                        f"{', '.join(names)}")
    return cfg.positive_class


def check_exp_outside_data(cfg: PartitionConfig) -> None:
    """A data folder is read whole, so an experiment inside it would be read back as data by a later partition
    (its GAN samples and figures as a new site with new classes)."""
    if cfg.data_dir is None or not Path(cfg.data_dir).is_dir():
        return
    data, exp = Path(cfg.data_dir).resolve(), Path(cfg.exp).resolve()
    if exp == data or data in exp.parents:
        raise UserError(f"--exp {cfg.exp} is inside --data-dir {cfg.data_dir}, whose images a later partition would "
                        "read together with the experiment's own; choose an --exp outside the data folder")


def check_source_names(source: SourceData, cfg: PartitionConfig) -> None:
    """Site and class names come from the user's data (folder names, CSV columns); sites become node
    names and so folder names: both are checked before anything is written."""
    origin = f"--source {cfg.source}" + (f" --data-dir {cfg.data_dir}" if cfg.data_dir is not None else "")
    check_names("site", source.sites, origin)
    check_names("class", source.label_names, origin)


@with_threads
def run(cfg: PartitionConfig, reserved: Collection[str]) -> Manifest:
    """Write `<exp>/partition/`: manifest.json, nodes/<node>.json (what each node may hold),
    summary.csv, summary.png, config.json; no node may be named as one of `reserved`."""
    out = partition_dir(cfg.exp)
    with locked(cfg.exp, [out]):
        return write_partition(cfg, out, reserved)


def write_partition(cfg: PartitionConfig, out: Path, reserved: Collection[str]) -> Manifest:
    """`run`, with the partition folder locked."""
    check_output_free(out, cfg.overwrite)
    manifest, cfg = make_manifest(cfg, reserved)
    with staged_output(out, cfg.overwrite) as stage:
        write_json(stage / "manifest.json", manifest.data)
        if manifest.hidden:
            write_json(stage / HIDDEN_LABELS, label_parts.oracle_file(manifest))
        for node in manifest.node_names:
            write_json(inside(stage, "nodes", f"{node}.json"), node_view(manifest.data, node))
        write_csv(stage / "summary.csv", summary_frame(manifest))
        write_summary_png(manifest, stage / "summary.png")
        write_json(stage / "config.json", provenance("partition", to_json(cfg), cfg.seed,
                                                     {"data": manifest.content_hash}))
    manifest.path = out / "manifest.json"
    return manifest
