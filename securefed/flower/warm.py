"""A warm ClientApp executor for a SuperNode in Flower's ``process`` isolation mode.

Flower 1.42's SuperNode (``--isolation subprocess``, the default) starts a SuperExec that launches
a new ``flwr-clientapp`` process for every message: a Python interpreter, Flower's imports and the
app's (securefed, NumPy) each time. ``flwr-clientapp`` takes one task token and exits
(``flwr.supernode.runtime.run_clientapp``); Flower's warm executor pools exist only for its
Kubernetes executor and not for ClientApps. With ``flower-supernode --isolation process`` the
SuperNode starts no SuperExec: whatever asks its Runtime API for tasks (``AcquireTask``) runs
them. :func:`serve` is such a process: it imports Flower's ClientApp runtime and the modules
named in ``preload`` once, then for each ClientApp task it ``fork``s a child that runs Flower's
own ``run_clientapp`` with the task's token, unchanged: the child pulls the message, the
``Context`` and the FAB from the SuperNode, installs the FAB and loads its ClientApp, runs it,
and pushes the reply and the ``Context`` back, exactly as a fresh ``flwr-clientapp`` would.

What stays as it was: one process per message (a child forked from the same pre-imported
parent, so nothing one message does in memory reaches the next: module state, the
ClientApp's objects and secrets die with the child); the node's state (FedMF's user vectors,
secure aggregation's secrets between stages) in the SuperNode's ``Context.state``; its floors in
its ``--node-config``; the ClientApp code from the FAB. What a child shares with its parent: the
pre-imported modules as they were imported. Secret randomness in securefed comes from
``os.urandom``, fresh in every child; a pseudo-random generator created at import in the parent
would repeat in every child (CPython reseeds ``random`` at a fork; NumPy's and torch's global
generators are not reseeded), so a ``preload`` module must not draw secrets from one at import
(securefed's do not: ``tests/test_flower_warm.py`` checks two children's secure-aggregation
secrets differ).

Run it beside each SuperNode (the same host; the Runtime API listens on 127.0.0.1 by default)::

    flower-supernode --isolation process --port 9094 \\
        --superexec-auth-secret-file /etc/securefed/superexec.secret ... &
    python -m securefed.flower.warm --runtime-api-address 127.0.0.1:9094 --insecure \\
        --superexec-auth-secret-file /etc/securefed/superexec.secret \\
        --preload securefed.flower.client,securefed.recsys.fedmf

Restart it after upgrading securefed or the app's dependencies: children run the code the
parent imported.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence

DEFAULT_POLL = 0.05
"""Seconds between two ``AcquireTask`` calls (Flower's SuperExec: 1 s by default)."""

ACQUIRE_TASK = frozenset({"/flwr.proto.Runtime/AcquireTask"})
"""The Runtime API method Flower's SuperExec authentication protects."""

START_LINE = "Start `flwr-clientapp` process (forked from securefed.flower.warm)"
"""What a child logs first (the same start as ``flwr-clientapp``'s, for log readers)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(children: set[int]) -> None:
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)


def fork_task(run: Callable[[], object]) -> int:
    """``run()`` in a forked child that exits with its status (``SystemExit``'s code, 0 when
    it returns, 1 when it raises) and never returns into the caller; the child's pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        run()
        code = 0
    except SystemExit as stop:  # flwr_exit ends every task with sys.exit
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # a child must never return into the parent's loop
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_task(
    token: str, runtime_api_address: str, insecure: bool, certificates: bytes | None
) -> None:
    """One ClientApp task, as ``flwr-clientapp --token`` runs it (in a forked child)."""
    from logging import INFO

    from flwr.supercore import log
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    log(INFO, START_LINE)
    run_clientapp(
        runtime_api_address=runtime_api_address,
        token=token,
        insecure=insecure,
        certificates=certificates,
        parent_pid=None,
        runtime_dependency_install=False,
    )


def serve(
    runtime_api_address: str,
    *,
    insecure: bool,
    root_certificates_path: str | None = None,
    preload: Sequence[str] = (),
    poll_interval: float = DEFAULT_POLL,
    parent_pid: int | None = None,
    max_tasks: int | None = None,
    superexec_auth_secret: bytes | None = None,
) -> int:
    """Ask the SuperNode's Runtime API for ClientApp tasks and run each in a forked child.

    Args:
        runtime_api_address: the SuperNode's Runtime API (``host:port``: its ``--port``).
        insecure: plain HTTP to the Runtime API (else TLS with ``root_certificates_path``).
        root_certificates_path: the CA certificate of the Runtime API's TLS.
        preload: modules to import once, before the first task (the app's dependencies).
        poll_interval: seconds between two ``AcquireTask`` calls (0.01-60).
        parent_pid: stop when this process (the SuperNode) is gone.
        max_tasks: stop after launching this many tasks (``None``: run until stopped).
        superexec_auth_secret: the secret of the SuperNode's ``--superexec-auth-secret-file``
            (Flower's HMAC on ``AcquireTask``, honoured in ``process`` isolation only): without
            it any process on the host that reaches the Runtime API acquires the node's tasks,
            their ``Context`` included.

    Returns:
        The number of tasks launched.

    Raises:
        ValueError: a poll interval outside 0.01-60 s.
        ImportError: a ``preload`` module that cannot be imported (naming it).
    """
    if not 0.01 <= poll_interval <= 60.0:
        raise ValueError(f"poll_interval must be 0.01-60 s, got {poll_interval!r}")
    # Flower's ClientApp runtime and the app's modules, imported once for every child.
    import flwr.supernode.runtime.run_clientapp  # noqa: F401
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import (
        RuntimeVersionHttpInterceptor,
        SuperExecAuthHttpInterceptor,
    )
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ImportError(f"securefed.flower.warm: cannot preload {name!r}: {error}") from error
    certificates = validate_and_resolve_root_certificates(root_certificates_path, insecure)
    interceptors: list = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if superexec_auth_secret is not None:
        interceptors.append(
            SuperExecAuthHttpInterceptor(
                master_secret=superexec_auth_secret, protected_methods=ACQUIRE_TASK
            )
        )
    client = RuntimeHttpClient.from_server_address(
        server_address=runtime_api_address,
        insecure=insecure,
        root_certificates=certificates,
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    children: set[int] = set()
    launched = 0
    try:
        while max_tasks is None or launched < max_tasks:
            _reap(children)
            if parent_pid is not None and not _alive(parent_pid):
                break
            answer = client.AcquireTask(request)
            if answer.HasField("task") and answer.token:
                pid = fork_task(
                    functools.partial(
                        _run_task, answer.token, runtime_api_address, insecure, certificates
                    )
                )
                children.add(pid)
                launched += 1
                continue  # another task may be waiting
            time.sleep(poll_interval)
    finally:
        client.close()
        for pid in children:  # let running tasks finish
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return launched


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m securefed.flower.warm",
        description="Run a SuperNode's ClientApps (--isolation process) from one warm process",
    )
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's host:port")
    parser.add_argument("--insecure", action="store_true", help="plain HTTP to the Runtime API")
    parser.add_argument("--root-certificates", default=None, help="CA of the Runtime API's TLS")
    parser.add_argument("--preload", default="", help="comma-separated modules to import once")
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL, help="AcquireTask interval, s")
    parser.add_argument("--parent-pid", type=int, default=None, help="stop when it is gone")
    parser.add_argument(
        "--superexec-auth-secret-file",
        default=None,
        help="the SuperNode's --superexec-auth-secret-file (sign AcquireTask with it)",
    )
    args = parser.parse_args(argv)
    secret = None
    if args.superexec_auth_secret_file is not None:
        from flwr.supercore.auth.superexec_secret import load_superexec_auth_secret

        secret = load_superexec_auth_secret(args.superexec_auth_secret_file)
    serve(
        args.runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        preload=[name for name in args.preload.split(",") if name],
        poll_interval=args.poll,
        parent_pid=args.parent_pid,
        superexec_auth_secret=secret,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
