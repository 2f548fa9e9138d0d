"""``securefed bench flower --parts deployment-apps``: FedHPD and FedSlate on real processes.

A SuperLink and SuperNodes as processes on 127.0.0.1
(:class:`~securefed.flower.loopback.LoopbackFederation`, the SuperExec's task poll at 0.05 s:
:data:`~securefed.flower.loopback.FAST_TASK_POLL`), each app submitted with ``flwr run``, seeded
(``--seed``), against the same run in one process:

* **FedHPD** (``rl/flower_app``): 3 CartPole agents of two architectures on
  ``--deploy-nodes`` SuperNodes, ``--deploy-app-rounds`` training rounds with ``d = 2`` (one
  loop over two parts of a 40-state ``S_p`` per event: two transport rounds per event);
  plaintext (first and again last: the load drifts), malicious-server secure aggregation (five
  message rounds a transport round) and the same with ``secagg-merge`` and
  ``secagg-advertise-ahead`` (three after the first); against ``ReferenceRun`` with the
  same transport in one process (max parameter difference; round time ratio);
* **FedSlate** (``rl/flower_fedslate_app``): the user simulator and two platforms on three
  SuperNodes, 2 members, ``--deploy-app-episodes`` episodes of ``--deploy-app-steps`` rounds;
  ``plaintext`` and ``dp`` seeded, against ``run_fedslate`` (the rewards, the server network
  the ServerApp wrote, both local networks: max difference); and secure mode (``seed = -1``)
  with the relay identities provisioned (``provision_relay_identities``) and passed to each
  SuperNode through ``--node-config``: nothing to compare (its own entropy on every process),
  its cost against the seeded plaintext run.

Per case: seconds per training round (FedHPD: median of the rounds after the first; FedSlate:
the episodes' wall seconds over the rounds), per message round, the ratio to the same app's
plaintext run on real processes (the mean of its two runs for FedHPD) and to the in-process run,
the federation's CPU seconds (its reaped processes: ``RUSAGE_CHILDREN``), the message bytes
down / up (the server's count of array payloads).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

COLUMNS = [
    "app",
    "case",
    "nodes",
    "rounds",
    "message_rounds",
    "round_s",
    "per_message_round_s",
    "x_plaintext_real",
    "in_process_round_s",
    "x_in_process",
    "max_abs_diff_to_in_process",
    "cpu_s",
    "MB_down",
    "MB_up",
]
SUBMIT_TIMEOUT = 600.0
"""Seconds ``flwr run`` may take to start a run (it builds the FAB; slow on a loaded machine)."""
FEDHPD_CASES = (  # label, transport, secagg-merge, secagg-advertise-ahead
    ("plaintext", "plaintext", False, False),
    ("secagg", "secagg", False, False),
    ("secagg merged + ahead", "secagg", True, True),
    ("plaintext (again)", "plaintext", False, False),
)
FEDSLATE_CASES = (  # label, fusion, secure mode
    ("plaintext", "plaintext", False),
    ("dp", "dp", False),
    ("plaintext, secure mode", "plaintext", True),
    ("ckks, packed", "ckks", False),  # one server width: the packed circuit
    ("ckks+dp, packed", "ckks+dp", False),
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wait(federation, path: Path, args: argparse.Namespace, run_id: str) -> None:
    """Wait for the ServerApp's result; if it does not come, the error carries the ServerApp's
    log (``flwr log``), which is also kept beside the federation's logs."""
    import subprocess

    from securefed.flower.loopback import CONNECTION, _executable

    try:
        federation.wait_for(path, timeout=args.deploy_timeout)
    except (TimeoutError, RuntimeError) as error:
        done = subprocess.run(
            [_executable("flwr"), "log", run_id, CONNECTION, "--show"],
            capture_output=True,
            text=True,
            env=federation.env,
            cwd=federation.workdir,
            timeout=120,
            check=False,
        )
        log = done.stdout + done.stderr
        (federation.workdir / "serverapp.log").write_text(log)
        raise RuntimeError(f"{error}; the ServerApp's log ends: {log[-2000:]}") from error


def _federation(root: Path, nodes: int, node_config=None):
    from securefed.flower.loopback import FAST_TASK_POLL, LoopbackFederation

    env = FAST_TASK_POLL | {"OMP_NUM_THREADS": "1"}  # torch on one thread, as in one process
    return LoopbackFederation(root, nodes, node_config=node_config, env=env)


# ----------------------------------------------------------------------------- FedHPD
def fedhpd_run_config(args: argparse.Namespace, **overrides) -> dict[str, object]:
    """FedHPD's app config: agents 0, 2, 5 of CartPole (two architectures), ``d = 2``, one loop
    over two parts of a 40-state ``S_p``, the bench's seed and rounds."""
    import tomllib

    from securefed.rl.flower_fedhpd import APP_DIR

    text = (APP_DIR / "pyproject.toml").read_text()
    values = dict(tomllib.loads(text)["tool"]["flwr"]["app"]["config"])
    values |= {
        "agents": "0,2,5", "d": 2, "rounds": args.deploy_app_rounds, "public-size": 40,
        "part-size": 25, "distill-loops": 1, "virtual-rounds": 8, "seed": args.seed,
        "min-nodes": args.deploy_nodes, "timeout": 600.0,
    }  # fmt: skip
    return values | overrides


def _fedhpd_reference(app):
    """``ReferenceRun`` of the app's run in one process (torch on 1 thread, as on the nodes)."""
    import torch

    from securefed.rl.fast import make_public_states
    from securefed.rl.fedhpd import ReferenceRun, RunSpec
    from securefed.transport.secagg import SecAggTransport

    config = app.run.config
    transport = None if app.secagg is None else SecAggTransport(app.secagg)
    spec = RunSpec(config, app.run.seed, transport, public_states=make_public_states(config))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return ReferenceRun(spec).run()
    finally:
        torch.set_num_threads(threads)


def _fedhpd_case(args: argparse.Namespace, root: Path, k: int) -> dict:
    """Case ``k`` of :data:`FEDHPD_CASES`: its app, config and output folder."""
    from securefed.rl.flower_fedhpd import FedHPDApp

    label, transport, merge, ahead = FEDHPD_CASES[k]
    name = f"fedhpd-{k}"
    out = root / name / "out"
    values = fedhpd_run_config(
        args,
        transport=transport,
        **{"secagg-merge": merge, "secagg-advertise-ahead": ahead, "output-dir": str(out)},
    )
    return {
        "app": "FedHPD", "label": label, "transport": transport, "merge": merge, "ahead": ahead,
        "root": root / name, "out": out, "values": values,
        "parsed": FedHPDApp.from_run_config(values), "nodes": args.deploy_nodes,
    }  # fmt: skip


def _run_fedhpd(args: argparse.Namespace, case: dict) -> dict:
    """The case's federation: submitted, waited for; its wall and (when alone) CPU seconds."""
    from securefed.rl.flower_fedhpd import write_fedhpd_app

    root, out = case["root"], case["out"]
    cpu, start = _children_cpu(), time.perf_counter()
    with _federation(root / "federation", case["nodes"]) as federation:
        app = write_fedhpd_app(root / "app", case["values"])
        _wait(federation, out / "result.json", args, federation.submit(app, SUBMIT_TIMEOUT))
        federation.wait_for(out / f"node-{case['nodes'] - 1}.npz", timeout=120)
    return {"wall_s": time.perf_counter() - start, "cpu_s": _children_cpu() - cpu}


def _fedhpd_row(case: dict, reference, measured: dict) -> dict:
    out, app = case["out"], case["parsed"]
    result = json.loads((out / "result.json").read_text())
    params = {}
    for path in sorted(out.glob("node-*.npz")):
        with np.load(path) as saved:
            params |= {a: saved[f"param{a}"] for a in saved["agents"].tolist()}
    seconds = [r["seconds"] for r in result["rounds"]]
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    counts = {m: n for m, n in result["message_rounds"].items() if m != "evaluate"}
    local_round = reference.seconds / len(seconds)
    return {
        "app": "FedHPD",
        "case": case["label"],
        "transport": case["transport"],
        "merge_share_mask": case["merge"],
        "advertise_ahead": case["ahead"],
        "nodes": case["nodes"],
        "agents": app.run.config.n_agents,
        "rounds": len(seconds),
        "message_rounds": sum(counts.values()) / len(seconds),
        "message_round_counts": result["message_rounds"],
        "round_s": steady,
        "per_message_round_s": sum(seconds) / sum(counts.values()),
        "first_round_s": seconds[0],
        "in_process_round_s": local_round,
        "x_in_process": steady / local_round,
        "same_returns": bool(
            np.array_equal(_returns(out, app.run.config.n_agents), reference.returns)
        ),
        "max_abs_diff_to_in_process": float(
            max(np.abs(params[a] - reference.params[a]).max() for a in params)
        ),
        "MB_down": result["message_bytes"]["down"] / 2**20,
        "MB_up": result["message_bytes"]["up"] / 2**20,
        "round_seconds": seconds,
    } | measured


def _returns(out: Path, n_agents: int) -> np.ndarray:
    from securefed.rl.flower_fedhpd import node_results

    nodes = len(list(out.glob("node-*.npz")))
    returns, _ = node_results(out, nodes, n_agents)
    return returns


# ----------------------------------------------------------------------------- FedSlate
def fedslate_run_config(args: argparse.Namespace, **overrides) -> dict[str, object]:
    """FedSlate's app config: two platforms (A with rewards), (6, 2), 2 members, small networks,
    learning from the second round on, the bench's episodes, rounds and seed."""
    import tomllib

    from securefed.rl.flower_fedslate import APP_DIR

    text = (APP_DIR / "pyproject.toml").read_text()
    values = dict(tomllib.loads(text)["tool"]["flwr"]["app"]["config"])
    steps = args.deploy_app_steps
    values |= {
        "candidates": 6, "slate-size": 2, "members": 2, "episodes": args.deploy_app_episodes,
        "steps": steps, "burn-in": 1, "learn-every": 2, "target-sync": 7, "buffer-size": 16,
        "batch-size": 4, "local-hidden": "8", "server-hidden": "4", "seed": args.seed,
        "timeout": 600.0,
    }  # fmt: skip
    return values | overrides


def _fedslate_case(args: argparse.Namespace, root: Path, k: int) -> dict:
    """Case ``k`` of :data:`FEDSLATE_CASES`: its run config, the run, and in secure mode the
    enrolment authority's files, each node's passed to it by ``--node-config``."""
    from securefed.rl import flower_fedslate as ffs

    label, fusion, secure = FEDSLATE_CASES[k]
    name = f"fedslate-{k}"
    out = root / name / "out"
    dp = {"dp-epsilon": 8.0} if fusion in ("dp", "ckks+dp") else {}
    if fusion.startswith("ckks"):
        dp["activation"] = "polynomial"  # CKKS evaluates the server network's polynomial
    seed = {"seed": -1} if secure else {}
    values = fedslate_run_config(args, fusion=fusion, **dp, **seed, **{"output-dir": str(out)})
    run = ffs.run_from_config(values)
    node_config = None
    if secure:
        enrol = root / name / "enrol"
        digest = ffs.provision_relay_identities(enrol, run.config.num_platforms)
        node_config = {
            role: {
                ffs.IDENTITY_PATH: str(enrol / f"identity-{role}.bin"),
                ffs.REGISTRY_PATH: str(enrol / "registry.bin"),
                ffs.REGISTRY_DIGEST: digest,
            }
            for role in range(run.nodes)
        }
    seeded = ffs.run_from_config(values | {"seed": args.seed}).config  # in process: its twin
    return {
        "app": "FedSlate", "label": label, "fusion": fusion, "secure": secure,
        "root": root / name, "out": out, "values": values, "run": run, "seeded": seeded,
        "node_config": node_config,
    }  # fmt: skip


def _run_fedslate(args: argparse.Namespace, case: dict) -> dict:
    from securefed.rl import flower_fedslate as ffs

    root, out, run = case["root"], case["out"], case["run"]
    cpu, start = _children_cpu(), time.perf_counter()
    with _federation(root / "federation", run.nodes, case["node_config"]) as federation:
        app = ffs.write_fedslate_app(root / "app", case["values"])
        _wait(federation, out / "result.json", args, federation.submit(app, SUBMIT_TIMEOUT))
    return {"wall_s": time.perf_counter() - start, "cpu_s": _children_cpu() - cpu}


def _fedslate_row(case: dict, reference, measured: dict) -> dict:
    from securefed.rl import flower_fedslate as ffs

    out, run, secure = case["out"], case["run"], case["secure"]
    summary, server = ffs.server_results(out)
    nodes = ffs.node_results(out, run.config)
    diffs = None
    if not secure:  # secure mode: each process's own entropy, nothing to compare
        diffs = [float(np.abs(nodes["simulator"]["rewards"] - reference.episode_rewards).max())]
        diffs += [
            float(np.abs(server[n] - p.numpy()).max())
            for n, p in reference.networks["server"].state_dict().items()
        ]
        for platform in ("A", "B"):
            diffs += [
                float(np.abs(nodes[platform][f"local.{n}"] - p.numpy()).max())
                for n, p in reference.networks[f"local_{platform}"].state_dict().items()
            ]
    round_s = float(sum(summary["episode_seconds"])) / summary["rounds"]
    local_round = reference.seconds / summary["rounds"]
    return {
        "app": "FedSlate",
        "case": case["label"],
        "fusion": case["fusion"],
        "secure_mode": summary["secure_mode"],
        "nodes": run.nodes,
        "episodes": run.config.episodes,
        "rounds": summary["rounds"],
        "learn_steps": summary["learn_steps"],
        "message_rounds": summary["message_rounds"],
        "messages": summary["messages"],
        "round_s": round_s,
        "per_message_round_s": summary["seconds"] / summary["message_rounds"],
        "server_loop_s": summary["seconds"],
        "server_cpu_s": summary["cpu_seconds"],
        "in_process_round_s": local_round,
        "x_in_process": round_s / local_round,
        "max_abs_diff_to_in_process": None if diffs is None else max(diffs),
        "same_rewards": None
        if secure
        else bool(np.array_equal(nodes["simulator"]["rewards"], reference.episode_rewards)),
        "epsilon_A": float(nodes["A"]["epsilon"]) if "epsilon" in nodes["A"] else None,
        "MB_down": summary["message_bytes"]["down"] / 2**20,
        "MB_up": summary["message_bytes"]["up"] / 2**20,
    } | measured


def _fedslate_reference(config):
    import torch

    from securefed.rl.fedslate import run_fedslate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_fedslate(config)
    finally:
        torch.set_num_threads(threads)


def deployment_app_rows(args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Every FedHPD and FedSlate case on real processes; the rows and the notes.

    The in-process runs go first, one at a time; then the federations, ``--deploy-app-parallel``
    at a time (1: one after the other, each with its federation's CPU seconds; more: at the same
    time, started ``--deploy-app-stagger`` seconds apart, so that the cases see the same load,
    and CPU seconds only for the whole part)."""
    from concurrent.futures import ThreadPoolExecutor

    from securefed.flower.loopback import missing_commands

    if missing := missing_commands():
        return [], [f"deployment-apps part not run: {missing} not installed"]
    apps = set(args.deploy_apps.split(","))
    if not apps or apps - {"fedhpd", "fedslate"}:
        raise ValueError(f"--deploy-apps takes fedhpd and/or fedslate, got {args.deploy_apps!r}")
    parallel = args.deploy_app_parallel
    if parallel < 1:
        raise ValueError(f"--deploy-app-parallel must be >= 1, got {parallel}")
    with tempfile.TemporaryDirectory(prefix="securefed-deploy-apps-") as tmp:
        root = Path(args.deploy_app_workdir or tmp)  # a folder given: its logs are kept
        cases = []
        if "fedhpd" in apps:
            chosen = args.deploy_app_fedhpd.split(",")
            labels = {"plaintext": 0, "secagg": 1, "merged": 2, "plaintext-again": 3}
            if not chosen or set(chosen) - set(labels):
                raise ValueError(f"--deploy-app-fedhpd takes {', '.join(labels)}; got {chosen}")
            cases += [_fedhpd_case(args, root, labels[c]) for c in chosen]
        if "fedslate" in apps:
            chosen = args.deploy_app_fedslate.split(",")
            labels = {"plaintext": 0, "dp": 1, "secure": 2, "ckks": 3, "ckks+dp": 4}
            if not chosen or set(chosen) - set(labels):
                raise ValueError(f"--deploy-app-fedslate takes {', '.join(labels)}; got {chosen}")
            cases += [_fedslate_case(args, root, labels[c]) for c in chosen]
        references = {}
        for case in cases:  # in process first, alone
            if case["app"] == "FedHPD" and case["transport"] not in references:
                references[case["transport"]] = _fedhpd_reference(case["parsed"])
            elif case["app"] == "FedSlate" and case["fusion"] not in references:
                references[case["fusion"]] = _fedslate_reference(case["seeded"])
        cpu, start, load = _children_cpu(), time.perf_counter(), os.getloadavg()

        def federation(k: int) -> dict:
            case = cases[k]
            time.sleep(k * args.deploy_app_stagger if parallel > 1 else 0.0)
            run = _run_fedhpd if case["app"] == "FedHPD" else _run_fedslate
            measured = run(args, case)
            if parallel > 1:
                measured["cpu_s"] = None  # the reaped processes of every case together
            print(f"{case['app']} {case['label']}: {measured}", flush=True)
            return measured | {"loadavg": os.getloadavg()}

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            measured = list(pool.map(federation, range(len(cases))))
        total = {"cpu_s": _children_cpu() - cpu, "wall_s": time.perf_counter() - start}
        rows = []
        for case, values in zip(cases, measured, strict=True):
            if case["app"] == "FedHPD":
                rows.append(_fedhpd_row(case, references[case["transport"]], values))
            else:
                rows.append(_fedslate_row(case, references[case["fusion"]], values))
    for app in ("FedHPD", "FedSlate"):
        group = [r for r in rows if r["app"] == app]
        plain = [r for r in group if r["case"].startswith("plaintext") and not r.get("secure_mode")]
        if not plain:
            continue
        plain_round = statistics.mean(r["round_s"] for r in plain)
        plain_message = statistics.mean(r["per_message_round_s"] for r in plain)
        for row in group:
            row["x_plaintext_real"] = row["round_s"] / plain_round
            row["x_plaintext_real_per_message_round"] = row["per_message_round_s"] / plain_message
    notes = [
        "deployment-apps: a SuperLink and SuperNodes as processes on 127.0.0.1, the SuperExec's "
        f"task poll at 0.05 s, {parallel} federation(s) at a time (load {load[0]:.1f} at the "
        f"start of the federations, {os.getloadavg()[0]:.1f} at the end; every federation "
        f"together: {total['wall_s']:.0f} s wall, {total['cpu_s']:.0f} CPU s reaped); "
        "x_plaintext_real: against the same app's seeded plaintext run on real processes "
        "(FedHPD: the mean of its two); x_in_process: against the same run in one process "
        "(torch on 1 thread); max_abs_diff_to_in_process: the final model (FedHPD: every "
        "agent's parameters; FedSlate: the rewards, the server and both local networks; none "
        "in secure mode, which draws from each process's own entropy)."
    ]
    return rows, notes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deploy-apps", default="fedhpd,fedslate", help="apps of the deployment-apps part"
    )
    parser.add_argument(
        "--deploy-app-rounds",
        type=int,
        default=4,
        help="FedHPD training rounds (d = 2: one transport round per training round)",
    )
    parser.add_argument(
        "--deploy-app-episodes", type=int, default=1, help="FedSlate episodes (deployment-apps)"
    )
    parser.add_argument(
        "--deploy-app-steps", type=int, default=2, help="FedSlate rounds per episode"
    )
    parser.add_argument(
        "--deploy-app-parallel",
        type=int,
        default=1,
        help="deployment-apps federations at a time (more: the same load for every case)",
    )
    parser.add_argument(
        "--deploy-app-fedhpd",
        default="plaintext,secagg,merged,plaintext-again",
        help="FedHPD cases of deployment-apps: plaintext, secagg, merged (secagg-merge and "
        "secagg-advertise-ahead), plaintext-again",
    )
    parser.add_argument(
        "--deploy-app-fedslate",
        default="plaintext,dp,secure",
        help="FedSlate cases of deployment-apps: plaintext, dp, secure (secure mode, provisioned "
        "relay identities), ckks, ckks+dp (the packed circuit)",
    )
    parser.add_argument(
        "--deploy-app-workdir",
        default="",
        help="where the deployment-apps federations and their logs go (default: a temporary "
        "folder, removed)",
    )
    parser.add_argument(
        "--deploy-app-stagger",
        type=float,
        default=20.0,
        help="seconds between the starts of parallel federations (their start-up is the peak)",
    )
