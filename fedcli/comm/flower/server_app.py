"""The coordinator's ServerApp: a mailbox that relays sealed envelopes between the hospitals' nodes.

Flower's engine is server-driven and a fedcli node is not (it sends, receives and gathers when its strategy
says), so the ServerApp keeps `DEPTH` messages queued for every SuperNode at all times. Each carries the
envelopes routed to that node since its last message, numbered so the node takes them in order, with the news
of the nodes (which have gone, seconds since each was last heard); each reply carries the envelopes the node
queued, which are routed to their recipients. A SuperNode never finds its queue empty, so it never takes
Flower's idle pause. The relay reads only each envelope's recipient: the contents are sealed for it.

A node whose bridge reports its process gone or failed, or that is silent for the run's timeout, is reported
gone to the others, who stop naming it; the run ends when every node has ended. A node's end, once recorded, is
acknowledged by one more message (its name among the news's `ended`), so that a hospital keeps its SuperNode until
the relay has its last reply (fedcli/comm/flower_launcher.py's `hospital`).
"""

from __future__ import annotations

import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import PullAppMessagesRequest  # pylint: disable=E0611
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, inflate_object_from_contents, pull_objects

from fedcli.comm.flower import wire

DEPTH = 2  # messages queued per SuperNode
POLL_S = 0.02
ENDED = ("done", "failed", "gone")
FINAL = ("done", "failed")  # a node's own word on its end, recorded and acknowledged
ACK_S = 10.0  # for the acknowledgements' answers before the run ends
MESSAGE_TYPE = "query.relay"
BACKOFF_S = (0.01, 0.1)  # retrying a reply's objects still uploading (Flower's default, 1 s doubling, left the
                          # SuperNodes' queues empty while the relay waited, and an empty queue costs a 3 s pause)

app = ServerApp()


class Mailbox:
    def __init__(self, nodes: list[str], timeout: float):
        self.nodes, self.timeout = nodes, timeout
        self.pending: dict[str, list[tuple[dict, bytes]]] = {node: [] for node in nodes}
        self.name_of: dict[int, str] = {}  # SuperNode id -> the node its bridge speaks for
        self.state: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.heard: dict[int, float] = {}
        self.sent: dict[str, int] = {node: 0 for node in nodes}  # deliveries numbered per node
        self.answers: dict[str, int] = {node: 0 for node in nodes}  # the next answer each node numbers
        self.held: dict[str, dict[int, tuple[dict, list[bytes]]]] = {node: {} for node in nodes}
        self.started = time.monotonic()

    def gone(self) -> list[str]:
        now = time.monotonic()
        silent = [name for nid, name in self.name_of.items() if self.state.get(name) not in ("done",)
                  and now - self.heard[nid] > self.timeout]
        return sorted({*silent, *(n for n, s in self.state.items() if s in ("failed", "gone"))})

    def final(self) -> set[str]:
        return {name for name, state in self.state.items() if state in FINAL}

    def ages(self) -> dict[str, float]:
        now = time.monotonic()
        return {name: round(now - self.heard[nid], 3) for nid, name in self.name_of.items()}

    def message(self, node_id: int) -> Message:
        name = self.name_of.get(node_id)
        items, n = [], -1  # a node whose process has not answered yet is brought nothing (-1: nothing to take)
        if name is not None and self.state.get(name) == "running":
            items, self.pending[name] = self.pending[name], []
            n, self.sent[name] = self.sent[name], self.sent[name] + 1
        header, body = wire.pack({"n": n, "items": [item for item, _ in items], "gone": self.gone(),
                                  "ages": self.ages(), "ended": sorted(self.final())}, [blob for _, blob in items])
        record = ConfigRecord({"header": header.decode(), "body": body})
        return Message(RecordDict({"relay": record}), dst_node_id=node_id, message_type=MESSAGE_TYPE)

    def take(self, node_id: int, reply: Message) -> None:
        self.heard[node_id] = time.monotonic()
        if reply.has_error():
            name = self.name_of.get(node_id)
            if name is not None and name not in self.final():
                self.state[name], self.errors[name] = "failed", reply.error.reason
            return
        record = reply.content["relay"]
        header, blobs = wire.unpack(str(record["header"]).encode(), bytes(record["body"]))
        name = header["node"]
        if name not in self.nodes:
            raise RuntimeError(f"a SuperNode speaks for {name!r}, which is not a node of this run")
        if self.name_of.setdefault(node_id, name) != name or list(self.name_of.values()).count(name) > 1:
            raise RuntimeError(f"two SuperNodes speak for node {name}")
        if "m" not in header:  # the bridge's own word (its node did not answer): no envelopes
            self.record(name, header, blobs)
            return
        self.held[name][int(header["m"])] = (header, blobs)  # a node's answers are taken in the order it gave them
        while self.answers[name] in self.held[name]:
            self.record(name, *self.held[name].pop(self.answers[name]))
            self.answers[name] += 1

    def record(self, name: str, header: dict, blobs: list[bytes]) -> None:
        if header["state"] != "absent" and name not in self.final():  # an end is final
            self.state[name] = header["state"]
        if header.get("error"):
            self.errors[name] = header["error"]
        for item, blob in zip(header["items"], blobs):
            if item["to"] not in self.pending:
                raise RuntimeError(f"node {name} addressed an envelope to {item['to']!r}, not a node of this run")
            self.pending[item["to"]].append(({"from": name, "kind": item["kind"]}, blob))

    def ended(self) -> bool:
        if len(self.name_of) < len(self.nodes):
            return False
        gone = set(self.gone())
        return all(self.state.get(node) in ENDED or node in gone for node in self.nodes)


def pull_replies(grid: Grid, message_ids: list[str]) -> list[tuple[str, Message]]:
    """(the message each answers, the reply) for the replies that have arrived, in no particular order:
    `grid.pull_messages` (flwr/superlink/grid/http_grid.py), its objects retried at `BACKOFF_S`."""
    client, node, run_id = grid._runtime_client, grid.node, grid._run.run_id  # pylint: disable=W0212
    answer = client.PullMessages(PullAppMessagesRequest(message_ids=message_ids))
    replies = []
    for proto, tree in zip(answer.messages_list, answer.message_object_trees, strict=True):
        message_id = proto.metadata.message_id
        try:
            contents = pull_objects([t.object_id for t in iterate_object_tree(tree)],
                                    make_pull_object_fn_protobuf(client.PullObject, node, run_id),
                                    initial_backoff=BACKOFF_S[0], backoff_cap=BACKOFF_S[1])
        except ObjectPullError as exc:  # its envelopes are lost: going on would deliver the rest out of order
            raise RuntimeError(f"a SuperNode's answer did not arrive whole ({exc}); the relay stops") from exc
        client.ConfirmMessageReceived(ConfirmMessageReceivedRequest(node=node, run_id=run_id,
                                                                    message_object_id=message_id))
        reply = inflate_object_from_contents(message_id, contents)
        reply.metadata.__dict__["_message_id"] = message_id
        replies.append((proto.metadata.reply_to_message_id, reply))
    return replies


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(ids := sorted(grid.get_node_ids())) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(ids)} of {count} SuperNodes connected within {timeout:g} s")
        time.sleep(0.1)
    return ids


@app.main()
def main(grid: Grid, context: Context) -> None:
    nodes = str(context.run_config["nodes"]).split(",")
    timeout = float(context.run_config["timeout"])
    mailbox = Mailbox(nodes, timeout)
    node_ids = wait_for_nodes(grid, len(nodes), timeout)
    for node_id in node_ids:
        mailbox.heard[node_id] = time.monotonic()
    queued: dict[str, int] = {}  # message id -> SuperNode id
    acks: dict[str, str] = {}  # node -> the message acknowledging its end

    def push(node_id: int) -> str:
        (message_id,) = grid.push_messages([mailbox.message(node_id)])
        queued[message_id] = node_id
        return message_id

    def acknowledge() -> None:
        for node_id, name in mailbox.name_of.items():
            if name in mailbox.final() and name not in acks:
                acks[name] = push(node_id)

    def pull() -> None:
        for answered, reply in pull_replies(grid, list(queued)):
            mailbox.take(queued.pop(answered), reply)

    while not mailbox.ended():
        acknowledge()
        for node_id in node_ids:
            if mailbox.state.get(mailbox.name_of.get(node_id)) in ENDED:
                continue
            while sum(1 for nid in queued.values() if nid == node_id) < DEPTH:
                push(node_id)
        pull()
        time.sleep(POLL_S)
    acknowledge()
    deadline = time.monotonic() + ACK_S
    while set(acks.values()) & set(queued) and time.monotonic() < deadline:
        pull()
        time.sleep(POLL_S)
    failed = {node: mailbox.errors.get(node, mailbox.state.get(node, "silent")) for node in mailbox.gone()}
    if failed:
        raise RuntimeError("; ".join(f"{node}: {why}" for node, why in failed.items()))
