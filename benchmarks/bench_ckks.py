"""CKKS benchmarks: encrypted vs plaintext fusion, a training run under CKKS, a FedMF round's cost.

``python -m securefed.bench.bench_ckks`` runs all three; ``python -m securefed.bench.bench_ckks
fusion`` (or
``training``, ``fedmf-round``) one of them. Each writes ``results/ckks_<name>.json`` and ``.md``
(the training run also ``ckks_training.png``) and prints the table. Plaintext references are
measured in the same process, from the same initial weights and data.

* fusion: 1000 random inputs through the fused MLP (two parties, FedSlate-like: each holds an
  8-dim vector per user and gets 4 fused Q-values back), encrypted and in the clear; the
  requirement is a max abs difference below 1e-3.
* training: the same network trained by SGD on a synthetic teacher under CKKS (masked-gradient
  exchange) and in the clear, step for step on the same minibatches; loss curves side by side.
* fedmf-round: one FedMF round on ML-100K u1 (943 clients, 1684 x 21 blocks, 9 ciphertexts each)
  under the CKKS transport: time per stage and bytes per client, and the projected run time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from securefed import SeedTree
from securefed.bench.bench_args import (
    add_data_argument,
    add_out_argument,
    add_seed_argument,
    add_split_argument,
)
from securefed.bench.bench_fedmf import markdown_table, write_outputs
from securefed.bench.registry import BENCHES
from securefed.crypto.ckks import ckks_context
from securefed.fusion import FusionSpec, PlaintextFusionChannel, forward_numpy, init_weights
from securefed.fusion.base import concatenate
from securefed.fusion.ckks import CKKSFusionChannel, CKKSFusionConfig, schedule_levels

RESULTS = Path("results")


def fedslate_spec(hidden: int = 16) -> FusionSpec:
    """Two platforms, 8-dim inputs each, 4 fused Q-values back to each."""
    return FusionSpec.of(
        {"platform_a": 8, "platform_b": 8}, {"platform_a": 4, "platform_b": 4}, hidden=(hidden,)
    )


def _write(name: str, payload: dict, table: str, out: Path) -> None:
    write_outputs(f"ckks_{name}", payload, table, out)


# ----------------------------------------------------------------------------- agreement
def fusion(args: argparse.Namespace) -> int:
    """Encrypted and plaintext fused outputs on ``--samples`` random inputs."""
    spec = fedslate_spec(args.hidden)
    rng = np.random.default_rng(args.seed)
    weights = init_weights(spec, rng)
    inputs = {p.name: rng.normal(size=(args.samples, p.input_dim)) for p in spec.parties}
    started = time.perf_counter()
    secret = ckks_context(spec.circuit(), encryption="public-key")
    keygen = time.perf_counter() - started
    channel = CKKSFusionChannel(spec, weights, seeds=SeedTree(args.seed), secret=secret)
    started = time.perf_counter()
    encrypted = channel.forward(inputs)
    encrypted_seconds = time.perf_counter() - started
    plain = PlaintextFusionChannel(spec, weights)
    started = time.perf_counter()
    reference = plain.forward(inputs)
    plain_seconds = time.perf_counter() - started
    numpy_reference = forward_numpy(spec, weights, concatenate(spec, inputs))
    difference = concatenate(spec, encrypted) - concatenate(spec, reference)
    levels, counts = schedule_levels(spec, training=False)
    row = {
        "samples": args.samples,
        "layers": "x".join(str(s) for s in spec.layer_sizes),
        "poly_modulus_degree": secret.params.poly_modulus_degree,
        "coeff_mod_bit_sizes": "/".join(str(b) for b in secret.params.coeff_mod_bit_sizes),
        "max_abs_diff": float(np.abs(difference).max()),
        "mean_abs_diff": float(np.abs(difference).mean()),
        "max_abs_output": float(np.abs(numpy_reference).max()),
        "torch_vs_numpy": float(np.abs(concatenate(spec, reference) - numpy_reference).max()),
        "ckks_forward_s": encrypted_seconds,
        "plaintext_forward_s": plain_seconds,
        "keygen_s": keygen,
        "levels_used": levels,
        "ciphertexts_up": spec.input_dim,
        "mb_to_server": sum(channel.transcript.bytes_to_server.values()) / 2**20,
        "mb_to_parties": sum(channel.transcript.bytes_to_party.values()) / 2**20,
        "passes_1e-3": bool(np.abs(difference).max() < 1e-3),
    }
    payload = {
        "row": row,
        "seconds_by_stage": channel.transcript.seconds,
        "operations": dict(counts),
        "params": secret.params.public(),
    }
    _write("fusion", payload, markdown_table([row], list(row)), Path(args.out))
    return 0 if row["passes_1e-3"] else 1


# ----------------------------------------------------------------------------- training
def _teacher_targets(spec: FusionSpec, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A ReLU teacher of the same shape (the student's activation is only its polynomial fit)."""
    teacher = init_weights(spec, rng)
    (w1, b1), (w2, b2) = teacher.layers
    hidden = np.maximum(x @ (2 * w1) + b1, 0.0)
    return hidden @ w2 + b2


def training(args: argparse.Namespace) -> int:
    """SGD on the same minibatches, under CKKS and in the clear; loss curves side by side."""
    spec = fedslate_spec(args.hidden)
    rng = np.random.default_rng(args.seed)
    n_train, n_test = args.steps * args.batch, 1000
    x_all = rng.normal(size=(n_train + n_test, spec.input_dim))
    y_all = _teacher_targets(spec, x_all, rng)
    weights = init_weights(spec, rng)
    secret = ckks_context(spec.circuit(), encryption="public-key")
    config = CKKSFusionConfig(lr=args.lr)
    encrypted = CKKSFusionChannel(
        spec, weights, seeds=SeedTree(args.seed), config=config, secret=secret
    )
    plain = PlaintextFusionChannel(spec, weights, lr=args.lr)
    in_slices, out_slices = spec.input_slices(), spec.output_slices()
    outputs = spec.output_dim
    x_test, y_test = x_all[n_train:], y_all[n_train:]
    curves = {"plaintext": [], "ckks": [], "plaintext_test": [], "ckks_test": []}
    started = time.perf_counter()
    for step in range(args.steps):
        rows = slice(step * args.batch, (step + 1) * args.batch)
        x, target = x_all[rows], y_all[rows]
        inputs = {name: x[:, cut] for name, cut in in_slices.items()}
        for name, channel in (("plaintext", plain), ("ckks", encrypted)):
            predicted = channel.forward(inputs)
            # Each party computes its own part of the mean squared error and its gradient.
            loss, grads = 0.0, {}
            for party, cut in out_slices.items():
                residual = predicted[party] - target[:, cut]
                loss += float((residual**2).sum())
                grads[party] = 2.0 * residual / (len(x) * outputs)
            curves[name].append(loss / (len(x) * outputs))
            channel.backward(grads)
            test = forward_numpy(spec, channel.weights, x_test)
            curves[f"{name}_test"].append(float(((test - y_test) ** 2).mean()))
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            print(
                f"step {step}: train loss plaintext {curves['plaintext'][-1]:.5f} "
                f"ckks {curves['ckks'][-1]:.5f} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    seconds = time.perf_counter() - started
    difference = np.abs(np.array(curves["ckks"]) - np.array(curves["plaintext"]))
    row = {
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "layers": "x".join(str(s) for s in spec.layer_sizes),
        "first_loss": curves["plaintext"][0],
        "final_loss_plaintext": curves["plaintext"][-1],
        "final_loss_ckks": curves["ckks"][-1],
        "max_loss_difference": float(difference.max()),
        "final_test_plaintext": curves["plaintext_test"][-1],
        "final_test_ckks": curves["ckks_test"][-1],
        "weight_max_abs_diff": encrypted.weights.max_abs_difference(plain.weights),
        "seconds": seconds,
        "ckks_s_per_step": encrypted.transcript.seconds["server_backward"] / args.steps,
        "exchanges_per_step": encrypted.transcript.exchanges / args.steps,
    }
    payload = {
        "row": row,
        "curves": curves,
        "transcript": encrypted.transcript.as_dict(),
        "params": secret.params.public(),
        "flooding": config.flooding.public(),
    }
    out = Path(args.out)
    _plot(curves, out / "ckks_training.png")
    _write("training", payload, markdown_table([row], list(row)), out)
    return 0


def _plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for axis, kind, title in (
        (axes[0], "", "training loss (minibatch)"),
        (axes[1], "_test", "held-out loss (1000 samples)"),
    ):
        axis.plot(curves[f"plaintext{kind}"], label="plaintext", linewidth=2)
        axis.plot(curves[f"ckks{kind}"], label="CKKS (masked exchange)", linestyle="--")
        axis.set_title(title)
        axis.set_xlabel("SGD step")
        axis.set_yscale("log")
        axis.legend()
    axes[0].set_ylabel("mean squared error")
    figure.suptitle("Fused MLP trained in the clear and under CKKS, same batches")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ----------------------------------------------------------------------------- FedMF cost
def fedmf_round(args: argparse.Namespace) -> int:
    """One FedMF round on ML-100K under CKKS: per-stage time, bytes, projection."""
    from securefed.bench import datasets
    from securefed.recsys.fedmf import FedMF, FedMFConfig
    from securefed.transport import build_transport

    split = datasets.load(args.data, args.split)
    config = FedMFConfig(variant=args.variant, rounds=1, upload="full")
    clients = np.arange(split.train.n_users)
    rows = []
    for name in ("plaintext", "ckks"):
        seeds = SeedTree(args.seed)
        model = FedMF(split.train, config, seeds)
        started = time.perf_counter()
        transport = build_transport(name, n_clients=len(clients))  # ckks: max(1024, n) clients
        setup = time.perf_counter() - started
        started = time.perf_counter()
        model.run_round(0, clients, transport, seeds)
        seconds = time.perf_counter() - started
        up, down = transport.view.mean_bytes_per_client()
        row = {
            "transport": name,
            "clients": len(clients),
            "values_per_client": (split.train.n_items + 2) * (config.dim + 1),
            "round_s": seconds,
            "setup_s": setup,
            "kib_up_per_client": up / 1024,
            "kib_down_per_client": down / 1024,
        }
        if name == "ckks":
            row["ciphertexts_per_client"] = transport.view.rounds[0].public["ckks_ciphertexts"]
            row |= {f"{stage}_s": value for stage, value in transport.timings.items()}
            row["ms_per_ciphertext"] = (
                1e3 * transport.timings["encrypt"] / (len(clients) * row["ciphertexts_per_client"])
            )
            row["projected_10_rounds_min"] = 10 * seconds / 60
            row["projected_500_rounds_h"] = 500 * seconds / 3600
        rows.append(row)
        print(row, flush=True)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    _write(
        "fedmf_round",
        {"rows": rows, "data": split.name},
        markdown_table(rows, columns),
        Path(args.out),
    )
    return 0


# ----------------------------------------------------------------------------- registration
def register(benches) -> None:
    parser = BENCHES["ckks-fusion"].add_to(benches)
    _fusion_arguments(parser)
    parser.set_defaults(func=fusion)
    parser = BENCHES["ckks-training"].add_to(benches)
    _fusion_arguments(parser)
    _training_arguments(parser)
    parser.set_defaults(func=training)
    parser = BENCHES["ckks-fedmf-round"].add_to(benches)
    _fedmf_arguments(parser)
    parser.set_defaults(func=fedmf_round)


def _fusion_arguments(parser) -> None:
    parser.add_argument("--samples", type=int, default=1000, help="inputs evaluated")
    parser.add_argument("--hidden", type=int, default=16, help="hidden width of the fused network")
    add_seed_argument(parser)
    add_out_argument(parser, RESULTS)


def _training_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=30, help="training steps")
    parser.add_argument("--batch", type=int, default=128, help="batch size of a training step")
    parser.add_argument("--lr", type=float, default=0.4, help="learning rate of the server network")


def _fedmf_arguments(parser) -> None:
    add_data_argument(parser)
    add_split_argument(parser)
    parser.add_argument("--variant", default="fedmf", help="FedMF variant (fedmf, fedrec, fedrec+)")
    add_seed_argument(parser)
    add_out_argument(parser, RESULTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m securefed.bench.bench_ckks")
    sub = parser.add_subparsers(dest="bench")
    for name, func, extra in (
        ("fusion", fusion, ()),
        ("training", training, (_training_arguments,)),
        ("fedmf-round", fedmf_round, None),
    ):
        child = sub.add_parser(name)
        if extra is None:
            _fedmf_arguments(child)
        else:
            _fusion_arguments(child)
            for add in extra:
                add(child)
        child.set_defaults(func=func)
    args = parser.parse_args(argv)
    if args.bench is not None:
        return args.func(args)
    codes = [
        main(["fusion"]),
        main(["training"]),
        main(["fedmf-round"]),
    ]
    return max(codes)


if __name__ == "__main__":
    raise SystemExit(main())
