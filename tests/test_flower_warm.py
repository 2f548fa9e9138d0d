"""Issue 33 (cost): :mod:`securefed.flower.warm`, a SuperNode's ClientApps forked from one
pre-imported process (``flower-supernode --isolation process``).

Fast: a forked task's exit status; what one message's child does in memory never reaches the
next; two children of one warm parent draw different secure-aggregation secrets (and the check
catches a generator that the parent made, which every child would repeat); the executor refuses a
bad poll or a missing preload module, naming it; the loopback federation's commands for both
modes. ``-m slow``: another process on the node's host acquires a node's tasks in Flower's
default mode, and not from a warm node without its executor's secret; two warm SuperNodes run two
rounds of FedMF with the malicious-server secure aggregation and both merges, every message
answered by a forked child, equal to the in-process model.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from securefed.flower import warm
from securefed.flower.loopback import FAST_TASK_POLL, LoopbackFederation
from securefed.randomness import SeedTree
from securefed.recsys.fedmf_flower import PRELOAD
from securefed.transport.secagg.client import _ClientRandomness


def _status(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _in_children(draw, n: int = 2) -> list[bytes]:
    """``draw()`` in ``n`` children forked by :func:`warm.fork_task`, their bytes."""
    results = []
    for _ in range(n):
        read, write = os.pipe()

        def task(write=write) -> None:
            os.write(write, draw())

        pid = warm.fork_task(task)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            results.append(pipe.read())
        assert _status(pid) == 0
    return results


def test_a_forked_task_exits_with_its_status_and_never_returns():
    assert _status(warm.fork_task(lambda: None)) == 0
    assert _status(warm.fork_task(lambda: (_ for _ in ()).throw(RuntimeError("x")))) == 1

    def flower_exit() -> None:
        raise SystemExit(7)

    assert _status(warm.fork_task(flower_exit)) == 7


STATE = {"messages": 0}


def test_one_messages_memory_never_reaches_the_next():
    def message() -> bytes:
        STATE["messages"] += 1  # e.g. a secret left in a module by a careless handler
        return str(STATE["messages"]).encode()

    assert _in_children(message, 3) == [b"1", b"1", b"1"]
    assert STATE["messages"] == 0  # nor the parent


def test_two_children_draw_different_secure_aggregation_secrets():
    """The attack: children forked from one parent that share a generator's state would draw
    the same masks and keys, and the server would learn the difference of two updates. securefed
    draws them from the OS in each child (secure mode)."""

    def secrets() -> bytes:
        randomness = _ClientRandomness(SeedTree(), 0, 1)
        pair = randomness.keypair("c")
        return randomness.secret("b") + randomness.randbytes(16) + repr(pair.public).encode()

    first, second = _in_children(secrets)
    assert first != second
    # The check would catch the hazard: a generator the parent made repeats in every child.
    made_in_parent = np.random.default_rng()
    repeated = _in_children(lambda: made_in_parent.bytes(16))
    assert repeated[0] == repeated[1]


def test_the_executor_refuses_a_bad_poll_or_a_missing_module():
    with pytest.raises(ValueError, match="poll_interval"):
        warm.serve("127.0.0.1:1", insecure=True, poll_interval=0.0)
    with pytest.raises(ImportError, match="no_such_module_here"):
        warm.serve("127.0.0.1:1", insecure=True, preload=["no_such_module_here"])


def test_the_loopback_commands_of_both_modes(tmp_path):
    old = LoopbackFederation(tmp_path / "old", 2)
    assert "--isolation" not in old.supernode_command(0, root_certificates=None, private_key=None)
    with pytest.raises(ValueError, match="SuperExec"):
        old.warm_command(9094, 1)
    new = LoopbackFederation(
        tmp_path / "new",
        2,
        env={"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05"},
        warm_clientapp=PRELOAD,
    )
    node = new.supernode_command(1, root_certificates=None, private_key=None, runtime_port=9094)
    assert node[node.index("--isolation") + 1] == "process"
    assert node[node.index("--port") + 1] == "9094"
    command = new.warm_command(9094, 4242)
    assert command[command.index("--runtime-api-address") + 1] == "127.0.0.1:9094"
    assert command[command.index("--parent-pid") + 1] == "4242"
    assert command[command.index("--poll") + 1] == "0.05"
    assert command[command.index("--preload") + 1].split(",") == list(PRELOAD)
    secret = str(new.superexec_secret)  # both hold it: only the executor acquires tasks
    assert node[node.index("--superexec-auth-secret-file") + 1] == secret
    assert command[command.index("--superexec-auth-secret-file") + 1] == secret


@pytest.mark.slow
def test_warm_nodes_carry_the_malicious_protocol_and_their_floors(example, tmp_path):
    from securefed.flower.loopback import missing_commands
    from securefed.recsys.fedmf_flower import write_fedmf_app

    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    out = tmp_path / "out"
    app = example.FedMFApp(
        seed=0,
        rounds=2,
        transport="secagg",
        secagg_merge=True,
        secagg_advertise_ahead=True,
        min_nodes=2,
        synthetic_users=30,
        output_dir=str(out),
        timeout=300.0,
    )
    assert app.secagg_server == "malicious"
    with LoopbackFederation(
        tmp_path / "federation",
        2,
        warm_clientapp=PRELOAD,
        env=FAST_TASK_POLL,
    ) as federation:
        federation.submit(write_fedmf_app(tmp_path / "app", app.run_config()))
        federation.wait_for(out / "result.json", timeout=900)
    result = json.loads((out / "result.json").read_text())
    model, _, _ = example.in_process(app)
    np.testing.assert_allclose(np.load(out / "server.npz")["V"], model.V, rtol=0, atol=1e-9)
    assert result["nodes"] == 2
    for partition in range(2):
        node_log = (tmp_path / "federation" / f"supernode-{partition}.log").read_text()
        warm_log = (tmp_path / "federation" / f"warm-{partition}.log").read_text()
        received = node_log.count("Receiving: ")
        assert received >= 5 and warm_log.count(warm.START_LINE) == received
        assert "flower-superexec" not in node_log


def _acquire(runtime_port: int, secret: bytes | None) -> str:
    """A process on the node's host asks its Runtime API for a task: "accepted" or the error."""
    import httpx
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import (
        RuntimeVersionHttpInterceptor,
        SuperExecAuthHttpInterceptor,
    )
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors: list = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret is not None:
        interceptors.append(
            SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=warm.ACQUIRE_TASK)
        )
    client = RuntimeHttpClient.from_server_address(
        server_address=f"127.0.0.1:{runtime_port}",
        insecure=True,
        root_certificates=None,
        interceptors=interceptors,
    )
    try:
        client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        return "accepted"
    except httpx.HTTPStatusError as error:
        return str(error.response.status_code)
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["subprocess", "warm"])
def test_only_the_warm_executor_acquires_a_warm_nodes_tasks(tmp_path, mode):
    """The attack: another process on a SuperNode's host asks its Runtime API for the node's
    next task (its token opens the message and the node's ``Context``: secure aggregation's
    secrets between stages). Flower's default mode accepts it (no SuperExec authentication in
    ``subprocess`` isolation: the old behaviour, asserted here); a warm node accepts it only
    signed with the secret its executor holds."""
    import signal
    import socket
    import time

    from securefed.flower.credentials import write_private
    from securefed.flower.loopback import free_port, missing_commands

    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    federation = LoopbackFederation(tmp_path, 1, warm_clientapp=PRELOAD if mode == "warm" else None)
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_private(federation.superexec_secret, os.urandom(32))
    federation.port = free_port()  # no SuperLink: the Runtime API serves before it connects
    runtime_port = free_port()
    node, _ = federation._popen(
        "supernode-0",
        federation.supernode_command(
            0, root_certificates=None, private_key=None, runtime_port=runtime_port
        ),
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", runtime_port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline and node.poll() is None
                time.sleep(0.2)
        stranger = _acquire(runtime_port, None)
        holder = _acquire(runtime_port, federation.superexec_secret.read_bytes())
        wrong = _acquire(runtime_port, os.urandom(32))
    finally:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=30)
    if mode == "subprocess":
        assert stranger == wrong == "accepted"  # Flower's default: any local process
    else:
        assert stranger == wrong == "401" and holder == "accepted"
