"""What a Flower federation's set-up makes (`fedcli deploy`, and `--engine flower --launch local` in the
experiment folder): a certificate authority, the SuperLink's TLS certificate, each node's authentication key
pair (ECDSA P-384, OpenSSH, as Flower's SuperNode takes it), the allow-list of the nodes' public keys, and one
bundle per hospital: its key, the allow-list, the CA certificate and the SuperLink's address.

    <folder>/ca/ca.key, ca.crt            the authority (keep its key off the SuperLink)
    <folder>/superlink/superlink.key, .crt, ca.crt, allowlist.json, superlink.json (the address)
    <folder>/bundles/<node>/node.key, node.pub, node.json, allowlist.json, ca.crt
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedcli.comm.sealing import load_private_key, public_line
from fedcli.core.errors import UserError

VALID_DAYS = 365
PEM = serialization.Encoding.PEM


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


def _pkcs8(key) -> bytes:
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _certificate(subject: str, public, issuer: str, signer, *, authority: bool, hosts: list[str] = ()):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(public).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=authority, path_length=None), critical=True))
    if authority:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        names = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = (builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    return builder.sign(signer, hashes.SHA256())


def make_federation(folder: Path, nodes: list[str], address: str) -> None:
    """The authority, the SuperLink's certificate for `address` (host:port) and every node's bundle. The
    allow-list is kept and only grows: a node it lists keeps the key it lists (a node's key is its identity); a
    node it does not list is given its bundle's key, or a new one."""
    host = address.rsplit(":", 1)[0].strip("[]")
    ca_key_path, ca_path = folder / "ca" / "ca.key", folder / "ca" / "ca.crt"
    if ca_key_path.is_file():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    else:
        ca_key = ec.generate_private_key(ec.SECP384R1())
        ca = _certificate("fedcli federation CA", ca_key.public_key(), "fedcli federation CA", ca_key, authority=True)
        _write_private(ca_key_path, _pkcs8(ca_key))
        ca_path.write_bytes(ca.public_bytes(PEM))
    link = folder / "superlink"
    link_key = ec.generate_private_key(ec.SECP384R1())
    _write_private(link / "superlink.key", _pkcs8(link_key))
    hosts = list(dict.fromkeys([host, "localhost", "127.0.0.1"]))
    (link / "superlink.crt").write_bytes(
        _certificate(host, link_key.public_key(), "fedcli federation CA", ca_key, authority=False,
                     hosts=hosts).public_bytes(PEM))
    (link / "ca.crt").write_bytes(ca.public_bytes(PEM))
    allowed = allow_list(link) if (link / "allowlist.json").is_file() else {}
    for node in nodes:
        bundle = folder / "bundles" / node
        key_path = bundle / "node.key"
        if node in allowed:  # listed: its key is the one listed, checked where the node starts (check_bundles)
            if not key_path.is_file():
                raise UserError(f"node {node} is on the allow-list {link / 'allowlist.json'} but {key_path} is "
                                "missing; put its bundle back, or remove it from the list to give it a new key")
            continue
        if key_path.is_file():  # a node's own key, listed now
            key = load_private_key(key_path.read_bytes(), str(key_path))
        else:
            key = ec.generate_private_key(ec.SECP384R1())
            _write_private(key_path, key.private_bytes(PEM, serialization.PrivateFormat.OpenSSH,
                                                       serialization.NoEncryption()))
        (bundle / "node.pub").write_text(public_line(key) + "\n")
        allowed[node] = public_line(key)
    listing = json.dumps(allowed, indent=1) + "\n"
    (link / "allowlist.json").write_text(listing)
    (link / "superlink.json").write_text(json.dumps({"superlink": address}, indent=1) + "\n")
    for node in nodes:
        bundle = folder / "bundles" / node
        (bundle / "allowlist.json").write_text(listing)
        (bundle / "ca.crt").write_bytes(ca.public_bytes(PEM))
        (bundle / "node.json").write_text(json.dumps({"node": node, "superlink": address}, indent=1) + "\n")


def _setup_file(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is not {what} ({exc}); make it with fedcli deploy setup") from exc


def allow_list(folder: Path) -> dict[str, str]:
    return _setup_file(folder / "allowlist.json", "a fedcli allow-list")


def superlink_address(folder: Path) -> str:
    """The host:port the hospitals connect to, as `make_federation` kept it in the superlink folder."""
    facts = _setup_file(folder / "superlink.json", "a fedcli SuperLink's address")
    if not isinstance(facts, dict) or not isinstance(facts.get("superlink"), str):
        raise UserError(f"{folder / 'superlink.json'} names no SuperLink address; make it with fedcli deploy setup")
    return facts["superlink"]
