"""Independent benchmark cells in worker processes, one core each.

Benchmarks whose cells do not depend on each other (the leak-versus-utility grid, FedSlate's
table) run them in ``spawn``-ed worker processes: a fresh interpreter per worker, so no forked
BLAS or torch thread pool, and one BLAS / OpenMP thread per worker, so that ``workers`` cells
use ``workers`` cores and the per-cell timings stay comparable with a single-process run.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager

__all__ = ["map_in_processes", "one_thread_per_process"]

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextmanager
def one_thread_per_process() -> Iterator[None]:
    """Set the BLAS / OpenMP thread variables to 1 for processes started inside the block."""
    saved = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
    os.environ.update(dict.fromkeys(_THREAD_VARIABLES, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def map_in_processes(
    fn: Callable[..., object],
    calls: Sequence[tuple],
    workers: int,
    on_done: Callable[[int, object], None] | None = None,
) -> list[object]:
    """``fn(*calls[k])`` for every ``k`` in ``workers`` processes; the results in call order.

    Calls are submitted in the given order, so put the dearest first: the workers then finish
    together. ``fn`` and its arguments must be picklable (a module-level function).

    Args:
        fn: the cell function.
        calls: its positional arguments, one tuple per cell.
        workers: the number of processes (at least 1).
        on_done: called in this process as ``on_done(k, result)`` when cell ``k`` finishes.

    Raises:
        ValueError: ``workers < 1``.
        Exception: the first failing cell's exception, re-raised here.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    results: list[object] = [None] * len(calls)
    context = multiprocessing.get_context("spawn")
    with one_thread_per_process(), ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(fn, *args): k for k, args in enumerate(calls)}
        for future in as_completed(futures):
            k = futures[future]
            results[k] = future.result()
            if on_done is not None:
                on_done(k, results[k])
    return results
