"""FedReplay (Qu et al. 2022, Algorithm 2): one node (`--encoder-node`, default the one with the most training
images) trains the whole classifier on its images in round 0 under a stated rule (`--encoder-rule`,
`--encoder-epochs`, below); its bottom up to `--cut` (the stem by default: conv1, BN, ReLU and max-pool, the
journal version's encoder) is then frozen and sent to every node; each node encodes its training images once
(BatchNorm at its stored statistics) and uploads the latents with their labels to the server (`--server-node`,
default the encoder node), which trains the rest of the network (the head, from the encoder node's weights) on
the union of the latents, E epochs a round. One upload, no averaging; the head never sees an image. The server
publishes encoder + head after each round, to be tested on every node's test set.

The encoder's rule (the study trains it "until model convergence" at one institution): `plateau` (default)
trains until the encoder node's training loss changes by under 1% over 3 epochs: after epoch t >= 4 it stops
when the mean training loss of each of epochs t-2, t-1 and t lies within 1% of epoch t-3's; at most
`--encoder-epochs N` epochs (default 50). `fixed` trains exactly N epochs. An epoch's training loss is the
mean over its images of the loss each batch was trained on (the supervised cross-entropy, in training mode,
before that batch's step). No encoder training at all is refused (`--encoder-epochs 0`) unless asked for by
name, `--encoder-rule untrained`: the frozen encoder is then the common initial model, which every node builds
alike, so it does not travel, and the report says "untrained encoder". What the encoder trained is written to
`encoder.csv` (one row per epoch: its mean training loss, the rule, the cap, and why it stopped: `plateau`,
`cap`, `fixed` or `untrained`).

Budget: the encoder's epochs at the encoder node, their own budget (one optimiser, the learning-rate schedule
over the cap's N epochs; a stop at the plateau leaves the schedule where it stood), then R x E epochs of the
head over every node's latents (as the central model's epochs span every node's images), the schedule over
those R x E epochs. `--init-epochs` does nothing for FedReplay (neither the encoder's epochs nor the head's
schedule read it); it stays a shared option of the other strategies run beside it.

What travels: the encoder (round 0, to every other node), the head to the server when it is not the encoder
node, and each node's latents once (N x C x H x W x 4 bytes and 8 N for the labels, plus the safetensors
header). Kept for an audit (`shared/latents.safetensors`): the first 256 latents of each node, with labels, the node's
index in the partition's order and each latent's position in that node's training set (`index`).
The server keeps every node's latents in its checkpoint part, so a resumed run does not upload them again.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from fedcli.comm.payloads import decode_features, decode_model, encode_features, encode_model
from fedcli.core.errors import UserError
from fedcli.data.dataset import to_float
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.config import MAX_COUNT
from fedcli.experiment.panels import SPLIT
from fedcli.federate.strategies.base import Declaration, Strategy, option
from fedcli.federate.strategies.split_options import Cut, cut, node as node_option, server_node
from fedcli.models.cuts import cut_shape, split
from fedcli.training.local import Batches, LatentBatches, LocalSettings
from fedcli.training.objectives import Batch, Supervised, Wrapped

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation
    from fedcli.training.settings import LocalTrainer

KEY = "global"
LATENTS = "latents"
ENCODER = "encoder"  # encoder.csv, and the checkpoint's copy of it (every node holds it)
KEPT_PER_NODE = 256
ENCODE_BATCH = 256
ENCODER_EPOCHS = 50  # the default cap
PLATEAU_CHANGE = 0.01  # the plateau rule: under 1% ...
PLATEAU_EPOCHS = 3  # ... over 3 epochs
EncoderRule = Literal["plateau", "fixed", "untrained"]
STOPS = ("plateau", "cap", "fixed", "untrained")  # why the encoder's training stopped (encoder.csv)


@dataclasses.dataclass(frozen=True)
class ReplayEncoderOptions:
    cut: Cut = cut("stem")
    encoder_node: str | None = node_option("The node that trains the classifier whose bottom becomes FedReplay's "
                                           "frozen, shared encoder (default: the one with the most training images).")
    server_node: str | None = server_node()
    encoder_rule: EncoderRule = dataclasses.field(default="plateau", metadata={
        "help": "How FedReplay's encoder node trains the whole classifier before its bottom is frozen: plateau "
                "(until its training loss changes by under 1% over 3 epochs, at most --encoder-epochs), fixed "
                "(exactly --encoder-epochs), untrained (none: the random initialisation is frozen; the report says "
                "'untrained encoder').", "select": False})
    encoder_epochs: int | None = option(None, 0, MAX_COUNT, help="FedReplay's encoder epochs: the cap of "
                                        "--encoder-rule plateau, the count of fixed (0 only with --encoder-rule "
                                        "untrained).")  # None: ENCODER_EPOCHS, or 0 when untrained

    def __post_init__(self) -> None:
        epochs = self.encoder_epochs
        if self.encoder_rule == "untrained":
            if epochs:
                raise UserError(f"--encoder-rule untrained trains no encoder, so --encoder-epochs {epochs} would go "
                                "unused; drop --encoder-epochs, or choose --encoder-rule plateau or fixed")
            object.__setattr__(self, "encoder_epochs", 0)
        elif epochs == 0:
            raise UserError("--encoder-epochs 0 trains no encoder: FedReplay would freeze and send the random "
                            "initialisation; give --encoder-epochs 1 or more, or ask for an untrained encoder by "
                            "name with --encoder-rule untrained")
        elif epochs is None:
            object.__setattr__(self, "encoder_epochs", ENCODER_EPOCHS)


def plateaued(losses: list[float]) -> bool:
    """The plateau rule after the last of `losses` (each epoch's mean training loss): each of the last 3
    lies within 1% of the epoch before them."""
    if len(losses) <= PLATEAU_EPOCHS:
        return False
    reference = losses[-PLATEAU_EPOCHS - 1]
    return all(abs(loss - reference) <= PLATEAU_CHANGE * reference for loss in losses[-PLATEAU_EPOCHS:])


class MeteredLoss(Wrapped):
    """The base objective, summing each batch's loss over its images: an epoch's mean training loss."""

    def __init__(self, base):
        super().__init__(base)
        self.total: torch.Tensor | float = 0.0
        self.images = 0

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        loss = self.base.loss(model, batch)
        self.total = self.total + loss.detach() * len(batch.labels)  # a tensor, read once an epoch
        self.images += len(batch.labels)
        return loss

    def take_mean(self) -> float:
        """The mean loss per image since the last call."""
        mean = float(self.total) / self.images if self.images else math.nan
        self.total, self.images = 0.0, 0
        return mean


class EncoderTraining:
    """The encoder node's training under its rule, as one call of local training: the batches of up to `cap`
    epochs (one optimiser, the schedule over the cap), cut short at the first epoch's end where the plateau
    rule holds; each epoch's mean training loss, read through the objective."""

    def __init__(self, rule: str):
        self.rule = rule
        self.metered = MeteredLoss(Supervised())
        self.losses: list[float] = []
        self.stopped: str | None = None

    def compose(self, primary: TensorSource, replay: TensorSource | None, settings: LocalSettings,
                generator: torch.Generator) -> "StoppingBatches":
        return StoppingBatches(Batches(primary, replay, settings, generator), self)

    def epoch_end(self, last: bool) -> bool:
        """Record the epoch's mean loss; whether training stops here."""
        self.losses.append(self.metered.take_mean())
        if self.rule == "plateau" and plateaued(self.losses):
            self.stopped = "plateau"
        elif last:
            self.stopped = "cap" if self.rule == "plateau" else "fixed"
        return self.stopped is not None


class StoppingBatches:
    """The cap's batches, ending early when the rule says so (checked at each epoch's end, once that epoch's
    last batch has been trained on); its length is the cap's, which the learning-rate schedule runs over."""

    def __init__(self, batches: Batches, training: EncoderTraining):
        self.batches, self.training = batches, training
        self.per_epoch = len(batches) // batches.settings.epochs

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        for step, batch in enumerate(self.batches):
            if step and step % self.per_epoch == 0 and self.training.epoch_end(last=False):
                return
            yield batch
        if self.per_epoch:
            self.training.epoch_end(last=True)


def encoder_rows(node: str, options: ReplayEncoderOptions, losses: list[float], stopped: str) -> list[dict]:
    """encoder.csv: one row per epoch the encoder trained (one of epoch 0 for an untrained encoder)."""
    rows = [{"node": node, "epoch": epoch, "train_loss": loss} for epoch, loss in enumerate(losses, 1)] \
        if stopped != "untrained" else [{"node": node, "epoch": 0, "train_loss": math.nan}]
    return [row | {"rule": options.encoder_rule, "epochs": options.encoder_epochs, "stopped": stopped}
            for row in rows]


def own_budget(trainer: "LocalTrainer", **changes) -> "LocalTrainer":
    """`trainer` on a budget of its own (the epochs its learning-rate schedule spans), the same in all else;
    its calls are counted with the run's (`spent`)."""
    other = copy.copy(trainer)
    other.budget = dataclasses.replace(trainer.budget, **changes)
    return other


class FedReplay(Strategy):
    name = "fedreplay"

    def __init__(self, options: ReplayEncoderOptions):
        self.options = options
        self.latents: TensorSource | None = None  # at the server: every node's, in node order
        self.owners = torch.empty(0, dtype=torch.int64)  # the node index of each latent
        self.encoder_log: list[dict] = []  # encoder.csv: every node holds it

    @property
    def trained(self) -> bool:
        return self.options.encoder_rule != "untrained"

    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.model = fed.trainer.new_model(KEY)
        self.encoder, self.head = split(self.model, fed.trainer.model_name, self.options.cut)
        sizes = fed.train_sizes()
        self.encoder_node = self.options.encoder_node or max(fed.nodes, key=lambda n: (sizes[n], -fed.nodes.index(n)))
        self.server = self.options.server_node or self.encoder_node
        self.shape = cut_shape(self.encoder, fed.data.image_shape)
        if self.trained and not sizes[self.encoder_node]:
            raise UserError(f"--encoder-node {self.encoder_node} has no training images, so FedReplay's encoder "
                            "would stay untrained; choose another --encoder-node")
        if not train:
            return
        if self.trained:
            rows = self.train_encoder(fed) if self.encoder_node in fed.local_nodes else []
            self.hand_over(fed)
            self.encoder_log = [row for part in fed.transport.gather(rows, "the encoder's training") for row in part]
        else:
            self.encoder_log = encoder_rows(self.encoder_node, self.options, [], "untrained")
        self.upload(fed)
        if self.trained:
            self.publish(fed, 0)

    def train_encoder(self, fed: "Federation") -> list[dict]:
        """At the encoder node: the whole network, round 0, until its rule stops it; encoder.csv's rows."""
        cap = self.options.encoder_epochs
        training = EncoderTraining(self.options.encoder_rule)
        trainer = own_budget(fed.trainer, init_epochs=cap, rounds=0)  # round 0 spans the schedule's cap
        trainer.train(self.model, self.encoder_node, 0, fed.data.train[self.encoder_node], None, cap,
                      training.metered, training.compose)
        return encoder_rows(self.encoder_node, self.options, training.losses, training.stopped)

    def hand_over(self, fed: "Federation") -> None:
        """The trained encoder to every other node, the head to the server (sent after a training of unbounded
        length: the receivers wait while the encoder node lives)."""
        parts = [(other, self.encoder) for other in fed.nodes if other != self.encoder_node]
        parts += [(self.server, self.head)] if self.server != self.encoder_node else []
        for receiver, part in parts:
            if self.encoder_node in fed.local_nodes:
                fed.transport.send_whenever(0, self.encoder_node, receiver, "model", encode_model(part.state_dict()))
            if receiver in fed.local_nodes:
                part.load_state_dict(decode_model(fed.transport.receive_whenever(0, self.encoder_node, receiver,
                                                                                 "model"), part.state_dict()))
        fed.transport.flush()

    def encode(self, fed: "Federation", node: str) -> torch.Tensor:
        """The frozen encoder's output on every training image of `node`, in batches, in eval mode."""
        self.encoder.eval()
        images = fed.data.train[node].images
        with torch.no_grad():
            return torch.cat([self.encoder(to_float(images[i:i + ENCODE_BATCH]).to(fed.trainer.device)).cpu()
                              for i in range(0, len(images), ENCODE_BATCH)] or [torch.empty(0, *self.shape)])

    def upload(self, fed: "Federation") -> None:
        """Every node's latents and labels to the server, once."""
        parts = []
        for node in fed.nodes:
            if node in fed.local_nodes:
                latents = self.encode(fed, node)
                if node == self.server:
                    parts.append((latents, fed.data.train[node].labels))
                else:
                    fed.transport.send(0, node, self.server, LATENTS,
                                       encode_features(latents, fed.data.train[node].labels))
            if self.server in fed.local_nodes and node != self.server:
                data = fed.transport.receive(0, node, self.server, LATENTS)
                parts.append(decode_features(data, "latents", self.shape, fed.data.num_classes))
        fed.transport.flush()
        if self.server in fed.local_nodes:
            self.latents = TensorSource(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            self.owners = torch.cat([torch.full((len(p[1]),), i, dtype=torch.int64) for i, p in enumerate(parts)])

    def run_round(self, fed: "Federation", round_: int) -> None:
        if self.server in fed.local_nodes:  # the head's R x E epochs are the schedule's span, init-epochs aside
            own_budget(fed.trainer, init_epochs=0).train(self.head, self.server, round_, self.latents, None,
                                                         fed.trainer.epochs, compose=LatentBatches)
        self.publish(fed, round_)

    def publish(self, fed: "Federation", round_: int) -> None:
        here = self.server in fed.local_nodes
        payload = fed.transport.publish(round_, self.server, encode_model(self.model.state_dict()) if here else None)
        self.model.load_state_dict(decode_model(payload, self.model.state_dict()))

    def models(self) -> dict[str, nn.Module]:
        return {KEY: self.model}

    def tables(self) -> dict[str, list[dict]]:
        return {ENCODER: list(self.encoder_log)} if self.encoder_log else {}

    def kept(self) -> dict[str, dict[str, torch.Tensor]]:
        if self.latents is None:
            return {}
        rows = [torch.nonzero(self.owners == i).flatten()[:KEPT_PER_NODE] for i in range(int(self.owners.max()) + 1)] \
            if len(self.owners) else [self.owners]
        kept = torch.cat(rows)
        return {LATENTS: {"latents": self.latents.images[kept].contiguous(), "labels": self.latents.labels[kept],
                          "node": self.owners[kept], "index": torch.cat([torch.arange(len(r)) for r in rows])}}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        held = {f"{LATENTS}:{self.server}": {"latents": self.latents.images, "labels": self.latents.labels,
                                             "node": self.owners}} if self.latents is not None else {}
        trained = [row["train_loss"] for row in self.encoder_log if row["epoch"]]
        log = {ENCODER: {"train_loss": torch.tensor(trained, dtype=torch.float64),
                         "stopped": torch.tensor([STOPS.index(self.encoder_log[0]["stopped"])])}
               } if self.encoder_log else {}
        return super().state() | held | log

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, {KEY: states[KEY]})
        held = states.get(f"{LATENTS}:{self.server}")
        if held is not None:
            self.latents = TensorSource(held["latents"].cpu(), held["labels"].cpu())
            self.owners = held["node"].cpu()
        log = states.get(ENCODER)
        if log is not None:
            self.encoder_log = encoder_rows(self.encoder_node, self.options, log["train_loss"].cpu().tolist(),
                                            STOPS[int(log["stopped"][0])])


DECLARED = (
    Declaration("fedreplay", "FedReplay: one node's trained bottom becomes a frozen shared encoder; every node "
                "uploads its latents once and the server trains the head on their union (Qu et al.)",
                lambda o: FedReplay(o), options=ReplayEncoderOptions, model_key=KEY, transfers=("model", LATENTS),
                families=("federated",), published=True,
                discloses={LATENTS: "latents of every training image, with labels"},
                bn_averaged="the encoder node's below the cut (frozen), the union of every node's latents above it "
                "(the server's head)", panel=SPLIT),
)
