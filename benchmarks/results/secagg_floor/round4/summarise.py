"""Print round four's tables from the records beside this script (old beside new).

python benchmarks/results/secagg_floor/round4/summarise.py
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
STAGES = ("key_agreement", "sharing", "encoding", "mask_expansion", "unmasking", "untimed")


def runs(side):
    lines = (HERE / f"alternate_{side}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if "n100" in r]


old, new = runs("old"), runs("new")
BASIC = ("mask_expansion", "rounding_draw", "x25519", "x25519_keygen")
REST = ("hkdf", "aead_seal", "aead_open")


def shamir_part(record, n):
    """The Shamir terms of a record's full floor (its costs are not kept apart)."""
    r = record[n]
    costs = record["primitive_cpu_us"]
    rest = sum(r["operations"][k] * costs[k] * 1e-6 for k in REST)
    return r["cpu_floor_full_seconds"] - r["cpu_floor_seconds"] - rest


def common_floor(n):
    """One floor for both trees (the operation counts are the same): each primitive at its
    lowest CPU cost over all the processes of the record, Shamir's terms likewise."""
    everyone = old + new
    ops = everyone[0][n]["operations"]
    assert all(r[n]["operations"] == ops for r in everyone)
    best = {k: min(r["primitive_cpu_us"][k] for r in everyone) * 1e-6 for k in BASIC + REST}
    basic = sum(ops[k] * best[k] for k in BASIC)
    full = basic + sum(ops[k] * best[k] for k in REST) + min(shamir_part(r, n) for r in everyone)
    accumulation = ops["ring_add"] * min(r["primitive_cpu_us"]["ring_add"] for r in everyone) * 1e-6
    return basic, full, full + accumulation


print("Against one floor for both trees (each primitive's lowest CPU cost over all processes):")
print()
print(
    "| n | floor / full / + accumulation (CPU s) | old CPU s (pairs) | old / full floor "
    "| new CPU s (pairs) | new / full floor | new / + accumulation | new / old (pairs) |"
)
print("|---|---|---|---|---|---|---|---|")
for n in ("n100", "n1000"):
    basic, full, plus = common_floor(n)
    o = [r[n]["cpu_seconds"] for r in old]
    w = [r[n]["cpu_seconds"] for r in new]
    print(
        f"| {n[1:]} | {basic:.3f} / {full:.3f} / {plus:.3f} | "
        + ", ".join(f"{x:.2f}" for x in o)
        + " | "
        + ", ".join(f"{x / full:.2f}x" for x in o)
        + " | "
        + ", ".join(f"{x:.2f}" for x in w)
        + " | "
        + ", ".join(f"{x / full:.2f}x" for x in w)
        + " | "
        + ", ".join(f"{x / plus:.2f}x" for x in w)
        + " | "
        + ", ".join(f"{b / a:.3f}" for a, b in zip(o, w, strict=False))
        + " |"
    )
print()
print("Each process against its own floor (the floor measured in that process):")
print()
print(
    "| pair | n | old CPU s | old / floor | / full floor | / full + accumulation "
    "| new CPU s | new / floor | / full floor | / full + accumulation |"
)
print("|---|---|---|---|---|---|---|---|---|---|")
for i, (o, w) in enumerate(zip(old, new, strict=False), 1):
    for n in ("n100", "n1000"):
        a, b = o[n], w[n]
        print(
            f"| {i} | {n[1:]} | {a['cpu_seconds']:.2f} | {a['ratio_to_floor']:.2f}x | "
            f"{a['ratio_to_full_floor']:.2f}x | {a['ratio_to_floor_accumulation']:.2f}x | "
            f"{b['cpu_seconds']:.2f} | {b['ratio_to_floor']:.2f}x | "
            f"{b['ratio_to_full_floor']:.2f}x | {b['ratio_to_floor_accumulation']:.2f}x |"
        )
print()
print("Stages at n = 1000 (CPU s / its floor's CPU s), old -> new:")
print()
print("| pair | " + " | ".join(STAGES) + " |")
print("|---|" + "---|" * len(STAGES))
for i, (o, w) in enumerate(zip(old, new, strict=False), 1):
    cells = []
    for s in STAGES:
        a, b = o["n1000"], w["n1000"]
        sec_a = a["cpu_untimed"] if s == "untimed" else a["cpu_stages"][s]
        sec_b = b["cpu_untimed"] if s == "untimed" else b["cpu_stages"][s]
        fa, fb = a["cpu_floor_by_stage"][s], b["cpu_floor_by_stage"][s]
        cells.append(f"{sec_a:.2f}/{fa:.2f} -> {sec_b:.2f}/{fb:.2f}")
    print(f"| {i} | " + " | ".join(cells) + " |")
print()
print(
    "| pair | old draw us | old encode_input us | old / draw | new draw us | new encode_input us "
    "| new / draw |"
)
print("|---|---|---|---|---|---|---|")
for i, (o, w) in enumerate(zip(old, new, strict=False), 1):
    a, b = o["micro_us"], w["micro_us"]
    print(
        f"| {i} | {a['rounding_draw']:.0f} | {a['encode_input']:.0f} | {a['encode_over_draw']:.2f}x"
        f" | {b['rounding_draw']:.0f} | {b['encode_input']:.0f} | {b['encode_over_draw']:.2f}x |"
    )
print()
keys = ("mask_expansion", "keystream", "ring_add", "rounding_draw", "x25519", "hkdf", "aead_seal")
print(
    "Primitives (CPU us), old process -> new process: "
    + "; ".join(
        f"{k} "
        + ", ".join(
            f"{o['primitive_cpu_us'][k]:.1f}->{w['primitive_cpu_us'][k]:.1f}"
            for o, w in zip(old, new, strict=False)
        )
        for k in keys
        if k in old[0]["primitive_cpu_us"]
    )
)

bench = {side: HERE / "rounds" / f"{side}_1" / "cost.json" for side in ("old", "new")}
if all(path.exists() for path in bench.values()):
    rows = {side: json.loads(path.read_text())["rows"] for side, path in bench.items()}
    print()
    print("`securefed bench secagg-malicious`, old then new (CPU, first round, set-up included):")
    print()
    print(
        "| n | dropout | variant | old CPU s | / floor | / full floor | / full + accumulation "
        "| new CPU s | / floor | / full floor | / full + accumulation |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for a_row, b_row in zip(rows["old"], rows["new"], strict=True):
        for key in ("honest_but_curious", "malicious_macs", "malicious_signatures"):
            cells = []
            for v in (a_row[key], b_row[key]):
                cpu = v["first_round_cpu_seconds"]
                cells += [
                    f"{cpu:.2f}",
                    f"{cpu / v['cpu_floor_seconds']:.2f}x",
                    f"{cpu / v['cpu_floor_full_seconds']:.2f}x",
                    f"{cpu / v['cpu_floor_accumulation_seconds']:.2f}x",
                ]
            print(
                f"| {a_row['clients']} | {a_row['dropout']:.0%} | {key} | "
                + " | ".join(cells)
                + " |"
            )
    records = {side: json.loads(path.read_text()) for side, path in bench.items()}
    names = ("mask_expansion", "rounding_draw", "x25519", "x25519_keygen", "ed25519_sign")
    names += ("ed25519_verify", "hmac", "hkdf", "aead_seal", "aead_open")
    low = {k: min(r["primitive_costs"]["cpu"][k] for r in records.values()) for k in names}
    print()
    print(
        "The same rounds against one floor (each primitive at the lower CPU cost of the two "
        "runs, Shamir likewise):"
    )
    print()
    print("| n | dropout | variant | full floor s | old CPU / it | new CPU / it | new / old |")
    print("|---|---|---|---|---|---|---|")
    for a_row, b_row in zip(rows["old"], rows["new"], strict=True):
        for key in ("honest_but_curious", "malicious_macs", "malicious_signatures"):
            a, b = a_row[key], b_row[key]
            assert a["operations"] == b["operations"]
            ops = a["operations"]
            floor = sum(ops[k] * low[k] for k in names) + sum(
                ops[k] * min(v["shamir_costs"]["cpu"][k] for v in (a, b))
                for k in ("shamir_split", "shamir_reconstruct")
            )
            ca, cb = a["first_round_cpu_seconds"], b["first_round_cpu_seconds"]
            print(
                f"| {a_row['clients']} | {a_row['dropout']:.0%} | {key} | {floor:.3f} | "
                f"{ca / floor:.2f}x | {cb / floor:.2f}x | {cb / ca:.3f} |"
            )

micro = {}
for side in ("old", "new"):
    lines = (HERE / f"micro_{side}.jsonl").read_text().splitlines()
    micro[side] = [json.loads(line) for line in lines if '"draw_us"' in line]
if all(micro.values()):
    print()
    print("`encode_input` over the rounding draw, d = 1e5, CPU us (run_micro.sh, alternated):")
    print()
    print("| side | draw us (pairs) | encode_input us (pairs) | / draw (pairs) | medians |")
    print("|---|---|---|---|---|")
    for side, records in micro.items():
        draws = [r["draw_us"] for r in records]
        encodes = [r["encode_input_us"] for r in records]
        ratios = [r["ratio"] for r in records]
        print(
            f"| {side} | {', '.join(f'{d:.0f}' for d in draws)} "
            f"| {', '.join(f'{e:.0f}' for e in encodes)} "
            f"| {', '.join(f'{q:.2f}x' for q in ratios)} "
            f"| {statistics.median(draws):.0f} / {statistics.median(encodes):.0f} / "
            f"{statistics.median(ratios):.2f}x |"
        )
