"""Join the kept federations of the deployment-apps runs into one record (``flower.json``/``.md``).

The runs of this record were started as separate ``securefed bench flower --parts
deployment-apps`` invocations with ``--deploy-app-workdir`` (README); this reads what each
federation's ServerApp and nodes wrote there and computes the rows with the bench's own
functions (``securefed.bench.bench_flower_deploy_apps``), the in-process twins run again here.

    python benchmarks/results/flower_deploy_apps/collect.py WORKDIR... --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from securefed.bench import bench_flower_deploy_apps as b
from securefed.bench.bench_fedmf import markdown_table, write_outputs

FEDHPD = {f"fedhpd-{k}": k for k in range(len(b.FEDHPD_CASES))}
FEDSLATE = {f"fedslate-{k}": k for k in range(len(b.FEDSLATE_CASES))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--measured", default="", help="JSON: case folder -> {wall_s, cpu_s}")
    cli = parser.parse_args()
    args = argparse.Namespace(
        seed=0, deploy_nodes=2, deploy_app_rounds=2, deploy_app_episodes=1, deploy_app_steps=2
    )
    measured = json.loads(Path(cli.measured).read_text()) if cli.measured else {}
    rows = []
    for workdir in map(Path, cli.workdirs):
        for folder in sorted(p for p in workdir.iterdir() if p.is_dir()):
            if not (folder / "out" / "result.json").exists():
                print(f"{folder}: no result.json (not finished), left out")
                continue
            extra = measured.get(folder.name, {})
            if folder.name in FEDHPD:
                case = b._fedhpd_case(args, workdir, FEDHPD[folder.name])
                rows.append(b._fedhpd_row(case, b._fedhpd_reference(case["parsed"]), extra))
            elif folder.name in FEDSLATE:
                case = b._fedslate_case(args, workdir, FEDSLATE[folder.name])
                reference = b._fedslate_reference(case["seeded"])
                rows.append(b._fedslate_row(case, reference, extra))
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
    table = markdown_table(rows, b.COLUMNS)
    write_outputs(
        "flower", {"deployment_app_rows": rows, "loadavg": os.getloadavg()}, table, Path(cli.out)
    )


if __name__ == "__main__":
    main()
