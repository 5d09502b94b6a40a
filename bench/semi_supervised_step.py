"""Few labels: fedcli's FixMatch step and FedPerl round against bare PyTorch loops, in one run.

1. FixMatch local training: `LocalTrainer.train` of one node with `--ssl fixmatch` (b labelled images with the
   source's flips, mu b unlabelled ones in a weak and a strong view, one forward pass, FixMatch's loss) against
   a bare loop taking the same optimiser steps on the same tensors. Both draw their views with fedcli's
   augmentation functions (fedcli/data/fixmatch_augment.py: RandAugment is per image, in Python, as in
   FixMatch's reference code), so the ratio is the cost of fedcli's batches, objective and streams; the
   augmentations' share of the bare step is printed beside it. Ratio = fedcli / bare; goal <= 1.10.
2. A FedPerl round (T = 2 peers, FedPerl's code regime: b = 16, mu = 1): `federate --strategy fedperl` against a
   bare loop with the same steps (each node: FixMatch with its peers' mean-of-softmax labels and the MSE term,
   then a plain average; peers chosen from the models' parameter statistics). Both evaluate nothing but round 0
   and the last round, which fedcli's time includes (bootstrap 10); best of two runs each, interleaved. Also the
   similarity step (describe every
   node's model, the similarity matrix, each node's top T), timed alone, as a share of fedcli's round: goal under
   1%. And FedPerl's round against SSFL's, both fedcli: what the peers cost.
Run: .venv/bin/python bench/semi_supervised_step.py
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from fedcli.data import partition
from fedcli.data.dataset import augment_batch, to_float
from fedcli.data.fixmatch_augment import strong_view, weak_view
from fedcli.data.loading import digit_images
from fedcli.experiment.config import PartitionConfig
from fedcli.federate import engine, stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import REGISTRY, peers
from fedcli.models.classifier import build_classifier
from fedcli.training.fixmatch import FixMatchSettings

NODES, BATCH, MU, STEPS = 5, 16, 7, 30
ROUNDS, PEERS, PERL_MU, PERL_STEPS = 3, 2, 1, 30


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bare_fixmatch_steps(model, labelled, unlabelled, steps: int, batch: int, mu: int, flips, settings, peer_models=(),
                        beta: float = 0.0) -> float:
    """`steps` FixMatch steps (with peers: FedPerl's labels and MSE term) on plain tensors; returns the seconds
    spent augmenting."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    augmenting = 0.0
    images, labels = labelled
    for step in range(steps):
        index = torch.randint(0, len(labels), (batch,), generator=generator)
        u = torch.randint(0, len(unlabelled), (mu * batch,), generator=generator)
        start = time.perf_counter()
        x = augment_batch(to_float(images[index]), flips, generator)
        weak, strong = weak_view(unlabelled[u], flips, generator), strong_view(unlabelled[u], flips, generator)
        augmenting += time.perf_counter() - start
        n = len(index)
        logits = model(torch.cat([x, weak, strong]).contiguous(memory_format=torch.channels_last))
        loss = F.cross_entropy(logits[:n], labels[index])
        weak_logits, strong_logits = logits[n:n + mu * n], logits[n + mu * n:]
        own = torch.softmax(weak_logits, dim=1)
        with torch.no_grad():
            theirs = [torch.softmax(p(weak), dim=1) for p in peer_models]
        confidence, pseudo = torch.stack([own.detach(), *theirs]).mean(0).max(1)
        mask = (confidence >= settings.confidence).float()
        loss = loss + settings.lambda_u * (F.cross_entropy(strong_logits, pseudo, reduction="none") * mask).mean()
        if theirs:
            loss = loss + beta * torch.stack([F.mse_loss(own, p) for p in theirs]).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return augmenting


def few_labels(tmp: str) -> tuple[Path, object]:
    exp = Path(tmp) / "exp"
    manifest = partition.run(PartitionConfig(exp=exp, nodes=NODES, labeled_fraction=0.1), REGISTRY.reserved_names())
    digit_images()
    return exp, manifest


def bench_step(exp: Path, manifest) -> None:
    cfg = FederateConfig(exp=exp, strategy=("standalone",), ssl="fixmatch", unlabeled_ratio=MU, batch=BATCH,
                         steps_per_round=STEPS, confidence=0.95, threads=2)
    fed = engine.build(cfg, manifest, 0)
    node = manifest.node_names[0]
    labelled, unlabelled = fed.data.train[node], fed.data.unlabeled[node]
    fed.trainer.train(fed.trainer.new_model(node), node, 1, labelled, None, 1)  # warm-up: images decoded
    ours, bare = [], []
    for _ in range(3):  # interleaved, best of three
        ours.append(timed(lambda: fed.trainer.train(fed.trainer.new_model(node), node, 1, labelled, None, 1)))
        model = build_classifier("cnn", 1, 10, init_seed=0).to(memory_format=torch.channels_last)
        augmenting = [0.0]
        bare.append((timed(lambda: augmenting.__setitem__(0, bare_fixmatch_steps(
            model, (labelled.images, labelled.labels), unlabelled.images, STEPS, BATCH, MU, fed.data.augment,
            FixMatchSettings()))), augmenting[0]))
    t_fedcli, (t_bare, t_augment) = min(ours), min(bare)
    print(f"FixMatch local training, one digits node ({len(labelled)} labelled, {len(unlabelled)} unlabelled), cnn, "
          f"{STEPS} steps of b = {BATCH} + mu b = {MU * BATCH} unlabelled in 2 views, 2 threads (best of 3, interleaved):")
    print(f"  bare loop {t_bare:.2f} s ({t_bare / STEPS * 1e3:.0f} ms/step, augmentations {t_augment / t_bare:.0%}), "
          f"fedcli {t_fedcli:.2f} s, ratio {t_fedcli / t_bare:.2f}")


def bare_fedperl(fed, rounds: int) -> None:
    """FedPerl's rounds as a bare loop: every node trains from the global model with its peers, then the plain mean."""
    nodes = fed.nodes
    data = {n: ((fed.data.train[n].images, fed.data.train[n].labels), fed.data.unlabeled[n].images) for n in nodes}
    global_model = build_classifier("cnn", 1, 10, init_seed=0).to(memory_format=torch.channels_last)
    trainable = [name for name, _ in global_model.named_parameters()]
    local: dict[str, dict] = {}  # each node's last trained state
    settings = FixMatchSettings(confidence=0.95, lambda_u=1.0)
    for _ in range(rounds):
        chosen = {}
        if local:
            sim = peers.similarity(torch.stack([peers.features([local[n][k] for k in trainable]) for n in nodes]))
            chosen = {n: [nodes[j] for j in peers.top_peers(i, sim, PEERS, [j for j in range(len(nodes)) if j != i])]
                      for i, n in enumerate(nodes)}
        states = {}
        for n in nodes:
            model = build_classifier("cnn", 1, 10, init_seed=0).to(memory_format=torch.channels_last)
            model.load_state_dict(global_model.state_dict())
            teachers = []
            for p in chosen.get(n, []):
                teacher = build_classifier("cnn", 1, 10, init_seed=0)
                teacher.load_state_dict(local[p])
                teachers.append(teacher.eval().to(memory_format=torch.channels_last))
            bare_fixmatch_steps(model, *data[n], PERL_STEPS, BATCH, PERL_MU, fed.data.augment, settings, teachers,
                                beta=0.01)
            states[n] = local[n] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        global_model.load_state_dict({k: torch.stack([s[k].float() for s in states.values()]).mean(0).to(v.dtype)
                                      for k, v in global_model.state_dict().items()})


def bench_round(exp: Path, manifest) -> None:
    common = dict(exp=exp, ssl="fixmatch", unlabeled_ratio=PERL_MU, batch=BATCH, steps_per_round=PERL_STEPS,
                  rounds=ROUNDS, init_epochs=0, eval_every=ROUNDS, bootstrap=10, threads=2, overwrite=True)
    fed = engine.build(FederateConfig(strategy=("fedperl",), **common), manifest, 0)
    times = {"fedperl": [], "fedavg": [], "bare": []}
    for _ in range(2):  # interleaved, best of two: the machine's drift falls on all three alike
        times["bare"].append(timed(lambda: bare_fedperl(fed, ROUNDS)))
        for name in ("fedperl", "fedavg"):
            times[name].append(timed(lambda: stage.run(FederateConfig(strategy=(name,), peers=PEERS, **common))))
    t_perl, t_ssfl, t_bare = (min(times[name]) for name in ("fedperl", "fedavg", "bare"))
    models = [build_classifier("cnn", 1, 10, init_seed=i) for i in range(NODES)]

    def choose() -> None:
        sim = peers.similarity(torch.stack([peers.features(list(m.parameters())) for m in models]))
        for i in range(NODES):
            peers.top_peers(i, sim, PEERS, peers.allowed(i, "static", sim))

    t_similarity = min(timed(choose) for _ in range(5))
    per_round = t_perl / ROUNDS
    print(f"FedPerl, {NODES} digits nodes, T = {PEERS}, {ROUNDS} rounds of {PERL_STEPS} steps of b = {BATCH} + mu b = "
          f"{PERL_MU * BATCH}, cnn, 2 threads:")
    print(f"  bare loop {t_bare:.2f} s, fedcli {t_perl:.2f} s, ratio {t_perl / t_bare:.2f}")
    print(f"  SSFL (fedcli) {t_ssfl:.2f} s: FedPerl / SSFL {t_perl / t_ssfl:.2f}")
    print(f"  similarity step {t_similarity * 1e3:.2f} ms, {t_similarity / per_round:.2%} of a fedcli round "
          f"({per_round:.2f} s)")


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        exp, manifest = few_labels(tmp)
        bench_step(exp, manifest)
        bench_round(exp, manifest)


if __name__ == "__main__":
    main()
