"""Print round six's tables from the records beside this script (old beside new).

python benchmarks/results/secagg_floor/round6/summarise.py [SUFFIX]

``SUFFIX`` picks ``alternate_old{SUFFIX}.jsonl`` / ``alternate_new{SUFFIX}.jsonl`` (default: none).
"""

import statistics
import sys
from pathlib import Path

from securefed.records import loads_record

HERE = Path(__file__).parent
SUFFIX = sys.argv[1] if len(sys.argv) > 1 else ""
STAGES = ("key_agreement", "sharing", "encoding", "mask_expansion", "unmasking", "untimed")
BASIC = ("mask_expansion", "rounding_draw", "x25519", "x25519_keygen")
REST = ("hkdf", "aead_seal", "aead_open")


def runs(side):
    lines = (HERE / f"alternate_{side}{SUFFIX}.jsonl").read_text().splitlines()
    return [r for r in (loads_record(line) for line in lines if line.strip()) if "n100" in r]


old, new = runs("old"), runs("new")


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


def load(r):
    return f"{r['loadavg_start'][0]:.1f}-{r['loadavg_end'][0]:.1f}"


print("Load average (1 min) at each process's start-end: old " + ", ".join(map(load, old)))
print("new " + ", ".join(map(load, new)))
print()
print("Against one floor for both trees (each primitive's lowest CPU cost over all processes):")
print()
print(
    "| n | floor / full / + accumulation (CPU s) | old CPU s (pairs) | old / full floor "
    "| new CPU s (pairs) | new / full floor | new / old (pairs) | median new / old |"
)
print("|---|---|---|---|---|---|---|---|")
for n in ("n100", "n1000"):
    basic, full, plus = common_floor(n)
    o = [r[n]["cpu_seconds"] for r in old]
    w = [r[n]["cpu_seconds"] for r in new]
    ratios = [b / a for a, b in zip(o, w, strict=False)]
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
        + ", ".join(f"{x:.3f}" for x in ratios)
        + f" | {statistics.median(ratios):.3f} |"
    )
print()
print("Stages at n = 1000, CPU s (each process's own stage floor after the slash), old -> new:")
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
print("Stages at n = 1000 against one stage floor (the lowest over all processes), old; new:")
print()
print("| stage | floor CPU s | old CPU s / it (pairs) | new CPU s / it (pairs) |")
print("|---|---|---|---|")
for s in STAGES:
    floor = min(r["n1000"]["cpu_floor_by_stage"][s] for r in old + new)

    def seconds(r, s=s):
        return r["n1000"]["cpu_untimed"] if s == "untimed" else r["n1000"]["cpu_stages"][s]

    print(
        f"| {s} | {floor:.2f} | "
        + ", ".join(f"{seconds(r):.2f} / {seconds(r) / floor:.2f}x" for r in old)
        + " | "
        + ", ".join(f"{seconds(r):.2f} / {seconds(r) / floor:.2f}x" for r in new)
        + " |"
    )
print()
print("Key agreement at n = 1000 over its floor (the process's own), old -> new (pairs):")
print(
    ", ".join(
        f"{o['n1000']['stage_over_floor']['key_agreement']:.2f}x -> "
        f"{w['n1000']['stage_over_floor']['key_agreement']:.2f}x"
        for o, w in zip(old, new, strict=False)
    )
)
print()
print("Each process against its own floor (full floor: with HKDF, Shamir, AEAD):")
print()
print("| pair | n | old CPU s | old / full floor | new CPU s | new / full floor |")
print("|---|---|---|---|---|---|")
for i, (o, w) in enumerate(zip(old, new, strict=False), 1):
    for n in ("n100", "n1000"):
        a, b = o[n], w[n]
        print(
            f"| {i} | {n[1:]} | {a['cpu_seconds']:.2f} | {a['ratio_to_full_floor']:.2f}x | "
            f"{b['cpu_seconds']:.2f} | {b['ratio_to_full_floor']:.2f}x |"
        )
print()
print("Encoding micro (d = 1e5, best of 5 x 100 calls, CPU us), old; new:")
print()
print("| pair | old draw / encode (x) | new draw / encode (x) | new, min and max given (x) |")
print("|---|---|---|---|")
for i, (o, w) in enumerate(zip(old, new, strict=False), 1):
    a, b = o["micro_us"], w["micro_us"]
    given = (
        f"{b['encode_input_bounds_given']:.0f} ({b['given_over_draw']:.2f}x)"
        if "given_over_draw" in b
        else "-"
    )
    print(
        f"| {i} | {a['rounding_draw']:.0f} / {a['encode_input']:.0f} ({a['encode_over_draw']:.2f}x)"
        f" | {b['rounding_draw']:.0f} / {b['encode_input']:.0f} ({b['encode_over_draw']:.2f}x)"
        f" | {given} |"
    )
