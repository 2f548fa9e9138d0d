"""Where a deployment message round goes, with the SuperNode's pull wait cut (issue 33).

Runs the FedMF example app on a :class:`~securefed.flower.loopback.LoopbackFederation` (two
SuperNodes, warm ClientApps, the SuperExec / warm executor task poll at 0.05 s) once per case
and stamps the lines its SuperNodes and warm executors log as they appear (every 0.05 s):
``Receiving`` (a message pulled), ``Received successfully`` (its objects pulled), the forked
ClientApp's start, ``Sending`` (its reply in the SuperNode's state), ``Sent successfully`` (the
reply's objects pushed). Per message round after each node's first training round, medians:

* per node: ``pull`` (Receiving -> Received: the message's objects pulled and confirmed, while
  the child may already run), ``launch`` (Receiving -> the child's start: the executor's task
  poll and the fork), ``child`` (start -> Sending: Flower's ``run_clientapp``
  pulling the message, Context and FAB over the Runtime API, the handler, its push back, and the
  SuperNode's 0.5 s wait for the reply, ``start_client_internal.py`` l.470), ``push``
  (Sending -> Sent);
* per message round: ``stagger`` (the last node's Sent minus the first's: the server waits for
  both) and ``turnaround`` (the last Sent to the first next Receiving: the server's 0.05 s pull
  poll, its work between message rounds, its push, the node's pull wait).

Usage (from the repository root)::

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python \\
        benchmarks/results/flower_cost/warm/pull_wait/timeline.py \\
        --out benchmarks/results/flower_cost/warm/pull_wait
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

EVENTS = re.compile(
    r"(Receiving): (\S+) message|(Received) successfully|(Start) `flwr-clientapp` process"
    r"|(Sending): (\S+) message|(Sent) successfully"
)
CASES = {  # name: transport, merge, ahead, server
    "plaintext": ("plaintext", False, False, "malicious"),
    "ahead": ("secagg", True, True, "malicious"),
    "hbc": ("secagg", True, True, "honest_but_curious"),
}


class Stamper:
    """Stamps matching log lines as they appear (a thread reading the files)."""

    def __init__(self, logs: dict[str, list[Path]], interval: float = 0.05) -> None:
        self.logs, self.interval = logs, interval
        self.by_log: dict[Path, list[tuple[float, str, str]]] = {
            log: [] for paths in logs.values() for log in paths
        }
        self._offsets = {log: 0 for paths in logs.values() for log in paths}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self) -> None:
        now = time.monotonic()
        for paths in self.logs.values():
            for log in paths:
                try:
                    with log.open("rb") as handle:
                        handle.seek(self._offsets[log])
                        chunk = handle.read()
                except FileNotFoundError:
                    continue
                text = chunk.decode(errors="replace")
                complete = text.rfind("\n") + 1
                self._offsets[log] += len(text[:complete].encode())
                for match in EVENTS.finditer(text[:complete]):
                    kind = next(g for g in match.groups() if g and g[0].isupper())
                    self.by_log[log].append((now, kind, match.group(2) or match.group(6) or ""))

    @property
    def events(self) -> dict[str, list[tuple[float, str, str]]]:
        """Node -> its logs' events, log after log (see :func:`message_rounds`)."""
        return {
            node: [event for log in paths for event in self.by_log[log]]
            for node, paths in self.logs.items()
        }

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def __enter__(self) -> Stamper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()


ORDER = ("Receiving", "Received", "Start", "Sending", "Sent")


def message_rounds(events: list[tuple[float, str, str]]) -> list[dict[str, float]]:
    """A node's message rounds: the stamp of each event.

    ``events`` holds the SuperNode log's events in file order followed by the executor log's
    (``Start``, in its order): the SuperNode's lines open and close the rounds; each child's
    start goes to the first round not yet given one whose ``Receiving`` came by then (Flower
    creates the task before it pulls the message's objects, so the child may start before
    ``Received``). The evaluation message is left out.
    """
    rounds: list[dict[str, float]] = []
    evaluate: list[bool] = []
    for stamp, kind, message_type in events:
        if kind == "Start":
            continue
        if kind == "Receiving":
            rounds.append({})
            evaluate.append(message_type == "evaluate")
        if rounds and kind not in rounds[-1]:
            rounds[-1][kind] = stamp
    starts = [stamp for stamp, kind, _ in events if kind == "Start"]
    for stamp in starts:
        for r in rounds:
            if "Start" not in r and r["Receiving"] <= stamp:
                r["Start"] = stamp
                break
    # the held-out evaluation after the last round is no training message round
    return [r for r, e in zip(rounds, evaluate, strict=True) if len(r) == len(ORDER) and not e]


def phases(events: dict[str, list], skip: int) -> dict[str, float]:
    """Median phase seconds over the message rounds after each node's first ``skip``."""
    per_node = {node: message_rounds(e)[skip:] for node, e in events.items()}
    spans = {"pull": [], "launch": [], "child": [], "push": []}
    pairs = {
        "pull": ("Receiving", "Received"),
        "launch": ("Receiving", "Start"),
        "child": ("Start", "Sending"),
        "push": ("Sending", "Sent"),
    }
    for rounds in per_node.values():
        for r in rounds:
            for name, (a, b) in pairs.items():
                spans[name].append(r[b] - r[a])
    stagger, turnaround, whole = [], [], []
    nodes = list(per_node.values())
    count = min(len(r) for r in nodes)
    for k in range(count):
        sent = [r[k]["Sent"] for r in nodes]
        stagger.append(max(sent) - min(sent))
        whole.append(max(sent) - min(r[k]["Receiving"] for r in nodes))
        if k + 1 < count:
            turnaround.append(min(r[k + 1]["Receiving"] for r in nodes) - max(sent))
    out = {name: statistics.median(v) for name, v in spans.items() if v}
    out["stagger"] = statistics.median(stagger) if stagger else float("nan")
    out["turnaround"] = statistics.median(turnaround) if turnaround else float("nan")
    out["first_received_to_last_sent"] = statistics.median(whole) if whole else float("nan")
    out["message_rounds_seen"] = count
    return out


def run_case(root: Path, name: str, pull_wait: float | None, rounds: int) -> dict:
    from securefed.flower.loopback import FAST_TASK_POLL, LoopbackFederation
    from securefed.recsys.fedmf_flower import APP_DIR, PRELOAD, write_fedmf_app

    sys.path.insert(0, str(APP_DIR))
    from securefed_fedmf_app import app as example

    transport, merge, ahead, server = CASES[name]
    tag = f"{name}-{'flower' if pull_wait is None else pull_wait}"
    out = root / tag / "out"
    app = example.FedMFApp(
        seed=0,
        rounds=rounds,
        transport=transport,
        secagg_merge=merge,
        secagg_advertise_ahead=ahead,
        secagg_server=server,
        min_nodes=2,
        output_dir=str(out),
        timeout=300.0,
    )
    floors = {"secagg-server": server} if server != "malicious" else {}
    federation = LoopbackFederation(
        root / tag / "federation",
        2,
        node_config=dict.fromkeys(range(2), floors),
        env=FAST_TASK_POLL,
        warm_clientapp=PRELOAD,
        supernode_pull_wait=pull_wait,
    )
    load_before = os.getloadavg()
    with federation:
        logs = {
            f"node-{i}": [
                federation.workdir / f"supernode-{i}.log",
                federation.workdir / f"warm-{i}.log",
            ]
            for i in range(2)
        }
        with Stamper(logs) as stamper:
            federation.submit(write_fedmf_app(root / tag / "app", app.run_config()))
            federation.wait_for(out / "result.json", timeout=1200)
    result = json.loads((out / "result.json").read_text())
    kinds = [k for k in result["message_seconds"] if k != "evaluate"]
    seconds = [r["seconds"] for r in result["rounds"]]
    row = {
        "case": name,
        "node_pull_wait": "Flower 3 s" if pull_wait is None else f"launcher {pull_wait:g} s",
        "message_rounds": len(kinds) - int(ahead),
        "round_s": statistics.median(seconds[1:]),
        "round_seconds": seconds,
        "message_seconds": result["message_seconds"],
        "phases": phases(stamper.events, skip=len(kinds)),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    from securefed.records import dumps_record

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default="plaintext:0.1,ahead:0.1,hbc:0.1,plaintext:flower")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="securefed-timeline-") as tmp:
        for spec in args.cases.split(","):
            name, wait = spec.split(":")
            rows.append(
                run_case(Path(tmp), name, None if wait == "flower" else float(wait), args.rounds)
            )
    record = {
        "command": " ".join(sys.argv),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "rows": rows,
    }
    path = Path(args.out) / "timeline.json"
    path.write_text(dumps_record(record, indent=2))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
