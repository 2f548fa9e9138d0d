"""The attack on DP-ALS's uploads: what the server reads from each user's item statistics.

DP-ALS (:mod:`securefed.recsys.dp_als`) sends, per user, rows at the items it chose. What an
honest-but-curious server can take from one payload that holds them in the clear (plaintext, or
central DP, whose inner view is the clipped plaintext):

* **Which items.** The rows' indices are the items the user rated (among its chosen ones), in
  every release.
* **The ratings, from the bias columns.** A bias row is ``w [clip(r - m), 1]`` (at the public
  ``bias_column``) with a per-user weight ``w``; its first column over its second is ``r - m``
  whatever ``w`` is, and ``m`` (the scale's midpoint) is public: every rating released in the
  bias release (or in a pass with ``bias_share > 0``) is recovered exactly unless it was clipped.
* The item passes add ``w [u u^T, e u]``, from which ``u`` and the residual ``e`` follow up to the
  user's own bias; the bias release already gives more, so this attack stops there.

Under secure aggregation, CKKS or ``secagg+dp`` the payloads hold masked integers or ciphertexts:
no row and no value of one user, and every user gets the chance baseline. Under local DP the rows
are densified (every item) and the values noisy: the same ratio is computed on the noisy values
and scored as it comes out. Chance baseline: the true ratings' global mean for a rating, and the
most released items (the bias release's aggregate counts) for the rated set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefed.attacks.metrics import (
    UserSets,
    item_overall,
    overall_metrics,
    per_user_metrics,
    truth_sets,
)
from securefed.recsys.data import Ratings
from securefed.views import ServerView

BIAS_RELEASE = "item biases"


@dataclass(frozen=True)
class ALSInversion:
    """What the attack believes per client (CSR over ``clients``).

    Attributes:
        clients: client ids, sorted.
        ratings: recovered ``(item, rating)`` per client (from the bias release).
        items: the items each client's payload rows name (every kept release).
        readable: clients whose payload held rows and values.
    """

    clients: np.ndarray
    ratings: UserSets
    items: UserSets
    readable: np.ndarray


def _csr(per_client: list[tuple[np.ndarray, np.ndarray | None]]) -> UserSets:
    counts = [len(items) for items, _ in per_client]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.concatenate([i for i, _ in per_client]) if per_client else np.zeros(0)
    if any(v is None for _, v in per_client):
        return UserSets(indptr, items.astype(np.int64))
    values = np.concatenate([v for _, v in per_client]) if per_client else np.zeros(0)
    return UserSets(indptr, items.astype(np.int64), values)


def invert_als_view(view: ServerView) -> ALSInversion:
    """Read every kept DP-ALS payload of ``view`` (module docstring).

    Raises:
        ValueError: ``view`` is not a DP-ALS view (``public["protocol"] != "dp-als"``).
    """
    if view.public.get("protocol") != "dp-als":
        raise ValueError("not a DP-ALS view: public['protocol'] is not 'dp-als'")
    midpoint = float(view.public["midpoint"])
    column = int(view.public["bias_column"])
    clients = np.unique(np.concatenate([r.clients for r in view] or [np.zeros(0, np.int64)]))
    ratings: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    items: dict[int, set[int]] = {}
    readable = np.zeros(len(clients), dtype=bool)
    for rnd in view:
        if not rnd.keep_payloads:
            continue
        for client, fields in rnd.payloads.items():
            if "rows" not in fields or "values" not in fields:
                continue  # masked integers or ciphertexts: nothing of one user
            rows, values = np.asarray(fields["rows"]), np.asarray(fields["values"])
            readable[np.searchsorted(clients, client)] = True
            items.setdefault(client, set()).update(rows.tolist())
            if len(rows) and np.any(values[:, column + 1] != 0) and client not in ratings:
                with np.errstate(divide="ignore", invalid="ignore"):
                    centred = values[:, column] / values[:, column + 1]
                ratings[client] = (rows, np.where(np.isfinite(centred), centred + midpoint, np.nan))
    empty = (np.zeros(0, np.int64), np.zeros(0))
    return ALSInversion(
        clients,
        _csr([ratings.get(int(c), empty) for c in clients]),
        _csr([(np.array(sorted(items.get(int(c), ())), np.int64), None) for c in clients]),
        readable,
    )


def _released_counts(view: ServerView, n_items: int) -> np.ndarray:
    """The bias release's aggregate count column (zeros where the view kept no aggregate)."""
    column = int(view.public["bias_column"]) + 1
    for rnd in view:
        if rnd.public.get("release") == BIAS_RELEASE:
            total = rnd.aggregate.get("dp_total", rnd.aggregate.get("total"))
            if total is not None and np.ndim(total) == 2 and len(total) == n_items:
                return np.asarray(total)[:, column]
    return np.zeros(n_items)


def score_als_view(view: ServerView, truth: Ratings) -> dict[str, float]:
    """Leak scores (:mod:`securefed.attacks.metrics`) of the DP-ALS attack against ``truth``.

    Users the attack could not read get the chance baseline (module docstring), so a hiding
    transport scores at chance. ``readable`` is the share of users whose payload was read.
    """
    inversion = invert_als_view(view)
    users = inversion.clients
    true = truth_sets(truth, users)
    fallback = float(np.mean(truth.ratings))
    popular = np.argsort(-_released_counts(view, truth.n_items), kind="stable")
    guessed = [
        (inversion.items.items[inversion.items.indptr[j] : inversion.items.indptr[j + 1]], None)
        if inversion.readable[j]
        else (np.sort(popular[: true.counts()[j]]), None)
        for j in range(len(users))
    ]
    predicted = _csr(guessed)
    per_user = per_user_metrics(
        true, inversion.ratings, predicted, truth.scale, truth.n_items, fallback
    )
    scores = overall_metrics(per_user)
    scores["readable"] = float(np.mean(inversion.readable)) if len(users) else 0.0
    scores["chance_exact_share"] = float(
        np.mean(truth.scale.snap(np.full(1, fallback))[0] == truth.ratings)
    )
    scores |= {
        f"popular_{k}": v
        for k, v in item_overall(
            true, _csr([(np.sort(popular[:n]), None) for n in true.counts()]), truth.n_items
        ).items()
    }
    return scores
