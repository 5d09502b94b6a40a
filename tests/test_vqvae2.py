"""The VQ-VAE-2 generator kind and the replay strategies built on it: the EMA codebook, the serial chain of
Algorithm 1 (what each institution sees, the final decoder, resuming), and cwt-replay / fedavg-replay."""

from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import pytest
import torch

from conftest import copy_exp
from fedcli.comm.payloads import encode_model
from fedcli.core import progress
from fedcli.core.errors import UserError
from fedcli.core.rng import torch_stream
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import load_tensors
from fedcli.federate import engine
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies.code_replay import CodeReplayOptions, replayed
from fedcli.generators.config import GAN_ENGINE_OPTIONS
from fedcli.generators.registry import node_codec
from fedcli.generators.vqvae2 import kind as vqvae2
from fedcli.generators.vqvae2.codes import encode_codes
from fedcli.generators.vqvae2.networks import VqArchitecture, VqVae2, encode_all, loss
from fedcli.generators.vqvae2.quantizer import Quantizer, perplexity

STAMP = re.compile(r"^\d\d:\d\d:\d\d ")  # a plain progress line's time
TINY_VQ = ["--generator", "vqvae2", "--iterations", "120", "--batch", "16", "--vq-channels", "32", "--vq-codebook",
           "32", "--vq-dim", "16", "--buffer-size", "24", "--fidelity-seeds", "0", "--threads", "1"]
FED = ["--rounds", "1", "--epochs", "1", "--init-epochs", "0", "--batch", "64", "--bootstrap", "10", "--threads", "1"]


# -- the codebook ------------------------------------------------------------------------------
def quantizer(decay=0.5) -> Quantizer:
    q = Quantizer(dim=2, codes=2, decay=decay, eps=0.0, dead_below=0.0)
    q.embed.copy_(torch.tensor([[0.0, 0.0], [10.0, 10.0]]))
    q.embed_sum.copy_(torch.tensor([[0.0, 0.0], [10.0, 10.0]]))
    q.cluster_size.fill_(1.0)
    return q


def test_the_ema_update_and_the_commitment_loss_match_a_hand_computation():
    q = quantizer()
    z = torch.tensor([[1.0, 2.0], [3.0, 0.0], [9.0, 9.0]]).t().reshape(1, 2, 1, 3)  # (B, D, H, W)
    out, codes, commitment, codebook = q(z)
    assert codes.flatten().tolist() == [0, 0, 1] and codebook is None  # the EMA update is the codebook's step
    # commitment: mean squared distance to the codes before the update: ((1+4) + 9 + (1+1)) / 6
    assert commitment.item() == pytest.approx(16 / 6)
    # counts: 0.5 * 1 + 0.5 * (2, 1); sums: 0.5 * old + 0.5 * assigned
    assert q.cluster_size.tolist() == [1.5, 1.0]
    assert q.embed_sum.tolist() == [[2.0, 1.0], [9.5, 9.5]]
    assert torch.allclose(q.embed, torch.tensor([[2.0 / 1.5, 1.0 / 1.5], [9.5, 9.5]]))
    # the forward value is each position's code as it was chosen, before the update
    assert out.flatten(2)[0].t().tolist() == [[0.0, 0.0], [0.0, 0.0], [10.0, 10.0]]


def test_the_straight_through_gradient_reaches_the_encoder_output_unchanged():
    q = quantizer().eval()
    z = torch.tensor([[1.0, 2.0], [8.0, 9.0]]).t().reshape(1, 2, 1, 2).requires_grad_(True)
    out, *_ = q(z)
    weight = torch.tensor([[[[3.0, -1.0]], [[0.5, 2.0]]]])
    (out * weight).sum().backward()
    assert torch.equal(z.grad, weight)


def test_a_dead_code_restarts_at_an_encoder_output_drawn_from_the_keyed_stream():
    q = Quantizer(dim=2, codes=3, decay=0.5, eps=0.0, dead_below=1.0)
    q.embed.copy_(torch.tensor([[0.0, 0.0], [1.0, 1.0], [100.0, 100.0]]))
    q.embed_sum.copy_(q.embed)
    q.cluster_size.fill_(2.0)
    z = torch.tensor([[0.1, 0.0], [1.0, 0.9], [0.0, 0.2], [1.1, 1.0]]).t().reshape(1, 2, 1, 4)
    q(z, torch_stream(0, "test", "restart"))  # the far code gets nothing: 0.5 x 2 = 1... still alive
    assert q.restarted == 0
    q(z, torch_stream(0, "test", "restart"))  # 0.5 x 1 = 0.5 < 1: dead, restarted
    assert q.restarted == 1
    pick = int(torch.randint(0, 4, (1,), generator=torch_stream(0, "test", "restart")))
    assert q.embed[2].tolist() == z.flatten(2)[0, :, pick].tolist()
    assert q.cluster_size[2].item() == 1.0


def tiny_digits(digits_manifest, split: str) -> torch.Tensor:
    data = NodeDataset(digits_manifest, digits_manifest.node_names[0], split)
    return torch.nn.functional.interpolate(to_float(data.images), size=16, mode="bilinear", align_corners=False)


def test_a_vqvae2_uses_its_codebook_and_reconstructs_held_out_images_better_than_the_mean_image(digits_manifest):
    train, test = tiny_digits(digits_manifest, "train"), tiny_digits(digits_manifest, "test")
    torch.manual_seed(0)
    model = VqVae2(VqArchitecture(resolution=16, channels=1, num_classes=10, hidden=32, codes=32, dim=16))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    stream = torch_stream(0, "test", "vq")
    for index in vqvae2.batches(len(train), 32, 150, stream):
        total, _, _ = loss(model, train[index], 0.25, stream)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    model.eval()
    top, bottom = model.encode(train)
    assert perplexity(top, 32) > 4 and perplexity(bottom, 32) > 8  # floors: an eighth and a quarter of the codes
    error = ((model.decode(*model.encode(test)) - test) ** 2).mean()
    assert error < ((train.mean(0, keepdim=True) - test) ** 2).mean() / 2


# -- the serial chain --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Three 16 px digits nodes and a VQ-VAE-2 trained serially across them, with what each institution trained
    on and the model it received recorded."""
    from conftest import Cli

    exp = tmp_path_factory.mktemp("vq") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--exp", exp)
    seen = []
    original = vqvae2.train_vqvae

    def recording(model, images, cfg, stream, device, log):
        seen.append({"images": images.clone(), "received": {k: v.clone() for k, v in model.state_dict().items()},
                     "steps": []})
        calls = {"encoder": 0, "decoder": 0, "images": 0}  # the networks' calls within the current step

        def counting(part):
            def hook(module, inputs, output):
                calls[part] += 1
                calls["images"] += len(inputs[0]) if part == "decoder" else 0
            return hook

        def step(row):  # log is called once a step, after it
            seen[-1]["steps"].append(dict(calls))
            calls.update(encoder=0, decoder=0, images=0)
            log(row)

        hooks = [model.enc_b.register_forward_hook(counting("encoder")),
                 model.dec.register_forward_hook(counting("decoder"))]
        try:
            original(model, images, cfg, stream, device, step)
        finally:
            for hook in hooks:
                hook.remove()

    vqvae2.train_vqvae = recording
    try:
        Cli().ok("train-gan", "--exp", exp, *TINY_VQ)
    finally:
        vqvae2.train_vqvae = original
    return exp, seen


def test_each_institution_trains_on_its_images_and_the_decodings_of_exactly_the_earlier_codes(chain):
    exp, seen = chain
    manifest = Manifest.load(exp)
    nodes = manifest.node_names
    assert len(seen) == 3
    for k, node in enumerate(nodes):
        record = json.loads((exp / "gan" / node / "config.json").read_text())["serial"]
        own = to_float(NodeDataset(manifest, node, "train").images)
        assert record["position"] == k + 1 and record["own"] == len(own)
        assert list(record["replayed"]) == nodes[:k]
        images = seen[k]["images"]
        assert torch.equal(images[len(images) - len(own):], own)  # its own images, last
        replayed = images[:len(images) - len(own)]
        assert len(replayed) == sum(record["replayed"].values())
        if k:  # the earlier codes, decoded by the model it received: reconstructions, not the real images
            earlier = torch.cat([to_float(NodeDataset(manifest, n, "train").images) for n in nodes[:k]])
            assert replayed.shape == earlier.shape and not torch.equal(replayed, earlier)
            assert ((replayed - earlier) ** 2).mean() < ((earlier.mean(0) - earlier) ** 2).mean()


def test_a_step_costs_the_same_at_every_position_in_the_chain(chain):
    """Each step encodes and decodes one batch, whatever the institution's position: the earlier codes are decoded
    once before its turn (and re-encoded once after it), not at every step, so the last node's turn costs what the
    first's does at equal --iterations and --batch (issue 54: the fourth of four had seemed 30x slower)."""
    _, seen = chain
    iterations, batch = (int(TINY_VQ[TINY_VQ.index(option) + 1]) for option in ("--iterations", "--batch"))
    assert len(seen) == 3 and len(seen[-1]["images"]) > 2 * len(seen[0]["images"])  # the last holds far more
    for visit in seen:
        assert visit["steps"] == [{"encoder": 1, "decoder": 1, "images": batch}] * iterations


def test_the_final_decoder_reproduces_the_image_of_every_shared_code(chain):
    exp, seen = chain
    manifest = Manifest.load(exp)
    nodes = manifest.node_names
    last = seen[-1]["images"]
    start = 0
    for node in nodes:
        codec = node_codec(exp, manifest, node, "test")
        stood_for = last[start:start + len(codec.codes)]  # at the last institution: the image each code encodes
        start += len(codec.codes)
        again = encode_all(codec.vqvae, stood_for, codec.codes.labels, "cpu")
        assert torch.equal(again.top, codec.codes.top) and torch.equal(again.bottom, codec.codes.bottom)
        decoded = codec.vqvae.decode(codec.codes.top, codec.codes.bottom)
        # the stated tolerance: within half the error of the images' own mean image
        assert ((decoded - stood_for) ** 2).mean() < ((stood_for.mean(0) - stood_for) ** 2).mean() / 2
    assert start == len(last)


def test_every_turn_and_prior_shows_its_step_count_and_time_left(chain, tmp_path, cli, monkeypatch):
    """Off a terminal each turn of the chain and each node's prior writes lines with its count out of its
    steps: a line when it starts, one every interval with the rate and the time left, and one when it ends."""
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)  # a line at every poll of the line writer
    monkeypatch.setattr(progress, "POLL_S", 0.01)
    exp, steps = copy_exp(chain[0], tmp_path), 20
    err = cli.ok("train-gan", "--exp", exp, "--overwrite", "--generator", "vqvae2", "--iterations", steps, "--batch",
                 "8", "--vq-channels", "8", "--vq-codebook", "8", "--vq-dim", "4", "--prior-iterations", steps,
                 "--prior-channels", "4", "--prior-layers", "1", "--buffer-size", "10", "--fidelity-seeds", "0",
                 "--threads", "1").stderr
    lines = [STAMP.sub("", line) for line in err.splitlines() if STAMP.match(line)]
    nodes = Manifest.load(exp).node_names
    tasks = [f"{node} VQ-VAE-2 ({k + 1} of 3)" for k, node in enumerate(nodes)] + [f"{n} prior" for n in nodes]
    for task in tasks:
        mine = [line.removeprefix(f"train-gan {task}: ") for line in lines if line.startswith(f"train-gan {task}: ")]
        assert mine[0] == f"0/{steps}, elapsed 0:00:00" and mine[-1].startswith(f"{steps}/{steps}, ")
        assert "done in" in mine[-1]
        counts = [int(line.split("/")[0]) for line in mine]
        assert counts == sorted(counts)
        running = [line for line, count in zip(mine[:-1], counts) if count >= 2]  # a rate from two steps on
        assert all(", eta " in line and ", elapsed " in line for line in running), running
    assert any(", eta " in line for line in lines)


def interrupted(exp, tmp_path, monkeypatch, at: int):
    """A copy of `exp` whose chain was interrupted at institution `at` (its node folders gone)."""
    fresh = copy_exp(exp, tmp_path)
    original = vqvae2.SerialTraining.visit

    def crash(self, k, node, held):
        if k == at:
            raise KeyboardInterrupt
        return original(self, k, node, held)

    with monkeypatch.context() as patched:
        patched.setattr(vqvae2.SerialTraining, "visit", crash)
        assert vqvae2_run(fresh).exit_code == 130
    drop_node_folders(fresh)
    return fresh


def test_the_chain_resumes_after_an_institution_to_the_same_bytes(chain, tmp_path, cli, monkeypatch):
    exp, _ = chain
    fresh = interrupted(exp, tmp_path, monkeypatch, at=2)
    # each institution's own checkpoint (on the distributed engine, each process writes its own)
    assert sorted(p.name for p in (fresh / "gan" / ".serial").iterdir()) == ["after-0.safetensors",
                                                                            "after-1.safetensors"]
    original = vqvae2.SerialTraining.visit
    visits = []
    monkeypatch.setattr(vqvae2.SerialTraining, "visit",
                        lambda self, k, node, held: visits.append(k) or original(self, k, node, held))
    assert vqvae2_run(fresh).exit_code == 0
    assert visits == [2]
    assert not (fresh / "gan" / ".serial").exists()
    for node in Manifest.load(exp).node_names:
        for name in ("generator.safetensors", "codes.safetensors", "buffer.safetensors", "metrics.csv"):
            assert (fresh / "gan" / node / name).read_bytes() == (exp / "gan" / node / name).read_bytes()
        records = [json.loads((e / "gan" / node / "config.json").read_text()) for e in (fresh, exp)]
        assert records[0]["serial"] == records[1]["serial"]  # the bytes it sent and received, across the resume


def drop_node_folders(exp):
    """The copied experiment's node folders go, so that what a test compares is what its run wrote."""
    for node in Manifest.load(exp).node_names:
        shutil.rmtree(exp / "gan" / node)


def vqvae2_run(exp, *more):
    from fedcli.cli import app
    from typer.testing import CliRunner

    return CliRunner().invoke(app, ["train-gan", "--exp", str(exp), "--overwrite", *TINY_VQ, *more])


def test_the_chain_runs_one_process_per_node_and_resumes_there_to_the_same_bytes(chain, tmp_path, monkeypatch):
    """Interrupted in process after the first institution, the chain resumes on the distributed engine: the
    second and third institutions train in processes of their own, each waiting for its predecessor, and every
    node's files and recorded bytes equal the uninterrupted in-process run's."""
    exp, _ = chain
    fresh = interrupted(exp, tmp_path, monkeypatch, at=1)
    result = vqvae2_run(fresh, "--engine", "distributed", "--launch", "local")
    assert result.exit_code == 0, result.output
    nodes = Manifest.load(exp).node_names
    for node in nodes:  # every process agreed where to resume
        assert f"resuming the serial training after {nodes[0]} (1 of 3)" in (fresh / "logs" / f"{node}.log").read_text()
    assert not (fresh / "gan" / ".serial").exists()
    for node in nodes:
        for name in ("generator.safetensors", "codes.safetensors", "buffer.safetensors", "metrics.csv"):
            assert (fresh / "gan" / node / name).read_bytes() == (exp / "gan" / node / name).read_bytes(), name
        records = [json.loads((e / "gan" / node / "config.json").read_text()) for e in (fresh, exp)]
        assert records[0]["serial"] == records[1]["serial"] and records[0]["codes"] == records[1]["codes"]


def test_the_serial_chain_bytes_are_the_payloads_it_sent(chain):
    exp, _ = chain
    manifest = Manifest.load(exp)
    nodes = manifest.node_names
    codecs = {node: node_codec(exp, manifest, node, "test") for node in nodes}
    model = len(encode_model(codecs[nodes[0]].vqvae.state_dict()))
    for k, node in enumerate(nodes):
        serial = json.loads((exp / "gan" / node / "config.json").read_text())["serial"]
        if node == nodes[-1]:  # received the model and the codes so far; sends the final model and codes back
            assert serial["bytes_sent"] == sum(model + len(encode_codes({n: codecs[n].codes})) for n in nodes[:-1])
        else:  # returned: the final model and its own codes
            assert serial["bytes_received"] >= model + len(encode_codes({node: codecs[node].codes}))


# -- the replay strategies ---------------------------------------------------------------------
def test_cwt_replay_decodes_every_institutions_codes_with_the_final_decoder(chain):
    exp, _ = chain
    manifest = Manifest.load(exp)
    fed = engine.build(FederateConfig(exp=exp, strategy=("cwt-replay",)), manifest, 0)
    union = replayed(fed, CodeReplayOptions())
    for node in fed.nodes:
        codec = node_codec(exp, manifest, node, "test")
        expected = torch.cat([codec.decoded(node_codec(exp, manifest, n, "test").codes, "cpu").images
                              for n in fed.nodes])
        assert torch.equal(union[node].images, expected)
    codes_sent = [t for t in fed.transport.transfers if t.kind == "codes"]
    assert {(t.sender, t.receiver) for t in codes_sent} == {(a, b) for a in fed.nodes for b in fed.nodes if a != b}
    for t in codes_sent:  # bytes exact: each node's codes payload, 2 x (4 + 16) int16 indices + a label per image
        codes = node_codec(exp, manifest, t.sender, "test").codes
        assert t.bytes == len(encode_codes({t.sender: codes}))
        assert t.bytes - len(codes) * (2 * (2 * 2 + 4 * 4) + 8) < 400  # the safetensors header


def test_fedavg_replay_with_nothing_to_replay_is_fedavg(chain, tmp_path, cli):
    exp = copy_exp(chain[0], tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg-replay", "--strategy", "fedavg", "--buffer-size", "0", *FED)
    ours, theirs = (pd.read_csv(exp / "federate" / name / "metrics.csv").drop(columns="strategy")
                    for name in ("fedavg-replay", "fedavg"))
    pd.testing.assert_frame_equal(ours, theirs, check_exact=True)
    a, b = (load_tensors(exp / "federate" / name / "models" / "global.safetensors", "m")
            for name in ("fedavg-replay", "fedavg"))
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_a_replay_of_more_codes_than_a_node_has_or_of_codes_in_a_fold_is_refused_in_one_line(chain, tmp_path, cli):
    exp = copy_exp(chain[0], tmp_path)
    assert "exceeds node node0's" in cli.user_error("federate", "--exp", exp, "--strategy", "cwt-replay",
                                                   "--buffer-size", "100000", *FED)
    assert "the validation fold's too" in cli.user_error("federate", "--exp", exp, "--strategy", "fedavg-replay",
                                                         "--fold", "0", *FED)
    assert not (exp / "federate").exists() or not any((exp / "federate").iterdir())


def test_the_replay_strategies_replay_a_prior_buffer_when_asked(chain, tmp_path, cli):
    exp = copy_exp(chain[0], tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "cwt-replay", "--replay-source", "buffers", *FED)
    comm = pd.read_csv(exp / "federate" / "cwt-replay" / "comm.csv")
    assert set(comm["kind"]) == {"buffer", "model"}


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--alpha", "0.5"], "--alpha is not an option of generator kind vqvae2"),
    (["--alpha", "1"], "--alpha is not an option of generator kind vqvae2"),  # its default, given: issue 58
    (["--lpips-net", "alex"], "--lpips-net is not an option of generator kind vqvae2"),
    (["--dp-epsilon", "5"], "--prior-iterations 0 trains no prior"),
    (["--node", "node0"], "trains serially across every node"),
    (["--launch", "local"], "--launch applies to --engine distributed"),
    (["--engine", "distributed", "--launch", "local", "--node", "node0"], "--launch local assigns nodes itself"),
    (["--engine", "distributed", "--generator", "stylegan2"], "a stylegan2 node trains on its own images alone"),
])
def test_options_a_vqvae2_cannot_take_are_refused_in_one_line(chain, tmp_path, cli, args, says):
    exp = copy_exp(chain[0], tmp_path)
    line = cli.user_error("train-gan", "--exp", exp, "--overwrite", *TINY_VQ, *args)
    assert says in line


def test_a_recipe_gives_what_its_tables_set_and_a_variant_gives_up_what_it_resets(tmp_path):
    """Issue 58: an option was known as given only when it differed from its default, so `alpha = 1.0` (the
    default) reached a VQ-VAE-2 unread; a variant that sets an option back to its default gives it up, so one
    recipe can hold StyleGAN rows and VQ-VAE-2 rows."""
    from fedcli.experiment.config import to_json
    from fedcli.generators.registry import generator_kind
    from fedcli.generators.node_training import check_options
    from fedcli.pipeline.recipe import Recipe

    path = tmp_path / "r.toml"
    path.write_text('[train_gan]\nalpha = 1.0\n\n[[sweep.variants]]\nname = "gan"\ntrain_gan.iterations = 10\n\n'
                    '[[sweep.variants]]\nname = "vq"\ntrain_gan.generator = "vqvae2"\ntrain_gan.alpha = 1.0\n\n'
                    '[[sweep.variants]]\nname = "vq-unreset"\ntrain_gan.generator = "vqvae2"\n')
    recipe = Recipe.load(path)
    configs = {p.name.split(",")[0]: recipe.configs(p, tmp_path / "exp")["train_gan"] for p in recipe.points()}
    assert {"alpha", "iterations"} <= configs["variant=gan"].given and "alpha" not in configs["variant=vq"].given
    check_options(configs["variant=vq"], generator_kind("vqvae2"))
    with pytest.raises(UserError, match="--alpha is not an option of generator kind vqvae2"):
        check_options(configs["variant=vq-unreset"], generator_kind("vqvae2"))
    assert "given" not in to_json(configs["variant=gan"])  # no config.json or fingerprint records it


def test_code_replay_on_a_gan_experiment_is_refused_in_one_line(gan3_exp, tmp_path, cli):
    gan = copy_exp(gan3_exp, tmp_path / "gan")
    assert "replays codes, and node node0's generator is a stylegan2" in cli.user_error(
        "federate", "--exp", gan, "--strategy", "cwt-replay", *FED)


def test_a_vqvae2_is_audited_through_its_buffer_and_refuses_the_projection_only_options(chain, tmp_path, cli):
    vq = copy_exp(chain[0], tmp_path / "vq")
    assert "--controls projects images into GAN generators" in cli.user_error(
        "audit-privacy", "--exp", vq, "--controls", "--threads", "1")
    assert not (vq / "audit").exists()
    cli.ok("audit-privacy", "--exp", vq, "--node", "node0", "--max-images", "40", "--threads", "1")
    folder = vq / "audit" / "node0"
    assert {p.name for p in folder.iterdir()} == {"distances.csv", "summary.json", "pairs.png", "nearest.png",
                                                  "roc.png", "config.json"}  # no paired effect: no histogram
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["attack"] == "nearest buffer image" and "privacy_effect" not in summary
    assert set(summary["generators"]) == {"privacy"}
    privacy = summary["generators"]["privacy"]  # the attack's scores are tested in test_buffer_attack.py
    assert privacy["mia"]["auroc"] == summary["buffer"]["mia"]["auroc"]
    frame = pd.read_csv(folder / "distances.csv")
    assert len(frame) == 80 and set(frame.generator) == {"privacy"} and (frame.steps == 0).all()
    assert set(json.loads((folder / "config.json").read_text())["inputs"]) == {"manifest", "buffer"}


def test_the_engine_options_leave_a_train_gan_units_fingerprint_unchanged(tmp_path):
    from fedcli.generators.config import GanConfig
    from fedcli.pipeline.runner import plain

    base = GanConfig(exp=tmp_path, generator="vqvae2")
    distributed = GanConfig(exp=tmp_path, generator="vqvae2", engine="distributed", launch="local", timeout=60)
    assert plain(base, GAN_ENGINE_OPTIONS) == plain(distributed, GAN_ENGINE_OPTIONS)
    assert not GAN_ENGINE_OPTIONS & set(plain(base, GAN_ENGINE_OPTIONS))  # a recipe run before them: same key


def test_a_recipe_audits_a_vqvae2_through_its_buffer_where_it_sets_audit(cli, tmp_path):
    recipe = tmp_path / "vq.toml"
    recipe.write_text("""
[partition]
nodes = 2
image-size = 16

[train_gan]
generator = "vqvae2"
iterations = 20
batch = 16
vq-channels = 32
vq-codebook = 32
vq-dim = 16
buffer-size = 24
fidelity-seeds = 0

[federate]
strategy = ["feder"]
rounds = 1
epochs = 1
init-epochs = 0
bootstrap = 10
""")
    exp = tmp_path / "exp"
    out = cli.ok("run", recipe, "--exp", exp, "--threads", "1").stdout
    assert "audit-privacy: not run, a vqvae2 generator is audited by its buffer where the recipe sets [audit]" in out
    assert not (exp / "audit").exists()
    recipe.write_text(recipe.read_text() + "\n[audit]\nmax-images = 20\n")
    cli.ok("run", recipe, "--exp", exp, "--threads", "1")
    assert json.loads((exp / "audit" / "node1" / "summary.json").read_text())["attack"] == "nearest buffer image"
    assert "Privacy summary per node" in (exp / "report" / "report.md").read_text()
