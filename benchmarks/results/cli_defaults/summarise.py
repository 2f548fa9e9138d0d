"""Build cli_defaults.md / cli_defaults.json from the records/ records of run.sh and run_units.sh.

Usage (repository root): .venv/bin/python -P benchmarks/results/cli_defaults/summarise.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
RUNS = HERE / "records"
DATA_SETS = [
    ("MovieLens 100K", [f"ml-100k_u{k}" for k in range(1, 6)]),
    ("ml-latest-small (embedded, random 80/20 split, seed 0)", ["ml-latest-small"]),
    ("MovieLens 100K x2 (every rating doubled, 2..10)", [f"ml-100k-x2_u{k}" for k in range(1, 6)]),
    ("half-star file (ml-latest-small mapped onto 0.5..4)", ["halfstar"]),
]
KINDS = ("paper", "defaults", "validation", "validation_old", "unit_one")


def _load(name: str, kind: str) -> dict | None:
    path = RUNS / f"{name}.{kind}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _row(name: str) -> dict:
    records = {kind: _load(name, kind) for kind in KINDS}
    defaults = records["defaults"]
    row = {
        "run": name,
        "global_mean": defaults["baselines"]["global_mean"],
        "damped_biases": defaults["baselines"]["damped_biases"],
    }
    for kind, record in records.items():
        if record is not None:
            row[f"{kind}_rmse"] = record["rmse"]
            row[f"{kind}_rounds"] = record["rounds"]
    row["defaults_beat_damped_biases"] = row["defaults_rmse"] < row["damped_biases"]
    row["validation_minus_fixed"] = row["validation_rmse"] - row["defaults_rmse"]
    return row


def _cell(row: dict, kind: str, rounds: bool = False) -> str:
    if f"{kind}_rmse" not in row:
        return ""
    text = f"{row[f'{kind}_rmse']:.4f}"
    return f"{text} ({row[f'{kind}_rounds']:.0f})" if rounds else text


def main() -> None:
    rows, lines = [], []
    header = (
        "| data set | split | old default (`--preset paper`, 500 rounds) | **defaults** "
        "(biased, fixed 35 rounds) | global mean | damped biases | `--validation 0.1` "
        "(rounds) | validation minus fixed | old stopping rule (rounds) | biased without "
        "`rating_unit` |"
    )
    lines += [header, "|" + "---|" * 10]
    for title, names in DATA_SETS:
        block = [_row(name) for name in names if _load(name, "defaults") is not None]
        if len(block) > 1:
            mean = {"run": "mean"}
            for key in block[0]:
                if key != "run" and all(key in r for r in block):
                    mean[key] = float(np.mean([r[key] for r in block]))
            block.append(mean)
        for row in block:
            row["data_set"] = title
            split = row["run"].split("_")[-1] if row["run"] != "mean" else "**mean**"
            split = split if split.startswith(("u", "*")) else "(CLI's)"
            lines.append(
                f"| {title} | {split} | {_cell(row, 'paper')} | **{_cell(row, 'defaults')}** | "
                f"{row['global_mean']:.4f} | {row['damped_biases']:.4f} | "
                f"{_cell(row, 'validation', True)} | {row['validation_minus_fixed']:+.4f} | "
                f"{_cell(row, 'validation_old', True)} | {_cell(row, 'unit_one')} |"
            )
        rows += block
    singles = [r for r in rows if r["run"] != "mean"]
    checks = {
        "defaults_beat_damped_biases_everywhere": all(
            r["defaults_rmse"] < r["damped_biases"] for r in singles
        ),
        "validation_worst_minus_fixed": max(r["validation_minus_fixed"] for r in singles),
    }
    table = "\n".join(lines)
    (HERE / "cli_defaults.md").write_text(table + "\n")
    (HERE / "cli_defaults.json").write_text(
        json.dumps({"rows": rows, "checks": checks}, indent=1) + "\n"
    )
    print(table)
    print(checks)


if __name__ == "__main__":
    main()
