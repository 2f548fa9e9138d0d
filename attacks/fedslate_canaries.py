"""Canary users for FedSlate's empirical audit: one run, guesses from the server's view.

The one-run audit of :mod:`securefed.audit.empirical` (Steinke, Nasr and Jagielski 2023) needs
canaries included at random and a score per canary. FedSlate's unit of privacy is one user's
episode (docs/fedslate.md section 9), so a canary is a *user*: the user of episode ``e`` in
member ``s`` (each member is its own deployment). An included canary user starts its episode with an
extreme net kale exposure (``nke``, default 300: satisfaction about 0.95 against 0.475-0.525 for
ordinary users, decaying by the memory discount 0.9 per step); an excluded one is an ordinary
user. The server's score of a canary reads only its
view: how far the platform's acting rows of the canary's episode lie from the same member's rows
of the episodes before and after (:func:`acting_row_score`), so a run in the clear
gives the included canaries away, and a DP run should not, beyond its ledger's epsilon.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from securefed.rl.envs.choc_kale import ChocKaleBatch
from securefed.rl.fedslate import ACT
from securefed.views import FusionView

__all__ = ["CanaryUsers", "acting_row_score", "insert_canary_users"]


@dataclass(frozen=True)
class CanaryUsers:
    """Which users are canaries, and what an included one looks like.

    Attributes:
        episodes: the canary episodes (each one's users in every member are canaries).
        members: the run's members ``S``; canary ``i`` is the user of episode
            ``episodes[i // S]`` in member ``i % S``.
        steps_per_platform: the run's rounds per episode.
        nke: the initial net kale exposure of an included canary (finite).
    """

    episodes: tuple[int, ...]
    members: int
    steps_per_platform: int
    nke: float = 300.0

    def __post_init__(self) -> None:
        if (
            not self.episodes
            or min(self.episodes) < 0
            or len(set(self.episodes)) != len(self.episodes)
        ):
            raise ValueError(f"episodes must be distinct and >= 0, got {self.episodes!r}")
        if self.members < 2:
            raise ValueError("canary users need >= 2 members (the others are the reference)")
        if not np.isfinite(self.nke):
            raise ValueError(f"nke must be finite, got {self.nke!r}")

    @property
    def count(self) -> int:
        return len(self.episodes) * self.members

    def slot(self, canary: int) -> tuple[int, int]:
        """``(episode, member)`` of canary ``canary``."""
        return self.episodes[canary // self.members], canary % self.members


def insert_canary_users(
    plan: CanaryUsers, included: np.ndarray
) -> Callable[[ChocKaleBatch, int], None]:
    """The ``on_reset`` hook of :func:`~securefed.rl.fedslate.run_fedslate` that gives the
    included canaries' users the initial exposure ``plan.nke`` (their first observation shifted
    with their satisfaction, its noise kept)."""
    included = np.asarray(included, dtype=bool)
    if included.shape != (plan.count,):
        raise ValueError(f"{included.shape} inclusions for {plan.count} canaries")
    by_episode: dict[int, list[int]] = {}
    for canary in np.flatnonzero(included):
        episode, member = plan.slot(int(canary))
        by_episode.setdefault(episode, []).append(member)

    def hook(env: ChocKaleBatch, episode: int) -> None:
        for member in by_episode.get(episode, ()):
            before = env.sat[member]
            env.nke[member] = plan.nke
            env.obs_sat[member] += env.sat[member] - before

    return hook


def acting_row_score(view: FusionView, plan: CanaryUsers, canary: int, party: str = "A") -> float:
    """The server's score of a canary: the mean absolute difference, entry by entry and step by
    step, between the canary's acting rows and the mean of the same member's rows at the same
    steps of the episodes before and after (the same deployment's network, the users next to it
    in time; its view's ``input`` payloads of the
    :data:`~securefed.rl.fedslate.ACT` exchanges, every round of the three episodes kept).

    Raises:
        ValueError: a round of those episodes whose payloads the view did not keep.
    """
    episode, member = plan.slot(canary)
    own = _member_rows(view, plan, episode, member, party)
    around = [
        _member_rows(view, plan, e, member, party)
        for e in (episode - 1, episode + 1)
        if e >= 0 and view.exchanges_of(tag=ACT, round_id=e * plan.steps_per_platform)
    ]
    if not around:
        raise ValueError(f"the view kept no acting rows of the episodes next to {episode}")
    return float(np.abs(own - np.mean(around, axis=0)).mean())


def _member_rows(
    view: FusionView, plan: CanaryUsers, episode: int, member: int, party: str
) -> np.ndarray:
    """``(steps, N)`` the rows ``party`` released for ``member``'s user of ``episode``."""
    first = episode * plan.steps_per_platform
    rows = []
    for round_id in range(first, first + plan.steps_per_platform):
        exchanges = view.exchanges_of(tag=ACT, round_id=round_id)
        if not exchanges or party not in exchanges[0].payloads:
            raise ValueError(f"the view kept no acting payloads of round {round_id}")
        rows.append(np.asarray(exchanges[0].payloads[party]["input"], np.float64)[member, 0])
    return np.stack(rows)
