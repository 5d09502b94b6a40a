"""The notes under the study's tables: the architectures, budgets, engines and disclosures of the runs they compare."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from fedcli.experiment.config import architectures
from fedcli.federate.strategies import REGISTRY
from fedcli.report.collect import SubExperiment
from fedcli.report.table import nodes_of


def engine_note(subs: list[SubExperiment]) -> str | None:
    """Which strategies ran one process per node, and whether their models travelled for evaluation."""
    runs = {r.strategy: r for s in subs for r in s.runs if r.config.get("engine", "inprocess") != "inprocess"}
    if not runs:
        return None
    sent = [name for name, r in runs.items() if r.comm is not None and (r.comm.kind == "eval").any()]
    published = [name for name in sent if (d := REGISTRY.get(name)) is not None and d.published]
    moved = [name for name in sent if name not in published]
    off = [name for name, r in runs.items() if not r.config.get("cross_eval") and name not in published]
    parts = [f"{', '.join(runs)} ran on the distributed engine (one torch.distributed process per node)."]
    if moved:
        parts.append(f"Cross-evaluation was on for {', '.join(moved)}: every node model was sent to every node to be "
                     "tested (eval traffic in Table 8), which FedER-A otherwise never does.")
    if published:
        parts.append(f"The model of {', '.join(published)}, which one node holds after each round, was sent to every "
                     "other node to be tested there (eval traffic in Table 8).")
    if off:
        parts.append(f"Cross-evaluation was off for {', '.join(off)}: each node tested only the models it holds, so "
                     "these have no node-convergence (Table 3) or ensemble entries.")
    return " ".join(parts)


def disclosure_note(subs: list[SubExperiment]) -> str | None:
    """Who received what a strategy computes from the nodes' images (latents, activations, the images
    themselves), read from what travelled."""
    seen: dict[tuple[str, str], tuple[set, set]] = {}  # (strategy, kind) -> receivers, senders over every run
    for run in (r for s in subs for r in s.runs):
        declaration = REGISTRY.get(run.strategy)
        if declaration is None or run.comm is None:
            continue
        for kind in declaration.discloses:
            sent = run.comm[run.comm.kind == kind]
            if len(sent):
                receivers, senders = seen.setdefault((run.strategy, kind), (set(), set()))
                receivers.update(sent.receiver)
                senders.update(sent.sender)
    parts = [f"In {name}, {', '.join(sorted(receivers))} received from {', '.join(sorted(senders))} the "
             f"{REGISTRY[name].discloses[kind]}: {'that rank' if len(receivers) == 1 else 'those ranks'} saw them."
             for (name, kind), (receivers, senders) in seen.items()]
    return " ".join(parts) or None


def by_strategy(label: str, subs: list[SubExperiment], describe: Callable[[dict], str]) -> str:
    """`label: strategies: description; ...`, strategies whose runs' configs read alike grouped."""
    described = {}
    for run in (r for s in subs for r in s.runs):
        described.setdefault(run.strategy, describe(run.config))
    if not described:
        return ""
    groups = defaultdict(list)
    for strategy, text in described.items():
        groups[text].append(strategy)
    return f"{label}: " + "; ".join(f"{', '.join(names)}: {text}" for text, names in groups.items()) + "."


def architecture_note(subs: list[SubExperiment]) -> str:
    """Each strategy's classifier, and each node's own where --model NODE=ARCH gave one."""
    nodes = nodes_of(subs)

    def describe(config: dict) -> str:
        default, own = architectures(config.get("model", "cnn"))
        return ", ".join(f"{node} {own.get(node, default)}" for node in nodes) if own else default
    return by_strategy("Classifiers", subs, describe)


def budget_note(subs: list[SubExperiment]) -> str:
    """How long each strategy trained, in epochs over its training data, and at what learning rate."""
    def describe(config: dict) -> str:
        init, rounds, epochs = (config.get(k) for k in ("init_epochs", "rounds", "epochs"))
        phases, rule, cap = "round 0, then R x E", config.get("encoder_rule"), config.get("encoder_epochs")
        if rule is not None:  # fedreplay: its encoder's own epochs (federate/strategies/fedreplay.py), then the head's
            init = {"untrained": "untrained encoder", "fixed": f"{cap} encoder epochs"}.get(
                rule, f"up to {cap} encoder epochs (until the loss changed under 1% over 3)")
            phases = "R x E of the head" if rule == "untrained" else "the encoder node, then R x E of the head"
        schedule = {"cosine": "annealed to 0 along a cosine over those epochs",
                    "step": f"times {config.get('lr_step_factor')} every {config.get('lr_step_epochs')} of those "
                            "epochs"}.get(config.get("lr_schedule"), "constant")
        optimizer = (f"SGD (momentum {config.get('sgd_momentum')})" if config.get("optimizer") == "sgd" else "Adam")
        decay = f", weight decay {config['weight_decay']:g}" if config.get("weight_decay") else ""
        return f"{init} + {rounds} x {epochs} epochs ({phases}), {optimizer} lr {config.get('lr')} " \
               f"{schedule}{decay}"
    return by_strategy("Budget", subs, describe)
