"""``verify(view, truth)``: run every attack that applies to a ServerView and measure the leak.

The entry point of the attack suite (DESIGN.md: attacks take a ServerView and nothing else; the
truth is only used to score them). Stages:

1. **Protocol.** ``view.public`` must hold FedMF's public parameters
   (:class:`~securefed.attacks.gradient_inversion.FedMFProtocol`); otherwise nothing applies.
2. **Rounds.** By default the last two consecutive rounds that kept payloads and the broadcast
   ``V`` (``t-1``, ``t``); one such round if there is no pair; ``rounds=(t-1, t)`` chooses.
3. **What the payloads are.** Plaintext rows/values (``"rows"``, ``"values"`` fields: plaintext,
   central DP whose inner view holds clipped plaintext) are inverted exactly. Dense noisy rows
   (local DP) are inverted the same way on the noisy values: the estimate is as good as the noise
   allows, and the tests that need exact values (rating grid, update consistency) are skipped.
   Anything else (``"masked"`` integers of secure aggregation, ciphertext bytes) holds nothing
   per client to invert: every user falls back to the chance baseline, and a note says so.
4. **Per user.** Vanilla FedMF: the closed form of two rounds
   (:func:`~securefed.attacks.gradient_inversion.invert_two_rounds`), else the one-round rating grid
   (:func:`~securefed.attacks.gradient_inversion.invert_one_round`); every uploaded row is a rated
   item.
   Hybrid filling (FedRec, FedRec+): the rating grid in each round, then the item tests of
   :mod:`securefed.attacks.item_inference` and their combination.
   A private offset or a weightless, clipped upload (the DP preset: ``aggregation="fixed"``,
   ``offset="user_mean"``; vanilla FedMF, two exact rounds): the shape of ``r - m_u`` from the
   closed form, then every user's admissible (scale, sign, shift) hypotheses
   (:mod:`securefed.attacks.offset_inversion`), one chosen per user by the rating prior and the
   agreement between users (a population step after the per-user one).
5. **Chance baseline.** Ratings: the global mean of the true ratings. Items: the most popular
   items, popularity read from the released aggregate's per-item uploader counts when the view
   holds one (else the truth's item counts), as many as the user truly rated (without truth, the
   expected number implied by the aggregate). Users the attack could not reach get these guesses.
6. **Scores** (:mod:`securefed.attacks.metrics`) when ``truth`` is given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from securefed.attacks.gradient_inversion import (
    ClientUpload,
    FedMFProtocol,
    Inversion,
    InversionError,
    extract_upload,
    invert_one_round,
    invert_two_rounds,
)
from securefed.attacks.item_inference import (
    TEST_NAMES,
    combine_tests,
    intersection_test,
    rated_count,
    rating_scale_test,
    update_consistency_test,
    upload_order_test,
    virtual_rating_test,
)
from securefed.attacks.metrics import (
    UserSets,
    item_overall,
    overall_metrics,
    per_user_metrics,
    truth_sets,
)
from securefed.attacks.offset_inversion import (
    OffsetShape,
    ValueMaps,
    biased_value_maps,
    offset_shape,
    offset_shape_from_grid,
    pin_shift,
    resolve_population,
    shape_value_maps,
    similarity_consistent,
    user_bias_shift,
)
from securefed.recsys.data import Ratings, RatingScale
from securefed.views import ServerView

PLAINTEXT_FIELDS = frozenset({"rows", "values"})

ITEM_ATTACKS = ("uploaded", *TEST_NAMES, "hybrid_filling", "combined")
"""Item predictions scored in ``LeakReport.item_attacks``: every uploaded row, each test alone,
the spec's section-3 attack (rating scale and intersection) and the headline combination."""


# ------------------------------------------------------------------------------ the report


@dataclass(frozen=True, eq=False)
class LeakReport:
    """What the attacks recovered from a view, and how much of it was right.

    Attributes:
        transport: ``view.transport``.
        protocol: ``view.public["protocol"]`` (``""`` if absent).
        rounds: the rounds attacked (``(t-1, t)``, ``(t,)`` or ``()``).
        attacks_applied: names of the attacks that ran for at least one user.
        notes: why other attacks did not apply, and caveats.
        users: evaluated client ids, sorted.
        method: per user, ``"closed_form"``, ``"rating_grid"``, ``"rows_only"`` (rows seen but
            no values recovered) or ``"baseline"`` (nothing per client: chance guesses).
        recovered: per user, the rows looked at and their recovered values (NaN: none).
        rated: mask over ``recovered`` entries: the headline prediction of rated items.
        tests: per item test (and ``"hybrid_filling"``), a mask over ``recovered`` entries of the
            rows it keeps (all rows where it could not decide).
        per_user: per-user metric arrays aligned with ``users`` (empty without truth).
        overall: overall metrics (without truth: counts only).
        item_attacks: overall precision / recall / F1 of each prediction in :data:`ITEM_ATTACKS`.
        baseline_per_user: the chance baseline's per-user metrics.
        baseline: the chance baseline's overall metrics.
    """

    transport: str
    protocol: str
    rounds: tuple[int, ...]
    attacks_applied: tuple[str, ...]
    notes: tuple[str, ...]
    users: np.ndarray
    method: np.ndarray
    recovered: UserSets
    rated: np.ndarray
    tests: dict[str, np.ndarray] = field(default_factory=dict)
    per_user: dict[str, np.ndarray] = field(default_factory=dict)
    overall: dict[str, float] = field(default_factory=dict)
    item_attacks: dict[str, dict[str, float]] = field(default_factory=dict)
    baseline_per_user: dict[str, np.ndarray] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)

    def _position(self, user: int) -> int:
        at = int(np.searchsorted(self.users, user))
        if at >= len(self.users) or self.users[at] != user:
            raise KeyError(f"user {user} was not evaluated")
        return at

    def recovered_ratings(self, user: int) -> tuple[np.ndarray, np.ndarray]:
        """``(items, values)`` of every row looked at for ``user`` (values NaN when unknown)."""
        at = self._position(user)
        span = slice(self.recovered.indptr[at], self.recovered.indptr[at + 1])
        values = self.recovered.values
        return self.recovered.items[span], (values[span] if values is not None else None)

    def predicted_items(self, user: int) -> np.ndarray:
        """The items predicted as rated by ``user``, sorted."""
        at = self._position(user)
        span = slice(self.recovered.indptr[at], self.recovered.indptr[at + 1])
        return np.sort(self.recovered.items[span][self.rated[span]])

    def to_dict(self) -> dict[str, object]:
        """JSON-ready copy (lists and floats; NaN becomes ``None``)."""
        return {
            "transport": self.transport,
            "protocol": self.protocol,
            "rounds": list(self.rounds),
            "attacks_applied": list(self.attacks_applied),
            "notes": list(self.notes),
            "overall": _jsonable(self.overall),
            "baseline": _jsonable(self.baseline),
            "item_attacks": _jsonable(self.item_attacks),
            "users": _jsonable(self.users),
            "method": [str(m) for m in self.method],
            "per_user": _jsonable(self.per_user),
            "baseline_per_user": _jsonable(self.baseline_per_user),
            "recovered": {
                "indptr": _jsonable(self.recovered.indptr),
                "items": _jsonable(self.recovered.items),
                "values": _jsonable(self.recovered.values),
                "rated": _jsonable(self.rated),
                "tests": _jsonable(self.tests),
            },
        }


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ------------------------------------------------------------------------------ rounds, payloads


def choose_rounds(view: ServerView, rounds: tuple[int, int] | None = None) -> tuple[int, ...]:
    """The rounds to attack: ``rounds`` if given (checked), else the last consecutive pair that
    kept payloads and the broadcast ``V``, else the last such round, else none.

    Raises:
        ValueError: if the requested rounds are not consecutive or kept no payloads or ``V``.
    """
    usable = [r for r in view.rounds_with_payloads() if "V" in view.round(r).broadcast]
    if rounds is not None:
        if len(rounds) != 2 or int(rounds[1]) != int(rounds[0]) + 1:
            raise ValueError(f"rounds must be two consecutive round ids (t-1, t), got {rounds!r}")
        for r in rounds:
            if int(r) not in usable:
                raise ValueError(
                    f"round {r} kept no payloads or no broadcast V (rounds with both: {usable})"
                )
        return (int(rounds[0]), int(rounds[1]))
    pairs = [r for r in usable if r + 1 in usable]
    if pairs:
        return (max(pairs), max(pairs) + 1)
    return (max(usable),) if usable else ()


def payload_fields(view: ServerView, rounds: Iterable[int]) -> set[str]:
    """Every payload field name seen in ``rounds``."""
    names: set[str] = set()
    for r in rounds:
        for payload in view.round(r).payloads.values():
            names.update(payload)
    return names


def dp_noise_std(view: ServerView, round_id: int) -> float | None:
    """Per-coordinate noise std on a client's payload, from the DP transport's public record.

    ``"local"``: ``dp_sigma * dp_clip``; ``"distributed"``: that over ``sqrt(n)`` (``n`` clients
    asked in the round); ``"central"``: 0 (the server's view holds the clipped updates before the
    noise). ``None`` when the round records no DP parameters (then estimated from the payload).
    """
    public = view.round(round_id).public
    placement = public.get("dp_placement")
    if placement is None or "dp_sigma" not in public or "dp_clip" not in public:
        return None
    std = float(public["dp_sigma"]) * float(public["dp_clip"])  # type: ignore[arg-type]
    if placement == "central":
        return 0.0
    if placement == "distributed":
        return std / math.sqrt(max(len(view.round(round_id).clients), 1))
    return std


def popularity_from_view(
    view: ServerView, n_items: int, rounds: Iterable[int]
) -> np.ndarray | None:
    """Per-item uploader counts from the released aggregate (item rows' last column), if any.

    Reads the first of ``rounds`` (then any other round) whose aggregate ``total`` covers the
    catalogue; under FedMF's ``item_blocks`` (a round releases one public block) the rounds'
    blocks are put together, the first round that covers an item giving its count. Under hybrid
    filling the counts include pseudo uploads.
    """
    order = list(rounds) + [r.round_id for r in view]
    popularity, covered = np.zeros(n_items), np.zeros(n_items, dtype=bool)
    for r in order:
        found = _aggregate_rows(view, r, n_items)
        if found is None:
            continue
        items, total = found
        fresh = ~covered[items]
        popularity[items[fresh]] = total[:-2, -1][fresh]
        covered[items] = True
        if covered.all():
            return popularity
    return popularity if covered.any() else None


def _aggregate_rows(view: ServerView, round_id: int, n_items: int):
    """``(items, total)`` of a round's released aggregate: the items its item rows stand for
    (every item, or the round's public ``item_block``) and the total (two statistics rows last);
    ``None`` when the round released no such aggregate."""
    record = view.round(round_id)
    total = record.aggregate.get("total")
    if total is None or np.ndim(total) != 2:
        return None
    block = record.public.get("item_block")
    if block is None:
        items = np.arange(n_items, dtype=np.int64)
    else:
        items = np.arange(int(block["offset"]), n_items, int(block["stride"]), dtype=np.int64)
    if np.shape(total)[0] != len(items) + 2:
        return None
    return items, np.asarray(total, dtype=np.float64)


def expected_rated_count(view: ServerView, protocol: FedMFProtocol, rounds: Iterable[int]) -> float:
    """Mean rated items per user implied by the aggregate (statistics row ``n_items``: the sum
    of uploaded row counts, over the aggregate's weight: the number of uniform-weight uploaders),
    divided by ``1 + rho`` under filling. NaN when the view holds no such aggregate."""
    for r in list(rounds) + [r.round_id for r in view]:
        found = _aggregate_rows(view, r, protocol.n_items)
        weight = view.round(r).aggregate.get("weight")
        if found is None or weight is None:
            continue
        uploaders = float(np.asarray(weight))
        if uploaders > 0:
            per_user = float(found[1][-2, -1]) / uploaders
            return per_user / (1.0 + protocol.rho) if protocol.fills else per_user
    return float("nan")


def top_popular(popularity: np.ndarray, counts: np.ndarray) -> UserSets:
    """For each user, its ``counts[k]`` most popular items (ties by item index)."""
    order = np.lexsort((np.arange(len(popularity)), -np.asarray(popularity)))
    counts = np.minimum(np.maximum(np.asarray(counts, dtype=np.int64), 0), len(order))
    indptr = np.concatenate([[0], np.cumsum(counts)])
    items = np.concatenate([order[:k] for k in counts] or [np.zeros(0, np.int64)])
    return UserSets(indptr, items)


# ------------------------------------------------------------------------------ per user


@dataclass(frozen=True, eq=False)
class UserAttack:
    """What the attacks found for one user: rows, recovered values, test masks, method.

    ``maps``: the user's values up to one of a few affine maps (a private offset, a clipping
    factor, the item-bias column's shift), chosen by the population step; ``listed``: every
    item row its payload listed (rows with a zero gradient included), for the filled-row share;
    ``suspect``: rows that look like FedRec+'s virtual ratings but are kept as rated (the test
    also flags real ratings at the user's mean: scored, not acted on).
    """

    items: np.ndarray
    values: np.ndarray
    tests: dict[str, np.ndarray | None]
    method: str
    applied: tuple[str, ...]
    shape: OffsetShape | None = None
    maps: ValueMaps | None = None
    listed: np.ndarray | None = None
    suspect: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class AttackContext:
    """What every user's attack shares.

    Attributes:
        protocol: the public parameters.
        rounds: the attacked rounds (``(t-1, t)`` or ``(t,)``).
        factors: the broadcast ``V`` of each attacked round.
        link_lr: gamma of the round whose steps link the two rounds' user vectors.
        clips: the DP clip of each attacked round (``None``: no clipping recorded).
        item_biases: the broadcast item biases of each attacked round (``None``: not in the
            view; FedMF with ``biases`` broadcasts them beside ``V``).
    """

    protocol: FedMFProtocol
    rounds: tuple[int, ...]
    factors: tuple[np.ndarray, ...]
    link_lr: float
    clips: tuple[float | None, ...] = ()
    item_biases: tuple[np.ndarray | None, ...] = ()


def _try(function, *args, **kwargs):
    """``function(...)``, or ``None`` when the inversion does not apply to this user."""
    try:
        return function(*args, **kwargs)
    except (InversionError, np.linalg.LinAlgError):
        return None


def _match_rows(items: np.ndarray, other_items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``items``: its position in ``other_items`` and whether it is there at all."""
    order = np.argsort(other_items, kind="stable")
    where = np.searchsorted(other_items[order], items)
    matched = order[np.minimum(where, max(len(order) - 1, 0))]
    present = other_items[matched] == items if len(order) else np.zeros(len(items), bool)
    return matched, present


def attack_user(
    uploads: tuple[ClientUpload | None, ...], context: AttackContext
) -> UserAttack | None:
    """Run the applicable inversions and item tests for one user (module docstring, stage 4)."""
    protocol, factors = context.protocol, context.factors
    present = [k for k, upload in enumerate(uploads) if upload is not None]
    if not present:
        return None
    base_at = present[0]
    base = uploads[base_at]
    two = len(uploads) == 2 and len(present) == 2
    exact = all(uploads[k].exact for k in present)
    round_ids = context.rounds
    applied: list[str] = []
    inversion: Inversion | None = None
    other: Inversion | None = None
    # The closed forms and the rating grid of (R) do not model biases: the bias column does.
    invertible = protocol.values_invertible and not protocol.biases
    fixed = protocol.aggregation == "fixed"
    # With a weight column the clipping factor cancels when the weight is divided out.
    base_clip = context.clips[base_at] if context.clips and fixed else None
    maps: ValueMaps | None = None
    biases = context.item_biases[base_at] if context.item_biases else None
    if protocol.biases and exact and biases is not None:
        found = _try(biased_value_maps, base, factors[base_at], biases, protocol, clip=base_clip)
        if found is not None:
            maps = found.maps
            applied.append("offset_inversion.item_bias")
        later = context.item_biases[1] if two else None
        if found is not None and later is not None and base_at == 0:
            following = _try(biased_value_maps, uploads[1], factors[1], later, protocol)
            constant, real = None, None
            if protocol.fills and protocol.pseudo_resampled and not protocol.virtual_on_scale:
                # FedRec: rated rows are on the grid and uploaded again in the next round.
                real = maps.covered & intersection_test(base.items, uploads[1].items)
            if following is not None and (real is not None or not protocol.fills):
                constant = _try(
                    user_bias_shift, found, following, protocol, lr=context.link_lr, real=real
                )
            if constant is not None:
                pinned = pin_shift(maps, constant, protocol.scale)
                if len(pinned.maps) < len(maps.maps):
                    maps = pinned
                    applied.append("offset_inversion.user_bias_shift")
    if invertible and two and (not protocol.fills or not exact):
        inversion = _try(
            invert_two_rounds,
            uploads[0],
            uploads[1],
            factors[0],
            factors[1],
            protocol,
            lr=context.link_lr,
            round_id=round_ids[0],
        )
        if inversion is not None:
            applied.append("gradient_inversion.closed_form")
    if invertible and inversion is None and exact:
        inversion = _try(
            invert_one_round, base, factors[base_at], protocol, round_id=round_ids[base_at]
        )
        if inversion is not None:
            applied.append("gradient_inversion.rating_grid")
        if two and protocol.fills:
            other = _try(invert_one_round, uploads[1], factors[1], protocol, round_id=round_ids[1])
    shape = None
    if not invertible and not protocol.biases and two and exact and not protocol.fills:
        clip = context.clips[0] if context.clips and fixed else None
        shape = _try(
            offset_shape,
            uploads[0],
            uploads[1],
            factors[0],
            factors[1],
            protocol,
            lr=context.link_lr,
            clip=clip,
        )
        if shape is not None:
            applied.append("offset_inversion.shape")
    if not invertible and not protocol.biases and exact and shape is None:
        # Filling hides the rows of the user's step (or one round only): the grid's shape.
        shape = _try(offset_shape_from_grid, base, factors[base_at], protocol, clip=base_clip)
        if shape is not None:
            applied.append("offset_inversion.grid_shape")
    if shape is not None:
        free_shift = protocol.offset == "user_mean"
        maps = shape_value_maps(shape, protocol.scale, free_shift=free_shift)
    suspect = None
    similar = protocol.fills and protocol.virtual_source == "similar" and not protocol.biases
    if maps is not None and similar and len(maps.maps):
        # FedRec+'s virtual ratings are the user's similarity-weighted mean: the rows that
        # look like one carry the least about the sign; the population scores the others.
        suspect = similarity_consistent(maps, factors[base_at], protocol.scale)
        maps = replace(maps, scored=maps.covered & ~suspect)
        applied.append("offset_inversion.similarity_filter")
    tests: dict[str, np.ndarray | None] = dict.fromkeys(TEST_NAMES)
    if protocol.fills and maps is not None and not np.all(maps.covered):
        tests["rating_scale"] = maps.covered.copy()  # off the grid: virtual ratings
        applied.append("item_inference.rating_scale")
    if protocol.fills:
        if inversion is not None and exact:
            scale_ok = rating_scale_test(inversion, protocol)
            if other is not None:
                # A row uploaded in both rounds must be on the grid in both.
                matched, again = _match_rows(inversion.items, other.items)
                scale_ok &= ~again | rating_scale_test(other, protocol)[matched]
            tests["rating_scale"] = scale_ok
            applied.append("item_inference.rating_scale")
        if two:
            tests["intersection"] = intersection_test(base.items, uploads[1].items)
            applied.append("item_inference.intersection")
        order_mask = upload_order_test(base.items, protocol)
        if order_mask is not None:
            tests["upload_order"] = order_mask
            applied.append("item_inference.upload_order")
        virtual = _virtual_rating_mask(inversion, other, context) if exact else None
        if virtual is not None:
            tests["virtual_rating"] = virtual
            applied.append("item_inference.virtual_rating")
        if inversion is not None and other is not None:
            consistent = _try(
                update_consistency_test,
                inversion,
                other,
                factors[0],
                factors[1],
                protocol,
                lr=context.link_lr,
            )
            if consistent is not None:
                tests["update_consistency"] = consistent
                applied.append("item_inference.update_consistency")
    if inversion is None:
        values = np.full(len(base.items), np.nan)
        method = "rows_only"
    else:
        values = inversion.values
        method = inversion.method
    listed = base.listed if base.listed is not None else base.items
    return UserAttack(
        base.items, values, tests, method, tuple(applied), shape, maps, listed, suspect
    )


def _virtual_rating_mask(
    inversion: Inversion | None, other: Inversion | None, context: AttackContext
) -> np.ndarray | None:
    """The virtual-rating test over the base rows, where the round is past the warm-up.

    ``"before"``: the base round's own vector ``a w`` is its start vector. ``"after"``: the start
    vector of round ``t`` is the vector behind round ``t-1``'s gradients, so the test runs on
    round ``t``'s rows and is mapped back to the base rows (rows absent in ``t`` are kept).
    """
    protocol = context.protocol
    if inversion is None:
        return None
    if protocol.gradient_user_vector == "before":
        base_at = 0 if inversion.round_id == context.rounds[0] else len(context.rounds) - 1
        if context.rounds[base_at] < protocol.warmup_rounds:
            return None
        return virtual_rating_test(
            inversion.items,
            inversion.values,
            inversion.user_vector,
            context.factors[base_at],
            protocol,
            n_rated=rated_count(len(inversion.items), protocol),
        )
    if other is None or context.rounds[-1] < protocol.warmup_rounds:
        return None
    differs = virtual_rating_test(
        other.items,
        other.values,
        inversion.user_vector,
        context.factors[-1],
        protocol,
        n_rated=rated_count(len(other.items), protocol),
    )
    if differs is None:
        return None
    kept = np.ones(len(inversion.items), dtype=bool)
    matched, again = _match_rows(inversion.items, other.items)
    kept[again] = differs[matched[again]]
    return kept


# ------------------------------------------------------------------------------ verify


def verify(
    view: ServerView,
    truth: Ratings | None = None,
    *,
    rounds: tuple[int, int] | None = None,
    users: Iterable[int] | None = None,
    rating_prior: np.ndarray | None = None,
) -> LeakReport:
    """Run every applicable attack on ``view`` and score it against ``truth``.

    Args:
        view: what the server saw (in memory or ``ServerView.load``-ed).
        truth: the training ratings (user index = client id, item index = row); ``None``
            reports what was recovered without accuracy metrics.
        rounds: ``(t-1, t)`` to attack; default: the last consecutive pair with payloads.
        users: client ids to evaluate; default: every client with a payload in the attacked
            rounds, plus every user with a true rating.
        rating_prior: the attacker's assumed share of each rating level in the population,
            used where a private offset leaves the sign and the shift of a user's ratings open
            (default :func:`~securefed.attacks.offset_inversion.skewed_prior`).

    Returns:
        A :class:`LeakReport`.

    Raises:
        ValueError: if ``rounds`` is invalid, or ``truth`` does not match the view's catalogue.
    """
    notes: list[str] = []
    protocol_name = str(view.public.get("protocol", ""))
    protocol: FedMFProtocol | None = None
    if protocol_name == "fedmf":
        protocol = FedMFProtocol.from_public(view.public)
        if truth is not None and truth.n_items != protocol.n_items:
            raise ValueError(
                f"truth has {truth.n_items} items but the view's protocol has {protocol.n_items}"
            )
        if truth is not None and protocol.rating_unit != 1.0:
            truth = _in_units(truth, protocol)  # scored in the units the uploads are in
    else:
        notes.append(
            f"protocol {protocol_name or 'unknown'!r} is not FedMF: no gradient inversion applies"
        )
    chosen = choose_rounds(view, rounds) if protocol is not None else ()
    uploads = _read_uploads(view, chosen, protocol, notes) if protocol is not None else []
    evaluated = _evaluated_users(view, chosen, truth, users)
    results, applied = _attack_users(
        view, chosen, protocol, uploads, evaluated, notes, rating_prior
    )
    scale = protocol.scale if protocol is not None else (truth.scale if truth else None)
    n_items = protocol.n_items if protocol is not None else (truth.n_items if truth else 0)
    truth_set = truth_sets(truth, evaluated) if truth is not None else None
    baseline_sets, guess_rating = _chance_baseline(
        view, protocol, chosen, truth, truth_set, len(evaluated), notes
    )
    if len(results) < len(evaluated):
        applied.add("baseline")
    methods, recovered, rated, tests = _assemble(evaluated, results, baseline_sets, guess_rating)
    scores: dict[str, dict] = {}
    if truth_set is not None and scale is not None:
        scores = _score(
            truth_set, recovered, rated, tests, baseline_sets, scale, n_items, guess_rating
        )
        if protocol is not None and protocol.fills:
            found, chance = filled_row_shares(evaluated, results, truth_set, recovered, rated)
            scores["overall"] |= found
            scores["baseline"] |= chance
    else:
        scores["overall"] = {
            "users": float(len(evaluated)),
            "rows": float(len(rated)),
            "predicted_rated": float(rated.sum()),
            "recovered_values": float(np.isfinite(recovered.values).sum()),
        }
        notes.append("no truth given: recovered ratings and items reported without accuracy")
    return LeakReport(
        transport=view.transport,
        protocol=protocol_name,
        rounds=chosen,
        attacks_applied=tuple(sorted(applied)),
        notes=tuple(notes),
        users=evaluated,
        method=np.array(methods, dtype=str),
        recovered=recovered,
        rated=rated,
        tests=tests,
        per_user=scores.get("per_user", {}),
        overall=scores["overall"],
        item_attacks=scores.get("item_attacks", {}),
        baseline_per_user=scores.get("baseline_per_user", {}),
        baseline=scores.get("baseline", {}),
    )


def _read_uploads(
    view: ServerView, chosen: tuple[int, ...], protocol: FedMFProtocol, notes: list[str]
) -> list[dict[int, ClientUpload]]:
    """Each attacked round's readable uploads by client (stage 3); appends notes."""
    if not chosen:
        notes.append("the view kept no payloads with the broadcast V: nothing per client to invert")
        return []
    if len(chosen) == 1:
        notes.append(
            f"only round {chosen[0]} kept payloads and V: one-round attacks only (rating grid; "
            "no closed form, no intersection, no update consistency)"
        )
    plaintext = all(
        set(p) >= PLAINTEXT_FIELDS for r in chosen for p in view.round(r).payloads.values()
    )
    if not plaintext:
        notes.append(
            f"payload fields {sorted(payload_fields(view, chosen))} carry no per-client plaintext "
            "rows (masked or encrypted): nothing per client to invert; every user gets the "
            "chance baseline"
        )
        return [{} for _ in chosen]
    uploads: list[dict[int, ClientUpload]] = []
    failures = 0
    for r in chosen:
        noise = dp_noise_std(view, r)
        block = view.round(r).public.get("item_block")
        per_round = {}
        for client, payload in view.round(r).payloads.items():
            if block is not None:
                payload = catalogue_rows(payload, block, protocol.n_items)
            try:
                per_round[client] = extract_upload(client, payload, protocol, noise_std=noise)
            except InversionError:
                failures += 1
        uploads.append(per_round)
    if failures:
        notes.append(f"{failures} payload(s) could not be read as gradient rows")
    if any(not up.exact for per_round in uploads for up in per_round.values()):
        notes.append(
            "payloads are noisy (dense noisy rows, e.g. local DP): rows were detected by a noise "
            "threshold and inverted by the closed form on the noisy values; the exact-value tests "
            "(rating grid, rating scale, virtual rating, update consistency) do not apply"
        )
    if protocol.fills:
        how = (
            "the one-round rating grid of (R)"
            if protocol.values_invertible and not protocol.biases
            else "the one-round grid shape of (S) or the item-bias column, then the population"
        )
        notes.append(
            f"hybrid filling ({protocol.variant}, rho={protocol.rho:g}): on exact payloads the "
            f"values come from {how}, the rated items from the item tests"
        )
    return uploads


def catalogue_rows(
    payload: Mapping[str, np.ndarray], block: Mapping[str, int], n_items: int
) -> dict[str, np.ndarray]:
    """A payload of an item-block round (FedMF ``item_blocks``) with its rows in catalogue terms.

    Row ``k`` of the round's block is item ``offset + k * stride`` (the round's public
    ``item_block``); the block's last two rows are the statistics rows ``n_items`` and
    ``n_items + 1``.
    """
    offset, stride = int(block["offset"]), int(block["stride"])
    items = np.arange(offset, n_items, stride, dtype=np.int64)
    catalogue = np.concatenate([items, [n_items, n_items + 1]])
    return dict(payload) | {"rows": catalogue[np.asarray(payload["rows"], dtype=np.int64)]}


def _in_units(truth: Ratings, protocol: FedMFProtocol) -> Ratings:
    """``truth`` with its ratings divided by the protocol's public rating unit, snapped onto the
    grid in units (as recovered values are, so that an exact recovery compares equal)."""
    ratings = protocol.scale.snap(truth.ratings / protocol.rating_unit)
    return replace(truth, ratings=ratings, scale=protocol.scale)


def _evaluated_users(
    view: ServerView, chosen: tuple[int, ...], truth: Ratings | None, users: Iterable[int] | None
) -> np.ndarray:
    """``users`` if given, else every payload client of the attacked rounds and true user."""
    if users is not None:
        return np.unique(np.asarray(list(users), dtype=np.int64))
    seen = {client for r in chosen for client in view.round(r).payloads}
    if truth is not None:
        seen |= set(np.unique(truth.users).tolist())
    return np.array(sorted(seen), dtype=np.int64)


def _attack_users(
    view: ServerView,
    chosen: tuple[int, ...],
    protocol: FedMFProtocol | None,
    uploads: list[dict[int, ClientUpload]],
    evaluated: np.ndarray,
    notes: list[str],
    rating_prior: np.ndarray | None = None,
) -> tuple[dict[int, UserAttack], set[str]]:
    """Stage 4 for every evaluated user with an upload; returns results and attack names."""
    results: dict[int, UserAttack] = {}
    applied: set[str] = set()
    if protocol is None or not any(uploads):
        return results, applied
    link_round = chosen[0] if protocol.gradient_user_vector == "before" else chosen[-1]
    context = AttackContext(
        protocol,
        chosen,
        tuple(np.asarray(view.round(r).broadcast["V"]) for r in chosen),
        float(view.round(link_round).public.get("lr", protocol.lr)),  # type: ignore[arg-type]
        tuple(_round_clip(view, r) for r in chosen),
        tuple(_round_item_biases(view, r, protocol) for r in chosen),
    )
    for client in evaluated.tolist():
        result = attack_user(tuple(u.get(client) for u in uploads), context)
        if result is not None:
            results[client] = result
            applied.update(result.applied)
    if protocol.biases and all(b is None for b in context.item_biases):
        notes.append(
            "the rows carry item-bias gradients but the view holds no broadcast item_bias: the "
            "item-bias inversion needs the b_i the server sent (FedMF broadcasts them)"
        )
    if any(result.maps is not None for result in results.values()):
        _resolve_offsets(results, protocol, notes, rating_prior)
        applied.add("offset_inversion.population")
    if protocol.fills:
        for name, why in (
            ("upload_order", "rows do not form rated-then-pseudo runs for any user"),
            ("virtual_rating", "still in the warm-up, or keeping every row scored better"),
            ("update_consistency", "needs two exact rounds, one local step, rows <= dim"),
        ):
            if f"item_inference.{name}" not in applied:
                notes.append(f"{name} decided for no user: {why}")
    return results, applied


def _round_item_biases(
    view: ServerView, round_id: int, protocol: FedMFProtocol
) -> np.ndarray | None:
    """The item biases broadcast in a round (FedMF with ``biases``), if the view kept them."""
    if not protocol.biases:
        return None
    biases = view.round(round_id).broadcast.get("item_bias")
    return None if biases is None else np.asarray(biases, dtype=np.float64)


def _round_clip(view: ServerView, round_id: int) -> float | None:
    """The DP clip a round's payloads went through, if the round records one."""
    clip = view.round(round_id).public.get("dp_clip")
    return None if clip is None else float(clip)  # type: ignore[arg-type]


def _resolve_offsets(
    results: dict[int, UserAttack],
    protocol: FedMFProtocol,
    notes: list[str],
    rating_prior: np.ndarray | None,
) -> None:
    """The population step: one of each user's value maps, chosen by the prior and agreement.

    Each user's maps are scored on the rows they put on the grid (distinct rating vectors
    there); the chosen map gives every row its value, the grid's rows snapped.
    """
    scale = protocol.scale
    clients = [client for client, result in results.items() if result.maps is not None]
    full, hypotheses, items = [], [], []
    for client in clients:
        maps = results[client].maps
        values = maps.values(scale)
        scored = maps.scored_rows
        distinct, first = np.unique(values[:, scored], axis=0, return_index=True)
        full.append(values[first])
        hypotheses.append(distinct)
        items.append(maps.items[scored])
    resolution = resolve_population(hypotheses, items, protocol.n_items, scale, prior=rating_prior)
    for k, client in enumerate(clients):
        pick = int(resolution.chosen[k])
        if pick < 0:
            continue
        result = results[client]
        method = "item_bias_population" if result.shape is None else "offset_population"
        results[client] = UserAttack(
            result.items,
            full[k][pick],
            result.tests,
            method,
            result.applied,
            result.shape,
            result.maps,
            result.listed,
            result.suspect,
        )
    counts = resolution.n_hypotheses
    shapes = [results[client].shape for client in clients if results[client].shape is not None]
    n_clipped = sum(fit.clipped for fit in shapes)
    n_grid = sum(fit.on_grid is not None for fit in shapes)
    off_grid = sum(int((~results[client].maps.covered).sum()) for client in clients)
    where = []
    if shapes:
        where.append(
            f"shape of r - m_u for {len(shapes)} users ({len(shapes) - n_grid} from two rounds' "
            f"closed form, {n_grid} from one round's rating grid; {n_clipped} blocks clipped, "
            "their scale from the rating grid)"
        )
    if len(shapes) < len(clients):
        where.append(
            f"r - C_u with its sign and scale from the item-bias column for "
            f"{len(clients) - len(shapes)} users"
        )
    notes.append(
        f"aggregation={protocol.aggregation!r}, offset={protocol.offset!r}"
        + (", biases" if protocol.biases else "")
        + ": values by the offset inversion ("
        + "; ".join(where)
        + "; sign, scale and shift left open chosen by the rating prior and the agreement "
        f"between users): {int(np.sum(counts == 1))} users had one admissible rating vector, "
        f"{int(np.sum(counts > 1))} several (median {float(np.median(counts)):g}), "
        f"{int(np.sum(counts == 0))} none"
        + (f"; {off_grid} rows off the rating grid (virtual ratings)" if off_grid else "")
    )


def _chance_baseline(
    view: ServerView,
    protocol: FedMFProtocol | None,
    chosen: tuple[int, ...],
    truth: Ratings | None,
    truth_set: UserSets | None,
    n_users: int,
    notes: list[str],
) -> tuple[UserSets, float]:
    """Stage 5: the baseline's item guesses per evaluated user and its rating guess."""
    n_items = protocol.n_items if protocol is not None else (truth.n_items if truth else 0)
    # Under aggregation="fixed" the aggregate carries no uploader counts.
    counted = protocol is not None and protocol.aggregation != "fixed"
    popularity = popularity_from_view(view, n_items, chosen) if counted else None
    if popularity is None and truth is not None:
        popularity = np.bincount(truth.items, minlength=truth.n_items).astype(np.float64)
        notes.append("no aggregate in the view: baseline popularity from the truth's item counts")
    if truth_set is not None:
        counts = truth_set.counts()
        guess_rating = float(np.mean(truth.ratings)) if len(truth) else float("nan")
    else:
        expected = expected_rated_count(view, protocol, chosen) if counted else float("nan")
        counts = np.full(n_users, int(np.rint(expected)) if np.isfinite(expected) else 0)
        guess_rating = float("nan")
    if popularity is None:
        return UserSets(np.zeros(n_users + 1, np.int64), np.zeros(0, np.int64)), guess_rating
    return top_popular(popularity, counts), guess_rating


def _assemble(
    evaluated: np.ndarray,
    results: Mapping[int, UserAttack],
    baseline_sets: UserSets,
    guess_rating: float,
) -> tuple[list[str], UserSets, np.ndarray, dict[str, np.ndarray]]:
    """Per-user results (baseline guesses where no attack ran) as aligned flat arrays."""
    items_parts, value_parts, rated_parts, methods = [], [], [], []
    test_parts: dict[str, list[np.ndarray]] = {name: [] for name in (*TEST_NAMES, "hybrid_filling")}
    for k, client in enumerate(evaluated.tolist()):
        result = results.get(client)
        if result is None:
            items = baseline_sets.items[baseline_sets.indptr[k] : baseline_sets.indptr[k + 1]]
            values = np.full(len(items), guess_rating)
            tests: dict[str, np.ndarray | None] = dict.fromkeys(TEST_NAMES)
            methods.append("baseline")
        else:
            items, values, tests = result.items, result.values, result.tests
            methods.append(result.method)
        n_rows = len(items)
        items_parts.append(np.asarray(items, dtype=np.int64))
        value_parts.append(np.asarray(values, dtype=np.float64))
        rated_parts.append(combine_tests(tests, n_rows))
        for name in TEST_NAMES:
            mask = tests.get(name)
            test_parts[name].append(np.ones(n_rows, bool) if mask is None else np.asarray(mask))
        hybrid = {n: tests.get(n) for n in ("rating_scale", "intersection")}
        test_parts["hybrid_filling"].append(combine_tests(hybrid, n_rows))

    def flat(parts: list[np.ndarray], dtype) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    indptr = np.concatenate([[0], np.cumsum([len(x) for x in items_parts])]).astype(np.int64)
    recovered = UserSets(indptr, flat(items_parts, np.int64), flat(value_parts, np.float64))
    tests_out = {name: flat(parts, bool) for name, parts in test_parts.items()}
    return methods, recovered, flat(rated_parts, bool), tests_out


def filled_row_shares(
    evaluated: np.ndarray,
    results: Mapping[int, UserAttack],
    truth_set: UserSets,
    recovered: UserSets,
    rated: np.ndarray,
) -> tuple[dict[str, float], dict[str, float]]:
    """How many of the filled (pseudo) rows the server saw the attack told apart from real ones.

    A filled row is an item row a user's payload listed (rows with a zero gradient included)
    that the user did not rate; it is identified when the attack does not predict it rated.
    The chance baseline calls as many of the user's listed rows filled, at random (the true
    count, as the item baseline uses the true rated count): it identifies ``|F_u| / |L_u|`` of
    them in expectation.

    Returns:
        ``({"filled_rows", "filled_identified"}, {"filled_identified"})``: the count, the
        attack's share, the chance share (NaN when no filled row was listed).
    """
    filled_total, identified_total, chance_total = 0, 0, 0.0
    flagged_filled, flagged_real, real_total, flagging = 0, 0, 0, False
    for k, client in enumerate(evaluated.tolist()):
        result = results.get(client)
        if result is None or result.listed is None:
            continue
        true_items = truth_set.items[truth_set.indptr[k] : truth_set.indptr[k + 1]]
        span = slice(recovered.indptr[k], recovered.indptr[k + 1])
        predicted = recovered.items[span][rated[span]]
        listed = np.unique(result.listed)
        filled = np.setdiff1d(listed, true_items)
        filled_total += len(filled)
        identified_total += len(np.setdiff1d(filled, predicted))
        chance_total += len(filled) ** 2 / max(len(listed), 1)
        if result.suspect is not None:
            flagging = True
            suspects = result.items[result.suspect]
            flagged_filled += len(np.intersect1d(filled, suspects))
            seen_real = np.intersect1d(result.items, true_items)
            flagged_real += len(np.intersect1d(seen_real, suspects))
            real_total += len(seen_real)
    found: dict[str, float] = {"filled_rows": float(filled_total)}
    found["filled_identified"] = identified_total / filled_total if filled_total else float("nan")
    if flagging:  # the similarity test's flags, kept as rated: what stays ambiguous
        found["filled_flagged"] = flagged_filled / filled_total if filled_total else float("nan")
        found["real_flagged"] = flagged_real / real_total if real_total else float("nan")
    chance = chance_total / filled_total if filled_total else float("nan")
    return found, {"filled_identified": chance}


def _score(
    truth_set: UserSets,
    recovered: UserSets,
    rated: np.ndarray,
    tests: Mapping[str, np.ndarray],
    baseline_sets: UserSets,
    scale: RatingScale,
    n_items: int,
    guess_rating: float,
) -> dict[str, dict]:
    """Stage 6: per-user and overall metrics of the attack, its item tests and the baseline."""
    per_user = per_user_metrics(
        truth_set, recovered, recovered.select(rated), scale, n_items, guess_rating
    )
    everything = np.ones(len(rated), bool)
    item_attacks = {
        name: item_overall(truth_set, recovered.select(mask), n_items)
        for name, mask in (("uploaded", everything), *tests.items(), ("combined", rated))
    }
    guesses = UserSets(
        baseline_sets.indptr, baseline_sets.items, np.full(len(baseline_sets.items), guess_rating)
    )
    baseline_per_user = per_user_metrics(
        truth_set, guesses, baseline_sets, scale, n_items, guess_rating
    )
    return {
        "per_user": per_user,
        "overall": overall_metrics(per_user),
        "item_attacks": item_attacks,
        "baseline_per_user": baseline_per_user,
        "baseline": overall_metrics(baseline_per_user),
    }


__all__ = [
    "ITEM_ATTACKS",
    "AttackContext",
    "LeakReport",
    "UserAttack",
    "attack_user",
    "choose_rounds",
    "dp_noise_std",
    "expected_rated_count",
    "filled_row_shares",
    "payload_fields",
    "popularity_from_view",
    "top_popular",
    "verify",
]
