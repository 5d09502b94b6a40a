"""End-to-end sealing of what one node sends another through a relay (Flower's SuperLink), which must
not be able to read, alter, replay or redirect it.

Each node process makes a fresh X25519 key pair for the run and announces its public half signed by its
node-authentication key (the ECDSA key Flower's SuperNode authenticates with); every node checks each
announcement against the federation's allow-list (node name -> authentication public key), so a relay that
swaps an X25519 key is caught. A payload from S to R is encrypted with AES-256-GCM under a key derived
(HKDF-SHA256) from the X25519 agreement of S and R, bound to both names, both public keys and the direction;
its header (sender, receiver, sequence number) is the associated data. The receiver takes exactly the next
sequence number from each sender, so a replayed, dropped or reordered envelope is refused, as is one
addressed to another node or one whose bytes changed. Decryption keys exist only in the two node processes.
"""

from __future__ import annotations

import json
import struct

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedcli.comm.payloads import PayloadError

MAGIC = b"fedcli-sealed-1\n"
ANNOUNCE = b"fedcli x25519 announcement 1"
OVERHEAD = len(MAGIC) + 4 + 16  # + the header's JSON: what sealing adds to a payload, besides the header


class SealError(PayloadError):
    """A relayed envelope or key announcement that this node refuses; the message says which and why."""


def load_private_key(pem: bytes, what: str) -> ec.EllipticCurvePrivateKey:
    """A node-authentication private key (OpenSSH or PEM, as Flower's SuperNode reads it)."""
    try:
        key = (serialization.load_ssh_private_key(pem, None) if pem.startswith(b"-----BEGIN OPENSSH")
               else serialization.load_pem_private_key(pem, None))
    except (ValueError, TypeError) as exc:
        raise SealError(f"{what} is not a private key fedcli can read ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise SealError(f"{what} is not an elliptic-curve key (Flower's node authentication takes ECDSA keys)")
    return key


def load_public_key(text: str, what: str) -> ec.EllipticCurvePublicKey:
    """A node-authentication public key in OpenSSH form (one line of the allow-list)."""
    try:
        key = serialization.load_ssh_public_key(text.encode())
    except (ValueError, TypeError) as exc:
        raise SealError(f"{what} is not an OpenSSH public key ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SealError(f"{what} is not an elliptic-curve key (Flower's node authentication takes ECDSA keys)")
    return key


def public_line(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) -> str:
    """The OpenSSH line of a key's public half, as the allow-list holds it."""
    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def _raw(public: X25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class Sealer:
    """This node's end of the sealed channels to every other node of the run."""

    def __init__(self, node: str, signing_key: ec.EllipticCurvePrivateKey, allowed: dict[str, str]):
        """`allowed`: node name -> authentication public key (OpenSSH line), this node's own included."""
        if node not in allowed:
            raise SealError(f"node {node} is not on the federation's allow-list; ask the coordinator to add its key")
        if allowed[node].split()[:2] != public_line(signing_key).split()[:2]:
            raise SealError(f"node {node}'s key is not the one the allow-list holds for it; use the key of its "
                            "bundle, or have the coordinator list this one")
        self.node, self._signing = node, signing_key
        self._allowed = {name: load_public_key(line, f"the allow-list's key of {name}") for name, line in allowed.items()}
        self._secret = X25519PrivateKey.generate()  # this run's: never written, never sent
        self._peers: dict[str, X25519PublicKey] = {}
        self._keys: dict[tuple[str, str], AESGCM] = {}
        self._sent: dict[str, int] = {}
        self._received: dict[str, int] = {}

    def announcement(self) -> bytes:
        """This node's X25519 public key, signed by its authentication key."""
        public = _raw(self._secret.public_key())
        signature = self._signing.sign(ANNOUNCE + self.node.encode() + b"\0" + public, ec.ECDSA(hashes.SHA256()))
        return json.dumps({"node": self.node, "x25519": public.hex(), "signature": signature.hex()}).encode()

    def admit(self, announced: bytes) -> str:
        """Take another node's announcement after checking its signature against the allow-list; its name."""
        try:
            record = json.loads(announced)
            node, public, signature = record["node"], bytes.fromhex(record["x25519"]), bytes.fromhex(record["signature"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SealError(f"a key announcement is not readable ({exc})") from exc
        if node not in self._allowed:
            raise SealError(f"node {node} announced a key but is not on the federation's allow-list; refused")
        try:
            self._allowed[node].verify(signature, ANNOUNCE + node.encode() + b"\0" + public, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise SealError(f"node {node}'s key announcement is not signed by its key on the allow-list (altered in "
                            "transit, or another key); refused") from None
        if node in self._peers and _raw(self._peers[node]) != public:
            raise SealError(f"node {node} announced a second key in one run; refused")
        self._peers[node] = X25519PublicKey.from_public_bytes(public)
        return node

    @property
    def admitted(self) -> set[str]:
        """The nodes whose keys this node has checked and taken."""
        return set(self._peers)

    def _key(self, sender: str, receiver: str) -> AESGCM:
        """The AES-GCM key of the direction sender -> receiver (this node is one end)."""
        if (sender, receiver) not in self._keys:
            other = receiver if sender == self.node else sender
            if other not in self._peers:
                raise SealError(f"no key of node {other} was admitted; it did not announce one")
            ours, theirs = _raw(self._secret.public_key()), _raw(self._peers[other])
            sender_key, receiver_key = (ours, theirs) if sender == self.node else (theirs, ours)
            info = b"fedcli payload 1|" + sender.encode() + b">" + receiver.encode() + b"|" + sender_key + receiver_key
            shared = self._secret.exchange(self._peers[other])
            self._keys[(sender, receiver)] = AESGCM(HKDF(hashes.SHA256(), 32, None, info).derive(shared))
        return self._keys[(sender, receiver)]

    def seal(self, receiver: str, payload: bytes) -> bytes:
        sequence = self._sent.get(receiver, 0)
        self._sent[receiver] = sequence + 1
        header = json.dumps({"from": self.node, "to": receiver, "seq": sequence}).encode()
        nonce = struct.pack(">4xQ", sequence)  # unique per key: one key per direction, one sequence number each
        return MAGIC + struct.pack(">I", len(header)) + header + self._key(self.node, receiver).encrypt(
            nonce, payload, header)

    def open(self, sender: str, envelope: bytes) -> bytes:
        """The payload of an envelope relayed as from `sender`, or a SealError saying why it is refused."""
        where = f"a payload relayed to {self.node} as from {sender}"
        if not envelope.startswith(MAGIC) or len(envelope) < len(MAGIC) + 4:
            raise SealError(f"refused {where}: it is not a sealed envelope")
        (size,) = struct.unpack_from(">I", envelope, len(MAGIC))
        start = len(MAGIC) + 4
        header = envelope[start:start + size]
        try:
            fields = json.loads(header)
            origin, receiver, sequence = fields["from"], fields["to"], int(fields["seq"])
        except (ValueError, KeyError, TypeError):
            raise SealError(f"refused {where}: its header is not readable (altered in transit)") from None
        if receiver != self.node:
            raise SealError(f"refused {where}: it is addressed to {receiver} (misrouted by the relay)")
        if origin != sender:
            raise SealError(f"refused {where}: it was sealed by {origin}")
        expected = self._received.get(sender, 0)
        if sequence != expected:
            reason = "a replay of one already received" if sequence < expected else "earlier ones are missing"
            raise SealError(f"refused {where}: its sequence number is {sequence}, expected {expected} ({reason})")
        try:
            payload = self._key(sender, self.node).decrypt(struct.pack(">4xQ", sequence), envelope[start + size:],
                                                          header)
        except InvalidTag:
            raise SealError(f"refused {where}: it does not decrypt with {sender}'s key (altered in transit, or "
                            "sealed with another key)") from None
        self._received[sender] = expected + 1
        return payload
