"""``securefed bench flower --parts deployment``: a round on Flower's deployment engine.

A SuperLink and ``--deploy-nodes`` SuperNodes as real processes on 127.0.0.1
(:class:`~securefed.flower.loopback.LoopbackFederation`), the FedMF example app submitted with
``flwr run`` (synthetic, seeded), ``--deploy-rounds`` rounds of each case, in one run:

* plaintext; secure aggregation against a malicious server (five message rounds a training
  round: AdvertiseKeys, ShareKeys, MaskedInputCollection, ConsistencyCheck, Unmasking); the same
  with ShareKeys and MaskedInputCollection merged (``secagg-merge``: four);
* with both merges (``secagg-advertise-ahead`` too: the next round's AdvertiseKeys with this
  round's Unmasking): three after the first round; the honest-but-curious protocol with both:
  two (its nodes started with ``secagg-server="honest_but_curious"``);
* each under Flower 1.42's defaults and with the SuperExec's task poll at 0.05 s
  (:data:`~securefed.flower.loopback.FAST_TASK_POLL`, the one node-side poll Flower exposes).
* each with Flower's SuperExec launching a ``flwr-clientapp`` process per message (the default)
  and/or (``--deploy-clientapp warm``) with the SuperNodes in ``--isolation process`` beside a
  :mod:`securefed.flower.warm` executor (one pre-imported process, a child forked per message),
  case by case one after the other; ``--deploy-cases`` picks the cases;
* each with the stock ``flower-supernode`` (``--deploy-pull-waits flower``: Flower's fixed 3 s
  wait after a pull of the SuperLink that returned no message) and/or with the SuperNodes
  started through :mod:`securefed.flower.supernode_launch` with that wait cut to the given
  seconds (default ``flower,0.1``: both, case by case, old beside new).

The plaintext case runs first and again last in each group (the shared machine's load drifts
during a group); the ratios divide by the mean of the two. Reported per case: the round time
(median of the rounds after the first), the ratio to plaintext, the federation's CPU seconds
(every process it started, reaped: ``RUSAGE_CHILDREN``) and their ratio, the server's seconds
per message type
(``result.json``'s ``message_seconds``) and, from the SuperNodes' logs read as they are
written, where a node's message round goes: ``idle`` (its last reply sent to its next message
pulled: the other nodes, the server's work, the SuperNode's 3 s wait between empty pulls),
``launch`` (pulled to the new ClientApp process's first log line: the SuperExec's task poll,
the interpreter's start and Flower's imports) and ``run`` (from there to the reply sent: the
app's imports, the handler, the SuperNode's 0.5 s push poll). The merged runs must end with
the separate run's model (``max_abs_V_diff_to_separate``, the same seed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

EVENTS = re.compile(r"(Receiving|Sending): (\S+) message|Start `flwr-clientapp` process")
CASES = (  # label, transport, secagg-merge, secagg-advertise-ahead, secagg-server
    ("plaintext", "plaintext", False, False, "malicious"),
    ("secagg", "secagg", False, False, "malicious"),
    ("secagg merged", "secagg", True, False, "malicious"),
    ("secagg merged + ahead", "secagg", True, True, "malicious"),
    ("secagg HbC merged + ahead", "secagg", True, True, "honest_but_curious"),
)
"""Against a malicious server: five message rounds, four (ShareKeys + MaskedInput merged),
three (and the next AdvertiseKeys with Unmasking); the honest-but-curious protocol with both
merges: two (its nodes started with ``secagg-server="honest_but_curious"``)."""
CASE_KEYS = dict(zip(("plaintext", "secagg", "merged", "ahead", "hbc"), CASES, strict=True))
"""``--deploy-cases`` names of :data:`CASES`."""
PULL_WAIT_FLOWER = "flower"
"""``--deploy-pull-waits`` name of the stock ``flower-supernode`` (its fixed 3 s)."""


def parse_pull_waits(text: str) -> list[float | None]:
    """``--deploy-pull-waits``: ``flower`` (``None``: the stock SuperNode) and/or seconds.

    Raises:
        ValueError: naming the flag, for an empty list, a repeat or a value that is neither.
    """
    from securefed.flower.supernode_launch import PullWait

    waits: list[float | None] = []
    for name in text.split(","):
        if name == PULL_WAIT_FLOWER:
            waits.append(None)
            continue
        try:
            waits.append(PullWait(float(name)).seconds)
        except ValueError as error:
            raise ValueError(
                f"--deploy-pull-waits takes {PULL_WAIT_FLOWER} and/or seconds in [0.01, 3], "
                f"got {name!r} ({error})"
            ) from None
    if len(set(waits)) != len(waits):
        raise ValueError(f"--deploy-pull-waits repeats a value: {text!r}")
    return waits


def pull_wait_label(wait: float | None) -> str:
    """A row's ``node_pull_wait``: the stock SuperNode's 3 s or the launcher's seconds."""
    return "Flower 3 s" if wait is None else f"launcher {wait:g} s"


CLIENTAPPS = {"subprocess": "flwr-clientapp per message", "warm": "warm fork"}
"""``--deploy-clientapp``: Flower's SuperExec launching ``flwr-clientapp`` per message, or
``--isolation process`` with :mod:`securefed.flower.warm` (one pre-imported parent, a child
forked per message)."""
COLUMNS = [
    "case",
    "clientapp",
    "flower_poll",
    "node_pull_wait",
    "message_rounds",
    "round_s",
    "ratio_to_plaintext",
    "per_message_round_s",
    "node_idle_s",
    "node_launch_s",
    "node_run_s",
    "first_round_s",
    "cpu_s",
    "cpu_ratio",
]


class LogClock:
    """Stamps the SuperNodes' log lines as they appear (a thread polling the files)."""

    def __init__(self, logs: list[Path], interval: float = 0.05) -> None:
        self.logs, self.interval = logs, interval
        self.events: dict[str, list[tuple[float, str, str]]] = {self.node(log): [] for log in logs}
        self._offsets = {log.stem: 0 for log in logs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def node(log: Path) -> str:
        """The node a log belongs to: ``warm-<i>`` (its warm executor's) is ``supernode-<i>``."""
        return log.stem.replace("warm-", "supernode-", 1)

    def _poll(self) -> None:
        now = time.monotonic()
        for log in self.logs:
            try:
                with log.open("rb") as handle:
                    handle.seek(self._offsets[log.stem])
                    chunk = handle.read()
            except FileNotFoundError:
                continue
            text = chunk.decode(errors="replace")
            complete = text.rfind("\n") + 1  # a partial last line waits for the next poll
            self._offsets[log.stem] += len(text[:complete].encode())
            for match in EVENTS.finditer(text[:complete]):
                kind = match.group(1) or "Start"
                self.events[self.node(log)].append((now, kind, match.group(2) or ""))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def __enter__(self) -> LogClock:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()

    def phases(self, skip_first: int) -> dict[str, float]:
        """Median ``idle``, ``launch`` and ``run`` seconds over the nodes' message rounds after
        the first ``skip_first`` of each node (the first includes the nodes' start)."""
        idle, launch, run = [], [], []
        order = {"Receiving": 0, "Start": 1, "Sending": 2}  # two logs seen in one poll
        for events in self.events.values():
            events = sorted(events, key=lambda event: (event[0], order[event[1]]))
            last_sent = received = started = None
            count = 0
            for stamp, kind, _ in events:
                if kind == "Receiving":
                    count += 1
                    received = stamp
                    if last_sent is not None and count > skip_first:
                        idle.append(stamp - last_sent)
                elif kind == "Start" and received is not None:
                    started = stamp
                    if count > skip_first:
                        launch.append(stamp - received)
                elif kind == "Sending":
                    if started is not None and count > skip_first:
                        run.append(stamp - started)
                    last_sent, started = stamp, None
        middle = lambda values: statistics.median(values) if values else float("nan")  # noqa: E731
        return {"idle": middle(idle), "launch": middle(launch), "run": middle(run)}


def _case(
    example,
    args,
    case: tuple,
    fast: bool,
    root: Path,
    run: int,
    clientapp: str,
    pull_wait: float | None,
):
    from securefed.flower.loopback import FAST_TASK_POLL, LoopbackFederation
    from securefed.recsys.fedmf_flower import PRELOAD, write_fedmf_app

    label, transport, merge, ahead, server = case
    # its own directory per run: a repeated case must not find the last one's result.json
    name = f"{run}-{label.replace(' ', '-').replace('+', 'and')}{'-fast' if fast else ''}"
    name += f"-{clientapp}-{'flower' if pull_wait is None else pull_wait}"
    out = root / name / "out"
    app = example.FedMFApp(
        seed=args.seed,
        rounds=args.deploy_rounds,
        transport=transport,
        secagg_merge=merge,
        secagg_advertise_ahead=ahead,
        secagg_server=server,
        min_nodes=args.deploy_nodes,
        output_dir=str(out),
        timeout=300.0,
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    floors = {"secagg-server": server} if server != "malicious" else {}
    federation = LoopbackFederation(
        root / name / "federation",
        args.deploy_nodes,
        node_config=dict.fromkeys(range(args.deploy_nodes), floors),
        env=FAST_TASK_POLL if fast else None,
        warm_clientapp=PRELOAD if clientapp == "warm" else None,
        supernode_pull_wait=pull_wait,
    )
    with federation:
        # a warm executor's ClientApps log to warm-<i>.log: node i's events too
        nodes = [log for log in federation.logs if log.stem.startswith(("supernode", "warm"))]
        with LogClock(nodes) as clock:
            federation.submit(write_fedmf_app(root / name / "app", app.run_config()))
            federation.wait_for(out / "result.json", timeout=args.deploy_timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads((out / "result.json").read_text())
    seconds = [r["seconds"] for r in result["rounds"]]
    kinds = [k for k in result["message_seconds"] if k != "evaluate"]
    rounds = len(kinds) - int(ahead)  # after the first round AdvertiseKeys rides on Unmasking
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    phases = clock.phases(skip_first=len(kinds))  # every node's first training round
    row = {
        "case": label,
        "transport": transport,
        "merge_share_mask": merge,
        "advertise_ahead": ahead,
        "secagg_server": server,
        "clientapp": CLIENTAPPS[clientapp],
        "flower_poll": "SuperExec 0.05 s" if fast else "defaults",
        "node_pull_wait": pull_wait_label(pull_wait),
        "nodes": args.deploy_nodes,
        "rounds": app.rounds,
        "message_rounds": rounds,
        "round_s": steady,
        "per_message_round_s": steady / rounds,
        "first_round_s": seconds[0],
        "node_idle_s": phases["idle"],
        "node_launch_s": phases["launch"],
        "node_run_s": phases["run"],
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "wall_s": time.perf_counter() - start,
        "round_seconds": seconds,
        "message_seconds": result["message_seconds"],
        "loadavg": os.getloadavg(),
        "V": np.load(out / "server.npz")["V"],
    }
    brief = {k: v for k, v in row.items() if k not in ("V", "message_seconds", "round_seconds")}
    print(brief, flush=True)
    return row


def deployment_rows(example, args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Every case under both poll settings; the rows and the notes (ratios)."""
    from securefed.flower.loopback import missing_commands

    missing = missing_commands()
    if missing:
        return [], [f"deployment part not run: {missing} not installed"]
    rows = []
    names = args.deploy_polls.split(",")
    if not names or set(names) - {"defaults", "fast"}:
        raise ValueError(f"--deploy-polls takes defaults and/or fast, got {args.deploy_polls!r}")
    polls = [poll == "fast" for poll in names]
    clientapps = args.deploy_clientapp.split(",")
    if not clientapps or set(clientapps) - set(CLIENTAPPS):
        raise ValueError(f"--deploy-clientapp takes {sorted(CLIENTAPPS)}, got {clientapps!r}")
    keys = list(CASE_KEYS) if args.deploy_cases == "all" else args.deploy_cases.split(",")
    if set(keys) - set(CASE_KEYS) or keys[0] != "plaintext" or len(keys) < 2:
        raise ValueError(
            f"--deploy-cases: plaintext first, then some of {list(CASE_KEYS)[1:]}, got "
            f"{args.deploy_cases!r}"
        )
    cases = [CASE_KEYS[key] for key in keys]
    waits = parse_pull_waits(args.deploy_pull_waits)
    modes = [(clientapp, wait) for clientapp in clientapps for wait in waits]
    repeat = (cases[0],) if args.deploy_repeat_plaintext else ()
    with tempfile.TemporaryDirectory(prefix="securefed-deploy-") as tmp:
        for fast in polls:
            # old beside new: each case under every ClientApp mode and pull wait before the
            # next case
            for k, case in enumerate((*cases, *repeat)):
                for clientapp, wait in modes:
                    row = _case(example, args, case, fast, Path(tmp), len(rows), clientapp, wait)
                    if k == len(cases):
                        row["case"] = "plaintext (again)"
                    rows.append(row)
    notes = []
    for fast, (clientapp, wait) in [(f, m) for f in polls for m in modes]:
        group = [
            r
            for r in rows
            if (r["flower_poll"] != "defaults") == fast
            and r["clientapp"] == CLIENTAPPS[clientapp]
            and r["node_pull_wait"] == pull_wait_label(wait)
        ]
        plain = group[0]
        # the separate rounds the merged ones must equal (when that case ran)
        separate = next((r for r in group if r["case"] == "secagg"), None)
        plains = [r for r in group if r["transport"] == "plaintext"]
        plain_round = statistics.mean(r["round_s"] for r in plains)
        plain_cpu = statistics.mean(r["cpu_s"] for r in plains)
        parts = []
        for row in group:
            row["ratio_to_plaintext"] = row["round_s"] / plain_round
            row["cpu_ratio"] = row["cpu_s"] / plain_cpu
            if row["transport"] == "secagg":
                same = ""
                if separate is not None:
                    diff = float(np.abs(row["V"] - separate["V"]).max())
                    row["max_abs_V_diff_to_separate"] = diff
                    same = f", V within {diff:.0e} of the separate rounds' model"
                parts.append(
                    f"{row['case']} {row['ratio_to_plaintext']:.2f}x ({row['message_rounds']} "
                    f"message rounds{same})"
                )
        notes.append(
            f"{plain['flower_poll']}, {plain['clientapp']}, SuperNode pull wait "
            f"{plain['node_pull_wait']}: against plaintext (round {plain_round:.2f} s): "
            + "; ".join(parts)
            + "."
        )
    stock = {
        (r["case"], r["flower_poll"], r["clientapp"]): r["V"]
        for r in rows
        if r["node_pull_wait"] == pull_wait_label(None)
    }
    launched = [r for r in rows if r["node_pull_wait"] != pull_wait_label(None)]
    diffs = []
    for row in launched:  # the same seed: the launcher must not change the model
        reference = stock.get((row["case"], row["flower_poll"], row["clientapp"]))
        if reference is not None:
            row["max_abs_V_diff_to_stock_supernode"] = float(np.abs(row["V"] - reference).max())
            diffs.append(row["max_abs_V_diff_to_stock_supernode"])
    if diffs:
        notes.append(
            f"SuperNode launcher against the stock flower-supernode, the same case: max abs V "
            f"difference {max(diffs):.0e} over {len(diffs)} cases."
        )
    for row in rows:
        del row["V"]
    return rows, notes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deploy-polls",
        default="defaults,fast",
        help="Flower poll settings of the deployment part: defaults, fast (SuperExec 0.05 s)",
    )
    parser.add_argument(
        "--deploy-clientapp",
        default="subprocess",
        help="ClientApp modes of the deployment part, comma-separated: subprocess (Flower's "
        "SuperExec, a flwr-clientapp process per message), warm (--isolation process with "
        "securefed.flower.warm); both run each case one after the other",
    )
    parser.add_argument(
        "--deploy-pull-waits",
        default=f"{PULL_WAIT_FLOWER},0.1",
        help="SuperNode waits after an empty pull, comma-separated: flower (the stock "
        "flower-supernode, Flower's fixed 3 s) and/or seconds (securefed.flower.supernode_launch); "
        "each case runs under every one, one after the other",
    )
    parser.add_argument(
        "--deploy-cases",
        default="all",
        help="cases of the deployment part: all, or some of plaintext,secagg,merged,ahead,hbc "
        "(plaintext first, secagg second)",
    )
    parser.add_argument(
        "--deploy-repeat-plaintext",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the plaintext case again last (the ratios divide by the mean of both)",
    )
    parser.add_argument(
        "--deploy-nodes", type=int, default=2, help="SuperNode processes of the deployment part"
    )
    parser.add_argument(
        "--deploy-rounds", type=int, default=3, help="training rounds per deployment case"
    )
    parser.add_argument(
        "--deploy-timeout",
        type=float,
        default=1200.0,
        help="seconds one deployment case may take before it fails",
    )
