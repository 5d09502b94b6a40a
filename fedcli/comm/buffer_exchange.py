"""Buffers on the wire: encoded once per node and codec, decoded once per distinct payload."""

from __future__ import annotations

import hashlib

from fedcli.comm.payloads import decode_buffer, encode_buffer
from fedcli.comm.transport import Transport
from fedcli.data.node_data import NodeData
from fedcli.data.tensor_source import TensorSource


class BufferExchange:
    def __init__(self, data: NodeData, transport: Transport):
        self.data, self.transport = data, transport
        self._payloads: dict[tuple[str, str], bytes] = {}
        self._decoded: dict[str, TensorSource] = {}

    def payload(self, node: str, codec: str) -> bytes:
        """`node`'s buffer as bytes in `codec`."""
        if (node, codec) not in self._payloads:
            buffer = self.data.buffers[node]
            self._payloads[node, codec] = encode_buffer(buffer.images, buffer.labels, codec)
        return self._payloads[node, codec]

    def receive(self, round_: int, sender: str, node: str) -> TensorSource:
        """The buffer payload from `sender` to `node`, decoded and validated. A payload whose exact bytes
        were decoded before is not decoded again (buffers do not change between rounds; the bytes still
        travel and are counted every round)."""
        data = self.transport.receive(round_, sender, node, "buffer")
        key = hashlib.sha256(data).hexdigest()
        if key not in self._decoded:
            self._decoded[key] = TensorSource(*decode_buffer(data, self.data.image_shape, self.data.num_classes))
        return self._decoded[key]
