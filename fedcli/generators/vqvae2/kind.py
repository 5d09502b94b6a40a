"""The VQ-VAE-2 generator kind (`train-gan --generator vqvae2`): the generative-replay study's auxiliary
generator (Qu et al. 2022, Algorithm 1's first round), always trained serially across the nodes.

At institution k (the partition's order) the VQ-VAE-2 it received decodes the codes shared so far into the
replayed images x^r = D_old(e); it trains on x_U = x^r + its own images for --iterations steps, both levels on
x_U (the paper's text trains the bottom level on x_k alone; a bottom level that never sees x^r would
reconstruct it worse at every later step, so fedcli trains both on x_U, as its loss over x_U reads), with loss
||x - D(e)||^2 + beta ||sg[e] - E(x)||^2 and EMA codebooks (fedcli/generators/vqvae2/quantizer.py), from a fresh Adam
(only
weights travel). Then it encodes its own images, and sends its weights and the codes with labels on.

Algorithm 1 leaves two things open; fedcli's choices:
- Earlier institutions' codes are re-encoded by the updated encoder: at institution k, the codes of j < k
  become E_k(x^r_j), so every code the chain hands on indexes the codebook it travels with. (Kept as they were,
  old codes would index codebook entries that have since moved.)
- So the final decoder decodes every code: the last institution re-encodes all earlier codes and returns to
  each node the final VQ-VAE-2 and its codes (fedcli/generators/node_training.py writes them in the node's folder).

Each node then trains its own class-conditional prior on its codes (--prior-iterations; 0: none); its buffer
is the prior's samples (synthetic), or without a prior its decoded codes (reconstructions of its real images).
Under --dp-epsilon (no part of the study; fedcli's DP row of the privacy frontier) nothing computed from a real image
leaves a node except through DP-SGD: the chain is cyclic weight transfer of the VQ-VAE-2 without replay (codes are
encodings of real images, which no DP guarantee covers, so none travel), each institution training on its own images
by DP-SGD (Poisson batches, each image's gradient clipped, Gaussian noise; generators/private.py) with gradient
codebooks
(fedcli/generators/vqvae2/quantizer.py: an EMA codebook is a data-dependent average outside the gradient). Each node
encodes its
own images with the returned model, keeps the codes to itself, and trains its prior on them by DP-SGD at the same
sample rate and noise, so the chain visit and the prior compose as one mechanism of --iterations + --prior-iterations
steps (RDP). Released: the prior's samples, decoded (post-processing). A later institution's training is
post-processing of an earlier one's DP weights, so each node's epsilon is its own two parts.

The chain travels over a fedcli transport (serialized bytes, recorded per node): in process, or with
`--engine distributed` one process per node over torch.distributed (fedcli/generators/distributed.py), where each
institution waits for its predecessor's training however long it takes, while that process lives. It is
resumable after each institution on either engine (gan/.serial/after-k, written by institution k).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from pathlib import Path
from collections.abc import Sequence

import pandas as pd
import torch
from torch import nn
from torch.func import functional_call

from fedcli.comm.payloads import decode_model, encode_model
from fedcli.comm.transport import InProcessTransport, Transport
from fedcli.core import console
from fedcli.core.errors import UserError
from fedcli.core.precision import Scaled, autocast
from fedcli.core.progress import StepProgress
from fedcli.core.rng import stream_seed, torch_stream
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import parse_tensors, save_tensors
from fedcli.experiment.config import to_json
from fedcli.experiment.paths import CODES, GENERATOR, SERIAL, inside
from fedcli.generators import fidelity, private
from fedcli.generators.buffer import to_uint8
from fedcli.generators.config import GanConfig
from fedcli.generators.protocol import RELEASED, Trained
from fedcli.generators.vqvae2.codec import NodeCodec, load_codec
from fedcli.generators.vqvae2.codes import NodeCodes, decode_codes, encode_codes, from_tensors
from fedcli.generators.vqvae2.networks import (VqArchitecture, VqVae2, code_shape, decode_all, encode_all, loss,
                                               objective)
from fedcli.generators.vqvae2.options import VqVae2Options
from fedcli.generators.vqvae2.prior import CodePrior, PriorArchitecture
from fedcli.generators.vqvae2.quantizer import perplexity

CHAIN_OPTIONS = ("iterations", "batch", "vq_lr", "vq_beta", "vq_decay", "vq_codebook", "vq_dim", "vq_channels")
# a DP chain's noise depends on them (and its source: a keyed checkpoint must not resume a secure chain, or the reverse)
DP_OPTIONS = ("dp_epsilon", "dp_delta", "dp_max_grad_norm", "dp_noise", "prior_iterations")
PRIVATISED = "DP-SGD on the VQ-VAE-2, with gradient codebooks and no codes leaving the node, and on its priors"
CHECKPOINT_FORMAT = 2  # per institution, its own rows and bytes (format 1 held one file with every node's)
RECONSTRUCTIONS = "decoded"  # the role of the sampler of decoded codes, beside a prior's samples
FIDELITY_SHARE = 0.5  # the fidelity score's classifier steps, in all, per step of the node's generator


class VqGenerator(nn.Module):
    """A node's VQ-VAE-2 and, when trained, its priors: a Sampler of prior samples, and a Codec."""

    def __init__(self, arch: VqArchitecture, prior: PriorArchitecture | None):
        super().__init__()
        self.vqvae = VqVae2(arch)
        self.prior_top = CodePrior(prior) if prior else None
        self.prior_bottom = CodePrior(dataclasses.replace(prior, condition_codes=arch.codes)) if prior else None

    def encode(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.vqvae.encode(images)

    def decode(self, top: torch.Tensor, bottom: torch.Tensor) -> torch.Tensor:
        return self.vqvae.decode(top, bottom)

    @torch.no_grad()
    def sample(self, labels: torch.Tensor, stream: torch.Generator, truncation: float = 1.0) -> torch.Tensor:
        """Codes of `labels` from the priors, decoded (truncation has no meaning here and is ignored)."""
        arch = self.vqvae.arch
        top = self.prior_top.sample(labels, arch.top_side, stream)
        bottom = self.prior_bottom.sample(labels, arch.bottom_side, stream, top)
        return self.decode(top, bottom)


class CodeSampler:
    """Decoded codes of a node's real images, drawn per label from its codes by the caller's stream: the
    Sampler of a buffer of reconstructions."""

    def __init__(self, generator: VqGenerator, codes: NodeCodes):
        self.generator, self.codes = generator, codes
        self.pools = {c: (codes.labels == c).nonzero().flatten() for c in set(codes.labels.tolist())}

    @torch.no_grad()
    def sample(self, labels: torch.Tensor, stream: torch.Generator, truncation: float = 1.0) -> torch.Tensor:
        index = []
        for label in labels.tolist():
            pool = self.pools[label]
            index.append(int(pool[torch.randint(len(pool), (), generator=stream)]))
        device = labels.device
        return self.generator.decode(self.codes.top[index].to(device), self.codes.bottom[index].to(device))


def architecture(cfg: GanConfig, manifest: Manifest) -> VqArchitecture:
    try:
        return VqArchitecture(resolution=manifest["image_size"], channels=manifest["channels"],
                              num_classes=manifest.num_classes, hidden=cfg.vq_channels, codes=cfg.vq_codebook,
                              dim=cfg.vq_dim, decay=cfg.vq_decay, codebook="gradient" if cfg.private else "ema")
    except ValueError as exc:
        raise UserError(f"the partition's image size cannot be a VQ-VAE-2's ({exc}); re-run fedcli partition with "
                        "--image-size 16, 24, 32, ..., 256") from exc


def prior_architecture(cfg: GanConfig, arch: VqArchitecture) -> PriorArchitecture | None:
    if not cfg.prior_iterations:
        return None
    return PriorArchitecture(codes=arch.codes, num_classes=arch.num_classes, channels=cfg.prior_channels,
                             layers=cfg.prior_layers)


class VqVae2Kind:
    name = "vqvae2"
    projectable = False  # no latent to project: audit-privacy attacks its buffer alone
    transfers = ("model", "codes")  # the chain hands on its weights and every node's codes so far
    options = VqVae2Options
    serial = True

    def titles(self, cfg: GanConfig) -> dict[str, str]:
        if not cfg.prior_iterations:
            return {RELEASED: "released buffer: decoded codes of its real images"}
        if cfg.private:  # its codes are kept for the prior alone
            return {RELEASED: f"released buffer: DP prior samples, epsilon {cfg.dp_epsilon:g}"}
        return {RELEASED: "released buffer: prior samples", RECONSTRUCTIONS: "decoded codes of its real images"}

    def plans(self, cfg: GanConfig, manifest: Manifest, nodes: Sequence[str], seed: int) -> dict:
        if cfg.node and cfg.engine == "inprocess":
            raise UserError(f"--node {cfg.node}: a vqvae2 generator trains serially across every node in turn "
                            "(Algorithm 1); drop --node")
        architecture(cfg, manifest)
        return dp_plans(cfg, manifest, nodes) if cfg.private else {}

    def trainer(self, cfg: GanConfig, manifest: Manifest, nodes: Sequence[str], seed: int, device: str,
                local: Sequence[str] = (), transport: Transport | None = None) -> SerialTraining:
        plans = self.plans(cfg, manifest, nodes, seed)  # every process refuses before training
        arch = architecture(cfg, manifest)
        return SerialTraining(cfg, manifest, list(nodes), seed, device, arch, prior_architecture(cfg, arch),
                              list(local or nodes), transport or InProcessTransport(self.transfers), plans)

    def fidelity_budget(self, cfg: GanConfig, budget: fidelity.Budget, train_images: int,
                        buffers: int) -> fidelity.Budget:
        """The fidelity score's classifiers take at most FIDELITY_SHARE x the node's own generator steps
        (--iterations at its chain visit + --prior-iterations) in all: the full --fidelity-* budget grows with the
        node's images and the generator's steps do not, so uncapped the score outgrew the generator it scores
        (issue 61: 44 s against 34 s a node on 540 X-rays at 32 px). A small-CNN step costs about half a step of
        the kind's default VQ-VAE-2, so the score is about a fifth of the stage (docs/train-gan.md)."""
        allowance = int(FIDELITY_SHARE * (cfg.iterations + cfg.prior_iterations))
        return fidelity.within(budget, allowance, train_images, buffers)

    def node_codec(self, exp: Path, manifest: Manifest, node: str, record: dict, strategy: str) -> NodeCodec:
        return load_codec(exp, manifest, node, record, strategy)

    def build(self, record: dict) -> VqGenerator:
        prior = record.get("prior_architecture")
        return VqGenerator(VqArchitecture(**record["architecture"]), PriorArchitecture(**prior) if prior else None)

    def image_size(self, record: dict) -> int:
        return record["architecture"]["resolution"]

    def latent_sizes(self, record: dict) -> tuple[int, int]:
        raise UserError("a vqvae2 generator has no latent to project; audit-privacy audits GAN generators")


def dp_plans(cfg: GanConfig, manifest: Manifest, nodes: Sequence[str]) -> dict[str, private.DpPlan]:
    """Each node's DP-SGD plan: one noise multiplier for its chain visit and its prior, both Poisson-sampled at
    batch / N from its N training images, so the two compose as one mechanism of their steps together."""
    if not cfg.prior_iterations:
        raise UserError("--dp-epsilon with --generator vqvae2 releases its prior's samples, and --prior-iterations 0 "
                        "trains no prior (the buffer would be decoded codes of real images); give --prior-iterations")
    what = "DP-SGD steps (--iterations of the VQ-VAE-2 and --prior-iterations of its prior)"
    return {node: private.plan(cfg.dp_epsilon, cfg.dp_delta, cfg.dp_max_grad_norm, cfg.batch,
                               manifest.train_count(node), cfg.iterations + cfg.prior_iterations, node, what,
                               fewer="--iterations or --prior-iterations", noise=cfg.dp_noise) for node in nodes}


def batches(n: int, batch: int, steps: int, stream: torch.Generator):
    """`steps` index batches of at most `batch`, epochs of keyed permutations without replacement."""
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        while len(order) < min(batch, n):
            order = torch.cat([order, torch.randperm(n, generator=stream)])
        yield order[:batch]
        order = order[batch:]


def train_vqvae(model: VqVae2, images: torch.Tensor, cfg: GanConfig, stream: torch.Generator, device: str,
                log) -> None:
    """--iterations Adam steps on `images` (float [-1, 1]), batches and dead-code restarts from `stream`."""
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.vq_lr)
    update = Scaled(optimizer, cfg.precision, device)
    forward = torch.compile(model) if cfg.compile else model  # the quantiser's restarts break its graph
    model.train()
    for i, index in enumerate(batches(len(images), cfg.batch, cfg.iterations, stream), 1):
        with autocast(cfg.precision, device):  # the quantiser and the losses stay fp32 inside
            total, parts, (top, bottom) = loss(forward, images[index].to(device), cfg.vq_beta, stream)
        optimizer.zero_grad(set_to_none=True)
        update.step(total.float())
        log({"iteration": i, **parts, "perplexity_top": perplexity(top, model.arch.codes),
             "perplexity_bottom": perplexity(bottom, model.arch.codes),
             "restarted": model.quant_t.restarted + model.quant_b.restarted})
    model.eval()


def train_prior(generator: VqGenerator, codes: NodeCodes, cfg: GanConfig, stream: torch.Generator, device: str,
                log) -> None:
    """--prior-iterations Adam steps of both priors on the node's codes (lr --vq-lr, batch --batch)."""
    priors = [generator.prior_top, generator.prior_bottom]
    optimizer = torch.optim.Adam([p for prior in priors for p in prior.parameters()], lr=cfg.vq_lr)
    update = Scaled(optimizer, cfg.precision, device)
    for i, index in enumerate(batches(len(codes), cfg.batch, cfg.prior_iterations, stream), 1):
        top, bottom, labels = (t[index].to(device) for t in (codes.top, codes.bottom, codes.labels))
        with autocast(cfg.precision, device):
            nll_top = generator.prior_top.nll(top, labels).float()
            nll_bottom = generator.prior_bottom.nll(bottom, labels, top).float()
        optimizer.zero_grad(set_to_none=True)
        update.step(nll_top + nll_bottom)
        log({"phase": "prior", "iteration": i, "nll_top": nll_top.item(), "nll_bottom": nll_bottom.item()})
    generator.eval()


def example_loss(model: VqVae2, beta: float):
    """One image's objective as a function of the parameters of a VQ-VAE-2 with gradient codebooks (van den Oord
    et al. 2017, equation 3)."""
    def loss(params: dict, x: torch.Tensor) -> torch.Tensor:
        return objective(functional_call(model, params, (x[None],)), x[None], beta)[0]

    return loss


def train_vqvae_private(model: VqVae2, images: torch.Tensor, cfg: GanConfig, plan: private.DpPlan,
                        stream: torch.Generator, noise: torch.Generator, device: str, log) -> None:
    """--iterations DP-SGD steps on the node's own images (float [-1, 1]): Poisson batches from `stream`, each
    image's gradient clipped, noise from `noise`. Only the step is logged: no number computed from real images
    may leave a step unnoised (a Poisson batch's size counts the images drawn, so it is not logged either)."""
    update = private.DpSgd(model, torch.optim.Adam(model.parameters(), lr=cfg.vq_lr), plan, noise)
    loss = example_loss(model, cfg.vq_beta)
    model.train()
    for i in range(1, cfg.iterations + 1):
        index = private.poisson_batch(len(images), plan.sample_rate, stream)
        update.step(loss, images[index].to(device))
        log({"iteration": i})
    model.eval()


def prior_loss(pair: "PriorPair"):
    """One image's code maps' summed NLL as a function of both priors' parameters."""
    def loss(params: dict, top: torch.Tensor, bottom: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return functional_call(pair, params, (top[None], bottom[None], label[None]))

    return loss


class PriorPair(nn.Module):
    """A node's two priors as one module: DP-SGD clips each image's gradient over both."""

    def __init__(self, generator: VqGenerator):
        super().__init__()
        self.top, self.bottom = generator.prior_top, generator.prior_bottom

    def forward(self, top: torch.Tensor, bottom: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.top.nll(top, labels) + self.bottom.nll(bottom, labels, top)


def train_prior_private(generator: VqGenerator, codes: NodeCodes, cfg: GanConfig, plan: private.DpPlan,
                        stream: torch.Generator, noise: torch.Generator, device: str, log) -> None:
    """--prior-iterations DP-SGD steps of both priors on the node's codes (one code map per image, Poisson batches
    at the plan's rate); only the step is logged."""
    pair = PriorPair(generator)
    update = private.DpSgd(pair, torch.optim.Adam(pair.parameters(), lr=cfg.vq_lr), plan, noise)
    for i in range(1, cfg.prior_iterations + 1):
        index = private.poisson_batch(len(codes), plan.sample_rate, stream)
        update.step(prior_loss(pair), *(t[index].to(device) for t in (codes.top, codes.bottom, codes.labels)))
        log({"phase": "prior", "iteration": i})
    generator.eval()


@dataclasses.dataclass
class Held:
    """What the institution the chain has reached holds: the VQ-VAE-2 and every earlier institution's codes (none
    under DP)."""

    model: VqVae2
    codes: dict[str, NodeCodes]


@dataclasses.dataclass
class SerialTraining:
    """The chain across the nodes, run when built (resuming from gan/.serial/), then each node's Trained. In
    process every node is `local`; on a distributed rank only its own, and the others' steps happen elsewhere."""

    cfg: GanConfig
    manifest: Manifest
    nodes: list[str]
    seed: int
    device: str
    arch: VqArchitecture
    prior: PriorArchitecture | None
    local: list[str]
    transport: Transport
    plans: dict[str, private.DpPlan] = dataclasses.field(default_factory=dict)  # DP: no replay, no codes travel

    def __post_init__(self) -> None:
        self.folder = inside(self.cfg.exp, "gan", SERIAL)
        self.rows: dict[str, list[dict]] = {node: [] for node in self.local}
        self.seen: dict[str, dict] = {}
        self.sent = {node: 0 for node in self.local}  # bytes, as each node's config.json records them
        self.received = {node: 0 for node in self.local}
        self.final = self.chain()

    @property
    def last(self) -> str:
        return self.nodes[-1]

    # -- the chain ------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """What decides the chain's numbers: its options, the device, the seed, the partition and the order."""
        options = CHAIN_OPTIONS + (DP_OPTIONS if self.plans else ())
        config = {k: v for k, v in to_json(self.cfg).items() if k in options}
        device = torch.device(self.device).type  # a distributed rank's cuda:k computes as cuda does
        text = json.dumps([CHECKPOINT_FORMAT, config, device, self.seed, self.manifest.content_hash, self.nodes],
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def chain(self) -> Held | None:
        """Each local institution in turn: receive, train, send on, checkpoint; the last returns the final
        model and each node's codes to every node. The last institution's Held where it is local, else None."""
        held, start = self.resume()
        for k in range(start, len(self.nodes)):
            node = self.nodes[k]
            if node not in self.local:
                continue
            if k > 0:
                held = self.receive(k)
            held = self.visit(k, node, held)
            if node != self.last:
                self.send_on(k, held)
            self.checkpoint(k, held)
        if self.last not in self.local:
            return None
        self.final_bytes = encode_model(held.model.state_dict())  # serialized once for every node's return leg
        for node in self.nodes[:-1]:
            self.send(len(self.nodes), self.last, node, "model", self.final_bytes)
            if not self.plans:
                self.send(len(self.nodes), self.last, node, "codes", encode_codes({node: held.codes[node]}))
        self.transport.flush()  # every node waits for its share
        return held

    def send(self, round_: int, sender: str, receiver: str, kind: str, payload: bytes, counted: bool = True) -> None:
        self.transport.send_whenever(round_, sender, receiver, kind, payload)
        if counted:
            self.sent[sender] += len(payload)

    def received_bytes(self, round_: int, sender: str, receiver: str, kind: str) -> bytes:
        """A payload that comes after its sender's training, however long that takes (a live sender)."""
        payload = self.transport.receive_whenever(round_, sender, receiver, kind)
        self.received[receiver] += len(payload)
        return payload

    def send_on(self, k: int, held: Held, counted: bool = True) -> None:
        """Institution k sends its weights and the codes so far (under DP its weights alone) to institution k + 1."""
        node, after = self.nodes[k], self.nodes[k + 1]
        self.send(k + 1, node, after, "model", encode_model(held.model.state_dict()), counted)
        if not self.plans:
            self.send(k + 1, node, after, "codes", encode_codes(held.codes), counted)
        self.transport.flush()  # institution k + 1 is waiting for it

    def receive(self, k: int) -> Held:
        """What institution k - 1 sent, validated: the model, and codes of exactly the earlier institutions (none
        under DP)."""
        before, node = self.nodes[k - 1], self.nodes[k]
        model = built(lambda: VqVae2(self.arch)).to(self.device)
        model.load_state_dict(decode_model(self.received_bytes(k, before, node, "model"), model.state_dict()))
        if self.plans:
            return Held(model, {})
        codes = decode_codes(self.received_bytes(k, before, node, "codes"), code_shape(self.arch), self.nodes[:k])
        return Held(model, codes)

    def visit(self, k: int, node: str, held: Held | None) -> Held:
        """Train on the decoded earlier codes and the node's own images; re-encode both. Under DP (no codes
        held) train on its own images by DP-SGD and hand on the weights alone."""
        data = NodeDataset(self.manifest, node, "train")
        if held is None:
            held = Held(built(lambda: VqVae2(self.arch), stream_seed(self.seed, "vqvae2-init")).to(self.device), {})
        replayed = {j: decode_all(held.model, codes, self.device) for j, codes in held.codes.items()}
        own = to_float(data.images)
        self.seen[node] = {"position": k + 1, "own": len(own), "replayed": {j: len(x) for j, x in replayed.items()}}
        images = torch.cat([*replayed.values(), own]) if replayed else own
        stream = torch_stream(self.seed, node, "vqvae2-train")
        title = f"{node} VQ-VAE-2 ({k + 1} of {len(self.nodes)})"
        with StepProgress("train-gan", title, self.cfg.iterations) as bar:
            def log(row: dict) -> None:  # once a step
                self.rows[node].append({"phase": "vqvae", **row})
                bar.advance()

            if self.plans:
                noise = torch_stream(self.seed, node, "vqvae2-dp-noise", device=self.device)
                train_vqvae_private(held.model, own, self.cfg, self.plans[node], stream, noise, self.device, log)
            else:
                train_vqvae(held.model, images, self.cfg, stream, self.device, log)
        if self.plans:
            return Held(held.model, {})
        codes = {j: encode_all(held.model, replayed[j], held.codes[j].labels, self.device) for j in held.codes}
        codes[node] = encode_all(held.model, own, data.labels, self.device)
        return Held(held.model, codes)

    # -- resuming -------------------------------------------------------------------------
    def checkpoint(self, k: int, held: Held) -> None:
        """After institution k trained and sent on: what it holds, and its rows, record and bytes so far."""
        node = self.nodes[k]
        tensors = {f"model.{key}": v.detach().cpu() for key, v in held.model.state_dict().items()}
        for owner, codes in held.codes.items():
            tensors |= {f"codes.{owner}.{key}": v for key, v in codes.tensors().items()}
        metadata = {"fingerprint": self.fingerprint(), "institution": str(k), "node": node,
                    "seen": json.dumps(self.seen[node]), "rows": json.dumps(self.rows[node]),
                    "bytes": json.dumps([self.sent[node], self.received[node]])}
        self.folder.mkdir(parents=True, exist_ok=True)
        save_tensors(self.checkpoint_path(k), tensors, metadata)

    def checkpoint_path(self, k: int):
        return self.folder / f"after-{k}.safetensors"

    def readable(self, k: int) -> tuple[dict, dict] | None:
        """Institution k's checkpoint when this same configuration wrote it whole."""
        try:
            tensors, metadata = parse_tensors(self.checkpoint_path(k).read_bytes())
        except (OSError, ValueError):  # none, or not one this chain wrote whole
            return None
        return (tensors, metadata) if metadata.get("fingerprint") == self.fingerprint() else None

    def resume(self) -> tuple[Held | None, int]:
        """The chain after institution m, where every institution up to m (as every process found them) holds a
        checkpoint of this same configuration; else the start. The hand-over into m + 1 is sent again (the
        interruption may have cut it), uncounted: its bytes are in m's checkpoint."""
        mine = {k: found for k, node in enumerate(self.nodes) if node in self.local
                and (found := self.readable(k)) is not None}
        everywhere = {k for found in self.transport.gather(sorted(mine), "the serial chain's checkpoints")
                      for k in found}
        m = -1
        while m + 1 in everywhere:
            m += 1
        held = None
        for k in (k for k in mine if k <= m):
            tensors, metadata = mine[k]
            node = self.nodes[k]
            self.seen[node], self.rows[node] = json.loads(metadata["seen"]), json.loads(metadata["rows"])
            self.sent[node], self.received[node] = json.loads(metadata["bytes"])
            if k == m:
                model = built(lambda: VqVae2(self.arch)).to(self.device)
                model.load_state_dict({key.removeprefix("model."): v.to(self.device) for key, v in tensors.items()
                                       if key.startswith("model.")})
                owners = () if self.plans else self.nodes[:k + 1]
                held = Held(model, {owner: from_tensors(tensors, f"codes.{owner}.") for owner in owners})
                if self.nodes[k] != self.last:
                    self.send_on(k, held, counted=False)
        if m >= 0:
            console.out.print(f"vqvae2: resuming the serial training after {self.nodes[m]} "
                              f"({m + 1} of {len(self.nodes)})")
        return held, m + 1

    def finish(self) -> None:
        """Every node folder is written (every process's: the barrier waits for their priors and fidelity
        scores, however long): the local checkpoints go, and the folder once empty."""
        self.transport.barrier_whenever("writing the node folders")
        for k, node in enumerate(self.nodes):
            if node in self.local:
                self.checkpoint_path(k).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty, or another process removed it first
            self.folder.rmdir()

    # -- each node's share ----------------------------------------------------------------
    def train(self, node: str, data: NodeDataset) -> Trained:
        """The final VQ-VAE-2 and the node's codes, returned to it by the last institution; its prior."""
        generator = built(lambda: VqGenerator(self.arch, self.prior), stream_seed(self.seed, node, "prior-init"))
        generator.to(self.device)
        rows = list(self.rows[node])
        codes = self.returned(node, generator, data)
        if self.prior:
            stream = torch_stream(self.seed, node, "prior-train")
            with StepProgress("train-gan", f"{node} prior", self.cfg.prior_iterations) as bar:
                def log(row: dict) -> None:  # once a step
                    rows.append(row)
                    bar.advance()

                if self.plans:
                    noise = torch_stream(self.seed, node, "prior-dp-noise", device=self.device)
                    train_prior_private(generator, codes, self.cfg, self.plans[node], stream, noise, self.device, log)
                else:
                    train_prior(generator, codes, self.cfg, stream, self.device, log)
        generator.eval()
        if self.plans:
            return self.private_share(node, generator, data, rows)
        decoded = CodeSampler(generator, codes)
        generators = {RELEASED: generator, RECONSTRUCTIONS: decoded} if self.prior else {RELEASED: decoded}
        reconstruction = decode_all(generator.vqvae, codes, self.device)
        if not reconstruction.isfinite().all():  # uint8 would turn NaN into black images that federate trains on
            raise diverged(node)
        buffer = None if self.prior else (to_uint8(reconstruction), codes.labels.clone())
        mse = float(((reconstruction - to_float(data.images)) ** 2).mean()) if len(codes) else float("nan")
        files = self.files(node, generator) | {CODES: (codes.tensors(), self.meta(node))}
        record = self.record(node, data) | {
            "codes": {"images": len(codes), "perplexity_top": perplexity(codes.top, self.arch.codes),
                      "perplexity_bottom": perplexity(codes.bottom, self.arch.codes), "reconstruction_mse": mse},
            "buffer_kind": "prior samples" if self.prior else "decoded codes"}
        return Trained(generators, files, pd.DataFrame(rows), record, decoded=buffer)

    def meta(self, node: str) -> dict:
        return {"node": node, "manifest": self.manifest.content_hash}

    def files(self, node: str, generator: VqGenerator) -> dict:
        return {GENERATOR: ({k: v.detach().cpu() for k, v in generator.state_dict().items()}, self.meta(node))}

    def record(self, node: str, data: NodeDataset) -> dict:
        """config.json's keys every share has: the networks, the device, the images and the node's chain."""
        return {"architecture": dataclasses.asdict(self.arch), "device": self.device, "train_images": len(data),
                "prior_architecture": dataclasses.asdict(self.prior) if self.prior else None,
                "serial": {"order": self.nodes, **self.seen[node], "bytes_received": self.received[node],
                           "bytes_sent": self.sent[node]}}

    def returned(self, node: str, generator: VqGenerator, data: NodeDataset) -> NodeCodes:
        """Load the final VQ-VAE-2 the last institution returned; the node's codes it returned, or under DP
        (nothing returns codes) the node's own encoding of its images, which stays with it."""
        if node == self.last:
            model_bytes = self.final_bytes
        else:
            model_bytes = self.received_bytes(len(self.nodes), self.last, node, "model")
        generator.vqvae.load_state_dict(decode_model(model_bytes, generator.vqvae.state_dict()))
        if self.plans:
            return encode_all(generator.vqvae, to_float(data.images), data.labels, self.device)
        if node == self.last:
            codes_bytes = encode_codes({node: self.final.codes[node]})
        else:
            codes_bytes = self.received_bytes(len(self.nodes), self.last, node, "codes")
        return decode_codes(codes_bytes, code_shape(self.arch), [node])[node]

    def private_share(self, node: str, generator: VqGenerator, data: NodeDataset, rows: list[dict]) -> Trained:
        """Under DP: the prior's samples alone are released; no codes file, and no statistic of its codes in the
        record (the fidelity score, on the node's real images as for a DP GAN, is the stage's, beside it)."""
        if not all(p.isfinite().all() for p in generator.parameters()):
            raise diverged(node)
        parts = {"vqvae": self.cfg.iterations, "prior": self.cfg.prior_iterations}
        record = self.record(node, data) | {
            "buffer_kind": "prior samples",
            "dp": self.plans[node].record() | {"privatised": PRIVATISED, "parts": parts}}
        return Trained({RELEASED: generator}, self.files(node, generator), pd.DataFrame(rows), record)


def diverged(node: str) -> UserError:
    return UserError(f"node {node}'s VQ-VAE-2 decodes non-finite images (its training diverged); re-run "
                     "fedcli train-gan --overwrite with a lower --vq-lr")


def built(make, seed: int = 0):
    """A module made under a fixed seed without touching the global generator: its weights are either keyed
    (`seed` from the stream) or overwritten at once by a received or saved state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


KIND = VqVae2Kind()
