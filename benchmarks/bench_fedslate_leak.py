"""``securefed bench fedslate-leak``: FedSlate behind every fusion transport, leak against reward.

::

    securefed bench fedslate-leak                        # the shortened schedule recorded
    securefed bench fedslate-leak --quick                # a smoke run, a few minutes
    securefed bench fedslate-leak --parts rewards --jobs 2

Two parts, written together into ``--out`` (default ``results/fedslate_leak``) as
``fedslate_leak.json``, ``fedslate_leak.md`` and ``fedslate_leak.png``:

* **rewards**: for each setting (N candidates, slate n) and transport (plaintext; DP at each
  ``--epsilons``), one FedSlate run of ``--members`` seeds: A's and B's mean
  reward, optimal reward (best 100-episode moving average) and ETROR (first episode whose
  moving average reaches 99% of it); the cost (seconds per learning step, fusion bytes per
  learning step); epsilon per platform and unit (one user's episode). Plus the random policy and,
  at (10, 3), the plaintext run with ``shared_corpus=True`` (the paper's (10, 3) script).
  Runs are cached under ``<out>/runs/`` (:func:`securefed.bench.bench_fedslate.run_cell`:
  checkpointed, resumed, shared between invocations).
* **leak**: for each transport (and DP at each ``--leak-epsilons``), one short FedSlate run at
  (10, 3) whose channel keeps every exchange; the measures of
  :mod:`securefed.attacks.fedslate_leak` replayed from its view, each beside its chance
  baseline: the server's inference of a user's net kale exposure, the server's recovery of
  each platform's slate from its uploaded Q-values, and what B learns about A's user from the
  fused values it receives.
* **the encrypted rows** (part of **leak**): ``ckks`` and ``ckks+dp`` at each
  ``--ckks-epsilons`` run through the channel FedSlate uses under CKKS
  (:class:`~securefed.fusion.ckks_module.CKKSModuleFusionChannel`: the polynomial server
  activation, ``--ckks-members`` members, their own ``--ckks-episodes`` schedule), with the
  plaintext run of the same server activation and schedule beside them as their reference
  (``plaintext, polynomial server``); their rewards and cost also enter the (10, 3) rewards
  table, each row with its schedule.

A run of some parts keeps the other parts of an existing ``fedslate_leak.json`` in ``--out``
(so the encrypted rows can be added beside the recorded ones without rerunning them).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

from securefed.bench.bench_args import add_out_argument, add_seed_argument
from securefed.bench.registry import BENCHES
from securefed.bench.tables import markdown_table
from securefed.records import dumps_record

RESULTS = Path("results") / "fedslate_leak"
TRANSPORTS = ("plaintext", "dp", "ckks", "ckks+dp")
CKKS_SERVER_HIDDEN = (16,)
"""The encrypted rows' server network: one hidden layer (degree 2), as the 200-episode CKKS
run (docs/fedslate.md section 7: with two the flooding of the released sums is 9.9e6)."""
POLYNOMIAL_REFERENCE = "plaintext, polynomial server"
"""The encrypted rows' reference: plaintext fusion, their server activation and schedule."""


def _log(message: str) -> None:
    print(f"[fedslate-leak] {message}", file=sys.stderr, flush=True)


def _numbers(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v)


def _settings(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        n_cand, slate = part.split("x")
        out.append((int(n_cand), int(slate)))
    return out


def transport_rows(epsilons) -> list[tuple[str, str, float | None]]:
    """``(label, transport, epsilon)`` for the plaintext and DP rows of a table."""
    rows: list[tuple[str, str, float | None]] = [("plaintext", "plaintext", None)]
    rows += [(f"dp eps={e:g}", "dp", float(e)) for e in epsilons]
    return rows


def encrypted_rows(
    epsilons, transports=("plaintext", "ckks", "ckks+dp")
) -> list[tuple[str, str, float | None]]:
    """``(label, transport, epsilon)`` of the encrypted rows and their plaintext reference
    (of ``transports`` only)."""
    rows: list[tuple[str, str, float | None]] = [(POLYNOMIAL_REFERENCE, "plaintext", None)]
    rows.append(("ckks", "ckks", None))
    rows += [(f"ckks+dp eps={e:g}", "ckks+dp", float(e)) for e in epsilons]
    return [row for row in rows if row[1] in transports]


def schedule(args: argparse.Namespace, n_cand: int, slate: int) -> dict[str, object]:
    """The shortened schedule's FedSlate fields (recorded with every row)."""
    return {
        "num_candidates": n_cand,
        "slate_size": slate,
        "episodes": args.episodes,
        "members": args.members,
        "seed": args.seed,
        "burn_in": args.burn_in,
        "eps_decay": args.eps_decay,
    }


def refusal(config) -> str | None:
    """Why ``config``'s transport cannot serve its server network (``None``: it can)."""
    from securefed.fusion import fusion_refusal

    return fusion_refusal(config.fusion, config.fusion_needs())


# ------------------------------------------------------------------------------ rewards


def reward_cells(args: argparse.Namespace):
    """Per setting: ``{label: (Cell, refusal or None)}`` (the references' cells included)."""
    from securefed.bench.bench_fedslate import Cell
    from securefed.rl.fedslate import FedSlateConfig
    from securefed.rl.slateq import SlateQConfig

    out = {}
    for n_cand, slate in args.settings:
        tag = f"N{n_cand}_n{slate}"
        base = schedule(args, n_cand, slate)
        cells = {}
        for label, transport, epsilon in transport_rows(args.epsilons):
            config = FedSlateConfig(**base, fusion=transport, dp_epsilon=epsilon)
            name = f"{tag}_{label.replace(' eps=', '_eps').replace('+', '_')}"
            cells[label] = (Cell(name, "fedslate", config), refusal(config))
        for epsilon in args.old_dp_epsilons:
            # The pre-issue-34 mechanism: local networks on raw data (flagged: no epsilon).
            config = FedSlateConfig(
                **base, fusion="dp", dp_epsilon=float(epsilon), dp_local_training="none"
            )
            label = f"dp eps={epsilon:g}, non-private local networks (old)"
            cells[label] = (Cell(f"{tag}_dp_eps{epsilon:g}_oldlocal", "fedslate", config), None)
        for epsilon in args.joint_dp_epsilons:
            # Joint DP: each platform acts on its own clean values (no acting row released).
            clip = float(args.joint_dp_local_clip)
            config = FedSlateConfig(
                **base, fusion="dp", dp_epsilon=float(epsilon), dp_acting="own", dp_local_clip=clip
            )
            label = f"dp eps={epsilon:g}, joint: acting on own values"
            name = f"{tag}_dp_eps{epsilon:g}_joint"
            if clip != 1.0:
                label, name = f"{label}, local clip {clip:g}", f"{name}_clip{clip:g}"
            cells[label] = (Cell(name, "fedslate", config), None)
        if (n_cand, slate) == (10, 3) and args.shared_corpus:
            shared = FedSlateConfig(**base, shared_corpus=True)
            cells["plaintext, shared corpus"] = (Cell(f"{tag}_shared", "fedslate", shared), None)
        cells["random"] = (Cell(f"{tag}_random", "random", SlateQConfig(**base)), None)
        out[tag] = ((n_cand, slate), cells)
    return out


def reward_row(record: dict[str, object], kind: str) -> dict[str, object]:
    """A and B: mean reward, optimal reward, ETROR (mean and s.d. over members); cost."""
    from securefed.bench.bench_fedslate import metrics

    row: dict[str, object] = {}
    for p, name in enumerate("AB"):
        m = metrics(record, p)
        row[name] = {key: m[key] for key in ("mean", "optimal_reward", "etror", "final")}
    steps = int(record.get("learn_steps") or 0)
    learning = float(record.get("timings", {}).get("learning", 0.0))
    row["learn_steps"] = steps
    row["seconds"] = float(record["seconds"])
    row["seconds_per_learning_step"] = learning / steps if steps and kind == "fedslate" else None
    row["fusion_bytes"] = record.get("fusion_bytes")
    row["bytes_per_learning_step"] = record.get("bytes_per_learning_step")
    row["dp"] = record.get("dp")
    return row


def run_rewards(args: argparse.Namespace, out: Path) -> dict[str, object]:
    """Run (or read from the cache) every reward cell; the table's rows."""
    from securefed.bench.bench_fedslate import run_cell, run_missing

    table = reward_cells(args)
    runnable = [cell for _, cells in table.values() for cell, why in cells.values() if why is None]
    ran = run_missing(runnable, out, args.jobs)
    _log(f"rewards: {ran} runs executed, {len(runnable) - ran} read from the cache")
    rows = {}
    for tag, (setting, cells) in table.items():
        entries = {}
        for label, (cell, why) in cells.items():
            if why is not None:
                entries[label] = {"transport": cell.config.fusion, "refused": why}
                continue
            record = run_cell(cell, out)
            entries[label] = {"transport": getattr(cell.config, "fusion", cell.kind)}
            entries[label] |= reward_row(record, cell.kind)
        rows[tag] = {"setting": list(setting), "rows": entries}
    return rows


# ------------------------------------------------------------------------------ leak


def leak_config(
    args: argparse.Namespace, transport: str, epsilon: float | None, *, encrypted: bool = False
):
    """The short recorded run's configuration (10 candidates, slate 3); ``encrypted``: the
    encrypted rows' (the polynomial server activation, their members and episodes)."""
    from securefed.rl.fedslate import FedSlateConfig

    shape = {
        "episodes": args.leak_episodes,
        "members": args.leak_members,
        "burn_in": args.leak_burn_in,
    }
    if encrypted:
        shape = {
            "episodes": args.ckks_episodes,
            "members": args.ckks_members,
            "burn_in": args.ckks_burn_in,
            "steps_per_platform": args.ckks_steps,
            "server_activation": "polynomial",
            "server_hidden": CKKS_SERVER_HIDDEN,
        }
    return FedSlateConfig(
        **shape,
        eps_decay=0.99,
        seed=args.leak_seed,
        fusion=transport,
        dp_epsilon=epsilon,
    )


def leak_schedule(config) -> str:
    """A row's schedule in words."""
    server = config.server_hidden_activation
    hidden = "x".join(str(w) for w in config.server_hidden)
    return (
        f"{config.episodes} episodes x {config.steps_per_platform} steps, {config.members} "
        f"member(s), burn-in {config.burn_in}, seed {config.seed}, {server} server {hidden}"
    )


def run_leak(args: argparse.Namespace, out: Path) -> list[dict[str, object]]:
    """One recorded run per transport row, and every leak measure of its view (each row cached
    under ``<out>/leak_runs/`` by its configuration)."""
    rows = []
    plans = [(*row, False) for row in transport_rows(args.leak_epsilons)]
    if args.ckks_episodes:
        chosen = encrypted_rows(args.ckks_epsilons, args.ckks_transports)
        plans += [(*row, True) for row in chosen]
    for label, transport, epsilon, encrypted in plans:
        config = leak_config(args, transport, epsilon, encrypted=encrypted)
        why = refusal(config)
        if why is not None:
            rows.append({"label": label, "transport": transport, "refused": why})
            continue
        key = json.dumps(config.to_dict(), sort_keys=True, default=str)
        stem = label.replace(", ", "_").replace(" ", "_").replace("=", "")
        path = out / "leak_runs" / f"{stem}.json"
        cached = json.loads(path.read_text()) if path.exists() else {}
        if "key" in cached and json.loads(cached["key"]) == json.loads(key):
            rows.append(json.loads(path.read_text())["row"])
            continue
        row = leak_row(label, transport, config)
        path.parent.mkdir(parents=True, exist_ok=True)
        from securefed.attacks.verify import _jsonable

        path.write_text(dumps_record(_jsonable({"key": key, "row": row})))
        rows.append(row)
    return rows


def leak_row(label: str, transport: str, config) -> dict[str, object]:
    """Record one run with every payload and measure its leak."""
    import torch

    from securefed import ALL_PAYLOADS
    from securefed.attacks.fedslate_leak import measure_fedslate_leak
    from securefed.bench.bench_fedslate import _record
    from securefed.fusion import DP_CHANNELS
    from securefed.rl.fedslate import ENCRYPTED_FUSIONS, run_fedslate

    torch.set_num_threads(config.threads)
    started = time.perf_counter()
    cpu = time.process_time()
    tapped = config.fusion in DP_CHANNELS or config.fusion in ENCRYPTED_FUSIONS
    result = run_fedslate(config, keep_payloads=ALL_PAYLOADS, keep_clean=tapped)
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu
    report = measure_fedslate_leak(config, result)
    view = result.fusion_view
    dp = view.public.get("dp")
    row = {
        "label": label,
        "transport": transport,
        "schedule": leak_schedule(config),
        "epsilon": None if dp is None else dp["epsilon_spent"],
        "noise_std": None if dp is None else dp["noise_std_input"],
        "train_seconds": seconds,
        "mean_reward": {
            name: float(result.episode_rewards[:, :, p].mean()) for p, name in enumerate("AB")
        },
        "measures": report,
    }
    if config.server_hidden_activation == "polynomial":
        # The encrypted rows (and their reference) also fill the rewards table.
        key = json.dumps(config.to_dict(), sort_keys=True, default=str)
        row["reward"] = reward_row(_record(label, "fedslate", key, result), "fedslate")
        row["reward"]["cpu_seconds"] = cpu
        if dp is not None and "clamp_bounds" in dp and dp["clamp_bounds"]:
            row["clamp_rates"] = result_clamp_rates(result)
        if "ckks" in view.public:
            row["ckks"] = _ckks_public(view.public)
    server = report["server_nke"]
    _log(
        f"leak {label}: server nke R^2 {server['attack']:.2f} (chance {server['chance']:.2f}); "
        f"slate overlap A {report['server_slate']['A']['attack']:.2f} (chance "
        f"{report['server_slate']['A']['chance']:.2f}); B about A R^2 "
        f"{report['other_platform']['attack']:.2f} ({seconds:.0f} s)"
    )
    return row


def _ckks_public(public: dict[str, object]) -> dict[str, object]:
    keys = ("ckks", "value_bound", "grad_bound", "flooding", "polynomial_degree", "monomials")
    return {k: public[k] for k in keys if k in public}


def result_clamp_rates(result) -> dict[str, object] | None:
    """The clamp rates the run's DP channel reported (recorded in its view at the end)."""
    return result.fusion_view.public.get("dp", {}).get("clamp_rates")


def encrypted_reward_rows(leak: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    """The (10, 3) rewards table's rows taken from the encrypted leak runs and their
    reference (each with its schedule)."""
    out = {}
    for row in leak:
        if "reward" not in row:
            continue
        entry = {"transport": row["transport"], "schedule": row["schedule"]} | row["reward"]
        out[row["label"]] = entry
    return out


def merge_rewards(record: dict[str, object]) -> None:
    """Put the encrypted rows of ``record["leak"]`` into its (10, 3) rewards table (in place),
    replacing any earlier rows of those labels; the encrypted rows of an earlier record (refused
    ones, made before the CKKS channel served FedSlate) leave every table."""
    rows = encrypted_reward_rows(record.get("leak", []))
    for tag, table in record.get("rewards", {}).items():
        kept = {
            label: row
            for label, row in table["rows"].items()
            if label not in rows and not row["transport"].startswith("ckks")
        }
        table["rows"] = kept | (rows if tag == "N10_n3" else {})


# ------------------------------------------------------------------------------ output


def _f(value: object, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _ms(m: dict[str, object], digits: int = 1) -> str:
    return f"{m['mean']:.{digits}f} ± {m['std']:.{digits}f}"


def _clamp(rates: dict[str, dict[str, float]] | None) -> str:
    if not rates:
        return "n/a"
    return " / ".join(f"{rates[p].get('input', 0.0):.1e}" for p in sorted(rates))


def markdown(record: dict[str, object]) -> str:
    """The tables as markdown."""
    meta = record["meta"]
    lines = [
        "# FedSlate behind every fusion transport: leak against reward",
        "",
        f"{meta['machine']}; total {meta['seconds']:.0f} s. Schedule: {meta['schedule']}.",
        "Optimal reward = best 100-episode moving average of the per-platform episode reward; "
        "ETROR = first episode at which it reaches 99% of that run's optimal reward; mean ± s.d. "
        "over members (independent seeds). Epsilon: per platform and unit of privacy (one "
        "user's episode on that platform), at delta 1e-5, against the server and the other "
        "platform.",
        "",
    ]
    for table in record.get("rewards", {}).values():
        n_cand, slate = table["setting"]
        headers = [
            "transport",
            "epsilon",
            "A mean",
            "A optimal",
            "A ETROR",
            "B mean",
            "B optimal",
            "B ETROR",
            "s / learning step",
            "KiB / learning step",
            "schedule",
        ]
        body = []
        for label, row in table["rows"].items():
            if "refused" in row:
                body.append((label, f"refused: {row['refused']}"))
                continue
            a, b = row["A"], row["B"]
            eps = spent_epsilon(row)
            if eps is None and row.get("dp"):
                eps = "not established (rows only: {:.2f})".format(
                    row["dp"]["epsilon_fusion_rows_only"]["A"]
                )
            per_step = row.get("bytes_per_learning_step")
            body.append(
                (
                    label,
                    _f(eps, 2),
                    _ms(a["mean"]),
                    _ms(a["optimal_reward"]),
                    _ms(a["etror"], 0),
                    _ms(b["mean"]),
                    _ms(b["optimal_reward"]),
                    _ms(b["etror"], 0),
                    _f(row["seconds_per_learning_step"], 4),
                    _f(None if per_step is None else per_step / 1024, 1),
                    row.get("schedule", "the schedule above"),
                )
            )
        lines += [
            f"## Rewards and cost, N={n_cand}, n={slate}",
            "",
            markdown_table(headers, body),
            "",
        ]
    leak = record.get("leak")
    if leak:
        c = record["meta"]["leak_schedule"]
        lines += [
            f"## Leak measures (N=10, n=3; {c})",
            "",
            "Server, nke: R^2 of the ridge inference of a user's net kale exposure from the "
            "Q-values it received (chance: 0, the labelled users' mean). Server, ranking: the "
            "fraction of each platform's model ranking (the top n of its Q-values before noise) "
            "among the top n of its uploaded Q-values (chance: n / N); 'shown': the same guess "
            "against the slate shown in greedy rounds (under DP a post-processing of the noised "
            "rows). Other platform: R^2 of B's inference of A's private engagement history from "
            "the fused values B received and its own observation (chance: 0; B's own "
            "observation alone: the 'own' column). Epsilon per platform and user episode.",
            "",
            "Under ckks and ckks+dp the server holds ciphertexts only: its fit has constant "
            "features (the public schedule's), its ranking guess is a random n-subset; B's "
            "measure uses the fused values B decrypted. Clamp: ckks+dp's share of noised "
            "Q-value entries clamped to B = clip + 4 std (A / B).",
            "",
        ]
        headers = [
            "transport",
            "epsilon",
            "noise std",
            "server nke R^2",
            "server ranking A (chance)",
            "server ranking B",
            "shown A / B",
            "B about A R^2",
            "B own-only R^2",
            "A mean",
            "B mean",
            "clamp A / B",
            "schedule",
        ]
        body = []
        for row in leak:
            if "refused" in row:
                body.append((row["label"], f"refused: {row['refused']}"))
                continue
            m = row["measures"]
            eps = None if row["epsilon"] is None else row["epsilon"]["A"]
            sa, sb = m["server_slate"]["A"], m["server_slate"]["B"]
            body.append(
                (
                    row["label"],
                    _f(eps, 2),
                    _f(row["noise_std"], 2),
                    _f(m["server_nke"]["attack"], 2),
                    f"{_f(sa['attack'], 3)} ({_f(sa['chance'], 3)})",
                    _f(sb["attack"], 3),
                    f"{_f(sa['shown_greedy'], 3)} / {_f(sb['shown_greedy'], 3)}",
                    _f(m["other_platform"]["attack"], 2),
                    _f(m["other_platform"]["own"], 2),
                    _f(row["mean_reward"]["A"]),
                    _f(row["mean_reward"]["B"]),
                    _clamp(row.get("clamp_rates")),
                    row.get("schedule", c),
                )
            )
        lines += [markdown_table(headers, body), ""]
    return "\n".join(lines) + "\n"


def plot(record: dict[str, object], path: Path) -> Path | None:
    """Leak measures against epsilon (DP rows; plaintext at the right edge), and reward."""
    leak = [row for row in record.get("leak", []) if "refused" not in row]
    dp = [row for row in leak if row["transport"] == "dp"]
    plain = [row for row in leak if row["transport"] == "plaintext"]
    if not dp:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = [row["epsilon"]["A"] for row in dp]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series = {
        "server: nke R^2": lambda m: m["server_nke"]["attack"],
        "server: ranking A overlap - chance": lambda m: (
            m["server_slate"]["A"]["attack"] - m["server_slate"]["A"]["chance"]
        ),
        "B about A: R^2": lambda m: m["other_platform"]["attack"],
    }
    for name, get in series.items():
        line = axes[0].plot(eps, [get(row["measures"]) for row in dp], marker="o", label=name)
        if plain:
            axes[0].axhline(get(plain[0]["measures"]), ls=":", color=line[0].get_color())
    axes[0].set_xscale("log")
    axes[0].set_xlabel("epsilon per platform and user episode (dotted: plaintext)")
    axes[0].set_ylabel("leak measure (0 = chance)")
    axes[0].legend(fontsize=7)
    for tag, table in record.get("rewards", {}).items():
        rows = table["rows"]
        points = [
            (spent_epsilon(row), row["A"]["mean"]["mean"], row["B"]["mean"]["mean"])
            for row in rows.values()
            if "refused" not in row and spent_epsilon(row) is not None
        ]
        if not points:
            continue
        points.sort()
        line = axes[1].plot([p[0] for p in points], [p[1] for p in points], marker="o",
                            label=f"{tag} A")  # fmt: skip
        axes[1].plot([p[0] for p in points], [p[2] for p in points], marker="s", ls="--",
                     color=line[0].get_color(), label=f"{tag} B")  # fmt: skip
        if "plaintext" in rows and "refused" not in rows["plaintext"]:
            axes[1].axhline(rows["plaintext"]["A"]["mean"]["mean"], ls=":",
                            color=line[0].get_color())  # fmt: skip
    axes[1].set_xscale("log")
    axes[1].set_xlabel("epsilon (dotted: plaintext A)")
    axes[1].set_ylabel("mean episode reward over the run")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> dict[str, object]:
    """Run the chosen parts; write JSON, markdown and the plot into ``args.out``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    existing = out / "fedslate_leak.json"
    record: dict[str, object] = json.loads(existing.read_text()) if existing.exists() else {}
    before = dict(record.get("meta", {}))
    if "rewards" in args.parts:
        record["rewards"] = run_rewards(args, out)
    if "leak" in args.parts:
        record["leak"] = run_leak(args, out)
    merge_rewards(record)
    record["meta"] = before | {
        "seconds": time.perf_counter() - started,
        "machine": f"{platform.machine()} {platform.system()}, Python "
        f"{platform.python_version()}, torch threads 1, {args.jobs} worker process(es)",
        "schedule": f"{args.episodes} episodes (the paper's: 5000), burn-in {args.burn_in} "
        f"rounds, exploration x{args.eps_decay} per round, {args.members} members, seed "
        f"{args.seed}",
        "leak_schedule": f"{args.leak_episodes} episodes, burn-in {args.leak_burn_in} rounds, "
        f"exploration x0.99 per round, {args.leak_members} members, seed {args.leak_seed}",
        "parts": list(args.parts),
    }
    if "rewards" not in args.parts and "schedule" in before:
        record["meta"]["schedule"] = before["schedule"]  # the rewards kept are that schedule's
    from securefed.attacks.verify import _jsonable

    (out / "fedslate_leak.json").write_text(dumps_record(_jsonable(record), indent=1))
    (out / "fedslate_leak.md").write_text(markdown(record))
    png = plot(record, out / "fedslate_leak.png")
    print(markdown(record))
    if png:
        print(f"plot: {png}")
    return record


def spent_epsilon(row: dict[str, object]) -> float | None:
    """Platform A's epsilon spent as the row's ledger records it (``None``: no DP, or not
    established: the local networks trained on raw data)."""
    dp = row.get("dp")
    return None if not dp else dp["epsilon_spent"]["A"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_out_argument(parser, RESULTS)
    parser.add_argument("--parts", default="rewards,leak", help="rewards, leak or both")
    parser.add_argument(
        "--settings",
        type=_settings,
        default=[(10, 3), (100, 10)],
        help="N,n settings of the reward rows, e.g. 10x3,100x10",
    )
    parser.add_argument(
        "--epsilons",
        type=_numbers,
        default=(1.0, 4.0, 16.0),
        help="comma-separated DP epsilons of the reward rows",
    )
    parser.add_argument(
        "--old-dp-epsilons",
        type=_numbers,
        default=(),
        help="comma-separated epsilons of reward rows under the pre-issue-34 mechanism (local "
        "networks trained on raw data; their epsilon is not established), for old beside new",
    )
    parser.add_argument(
        "--joint-dp-epsilons",
        type=_numbers,
        default=(),
        help="comma-separated epsilons of reward rows under joint DP (dp_acting='own': each "
        "platform acts on its own clean values; no acting row leaves it)",
    )
    parser.add_argument(
        "--joint-dp-local-clip",
        type=float,
        default=1.0,
        help="dp_local_clip of the joint-DP rows (one unit's gradient bound in the local DP-SGD)",
    )
    parser.add_argument("--episodes", type=int, default=200, help="episodes per reward run")
    parser.add_argument("--members", type=int, default=3, help="deployments per reward run")
    add_seed_argument(parser)
    parser.add_argument("--burn-in", type=int, default=1000, help="rounds before learning")
    parser.add_argument("--eps-decay", type=float, default=0.9995, help="exploration per round")
    parser.add_argument(
        "--shared-corpus",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="at (10, 3), also the plaintext run with shared_corpus=True (the paper's script)",
    )
    parser.add_argument(
        "--leak-epsilons",
        type=_numbers,
        default=(1.0, 4.0, 16.0, 1e3, 1e5, 1e7),
        help="comma-separated DP epsilons of the leak rows",
    )
    parser.add_argument("--leak-episodes", type=int, default=40, help="episodes per leak run")
    parser.add_argument("--leak-members", type=int, default=3, help="deployments per leak run")
    parser.add_argument(
        "--leak-burn-in", type=int, default=300, help="rounds before learning in the leak runs"
    )
    parser.add_argument(
        "--leak-seed",
        type=int,
        default=3,
        help="seed of the leak runs (reproducible, not private: a benchmark)",
    )
    parser.add_argument(
        "--ckks-episodes", type=int, default=40, help="the encrypted rows' episodes (0: none)"
    )
    parser.add_argument("--ckks-members", type=int, default=1, help="deployments per encrypted run")
    parser.add_argument(
        "--ckks-steps", type=int, default=10, help="the encrypted rows' steps per platform"
    )
    parser.add_argument(
        "--ckks-burn-in", type=int, default=100, help="rounds before learning in the encrypted runs"
    )
    parser.add_argument(
        "--ckks-epsilons",
        type=_numbers,
        default=(1.0, 4.0, 16.0),
        help="comma-separated DP epsilons of the encrypted (ckks+dp) rows",
    )
    parser.add_argument(
        "--ckks-transports",
        type=lambda text: tuple(t for t in text.split(",") if t),
        default=("plaintext", "ckks", "ckks+dp"),
        help="which encrypted rows (and the plaintext reference) run",
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes for reward runs")
    parser.add_argument("--quick", action="store_true", help="a smoke run (minutes)")


def _finish(args: argparse.Namespace) -> argparse.Namespace:
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if not parts or set(parts) - {"rewards", "leak"}:
        raise ValueError(f"--parts takes rewards and/or leak, got {args.parts!r}")
    args.parts = parts
    if args.jobs < 1 or args.episodes < 1 or args.leak_episodes < 6:
        raise ValueError("need --jobs >= 1, --episodes >= 1 and --leak-episodes >= 6")
    if any(not (math.isfinite(e) and e > 0) for e in (*args.epsilons, *args.leak_epsilons)):
        raise ValueError("epsilons must be finite and > 0")
    if args.ckks_episodes and (args.ckks_episodes < 6 or args.ckks_members < 1):
        raise ValueError("need --ckks-episodes >= 6 (or 0) and --ckks-members >= 1")
    if args.quick:
        args.settings, args.episodes, args.members = [(10, 3)], 120, 2
        args.burn_in, args.epsilons = 300, (4.0,)
        args.leak_episodes, args.leak_members, args.leak_epsilons = 8, 2, (4.0, 1024.0)
        args.ckks_episodes, args.ckks_epsilons = 0, ()
    return args


def _run_cli(args: argparse.Namespace) -> int:
    run(_finish(args))
    return 0


def register(benches) -> None:
    """Add ``fedslate-leak`` to the ``securefed bench`` subcommands."""
    parser = BENCHES["fedslate-leak"].add_to(benches)
    add_arguments(parser)
    parser.set_defaults(func=_run_cli)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return _run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "POLYNOMIAL_REFERENCE",
    "TRANSPORTS",
    "encrypted_rows",
    "markdown",
    "merge_rewards",
    "reward_cells",
    "run",
    "transport_rows",
]
