"""``securefed bench fusion-step``: one FedSlate learning step under CKKS against plaintext.

Two modes (``--mode``):

* ``step`` (default): a FedSlate run of the configuration (``--candidates``, ``--slate``,
  ``--members``, ``--batch``, ``--server-hidden``, polynomial server activation) is built twice,
  behind the ``ckks`` and the ``plaintext`` fusion channel, its replay filled by real acting
  rounds (random slates), then ``--repeats`` learning steps (:func:`securefed.rl.fedslate.learn`:
  the targets, Algorithm 1 for A, Algorithm 2 for B) and ``--repeats`` acting inquiries are
  timed in each, and ``--repeats`` acting inquiries each right after a learning step (the first
  on new weights: the packed circuit encodes them anew). Prints the CKKS breakdown
  (encryption, server evaluation, exchange, decryption, from the channel's clocks), wall and
  process-CPU seconds, the ratio to the plaintext step measured in the same run, and the
  projection of a full run (``--project`` episodes: learning steps x (step + acting after a
  step) + the other rounds x acting). JSON and markdown under ``--out``
  (default ``results/fusion_step``).
* ``curves``: ``--episodes`` FedSlate episodes behind each of ``--transports`` with the same
  seed and activation (acting, targets and learning through the channel), each transport's
  rewards to ``<out>/<transport>.json``; ``compare`` reads them and writes ``comparison.json``,
  ``comparison.md`` and ``curves.png`` (the 20-episode moving averages, mean +- s.d. over
  members); ``--controls`` adds plaintext runs of other seeds, compared the same way (what
  the one-s.d. criterion gives between plaintext runs). ``--scale-bits`` sets the encrypted
  runs' ``ckks_scale_bits``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from securefed.bench.bench_args import add_seed_argument
from securefed.bench.bench_fedmf import markdown_table, write_outputs
from securefed.bench.experiment import save_json
from securefed.bench.registry import BENCHES

RESULTS = Path("results")
STAGES = ("encryption", "server_evaluation", "exchange", "decryption")


def fedslate_config(args: argparse.Namespace, fusion: str, **overrides):
    """The benchmark's FedSlate configuration behind ``fusion``."""
    from securefed.rl.fedslate import FedSlateConfig

    fields = dict(
        num_candidates=args.candidates,
        slate_size=args.slate,
        members=args.members,
        batch_size=args.batch,
        server_hidden=tuple(int(w) for w in args.server_hidden.split(",")),
        server_activation="polynomial",
        seed=args.seed,
        fusion=fusion,
    )
    return FedSlateConfig(**(fields | overrides))


def ckks_overrides(
    args: argparse.Namespace, circuit: str | None = None, *, serialized: bool = False
):
    """The CKKS channel's parameters the command line (and ``circuit``: ``"packed"`` or
    ``"monomials"``, each at its own default scale; ``serialized``: every ciphertext crossing
    as bytes) changes; ``None``: FedSlate's own."""
    if (
        args.flooding_bits is None
        and args.poly_degree is None
        and args.scale_bits is None
        and circuit is None
        and not serialized
    ):
        return None
    from securefed.crypto.ckks import Flooding
    from securefed.rl.fedslate import CKKS_MONOMIAL_SCALE_BITS, CKKS_SCALE_BITS, ckks_config

    base = ckks_config(fedslate_config(args, "ckks"))
    changes: dict[str, object] = {}
    if circuit is not None:
        changes["circuit"] = circuit
        changes["scale_bits"] = CKKS_SCALE_BITS if circuit == "packed" else CKKS_MONOMIAL_SCALE_BITS
    if args.flooding_bits is not None:
        changes["flooding"] = Flooding(std=None, security_bits=args.flooding_bits)
    if args.poly_degree is not None:
        changes["poly_modulus_degree"] = args.poly_degree
    if args.scale_bits is not None:
        changes["scale_bits"] = args.scale_bits
    if serialized:
        changes["serialize_handovers"] = True
    return replace(base, **changes)


def _with_channel(run, ckks) -> None:
    """Rebuild ``run``'s CKKS channel with the parameters ``ckks`` (same server, optimiser,
    target copy and seeds)."""
    from securefed import SeedTree
    from securefed.fusion import build_fusion_channel

    config = run.config
    run.channel = build_fusion_channel(
        "ckks", run.names, run.channel.module, run.channel.optimiser, config.fusion_needs(),
        target=run.channel.target, cross=config.variant != "fedq", seeds=SeedTree(config.seed),
        ckks_config=ckks,
    )  # fmt: skip


def _filled_run(config, rounds: int, ckks=None):
    """A run whose replay holds ``rounds`` rounds of real acting (random slates); ``ckks``:
    the CKKS channel's parameters instead of FedSlate's."""
    from securefed.rl.fedslate import choose_slates, features, play_round, start_run

    run = start_run(config)
    if ckks is not None and config.fusion == "ckks":
        _with_channel(run, ckks)
    run.env.reset()
    x = [features(run.env.observation(p), config) for p in range(config.num_platforms)]
    for _ in range(rounds):
        from securefed.rl.fedslate import acting_inquiry

        run.channel.open_round(run.rounds)
        qf = acting_inquiry(run, x)
        done = play_round(run, 0, x, choose_slates(run, x, qf, 1.0))
        run.replay.commit(done)
        run.rounds += 1
        if done:
            run.env.reset()
            x = [features(run.env.observation(p), config) for p in range(config.num_platforms)]
    return run, x


def _time(function, repeats: int, clocks: dict | None) -> dict[str, object]:
    before = dict(clocks) if clocks is not None else None
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        function()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    out: dict[str, object] = {
        "wall_s": float(np.median(wall)),
        "cpu_s": float(np.median(cpu)),
        "wall_all": wall,
        "cpu_all": cpu,
    }
    if clocks is not None:
        out["stages_s"] = {k: (clocks[k] - before[k]) / repeats for k in STAGES}
    return out


def _time_after(before, function, repeats: int) -> dict[str, object]:
    """``function`` timed right after an untimed ``before`` each time (the acting inquiry
    after a learning step: the first on new weights, which encodes them anew)."""
    cpu = []
    for _ in range(repeats):
        before()
        c = time.process_time()
        function()
        cpu.append(time.process_time() - c)
    return {"cpu_s": float(np.median(cpu)), "cpu_all": cpu}


def measure(
    args: argparse.Namespace, fusion: str, circuit: str | None = None, *, serialized: bool = False
) -> dict[str, object]:
    """Median learning step and acting inquiry of one channel (``circuit``: the CKKS one's;
    ``serialized``: its ciphertexts crossing as bytes, whose count per step is recorded)."""
    import torch

    from securefed.rl.fedslate import acting_inquiry, learn

    torch.set_num_threads(1)
    config = fedslate_config(args, fusion)
    overrides = ckks_overrides(args, circuit, serialized=serialized)
    run, x = _filled_run(config, max(args.batch + 2, args.fill), overrides)
    clocks = getattr(run.channel, "seconds", None)
    learn(run)  # warm-up (lazy imports, first expansions)
    counts = dict(getattr(run.channel, "counts", {}))
    handed = dict(getattr(run.channel, "handed_bytes", {}))
    step = _time(lambda: learn(run), args.repeats, clocks)
    if fusion == "ckks":
        after = run.channel.counts
        step["operations"] = {k: (after[k] - counts.get(k, 0)) / args.repeats for k in after}
        step["handed_bytes"] = {
            k: (v - handed.get(k, 0)) / args.repeats for k, v in run.channel.handed_bytes.items()
        }
    acting = _time(lambda: acting_inquiry(run, x), args.repeats, clocks)
    after = _time_after(lambda: learn(run), lambda: acting_inquiry(run, x), args.repeats)
    record = {"fusion": fusion, "learning_step": step, "acting_inquiry": acting,
              "acting_after_step": after}  # fmt: skip
    if fusion == "ckks":
        record["circuit"] = getattr(run.channel, "circuit", "monomials")
        record["public"] = {
            k: v for k, v in run.channel.view.public.items() if k not in ("module",)
        }
        record["flooding_bound_std"] = list(
            run.channel.flooding_std(config.batch_size * config.num_candidates)
        )
    return record


def project(record: dict, episodes: int, config) -> dict[str, float]:
    """A full run's seconds from the measured per-step and per-round costs."""
    rounds = episodes * config.steps_per_platform
    learning = max(0, (rounds - config.burn_in) // config.learn_every)
    # One acting inquiry per learning step runs on new weights (acting_after_step, when
    # measured); the others on the weights of the one before (acting_inquiry).
    after = record.get("acting_after_step", record["acting_inquiry"])["cpu_s"]
    fresh = min(learning, rounds)
    acting_s = fresh * after + (rounds - fresh) * record["acting_inquiry"]["cpu_s"]
    learning_s = learning * record["learning_step"]["cpu_s"]
    return {
        "episodes": episodes,
        "rounds": rounds,
        "learning_steps": learning,
        "acting_s": acting_s,
        "learning_s": learning_s,
        "total_s": acting_s + learning_s,
        "total_h": (acting_s + learning_s) / 3600,
    }


def step(args: argparse.Namespace) -> int:
    import securefed.fusion.ckks_packed as packed_module

    load_start = os.getloadavg()
    config = fedslate_config(args, "ckks")
    circuits = [c for c in args.circuits.split(",") if c]
    records = {"plaintext": measure(args, "plaintext")}
    for circuit in circuits:
        records[f"ckks {circuit}"] = measure(args, "ckks", circuit)
        if args.serialize_handovers:
            records[f"ckks {circuit} serialized"] = measure(args, "ckks", circuit, serialized=True)
    plain = records["plaintext"]
    ratios = {
        name: r["learning_step"]["cpu_s"] / plain["learning_step"]["cpu_s"]
        for name, r in records.items()
        if name != "plaintext"
    }
    ckks = records[f"ckks {circuits[-1]}"]
    overhead: dict[str, float] = {}
    if args.serialize_handovers:
        overhead = {
            c: records[f"ckks {c} serialized"]["learning_step"]["cpu_s"]
            / records[f"ckks {c}"]["learning_step"]["cpu_s"]
            for c in circuits
        }
        handed = {c: records[f"ckks {c} serialized"]["learning_step"]["handed_bytes"]
                  for c in circuits}  # fmt: skip
        table_bytes = "; ".join(
            f"{c}: serialized / in memory {overhead[c]:.2f}x (CPU), "
            f"{handed[c].get('to_server', 0) / 2**20:.2f} MiB to the server and "
            f"{handed[c].get('to_parties', 0) / 2**20:.2f} MiB to the parties a step"
            for c in circuits
        )
    ratio = ratios[f"ckks {circuits[-1]}"]
    projection = {f: project(r, args.project, config) for f, r in records.items()}
    rows = []
    for fusion, record in records.items():
        row = {"fusion": fusion, "ratio to plaintext (cpu)": ratios.get(fusion, 1.0)}
        for what in ("learning_step", "acting_inquiry"):
            row[f"{what} cpu s"] = record[what]["cpu_s"]
            row[f"{what} wall s"] = record[what]["wall_s"]
        row["acting after a step cpu s"] = record["acting_after_step"]["cpu_s"]
        for stage in STAGES:
            stages = record["learning_step"].get("stages_s")
            row[f"step {stage} s"] = stages[stage] if stages else ""
        row[f"{args.project} episodes (h)"] = projection[fusion]["total_h"]
        rows.append(row)
    table = markdown_table(rows, list(rows[0]))
    table += (
        f"\n\n(N, n) = ({args.candidates}, {args.slate}), {args.members} members, batch "
        f"{args.batch}, server hidden {args.server_hidden} (polynomial activation); medians of "
        f"{args.repeats} steps. CKKS / plaintext learning step (CPU): "
        + ", ".join(f"{name} {value:.1f}x" for name, value in ratios.items())
        + f". Projected {args.project}-episode run under CKKS ({circuits[-1]}): "
        f"{projection[f'ckks {circuits[-1]}']['total_h']:.1f} h on one core "
        f"({projection[f'ckks {circuits[-1]}']['learning_steps']} learning steps, "
        f"{projection[f'ckks {circuits[-1]}']['rounds']} acting inquiries)."
    )
    if args.serialize_handovers:
        table += f" Serialized handovers (every ciphertext as bytes): {table_bytes}."
    bound, std = ckks["flooding_bound_std"]
    public = ckks["public"]
    table += (
        f" Flooding of a released batch sum: {public['flooding']}, std {std:.3g} (its error "
        f"bound {bound:.3g}); CKKS parameters {public['ckks']['coeff_mod_bit_sizes']} at degree "
        f"{public['ckks']['poly_modulus_degree']}, scale 2^{public['ckks']['scale_bits']}."
    )
    payload = {
        "config": config.to_dict(),
        "repeats": args.repeats,
        "records": records,
        "ratio_cpu": ratio,
        "ratios_cpu": ratios,
        "serialized_over_memory_cpu": overhead,
        "projection": projection,
        "command": "securefed " + " ".join(sys.argv[1:]),
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "ckks_packed_module": packed_module.__file__,
    }
    name = f"step_N{args.candidates}_n{args.slate}_h{args.server_hidden.replace(',', 'x')}"
    if len(circuits) > 1 or circuits != ["monomials"]:
        name += "_" + "_".join(circuits)
    if args.serialize_handovers:
        name += "_serialized"
    for flag, value in (("f", args.flooding_bits), ("d", args.poly_degree), ("s", args.scale_bits)):
        if value is not None:
            name += f"_{flag}{value}"
    write_outputs(name, payload, table, Path(args.out))
    return 0


# ----------------------------------------------------------------------------- curves
def curves(args: argparse.Namespace) -> int:
    import torch

    from securefed.rl.fedslate import ENCRYPTED_FUSIONS, run_fedslate, summarize

    if args.flooding_bits is not None or args.poly_degree is not None:
        raise ValueError(
            "--flooding-bits and --poly-degree apply to --mode step only; the curves take "
            "FedSlate's CKKS parameters, with --scale-bits for the encrypted runs"
        )
    torch.set_num_threads(1)
    out = Path(args.out)
    for fusion in args.transports.split(","):
        schedule = {"episodes": args.episodes, "log_every": args.log_every}
        for name in ("steps_per_platform", "burn_in", "eps_decay"):
            if getattr(args, name) is not None:
                schedule[name] = getattr(args, name)
        if args.scale_bits is not None and fusion in ENCRYPTED_FUSIONS:
            schedule["ckks_scale_bits"] = args.scale_bits
        config = fedslate_config(args, fusion, **schedule)
        checkpoints = None
        if args.checkpoint_every:
            from securefed.rl.checkpoint import EpisodeCheckpoints

            checkpoints = EpisodeCheckpoints(out / f"{fusion}.partial.pt", args.checkpoint_every)
        start = time.perf_counter()
        cpu = time.process_time()
        result = run_fedslate(config, checkpoints)
        record = {
            "fusion": fusion,
            "config": config.to_dict(),
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu,
            "learn_steps": result.learn_steps,
            "rounds": result.rounds,
            "timings": result.timings,
            "episode_rewards": result.episode_rewards.tolist(),
            "summary": summarize(result, window=min(100, args.episodes), tail=50),
        }
        if hasattr(result.fusion_view, "public"):
            record["channel_public"] = result.fusion_view.public
        save_json(record, out / f"{fusion}.json")
        print(f"{fusion}: {record['seconds']:.0f} s, written {out / f'{fusion}.json'}")
    return 0


def moving(rewards: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average along axis 0."""
    cumsum = np.concatenate([np.zeros((1, *rewards.shape[1:])), np.cumsum(rewards, axis=0)])
    return (cumsum[window:] - cumsum[:-window]) / window


def partial_record(path: Path) -> dict[str, object]:
    """The episodes completed so far of a run still going, from its checkpoint."""
    import torch

    payload = torch.load(path, weights_only=True)
    counters = json.loads(payload["meta"])["counters"]
    done = int(counters["episodes"])
    rewards = payload["arrays"]["rewards"].numpy()[:done]
    return {"episode_rewards": rewards.tolist(), "seconds": counters["seconds"],
            "partial": True, "counters": counters}  # fmt: skip


def _load_record(out: Path, fusion: str) -> dict[str, object]:
    final = out / f"{fusion}.json"
    if final.is_file():
        return json.loads(final.read_text())
    return partial_record(out / f"{fusion}.partial.pt")


def curve_agreement(reference: np.ndarray, other: np.ndarray, window: int) -> dict[str, dict]:
    """Per platform, how closely ``other``'s reward curve follows ``reference``'s (both
    ``[episode][member][platform]``): the share of ``window``-episode moving averages (mean over
    members) within one s.d. over ``reference``'s members, the largest gaps, and the whole-run
    means."""
    averages = {"reference": moving(reference, window), "other": moving(other, window)}
    out = {}
    for p, name in enumerate(("A", "B")):
        plain, enc = averages["reference"][:, :, p], averages["other"][:, :, p]
        mean_gap = np.abs(enc.mean(axis=1) - plain.mean(axis=1))
        sd = plain.std(axis=1, ddof=1) if plain.shape[1] > 1 else np.zeros(len(plain))
        run_means = {
            "reference": reference[:, :, p].mean(axis=0),
            "other": other[:, :, p].mean(axis=0),
        }
        out[name] = {
            "run_mean_gap": float(abs(run_means["other"].mean() - run_means["reference"].mean())),
            "run_mean_sd": float(run_means["reference"].std(ddof=1)),
            "fraction_within_one_sd": float(np.mean(mean_gap <= sd)),
            "max_mean_gap": float(mean_gap.max()),
            "mean_sd": float(sd.mean()),
            "max_member_gap": float(np.abs(enc - plain).max()),
            "plaintext_mean": float(reference[:, :, p].mean()),
            "ckks_mean": float(other[:, :, p].mean()),
        }
    return out


def compare(args: argparse.Namespace) -> int:
    """Compare the recorded curves: where the CKKS moving average lies within one s.d. (over
    members) of the plaintext one, over the episodes both runs completed (a run still going is
    read from its checkpoint). With ``--controls``, the same statistics for plaintext runs of
    other seeds against the plaintext run: what the criterion gives between two plaintext runs
    that share nothing but the schedule."""
    out = Path(args.out)
    records = {f: _load_record(out, f) for f in ("plaintext", "ckks")}
    controls = {}
    for directory in (d for d in (args.controls or "").split(",") if d):
        record = _load_record(Path(directory), "plaintext")
        controls[f"plaintext seed {record['config']['seed']}"] = record
    episodes = min(len(r["episode_rewards"]) for r in (*records.values(), *controls.values()))
    rewards = {f: np.asarray(r["episode_rewards"][:episodes]) for f, r in records.items()}
    window = args.window
    payload = {"window": window, "platforms": {}, "controls": {}}
    payload["platforms"] = curve_agreement(rewards["plaintext"], rewards["ckks"], window)
    rows = [{"run": "ckks", "platform": p} | m for p, m in payload["platforms"].items()]
    for label, record in controls.items():
        other = np.asarray(record["episode_rewards"][:episodes])
        payload["controls"][label] = curve_agreement(rewards["plaintext"], other, window)
        rows += [{"run": label, "platform": p} | m for p, m in payload["controls"][label].items()]
    payload["seconds"] = {f: r["seconds"] for f, r in records.items()}
    payload["episodes_compared"] = episodes
    payload["partial"] = {f: bool(r.get("partial")) for f, r in records.items()}
    payload["ckks_parameters"] = records["ckks"].get("channel_public", {}).get("ckks")
    table = markdown_table(rows, list(rows[0]))
    table += (
        f"\n\n{window}-episode moving averages, {episodes} episodes, s.d. over the plaintext "
        f"run's members (the `plaintext_mean` column is that run's, `ckks_mean` the compared "
        f"run's); seconds: plaintext {records['plaintext']['seconds']:.0f}, ckks "
        f"{records['ckks']['seconds']:.0f}."
    )
    write_outputs("comparison", payload, table, out)
    averages = {f: moving(r, window) for f, r in rewards.items()}
    _plot(averages, out / "curves.png", window)
    return 0


def _plot(averages: dict, path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
    for p, ax in enumerate(axes):
        for fusion, colour in (("plaintext", "tab:blue"), ("ckks", "tab:red")):
            series = averages[fusion][:, :, p]
            x = np.arange(window, window + len(series))
            mean, sd = series.mean(axis=1), series.std(axis=1)
            ax.plot(x, mean, color=colour, label=fusion)
            ax.fill_between(x, mean - sd, mean + sd, color=colour, alpha=0.2)
        ax.set_title(f"platform {'AB'[p]}")
        ax.set_xlabel("episode")
    axes[0].set_ylabel(f"{window}-episode mean reward")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    return {"step": step, "curves": curves, "compare": compare}[args.mode](args)


def register(benches) -> None:
    parser = BENCHES["fusion-step"].add_to(benches)
    parser.add_argument(
        "--mode",
        choices=("step", "curves", "compare"),
        default="step",
        help="step: time one fusion step per channel; curves: learning curves; compare: "
        "the curves' agreement",
    )
    parser.add_argument("--candidates", type=int, default=10, help="N candidates per step")
    parser.add_argument("--slate", type=int, default=3, help="slate size n")
    parser.add_argument(
        "--members", type=int, default=3, help="independent deployments run together"
    )
    parser.add_argument("--batch", type=int, default=32, help="replay batch size")
    parser.add_argument("--server-hidden", default="16", help="comma-separated widths")
    add_seed_argument(parser)
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed repetitions (the median is reported)"
    )
    parser.add_argument("--fill", type=int, default=64, help="acting rounds before timing")
    parser.add_argument("--project", type=int, default=5000, help="episodes to project")
    parser.add_argument("--episodes", type=int, default=200, help="curves: episodes per run")
    parser.add_argument("--transports", default="plaintext,ckks", help="curves: channels")
    parser.add_argument("--window", type=int, default=20, help="compare: moving average")
    parser.add_argument(
        "--controls", help="compare: comma list of folders with plaintext runs of other seeds"
    )
    parser.add_argument("--log-every", type=int, default=10, help="progress every K episodes")
    parser.add_argument("--steps-per-platform", type=int, help="curves: a shorter episode")
    parser.add_argument("--burn-in", type=int, help="curves: rounds before learning")
    parser.add_argument("--eps-decay", type=float, help="curves: exploration decay per round")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="curves: episodes")
    parser.add_argument(
        "--out",
        default=str(RESULTS / "fusion_step"),
        help="folder of the records (JSON and markdown)",
    )
    parser.add_argument(
        "--flooding-bits", type=int, help="step: the masked sums' flooding level (FedSlate: 20)"
    )
    parser.add_argument("--poly-degree", type=int, help="step: the CKKS ring degree")
    parser.add_argument(
        "--circuits",
        default="monomials,packed",
        help="step: the CKKS circuits to time, each at its own default scale (monomials: "
        "2^55, packed: 2^49; --scale-bits overrides both)",
    )
    parser.add_argument(
        "--serialize-handovers",
        action="store_true",
        help="step: also time each circuit with every ciphertext crossing as bytes (what a "
        "Flower message carries) and record the bytes a learning step hands over",
    )
    parser.add_argument(
        "--scale-bits",
        type=int,
        help="step, curves: log2 of the CKKS scale (curves: the encrypted runs' ckks_scale_bits)",
    )
    parser.set_defaults(func=run)
