"""`--engine flower --launch local`: a whole Flower federation on this machine, over loopback, with TLS and node
authentication: a SuperLink, then per node its fedcli process, its SuperNode and its bridge, then the run.

Keys and certificates are made in `<exp>/flower/` (fedcli/comm/bundles.py) and kept: a node's key is its
identity across runs. Flower's commands come from an environment of its own (`FEDCLI_FLOWER_BIN`, else the
folder of `flower-superlink` on PATH): Flower 1.42 pins typer below 0.21, fedcli's command line is built on
typer 0.29, so the two cannot share one environment. The SuperLink's state lives in a temporary folder; it
sees TLS keys of its own and sealed envelopes, never a node's key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fedcli
from fedcli.comm.bundles import allow_list, make_federation, superlink_address
from fedcli.comm.launcher import GRACE_S, Ended, free_port, last_error, watch
from fedcli.comm.node_process import RELAY_PORT, TENSORBOARD_FLAG, log_path
from fedcli.comm.relay_group import read_bundle
from fedcli.comm.sealing import load_private_key, public_line
from fedcli.core.errors import UserError
from fedcli.experiment import events
from fedcli.experiment.config import to_json
from fedcli.experiment.locking import TOKEN, TOKEN_ENV
from fedcli.experiment.paths import inside

FLOWER = "flwr>=1.42,<1.43"
FEDERATION = "fedcli"
START_S = 60.0  # for a Flower process to open its port
RETRY_S = 2.0  # before a refused SuperNode tries again
ADMITTED = b"SuperNode ID: "  # what flower-supernode logs once the SuperLink has activated it (flwr 1.42)
LAST_WORD_S = 30.0  # for the relay to acknowledge a hospital's end before its SuperNode stops
FORWARD_S = 1.0  # for a SuperNode to forward its bridge's last answer
FAB = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedcli-relay"
version = "1.0.0"
description = "fedcli's relay of sealed envelopes between the nodes of a federation"
license = "MIT"
dependencies = []

[tool.flwr.app]
publisher = "fedcli"

[tool.flwr.app.components]
serverapp = "fedcli.comm.flower.server_app:app"
clientapp = "fedcli.comm.flower.bridge:app"

[tool.flwr.app.config]
nodes = ""
timeout = 300.0
"""


def flower_bin() -> Path:
    """The folder of Flower's commands."""
    given = os.environ.get("FEDCLI_FLOWER_BIN")
    found = Path(given) if given else (Path(p).parent if (p := shutil.which("flower-superlink")) else None)
    if found is None or not (found / "flower-superlink").is_file():
        where = f"FEDCLI_FLOWER_BIN={given} holds no flower-superlink" if given else "flower-superlink is not on PATH"
        raise UserError(f"--engine flower needs Flower in an environment of its own ({where}): python3 -m venv "
                        f"flower-env && flower-env/bin/pip install '{FLOWER}', then set FEDCLI_FLOWER_BIN=flower-env/bin")
    return found


def flower_env(bin_dir: Path, home: Path) -> dict[str, str]:
    """The environment of a Flower process: its commands first on PATH, fedcli's relay code importable (it needs
    only the standard library and Flower), its state under `home`."""
    home.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLWR_", "PYTHON"))}
    return base | {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "FLWR_HOME": str(home),
                   "PYTHONPATH": str(Path(fedcli.__file__).resolve().parent.parent), "FLWR_TELEMETRY_ENABLED": "0",
                   "PYTHONUNBUFFERED": "1"}


def wait_port(port: int, proc: subprocess.Popen, what: str, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise UserError(f"{what} stopped at start (exit code {proc.returncode}); see {log}")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        time.sleep(0.1)
    raise UserError(f"{what} did not open port {port} within {START_S:g} s; see {log}")


def check_bundles(folder: Path, nodes: list[str]) -> None:
    """fedcli's own check, before Flower's: every node's key is the one the SuperLink's allow-list holds."""
    allowed = allow_list(folder / "superlink")
    for node in nodes:
        bundle = folder / "bundles" / node
        _, key, _ = read_bundle(bundle)
        line = public_line(load_private_key(key, str(bundle / "node.key")))
        if node not in allowed:
            raise UserError(f"node {node} is not on the allow-list {folder / 'superlink' / 'allowlist.json'}; refused "
                            "(have the coordinator list its key with fedcli deploy)")
        if allowed[node].split()[:2] != line.split()[:2]:
            raise UserError(f"node {node}'s key {bundle / 'node.key'} is not the key the allow-list holds for it; "
                            "refused (use the key of its bundle, or have the coordinator list this one)")


def admitted(supernode: subprocess.Popen, log: Path, offset: int, deadline: float) -> bool:
    """Whether the SuperLink activated `supernode` (it logs its node id then) before it exited or `deadline`; one
    not admitted by then is stopped."""
    with open(log, "rb") as handle:
        handle.seek(offset)
        seen = b""
        while time.monotonic() < deadline:
            seen = seen[-len(ADMITTED):] + handle.read()  # what it logged since, the line possibly split
            if ADMITTED in seen:
                return True
            if supernode.poll() is not None:
                return False
            time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(supernode.pid, signal.SIGKILL)
    supernode.wait()
    return False


@dataclasses.dataclass
class Federation:
    """The processes of one local Flower federation, stopped together."""

    folder: Path
    state: Path
    bin_dir: Path
    log: Path
    procs: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict)

    def start(self, name: str, command: list, log: Path, env: dict[str, str]) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as handle:
            self.procs[name] = subprocess.Popen([str(c) for c in command], stdout=handle, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True)
        return self.procs[name]

    def flwr(self, env: dict[str, str], *args) -> dict:
        done = subprocess.run([str(self.bin_dir / "flwr"), *map(str, args), "--format", "json"], env=env,
                              capture_output=True, text=True, timeout=120)
        with open(self.log, "a") as handle:  # what the Flower command line answered
            handle.write(f"$ flwr {' '.join(map(str, args))}\n{done.stdout}{done.stderr}")
        try:
            answer = json.loads(done.stdout[done.stdout.find("{"):])
        except ValueError:
            answer = {"success": False, "error-message": (done.stdout + done.stderr).strip()}
        if done.returncode != 0 or not answer.get("success"):
            reason = " ".join(str(answer.get("error-message", "")).split()) or f"exit code {done.returncode}"
            raise UserError(f"flwr {args[0]} {args[1]} failed: {reason} (see {self.log})")
        return answer

    def superlink(self, host: str, port: int, logs_dir: Path) -> dict[str, str]:
        """Start the SuperLink with the folder's certificate, list every node of its allow-list (node
        authentication), and return the environment of the `flwr` command line that speaks to it."""
        link, tmp, bin_dir = self.folder / "superlink", self.state, self.bin_dir
        process = self.start("superlink", [
            bin_dir / "flower-superlink", "--ssl-ca-certfile", link / "ca.crt", "--ssl-certfile",
            link / "superlink.crt", "--ssl-keyfile", link / "superlink.key", "--enable-supernode-auth",
            "--database", ":flwr-in-memory:", "--host", host, "--port", port,
            "--disable-runtime-dependency-installation"], logs_dir / "superlink.log", flower_env(bin_dir, tmp / "superlink"))
        wait_port(port, process, "the SuperLink", logs_dir / "superlink.log")
        cli = flower_env(bin_dir, tmp / "cli")
        (tmp / "cli" / "config.toml").write_text(
            f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\naddress = "127.0.0.1:{port}"\n'
            f'root-certificates = "{link / "ca.crt"}"\n')
        for node, line in allow_list(link).items():
            public = tmp / f"{node}.pub"
            public.write_text(line + "\n")
            self.flwr(cli, "supernode", "register", public, FEDERATION, "--name", node)
        return cli

    def relay(self, cli: dict[str, str], nodes: list[str], timeout: float) -> str:
        """Start the relay's run (fedcli/comm/flower/server_app.py) for `nodes`; its run id."""
        fab = self.state / "app"
        fab.mkdir(exist_ok=True)
        (fab / "pyproject.toml").write_text(FAB)
        started = self.flwr(cli, "run", fab, FEDERATION, "--run-config",
                            f"nodes='{','.join(nodes)}' timeout={float(timeout)}")
        return str(started["run-id"])

    def hospital(self, bundle: Path, node: str, postbox: int, logs_dir: Path, patience: float) -> None:
        """Start `node`'s SuperNode, connecting out to the bundle's SuperLink, until the SuperLink admits it (a
        SuperNode that comes before its key is listed there is refused and exits: it is started again, for up to
        `patience` seconds); then its bridge to the postbox."""
        address = json.loads((bundle / "node.json").read_text())["superlink"]
        env, log = flower_env(self.bin_dir, self.state / node), logs_dir / f"{node}-supernode.log"
        deadline = time.monotonic() + patience
        while True:
            runtime = free_port()
            offset = log.stat().st_size if log.is_file() else 0
            supernode = self.start(f"supernode {node}", [
                self.bin_dir / "flower-supernode", "--superlink", address, "--root-certificates", bundle / "ca.crt",
                "--auth-supernode-private-key", bundle / "node.key", "--node-config", f"name='{node}' postbox={postbox}",
                "--host", "127.0.0.1", "--port", runtime, "--isolation", "process"], log, env)
            if admitted(supernode, log, offset, deadline):
                break
            if time.monotonic() > deadline:
                raise UserError(f"node {node} was not admitted by the SuperLink at {address} within {patience:g} s: is "
                                "the coordinator's relay (fedcli deploy relay) running, and does its allow-list hold "
                                f"this bundle's key? (see {log})")
            time.sleep(RETRY_S)
        wait_port(runtime, supernode, f"node {node}'s SuperNode", log)
        self.start(f"bridge {node}", [self.bin_dir / "python", "-m", "fedcli.comm.flower.bridge",
                                      f"127.0.0.1:{runtime}", node, postbox], logs_dir / f"{node}-bridge.log", env)

    def wait(self, name: str, seconds: float) -> bool:
        """Whether process `name` ended within `seconds`."""
        try:
            self.procs[name].wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def processes(folder: Path, log: Path):
    """A `Federation` of `folder`, its state in a temporary folder, every process stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="fedcli-flower-") as tmp:
        fed = Federation(folder, Path(tmp), flower_bin(), log)
        try:
            yield fed
        finally:
            fed.stop()


def spawn(cfg, nodes: list[str], module: str) -> Ended:
    """One fedcli process per node with its SuperNode and bridge, a SuperLink and the relay's run; watched until
    every node has ended (as fedcli/comm/launcher.py's spawn)."""
    flower_bin()
    exp = cfg.exp
    folder = inside(exp, "flower").resolve()  # Flower takes absolute paths only
    link_port = free_port()
    make_federation(folder, nodes, f"127.0.0.1:{link_port}")
    check_bundles(folder, nodes)
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // len(nodes))
    flags = [TENSORBOARD_FLAG] if events.tensorboard_wanted() else []
    logs_dir = inside(exp, "logs", "flower")
    with processes(folder, logs_dir / "flwr.log") as fed:
        cli = fed.superlink("127.0.0.1", link_port, logs_dir)
        procs, logs = {}, {}
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), TOKEN_ENV: TOKEN}
        for node in nodes:
            values = to_json(dataclasses.replace(cfg, launch="none", threads=threads, node=node,
                                                 bundle=folder / "bundles" / node))
            config = fed.state / f"{node}.json"
            config.write_text(json.dumps({k: v for k, v in values.items() if v is not None}))
            postbox = free_port()
            log = log_path(exp, node)
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as handle:
                logs[node] = (log, handle.tell())
                procs[node] = subprocess.Popen([sys.executable, "-m", module, str(config), *flags], stdout=handle,
                                               stderr=None if node == nodes[0] else handle,
                                               env=env | {RELAY_PORT: str(postbox)})
            fed.hospital(folder / "bundles" / node, node, postbox, logs_dir, cfg.timeout)
        fed.relay(cli, nodes, cfg.timeout)
        try:
            stuck = watch(procs, cfg.timeout + GRACE_S)
        except BaseException:
            for proc in procs.values():
                proc.kill()
            raise
    failed = {node: p.returncode for node, p in procs.items() if p.returncode != 0}
    errors = {node: last_error(*logs[node]) for node in failed}
    named = next((e for e in errors.values() if e and e.startswith("lost ")), None)  # as the survivors saw it
    return Ended(failed, errors, named, stuck)


@contextlib.contextmanager
def hospital(cfg):
    """A node started by hand with its bundle (`federate --engine flower --bundle DIR`): its SuperNode and bridge
    run beside it while it does; yields `cfg` naming the bundle's node."""
    bundle = Path(cfg.bundle).resolve()
    node, _, _ = read_bundle(bundle)
    if cfg.node is not None and cfg.node != node:
        raise UserError(f"--node {cfg.node} but the bundle {bundle} is node {node}'s; drop --node or give its bundle")
    logs_dir = inside(cfg.exp, "logs", "flower")
    postbox = free_port()
    with processes(bundle, logs_dir / "flwr.log") as fed:
        fed.hospital(bundle, node, postbox, logs_dir, cfg.timeout)
        os.environ[RELAY_PORT] = str(postbox)
        try:
            yield dataclasses.replace(cfg, node=node)
        finally:
            os.environ.pop(RELAY_PORT, None)
            if fed.wait(f"bridge {node}", LAST_WORD_S):  # the relay has this node's end
                time.sleep(FORWARD_S)


def coordinate(folder: Path, port: int | None, timeout: float, poll_s: float = 2.0) -> None:
    """`fedcli deploy relay`: the coordinator's SuperLink (every interface, the port of the bundles' address) with
    the allow-list's nodes, and the relay's run until it ends; a run that did not complete is a user error
    naming why."""
    folder = folder.resolve()
    nodes = list(allow_list(folder / "superlink"))
    address = superlink_address(folder / "superlink")
    port = port or int(address.rsplit(":", 1)[1])
    logs_dir = folder / "logs"
    with processes(folder, logs_dir / "flwr.log") as fed:
        cli = fed.superlink("0.0.0.0", port, logs_dir)
        run_id = fed.relay(cli, nodes, timeout)
        while True:
            run = fed.flwr(cli, "ls", FEDERATION, "--run-id", run_id)["runs"][0]
            if run["status"] == "finished:completed":
                return
            if run["status"].startswith("finished"):
                raise UserError(f"the relay run ended {run['status']}: {' '.join(run['status-details'].split())} (see "
                                f"{logs_dir})")
            if fed.procs["superlink"].poll() is not None:
                raise UserError(f"the SuperLink stopped (see {logs_dir / 'superlink.log'})")
            time.sleep(poll_s)
