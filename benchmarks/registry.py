"""The ``securefed bench`` subcommands: each benchmark module exposes ``register(benches)``."""

from __future__ import annotations

import importlib

BENCH_MODULES = (
    "benchmarks.bench_fedmf",
    "benchmarks.leak_utility",
    "benchmarks.bench_secagg",
    "benchmarks.bench_ckks",
    "benchmarks.bench_fedhpd",
    "benchmarks.bench_fedslate",
    "benchmarks.bench_rl_leak",
    "benchmarks.bench_flower",
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
