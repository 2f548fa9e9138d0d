"""``flower-supernode`` with a shorter wait between two empty pulls of the SuperLink.

Flower 1.42's SuperNode asks the SuperLink for a message in a loop and, when a pull returns
none, sleeps a fixed 3 s (``time.sleep(3)`` in
``flwr.supernode.start_client_internal.start_client_internal``; no flag, no environment
variable). A node that has just sent its reply therefore waits up to 3 s before it sees the
server's next message, once per message round: a plaintext FedMF round is one message round, a
secure-aggregation round (Bonawitz et al., CCS 2017, Fig. 4: AdvertiseKeys, ShareKeys,
MaskedInputCollection, ConsistencyCheck, Unmasking) is up to five, so the fixed wait is paid up
to five times (``benchmarks/results/flower_cost/warm/README.md``).

This launcher runs Flower's own ``flower-supernode`` entry point in this process after one
change: the name ``time`` in that one module is bound to :class:`PullWaitTime`, a proxy of the
``time`` module whose ``sleep(3)`` sleeps :attr:`PullWait.seconds` instead; every other call
(the same module's 0.5 s reply and object polls, ``time.time``, ...) reaches ``time``
unchanged. It runs only on the Flower release whose source it was read against and refuses
(:class:`UnsupportedFlower`, naming the cause) when the version differs, when the line is not
where it was or when that module sleeps 3 s anywhere else: never a silent no-op.

Run it where ``flower-supernode`` would run, with the same flags after ``--``::

    python -m securefed.flower.supernode_launch --pull-wait 0.1 -- \\
        --insecure --superlink 10.0.0.1:9092 --node-config "partition-id=0 num-partitions=2"

The cost of a shorter wait: one more (empty) pull of the SuperLink per node every
``--pull-wait`` seconds while it has nothing to send (at 0.1 s, 30x Flower's rate).
:class:`securefed.flower.loopback.LoopbackFederation` starts its SuperNodes this way by default
(``supernode_pull_wait``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import math
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass

FLOWER_VERSION = "1.42.0"
"""The Flower release whose SuperNode source this launcher was read against."""

MODULE = "flwr.supernode.start_client_internal"
"""The module holding the SuperNode's pull loop."""

FUNCTION = "start_client_internal"
"""The function of :data:`MODULE` whose loop sleeps after an empty pull."""

LINE = 263
"""Where that sleep is in Flower 1.42.0's file (1-based)."""

FLOWER_SLEEP = "time.sleep(3)"
"""The source of that line, stripped."""

FLOWER_PULL_WAIT = 3
"""The seconds Flower sleeps after an empty pull: the one ``sleep`` argument replaced."""

DEFAULT_PULL_WAIT = 0.1
"""The wait :class:`~securefed.flower.loopback.LoopbackFederation` gives its SuperNodes."""

BANNER = "securefed.flower.supernode_launch: SuperNode pull wait {seconds} s (Flower's 3 s)"
"""What the launcher prints before it starts the SuperNode (log readers check it)."""


class UnsupportedFlower(RuntimeError):
    """The installed Flower is not the one whose pull loop this launcher knows."""


@dataclass(frozen=True)
class PullWait:
    """The SuperNode's wait after an empty pull.

    Attributes:
        seconds: in ``[0.01, 3]``: at least 10 ms (a tighter loop only loads the SuperLink),
            at most Flower's own 3 s.

    Raises:
        ValueError: naming the value, outside that range or not finite.
    """

    seconds: float = DEFAULT_PULL_WAIT

    def __post_init__(self) -> None:
        seconds = float(self.seconds)
        if not (math.isfinite(seconds) and 0.01 <= seconds <= FLOWER_PULL_WAIT):
            raise ValueError(
                f"the SuperNode pull wait must be in [0.01, {FLOWER_PULL_WAIT}] s, "
                f"got {self.seconds!r}"
            )


class PullWaitTime:
    """The ``time`` module, except that ``sleep(3)`` sleeps ``wait.seconds``.

    Args:
        real: the module it stands for (``time``).
        wait: the wait after an empty pull.
    """

    def __init__(self, real: types.ModuleType, wait: PullWait) -> None:
        self._real = real
        self.wait = wait

    def sleep(self, seconds: float) -> None:
        """``real.sleep`` of ``wait.seconds`` for Flower's 3 s, else of ``seconds``."""
        self._real.sleep(self.wait.seconds if seconds == FLOWER_PULL_WAIT else seconds)

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


def installed_flower_version() -> str:
    """The installed ``flwr`` distribution's version."""
    return importlib.metadata.version("flwr")


def check_source(lines: Sequence[str], start: int) -> None:
    """Check a function's source holds :data:`FLOWER_SLEEP` at :data:`LINE`.

    Args:
        lines: the function's source lines (``inspect.getsourcelines``).
        start: the file line of ``lines[0]``.

    Raises:
        UnsupportedFlower: naming what was found instead.
    """
    at = LINE - start
    found = lines[at].strip() if 0 <= at < len(lines) else "<outside the function>"
    if found != FLOWER_SLEEP:
        raise UnsupportedFlower(
            f"{MODULE}.{FUNCTION} line {LINE} is {found!r}, not {FLOWER_SLEEP!r}: "
            "its pull loop changed; refusing to patch it"
        )


def check_module(module: types.ModuleType, version: str) -> None:
    """Refuse anything but Flower :data:`FLOWER_VERSION`'s pull loop, as read.

    Checks the version, the line of the sleep after an empty pull, that the module sleeps
    :data:`FLOWER_PULL_WAIT` s nowhere else (the proxy tells that call apart by its argument)
    and that its ``time`` is the real ``time`` module (not patched already).

    Raises:
        UnsupportedFlower: naming the cause.
    """
    if version != FLOWER_VERSION:
        raise UnsupportedFlower(
            f"flwr {version} is installed; this launcher knows flwr {FLOWER_VERSION}'s "
            f"SuperNode pull loop only ({MODULE}:{LINE}); refusing to patch another release"
        )
    try:
        lines, start = inspect.getsourcelines(getattr(module, FUNCTION))
        source = inspect.getsource(module)
    except (OSError, TypeError, AttributeError) as error:
        raise UnsupportedFlower(
            f"cannot read {MODULE}.{FUNCTION}'s source to check its pull loop: {error}"
        ) from error
    check_source(lines, start)
    calls = source.count(f"sleep({FLOWER_PULL_WAIT})")
    if calls != 1:
        raise UnsupportedFlower(
            f"{MODULE} sleeps {FLOWER_PULL_WAIT} s in {calls} places, not once: refusing to "
            "replace them all"
        )
    if getattr(module, "time", None) is not time:
        raise UnsupportedFlower(f"{MODULE}.time is {module.time!r}, not the time module")


def install(wait: PullWait) -> PullWaitTime:
    """Bind :data:`MODULE`'s ``time`` to a :class:`PullWaitTime` (after :func:`check_module`).

    Returns:
        The proxy now in place.

    Raises:
        UnsupportedFlower: the checks refused this Flower.
    """
    module = importlib.import_module(MODULE)
    check_module(module, installed_flower_version())
    proxy = PullWaitTime(time, wait)
    module.time = proxy
    if module.time is not proxy:
        raise UnsupportedFlower(f"{MODULE}.time could not be replaced")
    return proxy


def check_installed() -> None:
    """:func:`check_module` on the installed Flower, without patching anything.

    Raises:
        UnsupportedFlower: naming the cause.
    """
    check_module(importlib.import_module(MODULE), installed_flower_version())


def parse_arguments(argv: Sequence[str]) -> tuple[PullWait, list[str]]:
    """``[--pull-wait S] -- <flower-supernode flags>``: the wait and Flower's flags.

    Raises:
        SystemExit: (argparse) an unknown flag before ``--``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m securefed.flower.supernode_launch",
        description="flower-supernode with a shorter wait after an empty pull (Flower 1.42: 3 s); "
        "flower-supernode's flags follow --",
    )
    parser.add_argument(
        "--pull-wait",
        type=float,
        default=DEFAULT_PULL_WAIT,
        help=f"seconds to wait after an empty pull (default {DEFAULT_PULL_WAIT})",
    )
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    return PullWait(args.pull_wait), argv[split + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    """Install the proxy, then run ``flower-supernode`` with the remaining flags."""
    wait, flower = parse_arguments(sys.argv[1:] if argv is None else argv)
    install(wait)
    print(BANNER.format(seconds=wait.seconds), flush=True)
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *flower]
    flower_supernode()
    return 0


if __name__ == "__main__":
    sys.exit(main())
