"""Print the round-two tables of README.md from the records in this folder.

python benchmarks/results/secagg_floor/round2/summarise.py
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = {
    "honest_but_curious": "honest-but-curious",
    "malicious_macs": "malicious, MACs",
    "malicious_signatures": "malicious, signatures",
}


def cpu_rows():
    print(
        "| n | dropout | variant | sample | old CPU s | / floor | / full floor | new CPU s |"
        " / floor | / full floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for sample in ("1", "2"):
        old = json.loads((HERE / "rounds" / f"old_{sample}" / "cost.json").read_text())
        new = json.loads((HERE / "rounds" / f"new_{sample}" / "cost.json").read_text())
        for a, b in zip(old["rows"], new["rows"], strict=True):
            for key, name in VARIANTS.items():
                cells = []
                for row in (a, b):
                    v = row[key]
                    cpu = v["first_round_cpu_seconds"]
                    full = v.get("cpu_floor_full_seconds")
                    cells += [
                        f"{cpu:.2f}",
                        f"{cpu / v['cpu_floor_seconds']:.2f}x",
                        "-" if full is None else f"{cpu / full:.2f}x",
                    ]
                print(
                    f"| {a['clients']} | {a['dropout']:.0%} | {name} | {sample} | "
                    + " | ".join(cells)
                    + " |"
                )


def jsonl(name):
    return [
        json.loads(line) for line in (HERE / name).read_text().splitlines() if line.startswith("{")
    ]


def alternate_rows():
    print("| pair | n | old CPU s | old / floor | new CPU s | new / floor |")
    print("|---|---|---|---|---|---|")
    for i, (old, new) in enumerate(
        zip(jsonl("alternate_old.jsonl"), jsonl("alternate_new.jsonl"), strict=True)
    ):
        for n in ("n100", "n1000"):
            print(
                f"| {i + 1} | {n[1:]} | {old[n]['cpu_seconds']:.3f} | "
                f"{old[n]['ratio_to_floor']:.2f}x | {new[n]['cpu_seconds']:.3f} | "
                f"{new[n]['ratio_to_floor']:.2f}x |"
            )


def micro_rows():
    print(
        "| pair | d | old draw us | old encode_input us | old / draw | new draw us |"
        " new encode_input us | new / draw | old mask us | new mask us |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, (old, new) in enumerate(
        zip(jsonl("micro_old.jsonl"), jsonl("micro_new.jsonl"), strict=True)
    ):
        for d in ("d100000", "d35000"):
            o, w = old[d], new[d]
            print(
                f"| {i + 1} | {int(d[1:]):,} | {o['rounding_draw_us']:.0f} | "
                f"{o['encode_input_us']:.0f} | {o['encode_over_draw']:.2f}x | "
                f"{w['rounding_draw_us']:.0f} | {w['encode_input_us']:.0f} | "
                f"{w['encode_over_draw']:.2f}x | {o['mask_add_us']:.1f} | "
                f"{w['mask_add_us']:.1f} |"
            )
        print(
            f"| {i + 1} | AES-CTR context | | | | | | | {old['aes_ctr_context_us']:.2f} | "
            f"{new['aes_ctr_context_us']:.2f} |"
        )


if __name__ == "__main__":
    cpu_rows()
    print()
    alternate_rows()
    print()
    micro_rows()
