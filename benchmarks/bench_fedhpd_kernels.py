"""FedHPD's learner with its two kernel sets, ``kernels="fast"`` beside ``kernels="torch"``,
trained on the same seeds: equal in distribution, or not (issue 32).

::

    python -m securefed.bench.bench_fedhpd_kernels --settings nofed --rounds 2000 \\
        --seeds 20,25,30,35,40,0,1,2,3,4,5,6,7,8,9 --chunk 5

The two kernel sets (:data:`securefed.rl.fast.KERNELS`) compute the same functions and differ in
float32 rounding (tests/test_fedhpd_fast_kernels.py checks every pass against float64), so two
runs of one seed share their first rounds bit for bit and part ways once a rounding difference
flips an action draw. Rounding-induced divergence leaves the distribution of returns over seeds
unchanged; a learning-rate, loss or gradient-scale difference does not. This bench trains every
(setting, seed) run once per kernel set, the two kernel sets in two processes at the same time
(one torch thread each: both see the same load), ``--chunk`` seeds a population, and writes each
process's runs to a partial record after every chunk (a long run stopped early keeps its finished
chunks). It then reports, per setting: each kernel set's mean and standard deviation of the
system average reward (the paper's metric, spec section 4), the paired difference (same seeds),
and the p-values of Welch's t-test, a two-sided permutation test of the difference in means
(unpaired, 100,000 relabellings from a fixed generator), the paired t-test and the Wilcoxon
signed-rank test. ``--from-partials`` summarises partial records already written.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from securefed.bench.bench_fedhpd import RESULTS, machine, parse_seeds, parse_settings
from securefed.records import dumps_record, loads_record

PERMUTATIONS = 100_000
"""Relabellings of the permutation test (a fixed generator: the p-value is reproducible)."""


def train_chunks(kernels: str, settings: str, rounds: int, chunks: list[list[int]], out: Path):
    """Train each chunk of seeds (every setting) as one population with ``kernels``; rewrite
    ``out`` (JSON) after each chunk. Returns the record."""
    import torch

    from securefed.rl.fast import Population, make_public_states
    from securefed.rl.fedhpd import FedHPDConfig, RunSpec, system_average_reward

    torch.set_num_threads(1)
    configs = [FedHPDConfig(algorithm=a, d=d, rounds=rounds) for a, d in parse_settings(settings)]
    public = None
    if any(c.algorithm == "fedhpd" for c in configs):
        public = make_public_states(FedHPDConfig(algorithm="fedhpd"))
    record = {"kernels": kernels, "rounds": rounds, "chunks": []}
    for seeds in chunks:
        runs = [
            RunSpec(c, s, None, public if c.algorithm == "fedhpd" else None)
            for c in configs
            for s in seeds
        ]
        start, cpu, load = time.perf_counter(), time.process_time(), os.getloadavg()
        results = Population(runs, kernels=kernels).run()
        record["chunks"].append(
            {
                "labels": [r.config.label() for r in results],
                "seeds": [r.seed for r in results],
                "load_start": list(load),
                "load_end": list(os.getloadavg()),
                "wall_s": time.perf_counter() - start,
                "cpu_s": time.process_time() - cpu,
                "system_average_reward": [
                    system_average_reward(r.returns[None], min(50, rounds)) for r in results
                ],
                "mean_return_last_100": [float(r.returns[-100:].mean()) for r in results],
            }
        )
        out.write_text(dumps_record(record))
    return record


def permutation_p(a: np.ndarray, b: np.ndarray, n: int = PERMUTATIONS, seed: int = 0) -> float:
    """Two-sided p-value of ``mean(a) - mean(b)`` under random relabelling of ``a`` and ``b``
    (the observed labelling counted, so never 0)."""
    pooled = np.concatenate([a, b])
    observed = abs(a.mean() - b.mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(n):
        perm = rng.permutation(pooled)
        hits += abs(perm[: len(a)].mean() - perm[len(a) :].mean()) >= observed - 1e-12
    return float((hits + 1) / (n + 1))


def compare(fast: dict[int, float], slow: dict[int, float]) -> dict:
    """Means, s.d. and the tests of one setting (``{seed: system average reward}`` each)."""
    from scipy import stats

    seeds = sorted(set(fast) & set(slow))
    a = np.array([fast[s] for s in seeds])
    b = np.array([slow[s] for s in seeds])
    out = {
        "seeds": seeds,
        "fast": a.tolist(),
        "torch": b.tolist(),
        "mean_fast": float(a.mean()),
        "mean_torch": float(b.mean()),
        "sd_fast": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        "sd_torch": float(b.std(ddof=1)) if len(b) > 1 else 0.0,
        "paired_difference_mean": float((a - b).mean()),
    }
    if len(seeds) > 1:
        out["paired_difference_sd"] = float((a - b).std(ddof=1))
        out["welch_p"] = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
        out["permutation_p"] = permutation_p(a, b)
        if np.array_equal(a, b):  # no run parted: both paired tests are undefined (0 / 0)
            out["paired_t_p"] = out["wilcoxon_p"] = 1.0
        else:
            out["paired_t_p"] = float(stats.ttest_rel(a, b).pvalue)
            out["wilcoxon_p"] = float(stats.wilcoxon(a, b).pvalue)
    return out


def summarise(partials: dict[str, dict]) -> dict:
    """Per setting, :func:`compare` over the seeds both kernel sets finished."""
    rewards: dict[str, dict[str, dict[int, float]]] = {}
    for kernels, record in partials.items():
        for chunk in record["chunks"]:
            labels = chunk.get("labels") or ["NoFed"] * len(chunk["seeds"])
            sar = chunk.get("system_average_reward", chunk.get("sar"))
            for label, seed, value in zip(labels, chunk["seeds"], sar, strict=True):
                rewards.setdefault(label, {}).setdefault(kernels, {})[seed] = value
    return {label: compare(by["fast"], by["torch"]) for label, by in rewards.items()}


def print_summary(summary: dict) -> None:
    for label, row in summary.items():
        print(
            f"{label} over {len(row['seeds'])} seeds: fast {row['mean_fast']:.1f} "
            f"(sd {row['sd_fast']:.1f}), torch {row['mean_torch']:.1f} (sd {row['sd_torch']:.1f})"
            f"; paired difference {row['paired_difference_mean']:+.1f}"
        )
        if "welch_p" in row:
            print(
                f"  p: Welch {row['welch_p']:.3f}, permutation {row['permutation_p']:.3f}, "
                f"paired t {row['paired_t_p']:.3f}, Wilcoxon {row['wilcoxon_p']:.3f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_fedhpd_kernels")
    parser.add_argument("--settings", default="nofed", help="settings, as for bench fedhpd")
    parser.add_argument(
        "--seeds", default="20,25,30,35,40", help="seeds, trained in this order in chunks"
    )
    parser.add_argument("--rounds", type=int, default=2000, help="rounds of every run")
    parser.add_argument("--chunk", type=int, default=5, help="seeds per population")
    parser.add_argument("--out", default=str(RESULTS), help="directory of the JSON record")
    parser.add_argument(
        "--worker",
        choices=("fast", "torch"),
        help="internal (the two processes): train with this kernel set only, into --partial",
    )
    parser.add_argument("--partial", help="internal: the worker's partial JSON record")
    parser.add_argument(
        "--from-partials",
        nargs=2,
        metavar=("FAST_JSON", "TORCH_JSON"),
        help="summarise these partial records (fast, torch) instead of training",
    )
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    if args.chunk < 1:
        parser.error("--chunk must be >= 1")
    chunks = [seeds[i : i + args.chunk] for i in range(0, len(seeds), args.chunk)]
    if args.worker:
        train_chunks(args.worker, args.settings, args.rounds, chunks, Path(args.partial))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = list(os.getloadavg())
    if args.from_partials:
        paths = dict(zip(("fast", "torch"), map(Path, args.from_partials), strict=True))
    else:
        paths = {k: out / f"fedhpd_kernels_partial_{k}.json" for k in ("fast", "torch")}
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "securefed.bench.bench_fedhpd_kernels",
                    *argv_of(args),
                    "--worker",
                    kernels,
                    "--partial",
                    str(path),
                ]
            )
            for kernels, path in paths.items()
        ]
        for worker in workers:
            if worker.wait():
                raise SystemExit(f"a worker failed (exit {worker.returncode})")
    partials = {k: loads_record(p.read_text()) for k, p in paths.items()}
    summary = summarise(partials)
    print_summary(summary)
    record = {
        "command": "python -m securefed.bench.bench_fedhpd_kernels "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "rounds": partials["fast"]["rounds"],
        "load_average_start": load_start,
        "chunks": {  # without per-round returns (a partial record may hold them)
            k: [{x: v for x, v in c.items() if x != "returns"} for c in r["chunks"]]
            for k, r in partials.items()
        },
        "cpu_seconds": {k: sum(c["cpu_s"] for c in r["chunks"]) for k, r in partials.items()},
        "summary": summary,
        "machine": machine(),
    }
    path = out / f"fedhpd_kernels_{record['rounds']}rounds.json"
    path.write_text(dumps_record(record, indent=1))
    print(f"written to {path}")
    return 0


def argv_of(args: argparse.Namespace) -> list[str]:
    """The training options of ``args``, for the worker processes."""
    return [
        "--settings", args.settings, "--seeds", args.seeds,
        "--rounds", str(args.rounds), "--chunk", str(args.chunk),
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
