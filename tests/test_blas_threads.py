"""Issue 29, item 3: the runtime sets the BLAS threads of a run itself, and restores them.

Not a timing test: threadpoolctl's own report (``threadpool_info``) is read inside the round
callback and after the run, with the process's setting first raised to 2 threads so that the
limit of 1 is visible on any machine.
"""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_limits

from securefed import PlaintextTransport, RunOptions, SeedTree, run_rounds
from securefed.recsys.fedmf import FedMF, FedMFConfig
from securefed.runtime import blas_threads_in_use


def _counts() -> list[int]:
    return [int(info["num_threads"]) for info in blas_threads_in_use()]


@pytest.fixture
def two_threads():
    """The process at 2 BLAS threads for the test (restored after)."""
    if not blas_threads_in_use():
        pytest.skip("no BLAS library loaded that threadpoolctl can see")
    with threadpool_limits(limits=2, user_api="blas"):
        assert set(_counts()) == {2}
        yield


def _run(small_split, **options) -> list[list[int]]:
    seen: list[list[int]] = []
    seeds = SeedTree(0)
    model = FedMF(small_split.train, FedMFConfig(dim=3, rounds=2), seeds)
    run_rounds(
        model,
        PlaintextTransport(),
        seeds,
        RunOptions(rounds=2, progress=False, **options),
        on_round=lambda *_: seen.append(_counts()),
    )
    return seen


def test_a_run_uses_one_blas_thread_by_default_and_restores_the_setting(small_split, two_threads):
    assert RunOptions(rounds=1).blas_threads == 1
    assert _run(small_split) == [[1] * len(_counts())] * 2
    assert set(_counts()) == {2}  # restored after the run
    assert _run(small_split, blas_threads=None) == [_counts()] * 2  # None: left as it is


def test_the_setting_is_restored_when_a_round_fails(small_split, two_threads):
    def fail(*_):
        assert set(_counts()) == {1}
        raise RuntimeError("a round failed")

    seeds = SeedTree(0)
    model = FedMF(small_split.train, FedMFConfig(dim=3, rounds=2), seeds)
    with pytest.raises(RuntimeError, match="a round failed"):
        run_rounds(model, PlaintextTransport(), seeds, RunOptions(rounds=2), on_round=fail)
    assert set(_counts()) == {2}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_a_bad_thread_count_is_refused(bad):
    with pytest.raises(ValueError, match="blas_threads must be None"):
        RunOptions(rounds=1, blas_threads=bad)
