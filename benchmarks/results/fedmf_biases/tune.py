"""Tune the biased preset on validation parts of the training ratings (never the test folds).

Run: OMP_NUM_THREADS=1 python benchmarks/results/fedmf_biases/tune.py NAME SPLITS '[{...}, ...]'
For every override dict and every split in SPLITS (comma-separated, e.g. ``u1,u2``): hold out
10% of each user's *training* ratings (``holdout_split``, the ``--validation`` rule's generator),
train the biased preset with the overrides on the rest and evaluate the validation RMSE every 5
rounds up to the config's rounds (no early stop: patience 1000). Prints and records, per
setting, the mean over splits of the best validation RMSE and the round it came at; the test
folds are never read.
"""

import json
import sys
import time

import numpy as np

from securefed.bench import datasets
from securefed.bench.experiment import FedMFRun, choose_rounds, save_json
from securefed.recsys.fedmf import biased_config
from securefed.recsys.validation import EarlyStopping

name, splits, settings = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
data = sys.argv[4] if len(sys.argv) > 4 else "/work/shared/data/ml-100k"
loaded = {s: datasets.load(data, s) for s in splits}
rows = []
for overrides in settings:
    started = time.perf_counter()
    curves = {}
    for split_name, split in loaded.items():
        run = FedMFRun(
            config=biased_config(**overrides),
            seed=0,
            progress=False,
            validation=0.1,
            early_stopping=EarlyStopping(patience=1000, every=5),
        )
        curves[split_name] = choose_rounds(split, run)["curve"]
    rounds = [r for r, _ in next(iter(curves.values()))]
    mean_curve = np.mean([[v for _, v in c] for c in curves.values()], axis=0)
    best = int(np.argmin(mean_curve))
    rows.append(
        {
            "overrides": overrides,
            "best_validation_rmse": float(mean_curve[best]),
            "best_rounds": rounds[best],
            "last_validation_rmse": float(mean_curve[-1]),
            "per_split_best": {s: min(v for _, v in c) for s, c in curves.items()},
            "seconds": time.perf_counter() - started,
            "curve": [[r, float(v)] for r, v in zip(rounds, mean_curve, strict=True)],
        }
    )
    print(json.dumps({k: v for k, v in rows[-1].items() if k != "curve"}), flush=True)
save_json(
    {"rows": rows, "splits": splits, "data": data, "validation_fraction": 0.1},
    f"benchmarks/results/fedmf_biases/tune_{name}.json",
)
