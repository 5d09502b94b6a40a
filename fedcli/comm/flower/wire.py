"""Frames between a hospital's bridge and its fedcli node, and the content of a relay message: a JSON header
that lists the blobs, then the blobs, concatenated. Standard library only (both environments import it); nothing
is unpickled, and what the relay carries is sealed end to end (fedcli/comm/sealing.py)."""

from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct(">I")
MAX_HEADER = 1 << 24


def pack(header: dict, blobs: list[bytes]) -> tuple[bytes, bytes]:
    """(header JSON, the blobs concatenated), the header listing each blob's size."""
    return json.dumps({**header, "sizes": [len(b) for b in blobs]}).encode(), b"".join(blobs)


def unpack(header: bytes, body: bytes) -> tuple[dict, list[bytes]]:
    fields = json.loads(header)
    sizes = fields.pop("sizes")
    if sum(sizes) != len(body):
        raise ValueError(f"a relay message lists {sum(sizes)} bytes of blobs but carries {len(body)}")
    blobs, start = [], 0
    for size in sizes:
        blobs.append(body[start:start + size])
        start += size
    return fields, blobs


def send_frame(sock: socket.socket, header: dict, blobs: list[bytes]) -> None:
    head, body = pack(header, blobs)
    sock.sendall(HEADER.pack(len(head)) + head + HEADER.pack(len(body)) + body)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive_frame(sock: socket.socket) -> tuple[dict, list[bytes]]:
    (head_size,) = HEADER.unpack(_exactly(sock, HEADER.size))
    if head_size > MAX_HEADER:
        raise ValueError(f"a frame header of {head_size} bytes is not fedcli's")
    head = _exactly(sock, head_size)
    (body_size,) = HEADER.unpack(_exactly(sock, HEADER.size))
    return unpack(head, _exactly(sock, body_size))
