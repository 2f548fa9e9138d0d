"""The ``securefed bench`` subcommands: each benchmark module exposes ``register(benches)``."""

from __future__ import annotations

import importlib

BENCH_MODULES = (
    "securefed.bench.bench_fedmf",
    "securefed.bench.leak_utility",
    "securefed.bench.bench_secagg",
    "securefed.bench.bench_ckks",
    "securefed.bench.bench_fedhpd",
    "securefed.bench.bench_fedslate",
    "securefed.bench.bench_rl_leak",
    "securefed.bench.bench_flower",
)


def register_all(benches) -> None:
    for name in BENCH_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name == name:
                continue
            raise
        register = getattr(module, "register", None)
        if register is not None:
            register(benches)
