"""A hospital's bridge: the long-lived ClientApp process of its SuperNode (`flower-supernode --isolation
process`), which hands every relay message to the hospital's fedcli node over loopback and answers with
what the node has queued.

Flower 1.42 starts a `flwr-clientapp` process per message by default (seconds each); this one process takes
the SuperNode's tasks one after another, as `flwr-clientapp` does for one (flwr/supernode/runtime/
run_clientapp.py). It speaks for the node named by the SuperNode's `--node-config name=...`; its contents are
sealed envelopes it cannot open. A node that does not answer is reported `absent` (not started yet) or
`gone` (it answered before). Once the relay acknowledges the node's end, the bridge answers and exits.

    python -m fedcli.comm.flower.bridge SUPERNODE_RUNTIME_ADDRESS NODE_NAME POSTBOX_PORT
"""

from __future__ import annotations

import signal
import socket
import sys
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
from flwr.supercore.constant import TaskType
from flwr.supercore.task_identity import TaskIdentity
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.common.serde import context_from_proto
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest  # pylint: disable=E0611
from flwr.supercore.inflatable.inflatable_protobuf_utils import (make_confirm_message_received_fn_protobuf,
                                                                 make_pull_object_fn_protobuf)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from fedcli.comm.flower import wire

POLL_S = 0.01
BACKOFF_S = (0.01, 0.1)  # retrying a message's objects the SuperNode is still fetching: Flower's default, 1 s
                          # doubling, cost about a second per message, for messages that take milliseconds to arrive

app = ClientApp()  # the same relay where the SuperNode starts a process per message (its default isolation)


def client(address: str, *interceptors) -> RuntimeHttpClient:
    return RuntimeHttpClient.from_server_address(server_address=address, insecure=True, root_certificates=None,
                                                 interceptors=list(interceptors),
                                                 retry_invoker=make_simple_http_retry_invoker())


def pull_task(session: RuntimeHttpClient) -> tuple[Message, object]:
    """The task's message and context, as flwr-clientapp pulls them (flwr/supernode/runtime/run_clientapp.py
    pull_task_input), retrying its objects at `BACKOFF_S`."""
    task = session.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = task.task_id, task.run.run_id, task.context.node_id
    context = context_from_proto(task.context)
    pulled = session.PullMessages(PullAppMessagesRequest())
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree, make_pull_object_fn_protobuf(session.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(session.ConfirmMessageReceived, node, context.run_id),
        return_type=Message, initial_backoff=BACKOFF_S[0], backoff_cap=BACKOFF_S[1])
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's: the deflated message lacks its id
    return message, context


class Bridge:
    def __init__(self, node: str, port: int):
        self.node, self.port = node, port
        self.answered = False
        self.acknowledged = False  # the relay has recorded this node's end

    def relay(self, message: Message) -> Message:
        record = message.content["relay"]
        header, blobs = wire.unpack(str(record["header"]).encode(), bytes(record["body"]))
        self.acknowledged = self.node in header.get("ended", [])
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=60) as connection:
                wire.send_frame(connection, header, blobs)
                answer, out = wire.receive_frame(connection)
            self.answered = True
        except OSError:
            answer, out = {"items": [], "state": "gone" if self.answered else "absent", "error": None}, []
        head, body = wire.pack({**answer, "node": self.node}, out)
        return Message(RecordDict({"relay": ConfigRecord({"header": head.decode(), "body": body})}),
                       reply_to=message)


@app.query("relay")
def relay(message: Message, context: Context) -> Message:
    return Bridge(str(context.node_config["name"]), int(context.node_config["postbox"])).relay(message)


def main(address: str, node: str, port: int) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    bridge = Bridge(node, port)
    tasks = client(address, RuntimeVersionHttpInterceptor(component_name="SuperExec"))
    while True:
        task = tasks.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        if not (task.HasField("task") and task.token):
            time.sleep(POLL_S)
            continue
        session = client(address, RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                         RuntimeTokenHttpInterceptor(task.token))
        try:
            message, context = pull_task(session)
            push_message(session, bridge.relay(message), context)
            push_task_output(session, context, SubStatus.COMPLETED, "")
        finally:
            session.close()
        if bridge.acknowledged:
            return


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
