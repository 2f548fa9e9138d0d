"""FedMF against the centralised anchors on the same splits, in one process: RMSE and time.

``securefed bench fedmf-vs-centralised`` fits, on every requested split,

- Surprise's SVD (scikit-surprise, the dev extra: ``pip install scikit-surprise``), the
  centralised biased MF the literature quotes (Koren et al. 2009), with ``--svd-*`` settings
  (defaults: 100 factors, 40 epochs, learning rate 0.007, L2 weight 0.07, the best of a small
  grid on u1; Surprise's own defaults score 0.9513 on u1);
- the global-mean + damped-biases baseline (:mod:`securefed.recsys.baselines`);
- FedMF's biased preset (:func:`securefed.recsys.fedmf.biased_config`) for each ``--variants``
  entry, plaintext, every user in every round, with ``--validation`` to let early stopping pick
  the rounds (its time is then counted in the FedMF run's);

and writes ``fedmf_vs_centralised.json`` / ``.md``: per split and averaged, test RMSE and
seconds of each, and FedMF's seconds over SVD's fit seconds (the goal: at most 3 at equal or
better RMSE). Surprise is fitted on the training ratings only; its time excludes building its
trainset (as FedMF's excludes loading the data).

Both are timed under the same BLAS thread limit, ``--blas-threads`` (1 by default, the runtime's
default, :attr:`securefed.runtime.RunOptions.blas_threads`; 0 leaves the process's own, e.g.
OpenBLAS's one thread per core), and the record's ``threads`` states what threadpoolctl reports
inside and outside that limit beside ``OMP_NUM_THREADS``: the ratios hold only for the threads
they were measured with (benchmarks/results/blas_threads/).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from securefed.bench import datasets, stopping_args
from securefed.bench.bench_args import add_data_argument, add_out_argument, add_seed_argument
from securefed.bench.bench_fedmf import markdown_table, write_outputs
from securefed.bench.experiment import FedMFRun, run_fedmf
from securefed.bench.registry import BENCHES
from securefed.recsys.baselines import damped_baseline
from securefed.recsys.data import Split
from securefed.recsys.fedmf import VARIANTS, biased_config
from securefed.recsys.metrics import rmse
from securefed.recsys.validation import EarlyStopping
from securefed.runtime import blas_thread_limit, blas_threads_in_use

RESULTS = Path("benchmarks/results/fedmf_biases")


@dataclass(frozen=True)
class SVDSettings:
    """Surprise SVD's hyperparameters (its argument names)."""

    n_factors: int = 100
    n_epochs: int = 40
    lr_all: float = 0.007
    reg_all: float = 0.07

    def __post_init__(self) -> None:
        if self.n_factors < 1 or self.n_epochs < 1:
            raise ValueError("SVD needs n_factors >= 1 and n_epochs >= 1")
        if not (self.lr_all > 0 and self.reg_all >= 0):
            raise ValueError("SVD needs lr_all > 0 and reg_all >= 0")


def surprise_svd(
    split: Split, settings: SVDSettings, seed: int, blas_threads: int | None = 1
) -> dict:
    """Fit Surprise's SVD on ``split.train``; its test RMSE and fit seconds.

    The fit runs under ``blas_threads`` BLAS threads (``None``: the process's), as FedMF's rounds.

    Raises:
        ModuleNotFoundError: scikit-surprise is not installed (named in the message).
    """
    try:
        from surprise import SVD, Dataset, Reader
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "bench fedmf-vs-centralised needs scikit-surprise: pip install scikit-surprise "
            "(in securefed's dev extra)",
            name=error.name,
        ) from error
    train, scale = split.train, split.train.scale
    with tempfile.TemporaryDirectory() as directory:  # Surprise reads files (pandas is optional)
        path = os.path.join(directory, "train.txt")
        with open(path, "w") as handle:
            for user, item, rating in zip(train.users, train.items, train.ratings, strict=True):
                handle.write(f"{user} {item} {float(rating)!r}\n")
        reader = Reader(
            line_format="user item rating", sep=" ", rating_scale=(scale.minimum, scale.maximum)
        )
        trainset = Dataset.load_from_file(path, reader).build_full_trainset()
    algorithm = SVD(
        n_factors=settings.n_factors,
        n_epochs=settings.n_epochs,
        lr_all=settings.lr_all,
        reg_all=settings.reg_all,
        random_state=seed,
    )
    with blas_thread_limit(blas_threads):
        started = time.perf_counter()
        algorithm.fit(trainset)
        seconds = time.perf_counter() - started
    test = split.test
    predictions = np.array(
        [
            algorithm.predict(str(u), str(i), clip=True).est
            for u, i in zip(test.users, test.items, strict=True)
        ]
    )
    return {"rmse": rmse(predictions, test.ratings), "seconds": seconds}


def compare(args: argparse.Namespace) -> int:
    """Run every split: SVD, the damped baseline and FedMF's variants (module docstring)."""
    settings = SVDSettings(args.svd_factors, args.svd_epochs, args.svd_lr, args.svd_reg)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {VARIANTS}")
    stopping = EarlyStopping(**stopping_args.given(args))
    blas_threads = args.blas_threads or None
    rows = []
    for split_name in args.splits.split(","):
        split = datasets.load(args.data, split_name)
        svd = surprise_svd(split, settings, args.seed, blas_threads)
        baseline = damped_baseline(split.train).predict(split.test.users, split.test.items)
        row = {
            "split": split_name,
            "svd_rmse": svd["rmse"],
            "svd_seconds": svd["seconds"],
            "baseline_rmse": rmse(baseline, split.test.ratings),
        }
        for variant in variants:
            config = biased_config(variant=variant, **_rounds(args))
            run = FedMFRun(
                config=config,
                seed=args.seed,
                progress=False,
                validation=args.validation,
                early_stopping=stopping,
                blas_threads=blas_threads,
            )
            record, _, _ = run_fedmf(split, run)
            seconds = record["seconds"] + record.get("validation", {}).get("seconds", 0.0)
            row |= {
                f"{variant}_rmse": record["rmse"],
                f"{variant}_rounds": record["rounds"],
                f"{variant}_seconds": seconds,
                f"{variant}_time_ratio": seconds / svd["seconds"],
            }
        rows.append(row)
        print(row, flush=True)
    mean = {"split": "mean"} | {
        key: float(np.mean([r[key] for r in rows])) for key in rows[0] if key != "split"
    }
    columns = ["split", "svd_rmse", "svd_seconds", "baseline_rmse"]
    for variant in variants:
        columns += [f"{variant}_{k}" for k in ("rmse", "rounds", "seconds", "time_ratio")]
    table = markdown_table([*rows, mean], columns) + "\n\n" + threads_line(blas_threads)
    payload = {
        "rows": rows,
        "mean": mean,
        "data": args.data,
        "svd": settings.__dict__,
        "fedmf_config": {v: biased_config(variant=v, **_rounds(args)).public() for v in variants},
        "validation": args.validation,
        "early_stopping": stopping.__dict__,
        "seed": args.seed,
        "threads": threads_record(blas_threads),
    }
    write_outputs(args.name, payload, table, Path(args.out))
    return 0


def threads_record(blas_threads: int | None) -> dict:
    """What a speed record states about threads: the limit asked for, ``OMP_NUM_THREADS``, and
    the BLAS thread counts threadpoolctl reports outside the limit and inside it."""
    with blas_thread_limit(blas_threads):
        inside = blas_threads_in_use()
    return {
        "blas_threads_option": blas_threads,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "cpu_count": os.cpu_count(),
        "blas_outside_runs": blas_threads_in_use(),
        "blas_in_runs": inside,
    }


def threads_line(blas_threads: int | None) -> str:
    """One line for the markdown table: the BLAS threads the timings were taken with."""
    record = threads_record(blas_threads)
    counts = sorted({int(info["num_threads"]) for info in record["blas_in_runs"]})
    return (
        f"BLAS threads in the timed runs: {', '.join(map(str, counts)) or 'none loaded'} "
        f"(--blas-threads {blas_threads or 0}; OMP_NUM_THREADS={record['OMP_NUM_THREADS']}; "
        f"{record['cpu_count']} CPUs)"
    )


def _rounds(args: argparse.Namespace) -> dict:
    """The preset overrides given on the command line (``--rounds``, ``--dim``)."""
    given = {"rounds": args.rounds, "dim": args.dim}
    return {name: value for name, value in given.items() if value is not None}


def register(benches) -> None:
    parser = BENCHES["fedmf-vs-centralised"].add_to(benches)
    add_data_argument(parser)
    parser.add_argument(
        "--splits", default="u1,u2,u3,u4,u5", help="comma-separated ML-100K splits (u1..u5)"
    )
    parser.add_argument(
        "--variants",
        default="fedmf",
        help="comma-separated FedMF variants (fedmf, fedrec, fedrec+)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="FedMF rounds (the biased preset's 35, FedRec+ 40)"
    )
    parser.add_argument(
        "--dim", type=int, default=None, help="FedMF's latent dimension (the biased preset's 100)"
    )
    parser.add_argument(
        "--validation",
        type=float,
        default=None,
        metavar="FRACTION",
        help="let early stopping on FRACTION of the training ratings pick FedMF's rounds",
    )
    stopping_args.add_arguments(parser)
    parser.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads of the timed fits, FedMF's and SVD's (1, the runtime's default; 0: "
        "the process's own, e.g. one per core); the record states them",
    )
    parser.add_argument(
        "--svd-factors",
        type=int,
        default=SVDSettings.n_factors,
        help="factors of Surprise's SVD (the centralised reference)",
    )
    parser.add_argument(
        "--svd-epochs", type=int, default=SVDSettings.n_epochs, help="epochs of Surprise's SVD"
    )
    parser.add_argument(
        "--svd-lr", type=float, default=SVDSettings.lr_all, help="learning rate of Surprise's SVD"
    )
    parser.add_argument(
        "--svd-reg",
        type=float,
        default=SVDSettings.reg_all,
        help="regularisation of Surprise's SVD",
    )
    add_seed_argument(parser)
    parser.add_argument("--name", default="fedmf_vs_centralised", help="output file stem")
    add_out_argument(parser, RESULTS)
    parser.set_defaults(func=compare)
