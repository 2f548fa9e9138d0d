"""FedSlate's tables on the multi-platform choc-vs-kale simulator (``securefed bench fedslate``).

Run from the repository root::

    securefed bench fedslate                                  # the paper's table, 5000 episodes
    securefed bench fedslate --episodes 2000 --members 3      # reduced
    securefed bench fedslate --experiments table,ablation,sparse,platforms,choice,corpus
    python -m securefed.bench.bench_fedslate --quick               # smoke run, about a minute

Experiments (each run is cached as JSON under ``<out>/runs/``; a run whose configuration is
already cached, under any name, is reused, so an interrupted benchmark resumes and experiments
share their common runs; a learning run also checkpoints every 100 episodes under
``<out>/runs/partial/`` and resumes mid-run; ``--jobs 2`` runs the uncached runs in two worker
processes, dearest first):

* ``table``: settings (N candidates, slate n) in {(10, 3), (100, 10), (500, 10)}: random and
  highest-k-first references (and A highest-k with B random or lowest-k: the coupling of the
  platforms through the shared user), SlateQ (platform A learns alone, B random) and FedSlate
  (A with feedback, B without), ``--members`` independent seeds each.
* ``ablation``: the linear server network and FedQ (no cross-platform fusion) against FedSlate.
* ``ablation_flat``: the linear server against the non-linear one in the paper's flat server
  architecture (an MLP on the whole concatenated Q-value vector).
* ``sparse``: "sparse team reward" (feedback revealed on 10% of steps): FedSlate against the
  extended variant (paper Algorithm 4).
* ``platforms``: K = 5, all with feedback and two without (position- and item-aligned),
  against SlateQ on each platform.
* ``choice``: FedSlate with the paper code's choice model instead of the environment's.
* ``corpus``: FedSlate with identical corpora on A and B (the paper script's defect).
* ``alignment``: FedSlate with item-aligned fusion (``alignment="item"``: the other platforms'
  networks evaluated on the fused platform's candidates) against the paper's position-aligned
  fusion, with the random and highest-k references.
* ``sizes``: the default networks against larger ones, the paper's flat architecture, Mish, a
  smaller learning rate and a wider server.

``--runs slateq_all,fedslate_two_without_item,random`` runs only the named runs of the variant
experiments (their names in the report), for a long schedule that cannot afford them all.

``--transport dp --epsilon 4`` (and the other DP options of ``securefed fedslate``) puts every
FedSlate run behind that fusion channel (cache names get a suffix, e.g. ``_dp_eps4``); the
references and SlateQ, which have no server, are unchanged.

Metrics (docs/fedslate.md): per-platform episode reward; optimal reward = best 100-episode moving
average; ETROR = first episode at which the 100-episode moving average reaches 99% of that run's
optimal reward; final = mean of the last 500 episodes. Outputs: ``<out>/fedslate.json``,
``<out>/fedslate.md`` and learning-curve PNGs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform as platform_mod
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from securefed.bench.bench_args import add_seed_argument
from securefed.bench.cli_fedslate import add_transport_arguments, transport_fields
from securefed.bench.processes import map_in_processes
from securefed.bench.registry import BENCHES
from securefed.bench.tables import markdown_table
from securefed.records import dumps_record, loads_record
from securefed.rl.checkpoint import EpisodeCheckpoints
from securefed.rl.fedslate import (
    PLATFORM_NAMES,
    REFERENCE_POLICIES,
    FedSlateConfig,
    etror,
    moving_average,
    optimal_reward,
    run_fedslate,
    run_reference,
)
from securefed.rl.slateq import RunResult, SlateQConfig, run_slateq

SETTINGS = ((10, 3), (100, 10), (500, 10))
EXPERIMENTS = (
    "table",
    "ablation",
    "ablation_flat",
    "sparse",
    "platforms",
    "choice",
    "corpus",
    "alignment",
    "sizes",
)
SPARSE_PROB = 0.1
WINDOW = 100
# Fixed-policy references run this many episodes side by side (securefed.rl.fedslate.run_reference).
REFERENCE_EPISODES_AT_ONCE = 100
# Learning runs checkpoint under <out>/runs/partial/ this often (episodes) and resume from there.
CHECKPOINT_EVERY = 100
# "Platforms without feedback reach SlateQ-level rewards" (the paper's five-platform claim):
# their final mean at least this fraction of SlateQ's with feedback on the same platform.
SLATEQ_LEVEL = 0.99


# --------------------------------------------------------------------------------------------
# Runs, cached


def _config_key(config: SlateQConfig, kind: str, reference: bool = False) -> str:
    fields = config.to_dict() | {"kind": kind}
    fields.pop("log_every", None)
    if reference:
        fields["episodes_at_once"] = REFERENCE_EPISODES_AT_ONCE
    return json.dumps(fields, sort_keys=True, default=str)


def _same_configuration(
    stored_key: str, config: SlateQConfig, kind: str, reference: bool = False
) -> bool:
    """Whether a cached run's key describes ``config``: equal, or equal but for fields added to
    the configuration after the run was recorded that hold their default value."""
    wanted = json.loads(_config_key(config, kind, reference))
    stored = json.loads(stored_key)
    if not set(stored) <= set(wanted):
        return False
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(config)
        if f.default is not dataclasses.MISSING
    }
    for name, value in wanted.items():
        if name in stored:
            if stored[name] != value:
                return False
        elif name not in defaults or json.loads(json.dumps(defaults[name], default=str)) != value:
            return False
    return True


@dataclass(frozen=True)
class Cell:
    """One run of the benchmark: its cache name, its kind and its configuration.

    ``kind``: ``"fedslate"`` (any FedSlate variant), ``"slateq"``, or a
    :func:`~securefed.rl.fedslate.run_reference` policy (``"random"``, ``"highest_k"``,
    ``"highest_k+lowest_k"``, ...).
    """

    name: str
    kind: str
    config: SlateQConfig

    @property
    def is_reference(self) -> bool:
        return self.kind in REFERENCE_POLICIES or "+" in self.kind

    @property
    def key(self) -> str:
        return _config_key(self.config, self.kind, self.is_reference)

    def cost(self) -> float:
        """A rough relative cost, to start the dearest runs first."""
        c = self.config
        per_step = {"fedslate": 4.0, "slateq": 2.0}.get(self.kind, 0.02)
        if getattr(c, "alignment", "position") == "item":
            per_step *= 1.5
        size = c.members * c.num_platforms * (1 + c.num_candidates / 100)
        return c.episodes * per_step * size


_STORED_KEYS: dict[tuple[Path, int, int], str] = {}


def _stored_key(path: Path) -> str:
    """The configuration key of the record at ``path``, parsed once per file version (every
    cell looks through every cached record, and a record holds thousands of rewards)."""
    stat = path.stat()
    version = (path, stat.st_mtime_ns, stat.st_size)
    if version not in _STORED_KEYS:
        _STORED_KEYS[version] = json.loads(path.read_text())["key"]
    return _STORED_KEYS[version]


def cached_record(cell: Cell, out_dir: Path) -> dict[str, object] | None:
    """The cached record of ``cell`` (its own file, else any run of the same configuration)."""
    path = out_dir / "runs" / f"{cell.name}.json"
    if not path.parent.exists():
        return None
    others = sorted(p for p in path.parent.glob("*.json") if p != path)
    for candidate in [path, *others]:
        if candidate.exists() and _same_configuration(
            _stored_key(candidate), cell.config, cell.kind, cell.is_reference
        ):
            return loads_record(candidate.read_text())
    return None


def run_cell(cell: Cell, out_dir: Path, *, force: bool = False) -> dict[str, object]:
    """Run (or load from ``out_dir/runs/<name>.json``) one cell; returns its record: config,
    episode rewards ``[episode][member][platform]``, timings.

    References run :data:`REFERENCE_EPISODES_AT_ONCE` episodes side by side (a fixed policy's
    episodes are independent draws; :func:`~securefed.rl.fedslate.run_reference`).
    """
    if not force:
        record = cached_record(cell, out_dir)
        if record is not None:
            return record
    print(f"[fedslate bench] running {cell.name} ({cell.kind})", file=sys.stderr, flush=True)
    import torch

    config = cell.config
    # The runs set no global state: this process (the bench's, or a worker's) takes the
    # configuration's torch threads (one: the records' "torch threads 1").
    torch.set_num_threads(config.threads)
    partial = out_dir / "runs" / "partial" / f"{cell.name}.pt"
    checkpoints = EpisodeCheckpoints(partial, every=CHECKPOINT_EVERY)
    if cell.kind == "fedslate":
        result = run_fedslate(config, checkpoints=checkpoints)
    elif cell.kind == "slateq":
        result = run_slateq(config, checkpoints=checkpoints)
    elif cell.is_reference:
        result = run_reference(
            config, cell.kind, users=config.members, episodes_at_once=REFERENCE_EPISODES_AT_ONCE
        )
    else:
        raise ValueError(f"unknown run kind {cell.kind!r}")
    record = _record(cell.name, cell.kind, cell.key, result)
    path = out_dir / "runs" / f"{cell.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_record(record))
    partial.unlink(missing_ok=True)  # the record is the cache now
    return record


def _run_uncached(cell: Cell, out_dir: Path) -> float:
    """Worker-process body: run one cell into the cache; returns its seconds."""
    return float(run_cell(cell, out_dir)["seconds"])


def run_missing(cells: list[Cell], out_dir: Path, jobs: int) -> int:
    """Run every cell without a cached record in ``jobs`` processes (dearest first); returns how
    many ran. Cells of the same configuration run once."""
    missing: dict[str, Cell] = {}
    for cell in cells:
        if cell.key not in missing and cached_record(cell, out_dir) is None:
            missing[cell.key] = cell
    todo = sorted(missing.values(), key=Cell.cost, reverse=True)
    if jobs > 1 and len(todo) > 1:
        map_in_processes(_run_uncached, [(cell, out_dir) for cell in todo], jobs)
    else:
        for cell in todo:
            run_cell(cell, out_dir)
    return len(todo)


def _record(name: str, kind: str, key: str, result: RunResult) -> dict[str, object]:
    record = {"name": name, "kind": kind, "key": key} | result.to_record()
    view = result.fusion_view
    if view is not None:
        record |= fusion_costs(view, result.learn_steps)
        if "dp" in view.public:
            record["dp"] = view.public["dp"]  # the mechanism and the epsilon spent
    return record


def fusion_costs(view, learn_steps: int) -> dict[str, object]:
    """Bytes the fusion channel carried: in all (up, down), and per learning step (a learning
    round's bytes beyond the mean of the rounds without learning, which hold only the acting
    inquiry, over the learning steps)."""
    ledger = view.ledger()
    per_round = ledger["bytes_up"].sum(axis=1) + ledger["bytes_down"].sum(axis=1)
    learning = ledger["backwards"] > 0
    acting = float(per_round[~learning].mean()) if (~learning).any() else 0.0
    extra = float((per_round[learning] - acting).sum())
    return {
        "fusion_bytes": list(view.total_bytes()),
        "bytes_per_learning_step": extra / learn_steps if learn_steps else None,
    }


def metrics(record: dict[str, object], platform: int) -> dict[str, object]:
    """Optimal reward, ETROR, final and overall mean of one platform, per member and summary."""
    rewards = np.asarray(record["rewards"])[:, :, platform]
    episodes = rewards.shape[0]
    window = min(WINDOW, episodes)
    per = {
        "optimal_reward": [optimal_reward(rewards[:, s], window) for s in range(rewards.shape[1])],
        "etror": [etror(rewards[:, s], window) for s in range(rewards.shape[1])],
        "final": [float(rewards[-min(500, episodes) :, s].mean()) for s in range(rewards.shape[1])],
        "mean": [float(rewards[:, s].mean()) for s in range(rewards.shape[1])],
    }
    out: dict[str, object] = {"per_member": per}
    for key, values in per.items():
        arr = np.asarray(values, dtype=float)
        out[key] = {
            "mean": float(arr.mean()),
            "std": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0,
        }
    return out


# --------------------------------------------------------------------------------------------
# Experiments


def _base(args: argparse.Namespace, n_cand: int, slate: int, **changes) -> dict[str, object]:
    return {
        "num_candidates": n_cand,
        "slate_size": slate,
        "episodes": args.episodes,
        "members": args.members,
        "seed": args.seed,
        "log_every": args.log_every,
    } | changes


def _fed(args: argparse.Namespace, fields: dict[str, object]) -> FedSlateConfig:
    """A FedSlate cell's configuration behind the bench's transport (``--transport``)."""
    return FedSlateConfig(**fields, **args.transport)


def table_cells(args) -> dict[str, tuple[tuple[int, int], dict[str, Cell]]]:
    """The paper's table: per setting, the references, SlateQ and FedSlate."""
    out = {}
    for n_cand, slate in args.settings:
        tag = f"N{n_cand}_n{slate}"
        base = _base(args, n_cand, slate)
        plain = SlateQConfig(**base)
        out[tag] = (
            (n_cand, slate),
            {
                "random": Cell(f"{tag}_random", "random", plain),
                "highest_k": Cell(f"{tag}_highest_k", "highest_k", plain),
                # How B's slates move A's reward through the shared user (spec section 1).
                "A_highest_k+B_random": Cell(f"{tag}_hk_random", "highest_k+random", plain),
                "A_highest_k+B_lowest_k": Cell(f"{tag}_hk_lk", "highest_k+lowest_k", plain),
                "slateq": Cell(f"{tag}_slateq", "slateq", plain),
                "fedslate": Cell(
                    f"{tag}_fedslate{args.transport_suffix}", "fedslate", _fed(args, base)
                ),
            },
        )
    return out


def experiment_table(args, out_dir: Path) -> dict[str, object]:
    rows = {}
    for tag, (setting, specs) in table_cells(args).items():
        cells = {label: run_cell(cell, out_dir) for label, cell in specs.items()}
        rows[tag] = {
            "setting": list(setting),
            "cells": {k: {p: metrics(v, i) for i, p in enumerate("AB")} for k, v in cells.items()},
            "episodes_per_second": {k: cells[k]["episodes_per_second"] for k in cells},
            "seconds": {k: cells[k]["seconds"] for k in cells},
            "records": cells,
        }
    return rows


def variant_cells(args, experiment: str) -> tuple[tuple[int, int], dict[str, Cell]]:
    """The cells of one experiment beyond the table (module docstring)."""
    n_cand, slate = args.ablation_setting
    tag = f"N{n_cand}_n{slate}"
    base = _base(args, n_cand, slate, episodes=args.variant_episodes or args.episodes)
    runs: dict[str, tuple[str, SlateQConfig]] = {}
    if experiment == "ablation":
        runs = {
            "fedslate": ("fedslate", _fed(args, base)),
            "linear": ("fedslate", _fed(args, base | {"variant": "linear"})),
            "fedq": ("fedslate", _fed(args, base | {"variant": "fedq"})),
            "random": ("random", SlateQConfig(**base)),
        }
    elif experiment == "ablation_flat":
        # The paper's server architecture (an MLP on the whole [Q_own, Q_other] vector), where
        # the paper reports that a linear server "never converges".
        flat = base | {"server_arch": "flat"}
        runs = {
            "fedslate_flat": ("fedslate", _fed(args, flat)),
            "linear_flat": ("fedslate", _fed(args, flat | {"variant": "linear"})),
            "random": ("random", SlateQConfig(**base)),
        }
    elif experiment == "sparse":
        sparse = base | {"feedback_prob": SPARSE_PROB}
        runs = {
            "fedslate": ("fedslate", _fed(args, sparse)),
            "extended": ("fedslate", _fed(args, sparse | {"variant": "extended"})),
            "slateq": ("slateq", SlateQConfig(**sparse)),
            "random": ("random", SlateQConfig(**base)),
        }
    elif experiment == "platforms":
        k5 = base | {"num_platforms": 5, "episodes": args.platform_episodes}
        all_fb = (True,) * 5
        two_without = (True, True, True, False, False)
        runs = {
            "fedslate_all": ("fedslate", _fed(args, k5 | {"feedback": all_fb})),
            "fedslate_two_without": ("fedslate", _fed(args, k5 | {"feedback": two_without})),
            "fedslate_two_without_item": (
                "fedslate",
                _fed(args, k5 | {"feedback": two_without, "alignment": "item"}),
            ),
            "slateq_all": ("slateq", SlateQConfig(**k5, feedback=all_fb)),
            "random": ("random", SlateQConfig(**k5)),
        }
    elif experiment == "choice":
        runs = {
            "fedslate": ("fedslate", _fed(args, base)),
            "fedslate_paper_code": ("fedslate", _fed(args, base | {"choice_model": "paper_code"})),
            "slateq_paper_code": ("slateq", SlateQConfig(**base, choice_model="paper_code")),
            "random": ("random", SlateQConfig(**base)),
        }
    elif experiment == "corpus":
        runs = {
            "fedslate": ("fedslate", _fed(args, base)),
            "fedslate_shared": ("fedslate", _fed(args, base | {"shared_corpus": True})),
            "random": ("random", SlateQConfig(**base)),
        }
    elif experiment == "alignment":
        runs = {
            "fedslate": ("fedslate", _fed(args, base)),
            "fedslate_item": ("fedslate", _fed(args, base | {"alignment": "item"})),
            "highest_k": ("highest_k", SlateQConfig(**base)),
            "random": ("random", SlateQConfig(**base)),
        }
    elif experiment == "sizes":
        n_cand, slate = args.sizes_setting
        tag = f"N{n_cand}_n{slate}"
        base = _base(args, n_cand, slate, episodes=args.sizes_episodes)
        runs = {
            "slateq": ("slateq", SlateQConfig(**base)),
            "slateq_large": ("slateq", SlateQConfig(**base, local_hidden=(256, 256, 256))),
            "slateq_flat_256": (
                "slateq",
                SlateQConfig(**base, local_arch="flat", local_hidden=(256, 256)),
            ),
            "slateq_mish": ("slateq", SlateQConfig(**base, activation="mish")),
            "slateq_lr3e-4": ("slateq", SlateQConfig(**base, lr=3e-4)),
            "fedslate": ("fedslate", _fed(args, base)),
            "fedslate_server_64": ("fedslate", _fed(args, base | {"server_hidden": (64, 64)})),
            "random": ("random", SlateQConfig(**base)),
        }
    else:
        raise ValueError(f"unknown experiment {experiment!r}")
    suffix = {"fedslate": args.transport_suffix}
    return (n_cand, slate), {
        name: Cell(f"{experiment}_{tag}_{name}{suffix.get(kind, '')}", kind, config)
        for name, (kind, config) in runs.items()
        if args.runs is None or name in args.runs
    }


def experiment_variants(args, out_dir: Path, experiment: str) -> dict[str, object]:
    (n_cand, slate), specs = variant_cells(args, experiment)
    cells = {name: run_cell(cell, out_dir) for name, cell in specs.items()}
    rewards = np.asarray(next(iter(cells.values()))["rewards"])  # [episode][member][platform]
    episodes, k_plat = rewards.shape[0], rewards.shape[2]
    return {
        "setting": [n_cand, slate],
        "episodes": episodes,
        "cells": {
            name: {PLATFORM_NAMES[p]: metrics(rec, p) for p in range(k_plat)}
            for name, rec in cells.items()
        },
        "episodes_per_second": {k: cells[k]["episodes_per_second"] for k in cells},
        "records": cells,
    }


# --------------------------------------------------------------------------------------------
# Report


def _fmt(m: dict[str, object], key: str, digits: int = 1) -> str:
    return f"{m[key]['mean']:.{digits}f} ± {m[key]['std']:.{digits}f}"


def checks(results: dict[str, object]) -> list[str]:
    """The issue's acceptance statements, each PASS/FAIL with the numbers behind it."""
    lines = []
    table = results.get("table", {})
    etror_wins = 0
    for tag, row in table.items():
        cells = row["cells"]
        random_mean = cells["random"]["B"]["mean"]["mean"]
        b_opt = cells["fedslate"]["B"]["optimal_reward"]["mean"]
        ratio = b_opt / random_mean
        lines.append(
            f"{'PASS' if ratio >= 1.15 else 'FAIL'} {tag}: FedSlate B optimal reward {b_opt:.1f} "
            f"= {ratio:.3f} x random mean {random_mean:.1f} (needs >= 1.15)"
        )
        e_fed = cells["fedslate"]["A"]["etror"]["mean"]
        e_sq = cells["slateq"]["A"]["etror"]["mean"]
        etror_wins += e_fed <= e_sq
        lines.append(f"     {tag}: ETROR A FedSlate {e_fed:.0f} vs SlateQ {e_sq:.0f}")
    if table:
        lines.append(
            f"{'PASS' if etror_wins >= 2 else 'FAIL'} FedSlate ETROR(A) <= SlateQ's in "
            f"{etror_wins} of {len(table)} settings (needs >= 2)"
        )

    def cells_of(experiment: str, *names: str) -> dict[str, object] | None:
        # None when the experiment, or one of the runs a check compares, was not run (--runs).
        cells = results.get(experiment, {}).get("cells", {})
        return cells if all(name in cells for name in names) else None

    ablations = {
        "ablation": ("fedslate", "linear"),
        "ablation_flat": ("fedslate_flat", "linear_flat"),
    }
    for experiment, (full, linear) in ablations.items():
        if (cells := cells_of(experiment, full, linear)) is None:
            continue
        for p in "AB":
            fed, lin = cells[full][p]["final"]["mean"], cells[linear][p]["final"]["mean"]
            lines.append(
                f"{'PASS' if lin < fed - 20 else 'FAIL'} {experiment}: {linear} final {p} "
                f"{lin:.1f} vs {full} {fed:.1f} (clearly worse: > 20 below)"
            )
    if (cells := cells_of("alignment", "random")) is not None:
        random_mean = cells["random"]["B"]["mean"]["mean"]
        for name in ("fedslate", "fedslate_item"):
            if name not in cells:
                continue
            b_opt = cells[name]["B"]["optimal_reward"]["mean"]
            lines.append(
                f"     alignment: {name} B optimal reward {b_opt:.1f} = "
                f"{b_opt / random_mean:.3f} x random mean {random_mean:.1f}"
            )
    if (cells := cells_of("sparse", "fedslate", "extended")) is not None:
        for p in "AB":
            org = cells["fedslate"][p]["optimal_reward"]["mean"]
            ext = cells["extended"][p]["optimal_reward"]["mean"]
            lines.append(
                f"{'PASS' if ext > org else 'FAIL'} sparse team reward: extended optimal {p} "
                f"{ext:.1f} vs original {org:.1f}"
            )
    for name in ("fedslate_two_without", "fedslate_two_without_item"):
        if (cells := cells_of("platforms", name, "slateq_all")) is None:
            continue
        for p in "DE":  # the platforms without feedback
            own, slateq = cells[name][p]["final"]["mean"], cells["slateq_all"][p]["final"]["mean"]
            lines.append(
                f"{'PASS' if own >= SLATEQ_LEVEL * slateq else 'FAIL'} platforms: {name} final "
                f"{p} (no feedback) {own:.1f} vs SlateQ with feedback {slateq:.1f} "
                f"(SlateQ level: >= {SLATEQ_LEVEL:.0%} of it)"
            )
    return lines


def _table_markdown(title: str, cells: dict[str, dict[str, object]]) -> list[str]:
    body = [
        (
            name,
            p,
            _fmt(m, "optimal_reward"),
            _fmt(m, "etror", 0),
            _fmt(m, "final"),
            _fmt(m, "mean"),
        )
        for name, per_platform in cells.items()
        for p, m in per_platform.items()
    ]
    headers = ("run", "platform", "optimal reward", "ETROR", "final (last 500)", "mean")
    return [f"### {title}", "", markdown_table(headers, body), ""]


def markdown(results: dict[str, object], meta: dict[str, object]) -> str:
    lines = [
        "# FedSlate on the multi-platform choc-vs-kale simulator",
        "",
        f"Episodes {meta['episodes']} (the table's; each experiment says its own), "
        f"members (independent seeds) {meta['members']}, "
        f"seed {meta['seed']}; {meta['machine']}; {meta['jobs']} worker process(es); "
        f"wall time {meta['seconds']:.0f} s ({meta['runs_executed']} runs executed, "
        f"{meta['runs_cached']} read from the cache).",
        "Optimal reward = best 100-episode moving average of the per-platform episode reward; "
        "ETROR = first episode at which that moving average reaches 99% of the run's optimal "
        "reward; final = mean of the last 500 episodes; mean ± std over members.",
        "",
        "## Checks",
        "",
        *[f"    {line}" for line in checks(results)],
        "",
    ]
    for row in results.get("table", {}).values():
        lines += _table_markdown(
            f"Table: N={row['setting'][0]}, n={row['setting'][1]}", row["cells"]
        )
        speed = ", ".join(f"{k} {v:.2f}" for k, v in row["episodes_per_second"].items())
        lines += [f"Episodes per second (all members together): {speed}", ""]
    for name in EXPERIMENTS[1:]:
        if name in results:
            row = results[name]
            lines += _table_markdown(
                f"{name}: N={row['setting'][0]}, n={row['setting'][1]}, {row['episodes']} episodes",
                row["cells"],
            )
    return "\n".join(lines)


def plot(results: dict[str, object], path: Path) -> Path | None:
    """Learning curves (100-episode moving averages), one panel per table setting/experiment."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = [
        (f"N={r['setting'][0]}, n={r['setting'][1]}", r) for r in results.get("table", {}).values()
    ]
    panels += [(name, results[name]) for name in EXPERIMENTS[1:] if name in results]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, row) in zip(axes[0], panels, strict=True):
        for name, rec in row["records"].items():
            rewards = np.asarray(rec["rewards"])
            window = min(WINDOW, rewards.shape[0])
            for p in range(rewards.shape[2]):
                if (rec["kind"] in REFERENCE_POLICIES or "+" in rec["kind"]) and p > 0:
                    continue
                curve = np.mean(
                    [moving_average(rewards[:, s, p], window) for s in range(rewards.shape[1])],
                    axis=0,
                )
                ax.plot(
                    np.arange(window, rewards.shape[0] + 1),
                    curve,
                    label=f"{name} {PLATFORM_NAMES[p]}",
                    lw=1,
                )
        ax.set_title(title)
        ax.set_xlabel("episode")
        ax.set_ylabel("episode reward (100-episode MA)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> dict[str, object]:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cells: list[Cell] = []
    for name in args.experiments:
        if name == "table":
            cells += [c for _, specs in table_cells(args).values() for c in specs.values()]
        else:
            cells += list(variant_cells(args, name)[1].values())
    ran = run_missing(cells, out_dir, args.jobs)
    results: dict[str, object] = {}
    for name in args.experiments:
        if name == "table":
            results["table"] = experiment_table(args, out_dir)
        else:
            results[name] = experiment_variants(args, out_dir, name)
    meta = {
        "episodes": args.episodes,
        "members": args.members,
        "seed": args.seed,
        "machine": f"{platform_mod.processor() or platform_mod.machine()}, torch threads 1",
        "jobs": args.jobs,
        "runs_executed": ran,
        "runs_cached": len({c.key for c in cells}) - ran,
        "seconds": time.perf_counter() - start,
    }
    slim = {
        name: (
            {tag: {k: v for k, v in row.items() if k != "records"} for tag, row in value.items()}
            if name == "table"
            else {k: v for k, v in value.items() if k != "records"}
        )
        for name, value in results.items()
    }
    (out_dir / "fedslate.json").write_text(
        dumps_record({"meta": meta, "results": slim, "checks": checks(results)}, indent=1)
    )
    (out_dir / "fedslate.md").write_text(markdown(results, meta))
    png = plot(results, out_dir / "fedslate_curves.png")
    print(markdown(results, meta))
    if png:
        print(f"\nlearning curves: {png}")
    return results


def _settings(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        n_cand, slate = part.split("x")
        out.append((int(n_cand), int(slate)))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default="results/fedslate", help="folder of the records (JSON and markdown)"
    )
    parser.add_argument(
        "--episodes", type=int, default=5000, help="episodes per run (5000, the paper's)"
    )
    parser.add_argument("--members", type=int, default=3, help="independent seeds per run")
    add_seed_argument(parser)
    parser.add_argument(
        "--settings",
        type=_settings,
        default=list(SETTINGS),
        help="NxN list for the table, e.g. 10x3,100x10,500x10",
    )
    parser.add_argument(
        "--experiments",
        default="table",
        help=f"comma list of {','.join(EXPERIMENTS)} (or 'all')",
    )
    parser.add_argument(
        "--runs",
        default=None,
        help="comma list: only these runs of the variant experiments (e.g. "
        "slateq_all,fedslate_two_without_item,random); the others are left out of the report",
    )
    parser.add_argument(
        "--ablation-setting",
        type=lambda t: _settings(t)[0],
        default=(10, 3),
        help="N,n of the ablation runs (10,3)",
    )
    parser.add_argument(
        "--sizes-setting",
        type=lambda t: _settings(t)[0],
        default=(100, 10),
        help="N,n of the larger-size runs (100,10)",
    )
    parser.add_argument(
        "--variant-episodes",
        type=int,
        default=None,
        help="episodes of ablation/sparse/choice/corpus/alignment runs (default --episodes)",
    )
    parser.add_argument(
        "--sizes-episodes", type=int, default=1500, help="episodes of the larger-size runs (1500)"
    )
    parser.add_argument(
        "--platform-episodes",
        type=int,
        default=1500,
        help="episodes of the five-platform runs (1500)",
    )
    parser.add_argument(
        "--log-every", type=int, default=0, help="progress every K episodes (0: silent)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes for the uncached runs (one core each)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (about a minute)")
    add_transport_arguments(parser)


def _finish(args: argparse.Namespace) -> argparse.Namespace:
    names = EXPERIMENTS if args.experiments == "all" else tuple(args.experiments.split(","))
    unknown = set(names) - set(EXPERIMENTS)
    if unknown:
        raise ValueError(f"unknown experiments {sorted(unknown)}; choose from {EXPERIMENTS}")
    args.experiments = names
    # The FedSlate runs' transport (the references and SlateQ have no server to send to).
    args.transport = transport_fields(args)
    args.transport_suffix = ""
    if args.fusion != "plaintext":
        eps = f"_eps{args.epsilon:g}" if args.epsilon is not None else ""
        scale = f"_s{args.ckks_scale_bits}" if args.ckks_scale_bits is not None else ""
        args.transport_suffix = f"_{args.fusion.replace('+', '_')}{eps}{scale}"
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1 worker process, got {args.jobs}")
    if args.quick:
        args.episodes = args.sizes_episodes = args.platform_episodes = 120
        args.variant_episodes = None
        args.members = 2
        args.settings = [(10, 3)]
    if args.runs is not None:
        wanted, args.runs = set(args.runs.split(",")), None
        known = {run for name in names if name != "table" for run in variant_cells(args, name)[1]}
        if wanted - known:
            raise ValueError(
                f"--runs {sorted(wanted - known)} are not runs of the variant experiments "
                f"{[name for name in names if name != 'table']}; choose from {sorted(known)}"
            )
        args.runs = wanted
        # An experiment none of whose runs was named is left out, not reported empty.
        args.experiments = tuple(
            name for name in names if name == "table" or variant_cells(args, name)[1]
        )
    return args


def _run_cli(args: argparse.Namespace) -> int:
    run(_finish(args))
    return 0


def register(benches) -> None:
    """Add ``fedslate`` to the ``securefed bench`` subcommands."""
    parser = BENCHES["fedslate"].add_to(benches)
    add_arguments(parser)
    parser.set_defaults(func=_run_cli)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return _run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
