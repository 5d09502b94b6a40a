"""`--engine flower`: fedcli's nodes over Flower's deployment engine (a SuperLink, a SuperNode per node, TLS and node
authentication), their payloads sealed end to end so the relay cannot read, alter, replay or redirect them.

Flower lives in an environment of its own (`FEDCLI_FLOWER_BIN`; `make test` makes `.venv-flower`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from conftest import copy_exp
from fedcli.comm.bundles import make_federation
from fedcli.comm.flower import wire
from fedcli.comm.launcher import free_port
from fedcli.comm.sealing import SealError, Sealer, public_line
from fedcli.experiment.artifacts import load_tensors

NODES = ("h1", "h2", "h3")
FLOWER = ["--engine", "flower", "--launch", "local"]
RUN = ["--rounds", "2", "--epochs", "1", "--bootstrap", "20", "--threads", "1"]
needs_flower = pytest.mark.skipif(not os.environ.get("FEDCLI_FLOWER_BIN"),
                                  reason="Flower's environment is not given (FEDCLI_FLOWER_BIN; make test sets it)")


@pytest.fixture
def sealers():
    keys = {node: ec.generate_private_key(ec.SECP384R1()) for node in NODES}
    allowed = {node: public_line(key) for node, key in keys.items()}
    ends = {node: Sealer(node, keys[node], allowed) for node in NODES}
    for node, end in ends.items():
        for other in NODES:
            if other != node:
                end.admit(ends[other].announcement())
    return ends, keys, allowed


def test_the_recipient_opens_a_sealed_payload_and_the_relay_sees_no_plaintext(sealers):
    ends, _, _ = sealers
    payload = os.urandom(4096)
    envelope = ends["h1"].seal("h2", payload)
    assert payload not in envelope and payload[:64] not in envelope
    assert ends["h2"].open("h1", envelope) == payload
    second = ends["h1"].seal("h2", b"the next one")
    assert ends["h2"].open("h1", second) == b"the next one"


def test_another_nodes_key_a_flipped_byte_a_replay_and_a_misaddressed_envelope_are_refused(sealers):
    ends, _, _ = sealers
    envelope = ends["h1"].seal("h2", b"model bytes")
    with pytest.raises(SealError, match="addressed to h2"):
        ends["h3"].open("h1", envelope)  # the relay hands h2's envelope to h3
    for position in (len(envelope) - 1, len(envelope) - 20):  # the tag, and the ciphertext
        flipped = bytearray(envelope)
        flipped[position] ^= 1
        with pytest.raises(SealError, match="does not decrypt with h1's key"):
            ends["h2"].open("h1", bytes(flipped))
    tampered_header = envelope.replace(b'"seq": 0', b'"seq": 1')
    with pytest.raises(SealError, match="sequence number is 1, expected 0"):
        ends["h2"].open("h1", tampered_header)
    with pytest.raises(SealError, match="as from h3: it was sealed by h1"):
        ends["h2"].open("h3", envelope)
    assert ends["h2"].open("h1", envelope) == b"model bytes"
    with pytest.raises(SealError, match="a replay of one already received"):
        ends["h2"].open("h1", envelope)
    skipped = [ends["h1"].seal("h2", b"one"), ends["h1"].seal("h2", b"two")]
    with pytest.raises(SealError, match="earlier ones are missing"):
        ends["h2"].open("h1", skipped[1])  # the relay dropped one


def test_a_swapped_or_unlisted_key_announcement_is_refused(sealers):
    ends, keys, allowed = sealers
    relay_key = ec.generate_private_key(ec.SECP384R1())
    impostor = Sealer("h2", relay_key, {**allowed, "h2": public_line(relay_key)})  # a relay posing as h2
    fresh = Sealer("h1", keys["h1"], allowed)
    with pytest.raises(SealError, match="not signed by its key on the allow-list"):
        fresh.admit(impostor.announcement())
    stranger_key = ec.generate_private_key(ec.SECP384R1())
    stranger = Sealer("h4", stranger_key, {**allowed, "h4": public_line(stranger_key)})
    with pytest.raises(SealError, match="node h4 announced a key but is not on the federation's allow-list"):
        fresh.admit(stranger.announcement())
    with pytest.raises(SealError, match="not the one the allow-list holds"):
        Sealer("h1", relay_key, allowed)  # a node started with a key the coordinator did not list
    announced = json.loads(ends["h3"].announcement())
    announced["x25519"] = os.urandom(32).hex()  # the relay swaps h3's key for its own
    with pytest.raises(SealError, match="node h3's key announcement is not signed"):
        fresh.admit(json.dumps(announced).encode())


def test_wire_frames_carry_blobs_exactly_and_refuse_a_short_body():
    header, body = wire.pack({"n": 3}, [b"", b"abc", os.urandom(1000)])
    fields, blobs = wire.unpack(header, body)
    assert fields == {"n": 3} and blobs[1] == b"abc" and len(blobs[2]) == 1000
    with pytest.raises(ValueError, match="lists 1003 bytes"):
        wire.unpack(header, body[:-1])


TWO_ANSWERS = """
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from fedcli.comm.flower import wire
from fedcli.comm.flower.server_app import Mailbox

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
box = Mailbox(["a", "b"], 60.0)
for m, blob in ((1, b"second"), (0, b"first")):  # pulled together, in the other order
    head, body = wire.pack({"node": "b", "state": "running", "error": None, "m": m,
                            "items": [{"to": "a", "kind": "x"}]}, [blob])
    relay = RecordDict({"relay": ConfigRecord({"header": head.decode(), "body": body})})
    box.take(7, Message(relay, dst_node_id=1, message_type="query.relay"))
    print(*[blob.decode() for _, blob in box.pending["a"]])
"""


@needs_flower
def test_the_relay_passes_on_a_nodes_envelopes_in_the_order_it_sent_them():
    """Two answers of one node can reach the relay in one pull, in either order (this lost a run to a refused
    sequence number before answers were numbered)."""
    done = subprocess.run([str(Path(os.environ["FEDCLI_FLOWER_BIN"]) / "python"), "-c", TWO_ANSWERS],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.stdout.splitlines() == ["", "first second"], done.stdout + done.stderr


def test_the_federation_keeps_its_allow_list_and_bundles_hold_only_their_own_key(tmp_path):
    make_federation(tmp_path, list(NODES), "127.0.0.1:9000")
    listed = json.loads((tmp_path / "superlink" / "allowlist.json").read_text())
    assert sorted(listed) == sorted(NODES)
    for node in NODES:
        bundle = tmp_path / "bundles" / node
        assert sorted(p.name for p in bundle.iterdir()) == ["allowlist.json", "ca.crt", "node.json", "node.key",
                                                            "node.pub"]
        assert oct((bundle / "node.key").stat().st_mode & 0o777) == "0o600"
    assert not any(p.suffix == ".key" and p.name != "superlink.key" for p in (tmp_path / "superlink").iterdir())
    make_federation(tmp_path, list(NODES), "127.0.0.1:9001")  # a new address: same identities
    assert json.loads((tmp_path / "superlink" / "allowlist.json").read_text()) == listed


def models(exp, name):
    return {p.stem: load_tensors(p, "model") for p in sorted((exp / "federate" / name / "models").glob("*"))}


def descendants(pid: int) -> dict[int, bytes]:
    """pid -> command line of every process below `pid`."""
    parents, commands = {}, {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            commands[int(entry.name)] = (entry / "cmdline").read_bytes()
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found, frontier = found + children, children
    return {child: commands[child] for child in found}


def memory(pid: int) -> bytes:
    """Every readable region of process `pid`'s memory, joined."""
    regions = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, permissions = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if permissions.startswith("r"):
                with contextlib.suppress(OSError, ValueError, OverflowError):
                    mem.seek(start)
                    regions.append(mem.read(end - start))
    return b"".join(regions)


def secrets(path: Path) -> list[bytes]:
    """A private key as it could sit in memory: its file, and its scalar in either byte order."""
    data = path.read_bytes()
    key = (serialization.load_ssh_private_key(data, None) if data.startswith(b"-----BEGIN OPENSSH")
           else serialization.load_pem_private_key(data, None))
    scalar = key.private_numbers().private_value.to_bytes(48, "big")
    return [data.strip(), scalar, scalar[::-1]]


@needs_flower
def test_three_hospitals_and_a_relay_set_up_by_fedcli_deploy_equal_the_in_process_engine(cli, gan3_exp, tmp_path):
    """The walk-through of docs/deploy.md on one machine: the coordinator's `deploy setup` and `deploy relay`,
    three hospitals each running `federate --engine flower --bundle` with its own bundle."""
    strategies = ["--strategy", "fedavg", "--strategy", "feder"]
    reference = copy_exp(gan3_exp, tmp_path / "reference")
    cli.ok("federate", "--exp", reference, *strategies, *RUN)
    exp, folder, address = copy_exp(gan3_exp, tmp_path / "flower"), tmp_path / "federation", f"127.0.0.1:{free_port()}"
    cli.ok("deploy", "setup", folder, "--superlink", address, *(f"--node=node{k}" for k in range(3)))
    bundles = []  # copied to the hospitals, and the authority kept elsewhere: the relay reads superlink/ only
    for k in range(3):
        bundles.append(Path(shutil.move(folder / "bundles" / f"node{k}", tmp_path / f"hospital{k}")))
    shutil.move(folder / "ca", tmp_path / "authority")
    relay = subprocess.Popen([sys.executable, "-m", "fedcli", "deploy", "relay", str(folder), "--timeout", "120"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hospitals = [subprocess.Popen([sys.executable, "-m", "fedcli", "federate", "--exp", str(exp), *strategies, *RUN,
                                   "--cross-eval", "--timeout", "120", "--engine", "flower", "--bundle",
                                   str(bundles[k])], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for k in range(3)]
    deadline = time.monotonic() + 400
    while not (exp / "federate" / ".feder.checkpoint" / "node0" / "round-1.json").is_file():  # keys long exchanged
        assert relay.poll() is None and time.monotonic() < deadline, relay.communicate()
        time.sleep(0.05)
    coordinator = [memory(pid) for pid, command in descendants(relay.pid).items()  # the SuperLink, its ServerApp
                   if b"flower-superlink" in command or b"flwr-serverapp" in command]
    assert len(coordinator) == 2
    assert any(secrets(folder / "superlink" / "superlink.key")[0] in m for m in coordinator)  # the scan finds a key
    node_keys = [s for bundle in bundles for s in secrets(bundle / "node.key")]
    assert not any(key in m for key in node_keys for m in coordinator)
    make_federation(tmp_path / "rogue", ["node1"], address)  # a node1 whose key the coordinator never listed
    line = cli.user_error("federate", "--exp", copy_exp(gan3_exp, tmp_path / "rogue-exp"), "--strategy", "fedavg", *RUN,
                          "--engine", "flower", "--bundle", tmp_path / "rogue" / "bundles" / "node1", "--timeout", "5")
    assert line.startswith(f"error: node node1 was not admitted by the SuperLink at {address} within 5 s"), line
    assert b"No SuperNode found with the given public key" in (folder / "logs" / "superlink.log").read_bytes()
    for hospital in hospitals:
        output, _ = hospital.communicate(timeout=400)
        assert hospital.returncode == 0, output
    out, err = relay.communicate(timeout=120)
    assert relay.returncode == 0 and out.strip() == "relay run completed: every node has ended", out + err
    for name in ("fedavg", "feder"):
        assert (exp / "federate" / name / "metrics.csv").read_bytes() == \
            (reference / "federate" / name / "metrics.csv").read_bytes(), name
        comm = pd.read_csv(exp / "federate" / name / "comm.csv")
        training = comm[comm.kind != "eval"].reset_index(drop=True)
        assert training.drop(columns="sealed_bytes").to_dict("records") == pd.read_csv(
            reference / "federate" / name / "comm.csv").to_dict("records"), name
        point = comm[comm.receiver != "all"]  # a payload in one envelope: the payload, its header and tag
        assert ((point.sealed_bytes - point.bytes).between(60, 120)).all(), name
        reduced = comm[comm.receiver == "all"]  # relayed: every contribution (and its exponents) to each other node
        assert (reduced.sealed_bytes > reduced.bytes).all(), name
        expected, got = models(reference, name), models(exp, name)
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[key][k], expected[key][k]) for key in expected for k in expected[key]), name
    link = folder / "superlink"  # what the coordinator's SuperLink reads: its own TLS key, public keys
    assert sorted(p.name for p in link.iterdir()) == ["allowlist.json", "ca.crt", "superlink.crt", "superlink.json",
                                                  "superlink.key"]
    for path in [*(folder / "logs").iterdir(), *(exp / "logs" / "flower").iterdir()]:
        assert not any(key in path.read_bytes() for key in node_keys), path


def test_deploy_setup_refuses_a_bad_address_or_node_name_and_writes_nothing(cli, tmp_path):
    folder = tmp_path / "federation"
    assert "is not host:port" in cli.user_error("deploy", "setup", folder, "--superlink", "hub", "--node", "a")
    assert "--node" in cli.user_error("deploy", "setup", folder, "--superlink", "hub:9092", "--node", "a/b")
    assert not folder.exists()
    assert "is not a fedcli allow-list" in cli.user_error("deploy", "relay", folder)


def test_deploy_setup_makes_one_bundle_per_hospital_and_a_node_keeps_its_key(cli, tmp_path):
    folder = tmp_path / "federation"
    out = cli.ok("deploy", "setup", folder, "--superlink", "hub.example.org:9092", "--node", "a", "--node", "b").output
    assert f"a: copy {folder / 'bundles' / 'a'}" in out and f"fedcli deploy relay {folder}" in out
    key = (folder / "bundles" / "a" / "node.key").read_bytes()
    assert (folder / "bundles" / "a" / "node.key").stat().st_mode & 0o077 == 0
    assert json.loads((folder / "bundles" / "b" / "node.json").read_text()) == {"node": "b",
                                                                                "superlink": "hub.example.org:9092"}
    cli.ok("deploy", "setup", folder, "--superlink", "hub.example.org:9092", "--node", "a", "--node", "c")
    assert (folder / "bundles" / "a" / "node.key").read_bytes() == key
    assert list(json.loads((folder / "superlink" / "allowlist.json").read_text())) == ["a", "b", "c"]


def test_a_flower_node_needs_its_bundle_and_a_bundle_names_its_node(cli, gan3_exp, tmp_path):
    exp = copy_exp(gan3_exp, tmp_path)
    line = cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", "--engine", "flower")
    assert "--engine flower needs this node's --bundle" in line
    make_federation(tmp_path / "federation", ["node0"], "127.0.0.1:9000")
    line = cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", "--engine", "flower", "--node", "node1",
                          "--bundle", tmp_path / "federation" / "bundles" / "node0")
    assert "--node node1 but the bundle" in line and "is node node0's" in line


@needs_flower
def test_a_node_key_the_allow_list_does_not_hold_is_refused_before_flower_starts(cli, gan3_exp, tmp_path):
    exp = copy_exp(gan3_exp, tmp_path)
    make_federation(exp / "flower", ["node0", "node1", "node2"], "127.0.0.1:9000")
    rogue = tmp_path / "rogue"
    make_federation(rogue, ["node1"], "127.0.0.1:9000")
    shutil.copy(rogue / "bundles" / "node1" / "node.key", exp / "flower" / "bundles" / "node1" / "node.key")
    line = cli.user_error("federate", "--exp", exp, "--strategy", "fedavg", *RUN, *FLOWER)
    assert "node node1's key" in line and "is not the key the allow-list holds for it; refused" in line
    assert not (exp / "logs" / "flower").exists()  # refused by fedcli's set-up: no Flower process started
    assert not (exp / "federate" / "fedavg").exists()


def node_pid(exp, node: str) -> int | None:
    """The pid of `node`'s fedcli process of the run on `exp` (its config file is named after it)."""
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fedcli.federate.node" in command and f"FEDCLI_TEST_RUN={exp}".encode() in environ and any(
                part.endswith(f"/{node}.json".encode()) for part in command):
            return int(entry.name)
    return None


@needs_flower
def test_a_node_killed_after_round_1_stops_the_run_naming_it_and_resume_gives_the_uninterrupted_bytes(
        cli, gan3_exp, tmp_path):
    args = ["--strategy", "feder", *RUN, "--timeout", "60"]
    reference = copy_exp(gan3_exp, tmp_path / "reference")
    cli.ok("federate", "--exp", reference, *args)
    exp = copy_exp(gan3_exp, tmp_path / "killed")
    flower = [*args, *FLOWER, "--cross-eval"]  # every model on every test set, as in process
    launcher = subprocess.Popen([sys.executable, "-m", "fedcli", "federate", "--exp", str(exp), *flower],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "FEDCLI_TEST_RUN": str(exp)})
    deadline = time.monotonic() + 300
    while not (exp / "federate" / ".feder.checkpoint" / "node1" / "round-1.json").is_file():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.05)
    os.kill(node_pid(exp, "node1"), signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    assert launcher.returncode == 2 and lines[-1].startswith("error: distributed run failed: node1 was killed by "
                                                            "SIGKILL; the others stopped (lost node1 during"), stderr
    assert "rerun with --resume" in lines[-1]
    assert node_pid(exp, "node0") is None and node_pid(exp, "node2") is None  # none left behind
    cli.ok("federate", "--exp", exp, *flower, "--resume")
    assert (exp / "federate" / "feder" / "metrics.csv").read_bytes() == \
        (reference / "federate" / "feder" / "metrics.csv").read_bytes()
    comm = pd.read_csv(exp / "federate" / "feder" / "comm.csv")
    assert comm[comm.kind != "eval"].drop(columns="sealed_bytes").reset_index(drop=True).equals(
        pd.read_csv(reference / "federate" / "feder" / "comm.csv"))
    expected, got = models(reference, "feder"), models(exp, "feder")
    assert all(torch.equal(got[key][k], expected[key][k]) for key in expected for k in expected[key])
