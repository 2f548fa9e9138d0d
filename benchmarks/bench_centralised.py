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
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from securefed.bench import datasets
from securefed.bench.bench_fedmf import markdown_table, write_outputs
from securefed.bench.experiment import FedMFRun, run_fedmf
from securefed.bench.registry import BENCHES
from securefed.recsys.baselines import damped_baseline
from securefed.recsys.data import Split
from securefed.recsys.fedmf import VARIANTS, biased_config
from securefed.recsys.metrics import rmse
from securefed.recsys.validation import EarlyStopping

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


def surprise_svd(split: Split, settings: SVDSettings, seed: int) -> dict:
    """Fit Surprise's SVD on ``split.train``; its test RMSE and fit seconds.

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
    stopping = EarlyStopping(patience=args.patience, every=args.validate_every)
    rows = []
    for split_name in args.splits.split(","):
        split = datasets.load(args.data, split_name)
        svd = surprise_svd(split, settings, args.seed)
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
    table = markdown_table([*rows, mean], columns)
    payload = {
        "rows": rows,
        "mean": mean,
        "data": args.data,
        "svd": settings.__dict__,
        "fedmf_config": {v: biased_config(variant=v, **_rounds(args)).public() for v in variants},
        "validation": args.validation,
        "early_stopping": stopping.__dict__,
        "seed": args.seed,
        "threads": os.environ.get("OMP_NUM_THREADS"),
    }
    write_outputs(args.name, payload, table, Path(args.out))
    return 0


def _rounds(args: argparse.Namespace) -> dict:
    """The preset overrides given on the command line (``--rounds``, ``--dim``)."""
    given = {"rounds": args.rounds, "dim": args.dim}
    return {name: value for name, value in given.items() if value is not None}


def register(benches) -> None:
    parser = BENCHES["fedmf-vs-centralised"].add_to(benches)
    parser.add_argument(
        "--data",
        default="ml-100k",
        help="a data set name (ml-100k, ml-latest-small) or a path to a ratings file/dir",
    )
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
    parser.add_argument(
        "--patience",
        type=int,
        default=4,
        help="with --validation: evaluations without improvement before stopping (4)",
    )
    parser.add_argument(
        "--validate-every",
        type=int,
        default=5,
        help="with --validation: rounds between two evaluations (5)",
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
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the runs' seed (reproducible, not private: a benchmark)",
    )
    parser.add_argument("--name", default="fedmf_vs_centralised", help="output file stem")
    parser.add_argument(
        "--out", default=str(RESULTS), help="folder of the records (JSON and markdown)"
    )
    parser.set_defaults(func=compare)
