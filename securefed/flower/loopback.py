"""A real Flower federation on one machine: a SuperLink and SuperNodes as separate processes.

:class:`LoopbackFederation` starts ``flower-superlink`` and ``n`` ``flower-supernode`` processes
on ``127.0.0.1`` (``--insecure``, or TLS and Flower's SuperNode authentication with
:class:`FederationCredentials`; free ports, a private ``FLWR_HOME``, no runtime dependency
installation: everything offline), submits an app with ``flwr run <app-dir> <connection>``, and
stops every process it started when it leaves its ``with`` block. It is what
``tests/test_flower.py`` uses, and the commands it runs are the ones docs/flower.md gives for
several hosts, except that by default each SuperNode runs through
:mod:`securefed.flower.supernode_launch` (Flower's ``flower-supernode`` with its 3 s wait after
an empty pull cut to ``supernode_pull_wait`` = 0.1 s; ``None``: the stock command).

How Flower 1.42 submits a run: ``flwr run`` builds a FAB (a zip of the app directory, which holds
a ``pyproject.toml`` with ``[tool.flwr.app]``) and sends it to the SuperLink named by a
connection in ``$FLWR_HOME/config.toml`` (``[superlink.<name>] address = "host:port"``,
``insecure = true``). The SuperLink starts the ServerApp in a subprocess; each SuperNode pulls
its messages and starts a ClientApp process per message (with ``warm_clientapp``: forked from a
:mod:`securefed.flower.warm` executor beside each SuperNode, ``--isolation process``).

:func:`write_app` copies an app directory (e.g. FedMF's example app,
:data:`securefed.recsys.fedmf_flower.APP_DIR`) and sets its run config.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from securefed.flower.credentials import NodeKeyFiles, TLSFiles, write_private
from securefed.flower.supernode_launch import DEFAULT_PULL_WAIT, PullWait, check_installed

CONNECTION = "loopback"


@dataclass(frozen=True)
class FederationCredentials:
    """TLS and SuperNode authentication for a federation (:mod:`securefed.flower.credentials`).

    Attributes:
        tls: the CA certificate and the SuperLink's certificate and key (its names must include
            ``127.0.0.1``: the federation's processes reach the SuperLink there).
        node_keys: partition -> that SuperNode's authentication key pair. The SuperLink runs
            ``--enable-supernode-auth``; every public key here is registered
            (``flwr supernode register``) before the nodes start, so only these nodes join.
    """

    tls: TLSFiles
    node_keys: Mapping[int, NodeKeyFiles]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def toml_value(value: object) -> str:
    """A scalar as a TOML value (strings, booleans, integers, finite floats).

    Raises:
        ValueError: for anything else (lists, None, NaN, infinities).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML has no non-finite float for a run config, got {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string
    raise ValueError(f"run-config values are str, bool, int or float; got {value!r}")


def write_app(
    template: str | os.PathLike,
    dest: str | os.PathLike,
    run_config: Mapping[str, object] | None = None,
) -> Path:
    """Copy the app in ``template`` to ``dest`` with ``run_config`` in its
    ``[tool.flwr.app.config]``.

    Keys that the template does not have are added; the template's others keep their values.

    Args:
        template: an app directory (a ``pyproject.toml`` with ``[tool.flwr.app]`` and its package).
        dest: where the copy goes.
        run_config: values for ``[tool.flwr.app.config]``.

    Returns:
        The app directory (``flwr run`` takes it).
    """
    dest = Path(dest)
    shutil.copytree(
        Path(template), dest, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
    )
    pyproject = dest / "pyproject.toml"
    text = pyproject.read_text()
    head, marker, section = text.partition("[tool.flwr.app.config]\n")
    if not marker:
        raise ValueError(f"{pyproject} has no [tool.flwr.app.config] section")
    values: dict[str, str] = {}
    for line in section.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    for key, value in (run_config or {}).items():
        values[key] = toml_value(value)
    body = "".join(f"{key} = {value}\n" for key, value in values.items())
    pyproject.write_text(head + marker + body)
    return dest


FAST_TASK_POLL = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05"}
"""Flower 1.42's one setting of the node-side poll: the SuperExec a SuperNode starts asks its
SuperNode for a ClientApp to launch every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` seconds (default
1, at least 0.01); set in the SuperNode's environment, which the SuperExec inherits. The
SuperNode's own wait between two empty pulls from the SuperLink (3 s) has no setting."""

COMMANDS = ("flower-superlink", "flower-supernode", "flwr")
"""The Flower commands a loopback federation starts."""


def missing_commands() -> list[str]:
    """The :data:`COMMANDS` found neither beside this Python nor on ``PATH``."""
    return [
        name
        for name in COMMANDS
        if not (Path(sys.executable).parent / name).exists() and shutil.which(name) is None
    ]


def _executable(name: str) -> str:
    """A Flower command next to this Python (the venv's bin), else from PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install securefed[flower] (flwr >= 1.42)")
    return found


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the SuperLink exited with {process.returncode}; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"the SuperLink did not listen on port {port} within {timeout} s")


def _json_answer(stdout: str) -> dict:
    """The JSON object ``flwr ... --format json`` printed (after any log lines), else ``{}``."""
    try:
        return json.loads(stdout[stdout.index("{") :])
    except ValueError:
        return {}


class LoopbackFederation:
    """A SuperLink and ``n_nodes`` SuperNodes on 127.0.0.1, stopped on exit (use ``with``).

    Args:
        workdir: where ``FLWR_HOME`` and the processes' logs go.
        n_nodes: SuperNodes to start; node ``i`` gets ``partition-id=i num-partitions=n_nodes``.
        startup_timeout: seconds for the SuperLink to listen.
        node_config: partition -> more ``--node-config`` keys of that node (e.g. its identity
            files and privacy floors: :mod:`securefed.flower.identity`,
            :mod:`securefed.flower.floors`).
        credentials: TLS and SuperNode authentication (a key pair for every node); ``None``:
            ``--insecure`` and no authentication.
        env: more environment variables for every process it starts, e.g.
            ``{"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05"}`` (:data:`FAST_TASK_POLL`): how
            often each SuperNode's SuperExec asks for a ClientApp to start (Flower 1.42's
            default 1 s).
        warm_clientapp: ``None`` (default): each SuperNode starts its SuperExec, which launches a
            new ``flwr-clientapp`` process per message. A tuple of module names: each SuperNode
            runs ``--isolation process`` beside a :mod:`securefed.flower.warm` executor that
            imports Flower's ClientApp runtime and these modules once and forks a child per
            message (its log and its children's: ``warm-<partition>.log``). Both are given a
            fresh SuperExec secret (``superexec.secret``, mode 0600): the SuperNode accepts
            ``AcquireTask`` only signed with it (Flower's default mode accepts it from any
            process on the host).

    Raises:
        ValueError: ``n_nodes < 1``; credentials without a key pair for some node.

    Example:
        >>> with LoopbackFederation(tmp, 2) as federation:  # doctest: +SKIP
        ...     federation.submit(write_app(app_dir, tmp / "app", {"rounds": 3, "output-dir": out}))
        ...     federation.wait_for(Path(out) / "result.json", timeout=120)
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        n_nodes: int,
        *,
        startup_timeout: float = 60.0,
        node_config: Mapping[int, Mapping[str, object]] | None = None,
        credentials: FederationCredentials | None = None,
        env: Mapping[str, str] | None = None,
        warm_clientapp: tuple[str, ...] | None = None,
        supernode_pull_wait: float | None = DEFAULT_PULL_WAIT,
    ) -> None:
        if n_nodes < 1:
            raise ValueError(f"n_nodes must be >= 1, got {n_nodes}")
        if credentials is not None and (
            missing := sorted(set(range(n_nodes)) - set(credentials.node_keys))
        ):
            raise ValueError(
                f"SuperNode authentication needs a key pair for every node; none for {missing}"
            )
        self.credentials = credentials
        self.workdir = Path(workdir)
        self.n_nodes = n_nodes
        self.node_config = {int(p): dict(c) for p, c in (node_config or {}).items()}
        self.startup_timeout = startup_timeout
        self.warm_clientapp = None if warm_clientapp is None else tuple(warm_clientapp)
        self.pull_wait = None if supernode_pull_wait is None else PullWait(supernode_pull_wait)
        self.superexec_secret = self.workdir / "superexec.secret"
        self.home = self.workdir / "flwr_home"
        self.port = 0
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        bin_dir = str(Path(sys.executable).parent)
        self.env = (
            os.environ
            | {
                "FLWR_HOME": str(self.home),
                "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                "PYTHONUNBUFFERED": "1",
            }
            | dict(env or {})
        )

    # -- processes ------------------------------------------------------------------------
    def _popen(self, name: str, command: list[str]) -> tuple[subprocess.Popen, Path]:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,  # its own process group: stopped with its children
            )
        return process, log

    def _start(self, name: str, command: list[str]) -> subprocess.Popen:
        process, log = self._popen(name, command)
        self.processes.append(process)
        self.logs.append(log)
        return process

    def _link_flags(self) -> list[str]:
        if self.credentials is None:
            return ["--insecure"]
        tls = self.credentials.tls
        return [
            "--ssl-ca-certfile",
            str(tls.ca_certificate),
            "--ssl-certfile",
            str(tls.superlink_certificate),
            "--ssl-keyfile",
            str(tls.superlink_key),
            "--enable-supernode-auth",
        ]

    def supernode_command(
        self,
        partition: int,
        *,
        root_certificates: str | os.PathLike | None,
        private_key: str | os.PathLike | None,
        max_retries: int | None = None,
        runtime_port: int | None = None,
    ) -> list[str]:
        """The ``flower-supernode`` command of node ``partition``.

        Args:
            partition: its ``partition-id`` (its ``--node-config`` keys are added).
            root_certificates: the CA certificate it checks the SuperLink against (``None``:
                ``--insecure`` if the federation is, else the system's certificates).
            private_key: its authentication key (``None``: none).
            max_retries: ``--max-retries`` (``None``: Flower's default, retry forever).
            runtime_port: its Runtime API's ``--port`` (``None``: a free one).

        With :attr:`warm_clientapp` set it runs ``--isolation process`` (no SuperExec of its
        own: :meth:`warm_command` runs its ClientApps). With :attr:`pull_wait` set it is
        ``python -m securefed.flower.supernode_launch --pull-wait S --`` and the same flags.
        """
        extra = "".join(
            f" {key}={toml_value(value)}"
            for key, value in self.node_config.get(partition, {}).items()
        )
        if self.pull_wait is None:
            command = [_executable("flower-supernode")]
        else:
            launcher = [sys.executable, "-m", "securefed.flower.supernode_launch"]
            command = [*launcher, "--pull-wait", repr(self.pull_wait.seconds), "--"]
        if self.credentials is None:
            command.append("--insecure")
        elif root_certificates is not None:
            command += ["--root-certificates", str(root_certificates)]
        if private_key is not None:
            command += ["--auth-supernode-private-key", str(private_key)]
        if max_retries is not None:
            command += ["--max-retries", str(max_retries)]
        if self.warm_clientapp is not None:
            command += ["--isolation", "process"]
            command += ["--superexec-auth-secret-file", str(self.superexec_secret)]
        return [
            *command,
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--port",
            str(free_port() if runtime_port is None else runtime_port),
            "--node-config",
            f"partition-id={partition} num-partitions={self.n_nodes}{extra}",
        ]

    def warm_command(self, runtime_port: int, supernode_pid: int) -> list[str]:
        """The :mod:`securefed.flower.warm` executor beside a SuperNode (its Runtime API on
        ``127.0.0.1:runtime_port``, plain HTTP as Flower's own SuperExec uses it there)."""
        if self.warm_clientapp is None:
            raise ValueError("this federation runs Flower's SuperExec (warm_clientapp=None)")
        poll = self.env.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "1.0")
        return [
            sys.executable,
            "-m",
            "securefed.flower.warm",
            "--runtime-api-address",
            f"127.0.0.1:{runtime_port}",
            "--insecure",
            "--poll",
            poll,
            "--parent-pid",
            str(supernode_pid),
            "--superexec-auth-secret-file",
            str(self.superexec_secret),
            "--preload",
            ",".join(self.warm_clientapp),
        ]

    def _flwr(self, *arguments: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            [_executable("flwr"), *arguments],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.workdir,
            timeout=timeout,
            check=False,
        )

    def register_node(self, public_key: str | os.PathLike, timeout: float = 60.0) -> int:
        """``flwr supernode register <public_key> loopback``: the node id the SuperLink gave it.

        Raises:
            RuntimeError: naming flwr's output, if the key was not registered.
        """
        done = self._flwr(
            "supernode",
            "register",
            str(public_key),
            CONNECTION,
            "--format",
            "json",
            timeout=timeout,
        )
        answer = _json_answer(done.stdout)
        if done.returncode != 0 or not answer.get("success"):
            raise RuntimeError(
                f"flwr supernode register failed ({done.returncode}): "
                f"{done.stdout[-2000:]} {done.stderr[-2000:]}"
            )
        return int(answer["node-id"])

    def start(self) -> LoopbackFederation:
        """Start the SuperLink, wait until it listens, register the nodes' keys (with
        credentials), then start the SuperNodes.

        Raises:
            UnsupportedFlower: a pull wait is set and the installed Flower is not the one
                :mod:`securefed.flower.supernode_launch` knows (before any process starts).
        """
        if self.pull_wait is not None:
            check_installed()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        if self.warm_clientapp is not None:
            write_private(self.superexec_secret, os.urandom(32))
        self.port = free_port()
        transport = (
            "insecure = true"
            if self.credentials is None
            else f"root-certificates = {toml_value(str(self.credentials.tls.ca_certificate))}"
        )
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.port}"\n{transport}\n'
        )
        superlink = self._start(
            "superlink",
            [
                _executable("flower-superlink"),
                *self._link_flags(),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
        )
        _wait_for_port(self.port, superlink, self.startup_timeout, self.logs[0])
        node_keys = {} if self.credentials is None else self.credentials.node_keys
        for partition in range(self.n_nodes):
            if partition in node_keys:
                self.register_node(node_keys[partition].public_key)
        warm = []
        for partition in range(self.n_nodes):
            keys = node_keys.get(partition)
            runtime_port = free_port()
            supernode = self._start(
                f"supernode-{partition}",
                self.supernode_command(
                    partition,
                    root_certificates=None
                    if self.credentials is None
                    else self.credentials.tls.ca_certificate,
                    private_key=None if keys is None else keys.private_key,
                    runtime_port=runtime_port,
                ),
            )
            if self.warm_clientapp is not None:
                warm.append((partition, self.warm_command(runtime_port, supernode.pid)))
        for partition, command in warm:  # after the nodes: processes[1 + i] is node i
            self._start_warm(partition, command)
        return self

    def _start_warm(self, partition: int, command: list[str]) -> None:
        """The warm executor of node ``partition`` (its log: ``warm-<partition>.log``)."""
        process, log = self._popen(f"warm-{partition}", command)
        self.processes.append(process)
        self.logs.append(log)

    def probe_supernode(
        self, name: str, command: list[str], timeout: float = 120.0
    ) -> tuple[int, str]:
        """Run a SuperNode outside the federation until it exits (e.g. one the SuperLink must
        refuse: started with ``max_retries=0``); its exit status and log.

        Raises:
            TimeoutError: it was still running after ``timeout`` s (it was let in).
        """
        process, log = self._popen(name, command)
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            raise TimeoutError(f"{name} was still running after {timeout} s; see {log}") from None
        return returncode, log.read_text(errors="replace")

    def stop(self, grace: float = 10.0) -> None:
        """Stop every process this federation started (SIGTERM, then SIGKILL after ``grace``)."""
        for process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self.processes.clear()

    def __enter__(self) -> LoopbackFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- runs -----------------------------------------------------------------------------
    def submit(self, app_dir: str | os.PathLike, timeout: float = 120.0) -> str:
        """``flwr run <app_dir> loopback``: build the FAB and start the run; returns its id.

        Raises:
            RuntimeError: naming flwr's output, if the run was not started.
        """
        done = self._flwr("run", str(app_dir), CONNECTION, "--format", "json", timeout=timeout)
        answer = _json_answer(done.stdout)
        if done.returncode != 0 or not answer.get("success"):
            raise RuntimeError(
                f"flwr run failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}"
            )
        return str(answer["run-id"])

    def wait_for(self, path: str | os.PathLike, timeout: float) -> Path:
        """Wait until ``path`` exists (e.g. the server's result file) while the processes live.

        Raises:
            RuntimeError: a process of the federation exited.
            TimeoutError: naming the logs to read.
        """
        path = Path(path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                return path
            for process, log in zip(self.processes, self.logs, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"{log.stem} exited with {process.returncode}; see {log}")
            time.sleep(0.25)
        raise TimeoutError(f"{path} did not appear within {timeout} s; logs: {self.workdir}")
