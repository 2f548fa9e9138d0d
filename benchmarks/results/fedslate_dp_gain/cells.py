"""The runs of issue 34's "DP fusion that keeps the gain" record, and their table.

``python cells.py run NAME... [--seeds 0,1] [--jobs 2]`` runs (or reads from the cache under
``work/seed<S>/runs/``) the named cells at each seed; ``python cells.py table NAME...`` prints
A's mean, final (last 50 episodes) and the kept share of its gain over random (pooled over
the seeds' members; per member against its own seed's plaintext and random runs), with the
ledger's epsilon (``--plaintext CELL``: the share against that cell instead of plaintext);
``python cells.py partial NAME... --seeds S`` the same share over the episodes every named
run has done, unfinished runs read from their checkpoints. Every cell is the reduced schedule
of ``../fedslate_dp_joint``: 250 episodes, burn-in 2000, exploration x0.9997 per round,
(10, 3), 3 members per seed; ``--schedule paper`` (every command) takes the paper's instead
(:data:`PAPER_SCHEDULE`, the fields of ``../fedslate_5000_dp``'s runs: 5000 episodes, burn-in
5000, x0.99995, 3 members), cached under ``work/paper/seed<S>/``.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SCHEDULE = {
    "num_candidates": 10,
    "slate_size": 3,
    "episodes": 250,
    "members": 3,
    "burn_in": 2000,
    "eps_decay": 0.9997,
}
PAPER_SCHEDULE = SCHEDULE | {
    "episodes": 5000,
    "burn_in": 5000,
    "eps_decay": 0.99995,
    "shared_corpus": False,
}
"""The paper's schedule (``../fedslate_5000_dp/run_records``), 3 members per seed."""
SCHEDULES = {"reduced": SCHEDULE, "paper": PAPER_SCHEDULE}
JOINT = {"fusion": "dp", "dp_epsilon": 8.0, "dp_acting": "own", "dp_local_clip": 0.1}


def cells() -> dict[str, tuple[str, dict[str, object]]]:
    """``{name: (kind, FedSlateConfig fields beyond the schedule)}``."""
    out: dict[str, tuple[str, dict[str, object]]] = {
        "plaintext": ("fedslate", {}),
        "random": ("random", {}),
        # The previous record's best private row (joint acting, local clip 0.1): "both".
        "joint_clip0.1": ("fedslate", JOINT),
        # Diagnostics (not private): one mechanism's noise off.
        "diag_noiseless_rows": ("fedslate", JOINT | {"dp_diagnostic": "noiseless-rows"}),
        "diag_noiseless_local": ("fedslate", JOINT | {"dp_diagnostic": "noiseless-local"}),
    }
    for eps in (1.0, 4.0, 8.0, 16.0):
        out[f"sums_eps{eps:g}"] = ("fedslate", JOINT | {"dp_epsilon": eps, "dp_learning": "sums"})
    # Issue 34, the noiseless ceiling of sums (diagnostics, not private): the DP-SGD noise off
    # with the clip kept, and with the clip off too (a clip of 1e6 never binds).
    sums8 = JOINT | {"dp_learning": "sums"}
    out["diag_sums_noiseless"] = ("fedslate", sums8 | {"dp_diagnostic": "noiseless-local"})
    out["diag_sums_noiseless_noclip"] = (
        "fedslate",
        sums8 | {"dp_diagnostic": "noiseless-local", "dp_local_clip": 1e6},
    )
    # Issue 34, per-part clipping: the server part of a unit's gradient clipped to C_s, the
    # local part to sqrt(C^2 - C_s^2) (the whole within C: same release, same ledger).
    for server_clip in (0.05, 0.07):
        split = sums8 | {"dp_server_clip": server_clip}
        out[f"sums_eps8_split{server_clip:g}"] = ("fedslate", split)
    # Issue 34, levers on the DP-SGD's noise-to-signal ratio at per-part clip C_s 0.07
    # (README section 6; levers_sigma.py prints each one's sigma first): (a) with secret
    # Poisson sampling, (b) a smaller server network (fewer noised weights), (c) more rows per
    # learning step with the steps per unit scaled down (learn_every), and (b) with (c).
    split7 = sums8 | {"dp_server_clip": 0.07}
    poisson = {"dp_sampling": "poisson"}
    out["split0.07_q0.5"] = ("fedslate", split7 | poisson | {"dp_sample_rate": 0.5})
    for hidden in ((8,), (4,), (8, 8)):
        tag = "x".join(str(w) for w in hidden)
        out[f"split0.07_h{tag}"] = ("fedslate", split7 | {"server_hidden": hidden})
    for batch, every in ((64, 6), (128, 12)):
        larger = {"batch_size": batch, "learn_every": every}
        out[f"split0.07_b{batch}"] = ("fedslate", split7 | larger)
        out[f"split0.07_b{batch}_h8"] = ("fedslate", split7 | larger | {"server_hidden": (8,)})
    # Issue 34, the levers' own plaintext (no DP): what the architecture or schedule change
    # costs or gains without noise, beside the default plaintext the kept share is against.
    out["plaintext_h8"] = ("fedslate", {"server_hidden": (8,)})
    out["plaintext_b128_h8"] = (
        "fedslate",
        {"batch_size": 128, "learn_every": 12, "server_hidden": (8,)},
    )
    # Issue 34, secret sampling: each platform Poisson-samples its own units per step.
    for q in (0.1, 0.25, 0.5):
        sampled = {"dp_learning": "sums", "dp_sampling": "poisson", "dp_sample_rate": q}
        out[f"sums_eps8_q{q:g}"] = ("fedslate", JOINT | sampled)
    return out


def work_dir(seed: int, schedule: str = "reduced") -> Path:
    """The cache of ``seed``'s runs: ``work/seed<S>`` (reduced), ``work/paper/seed<S>``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
    return HERE / "work" / ("" if schedule == "reduced" else schedule) / f"seed{seed}"


def cell(name: str, seed: int, schedule: str = "reduced"):
    from securefed.bench.bench_fedslate import Cell
    from securefed.rl.fedslate import FedSlateConfig
    from securefed.rl.slateq import SlateQConfig

    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
    kind, fields = cells()[name]
    base = SCHEDULES[schedule] | {"seed": seed}
    config = SlateQConfig(**base) if kind == "random" else FedSlateConfig(**base, **fields)
    return Cell(f"N10_n3_{name}", kind, config)


def run(names: list[str], seeds: list[int], jobs: int, schedule: str = "reduced") -> None:
    from securefed.bench.bench_fedslate import run_missing

    for seed in seeds:
        out = work_dir(seed, schedule)
        started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        ran = run_missing([cell(n, seed, schedule) for n in names], out, jobs)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(
            f"seed {seed}: {ran} runs, {time.perf_counter() - started:.0f} s wall, children "
            f"{after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime:.0f} CPU s",
            flush=True,
        )


def platform_a(
    seed: int, name: str, schedule: str = "reduced"
) -> tuple[np.ndarray, dict[str, object]]:
    from securefed.bench.bench_fedslate import cached_record

    record = cached_record(cell(name, seed, schedule), work_dir(seed, schedule))
    if record is None:
        raise FileNotFoundError(f"{name} at seed {seed} has not run")
    return np.asarray(record["rewards"])[:, :, 0], record


def partial_a(seed: int, name: str, schedule: str = "reduced") -> tuple[np.ndarray, int]:
    """Platform A's rewards ``(episodes done, members)`` of a finished run, or of an unfinished
    one from its last checkpoint (``work/seed<S>/runs/partial/``), and how many episodes."""
    import json

    import torch

    try:
        rewards, _ = platform_a(seed, name, schedule)
        return rewards, rewards.shape[0]
    except FileNotFoundError:
        pass
    name_of = cell(name, seed, schedule).name
    path = work_dir(seed, schedule) / "runs" / "partial" / f"{name_of}.pt"
    state = torch.load(path, weights_only=False)
    done = int(json.loads(state["meta"])["counters"]["episodes"])
    return np.asarray(state["arrays"]["rewards"])[:done, :, 0], done


def partial_table(names: list[str], seed: int, schedule: str = "reduced") -> None:
    """The kept share of A's mean gain over the episodes every named run has done (the common
    prefix; unfinished runs from their checkpoints), against plaintext's and random's same
    episodes: a comparison of equal prefixes, not of whole runs."""
    got = {n: partial_a(seed, n, schedule) for n in names}
    upto = min(done for _, done in got.values())
    plain, rand = (platform_a(seed, n, schedule)[0][:upto] for n in ("plaintext", "random"))
    done = ", ".join(f"{n} {d}" for n, (_, d) in got.items())
    total = SCHEDULES[schedule]["episodes"]
    print(f"seed {seed}, episodes 1-{upto} of {total} (done: {done})")
    print("| row | A mean, episodes 1-E | kept, mean (per member) |")
    print("|---|---|---|")
    for name, (rewards, _) in got.items():
        a = rewards[:upto]
        per = (a.mean(0) - rand.mean(0)) / (plain.mean(0) - rand.mean(0))
        kept = (a.mean() - rand.mean()) / (plain.mean() - rand.mean())
        print(f"| {name} | {a.mean():.1f} | {kept:.2f} ({', '.join(f'{v:.2f}' for v in per)}) |")


def table(
    names: list[str], seeds: list[int], plaintext: str = "plaintext", schedule: str = "reduced"
) -> None:
    """The table of the module docstring; ``plaintext`` names the cell the kept share's 1.00
    is (the default: plaintext FedSlate, the paper's configuration and the issue's share)."""
    refs = {
        s: (platform_a(s, plaintext, schedule)[0], platform_a(s, "random", schedule)[0])
        for s in seeds
    }
    print(
        "| row | epsilon (ledger, A) | sigma rows / DP-SGD | A mean | A final | kept, mean "
        "(per member) | kept, final | s / learning step (wall, loaded) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        a = np.concatenate([platform_a(s, name, schedule)[0] for s in seeds], axis=1)
        plain = np.concatenate([refs[s][0] for s in seeds], axis=1)
        rand = np.concatenate([refs[s][1] for s in seeds], axis=1)
        per = (a.mean(0) - rand.mean(0)) / (plain.mean(0) - rand.mean(0))
        kept = (a.mean() - rand.mean()) / (plain.mean() - rand.mean())
        final = (a[-50:].mean() - rand[-50:].mean()) / (plain[-50:].mean() - rand[-50:].mean())
        _, record = platform_a(seeds[0], name, schedule)
        dp = record.get("dp") or {}
        eps = (dp.get("epsilon_spent") or {}).get("A") if dp else None
        if dp and eps is None:
            eps_text = "none (diagnostic)" if "diagnostic" in dp else "not established"
        else:
            eps_text = "-" if eps is None else f"{eps:.2f}"
        sig = "-"
        if dp:
            rows = dp.get("noise_multiplier")
            local = (dp.get("local_sgd") or {}).get("noise_multiplier")
            sig = " / ".join("-" if v is None else f"{v:.2f}" for v in (rows, local))
        steps = record.get("learn_steps") or 0
        learning = record.get("timings", {}).get("learning", 0.0)
        per_step = f"{learning / steps:.4f}" if steps and record.get("kind") == "fedslate" else "-"
        se = per.std(ddof=1) / np.sqrt(per.size) if per.size > 1 else float("nan")
        print(
            f"| {name} | {eps_text} | {sig} | {a.mean():.1f} ± {a.mean(0).std(ddof=1):.1f} | "
            f"{a[-50:].mean():.1f} | {kept:.2f} ± {se:.2f} ({', '.join(f'{v:.2f}' for v in per)}) "
            f"| {final:.2f} | {per_step} |"
        )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("run", "table", "partial"))
    parser.add_argument("names", nargs="+", help="cells (see cells())")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--plaintext", default="plaintext", help="table: the cell of the kept share's 1.00"
    )
    parser.add_argument(
        "--schedule",
        choices=sorted(SCHEDULES),
        default="reduced",
        help="reduced (250 episodes, work/seed<S>) or paper (5000, work/paper/seed<S>)",
    )
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.what == "run":
        run(args.names, seeds, args.jobs, args.schedule)
    elif args.what == "partial":
        partial_table(args.names, seeds[0], args.schedule)
    else:
        table(args.names, seeds, args.plaintext, args.schedule)


if __name__ == "__main__":
    main(sys.argv[1:])
