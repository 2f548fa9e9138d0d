"""FedSlate's leak measures under any fusion transport, each beside its chance baseline.

Replayed from what a FedSlate run's fusion channel recorded (its
:class:`~securefed.views.FusionView`, kept with ``keep_payloads=ALL_PAYLOADS``): the acting
inquiries, as the server received them (noised under DP) and as each platform got its fused
values back. The truth comes from the scorer, never from the attacker: the users' hidden states
and the slates shown are replayed from the public simulator
(:func:`~securefed.attacks.qvalue_leak.replay_truth`), and under DP the Q-values before noise
are the channel's scoring tap (``run_fedslate(..., keep_clean=True)``).

Three observers, four measures (:func:`measure_fedslate_leak`):

* **The server, a user's hidden state** (:mod:`securefed.attacks.qvalue_leak`): ridge
  inference of the net kale exposure ``nke`` from the inquiries' Q-values, with half the users
  labelled; R^2 on the others. Chance: 0 (the labelled users' mean).
* **The server, each platform's ranking** (:func:`slate_overlap`): the server guesses platform
  ``p``'s slate as the ``n`` candidates with the highest uploaded Q-values, scored by the
  fraction of the truth's ``n`` it contains. Two truths: the platform's own model ranking (the
  top ``n`` of its Q-values *before* noise: what its model concluded about the user; under
  plaintext the server sees it exactly) and the slate actually shown in greedy rounds (under DP
  the platform acts on fused values of noised rows, so the slate shown is itself a
  post-processing of what the server saw: not protected, and not a leak of the user's data
  beyond it). Chance: ``n / N`` (a uniformly random ``n``-subset).
* **The other platform** (:func:`other_platform_inference`): platform B regresses A's private
  engagement history (the sum of A's last five engagements, which only A observes) on features
  of the fused values B received plus its own observation of the user; against the same ridge
  on B's own observation alone ("own"), and chance 0. The gap is what crossing the server told
  B about A's user.

Under an encrypted transport (``"ckks"``, ``"ckks+dp"``) the server's view holds ciphertexts
only (:func:`encrypted_records`): it reads no value from them, so its features are constant (its
nke fit is the public schedule's, its ranking guess a uniformly random ``n``-subset drawn from
:data:`CIPHERTEXT_GUESS_SEED`); the truth and what B received come from the platforms' own
record (``run_fedslate(..., keep_clean=True)``).

Threat models as in :mod:`securefed.attacks.qvalue_leak`: honest-but-curious, the public
schedule known (episode length, round counter), auxiliary truth for a labelled half of the
users.
"""

from __future__ import annotations

import numpy as np

from securefed import ranking
from securefed.attacks.qvalue_leak import (
    FusionRecord,
    HiddenStates,
    QLeakConfig,
    deployment_scores,
    discounted_sums,
    inquiry_features,
    labelled_users,
    read_inquiries,
    replay_truth,
    ridge_fit,
    step_basis,
    verify_qvalue_leak,
)
from securefed.rl.fedslate import ACT, FedSlateConfig
from securefed.rl.slateq import RunResult

__all__ = [
    "CIPHERTEXT_GUESS_SEED",
    "clean_inquiries",
    "encrypted_records",
    "measure_fedslate_leak",
    "other_platform_inference",
    "slate_overlap",
    "top_n",
]


CIPHERTEXT_GUESS_SEED = 20261201
"""Seed of the server's uniformly random ranking guess when it holds ciphertexts only."""


def top_n(values: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` largest entries along the last axis, best first, ties by lower index."""
    return ranking.top_n(values, n)


def slate_overlap(guess: np.ndarray, truth: np.ndarray, rows: np.ndarray | None = None) -> float:
    """Mean over rows of ``|guess ∩ truth| / n`` for ``(..., n)`` index sets.

    Args:
        guess, truth: index sets of the same shape ``(..., n)``.
        rows: optional boolean mask of the leading shape (rows scored).
    """
    guess, truth = np.asarray(guess), np.asarray(truth)
    if guess.shape != truth.shape:
        raise ValueError(f"guess {guess.shape} and truth {truth.shape} differ in shape")
    hits = (guess[..., :, None] == truth[..., None, :]).any(axis=-1).mean(axis=-1)
    if rows is not None:
        hits = hits[rows]
    if hits.size == 0:
        raise ValueError("no rows to score")
    return float(hits.mean())


def clean_inquiries(result: RunResult, record: FusionRecord) -> dict[str, np.ndarray]:
    """Per party, ``(T, S, N)`` Q-values of the acting inquiries before noise.

    Under plaintext the record's inputs are the clean values; under DP they come from the
    channel's scoring tap (``run_fedslate(..., keep_clean=True)``).

    Raises:
        ValueError: a DP run without the tap, or a tap that does not match the record.
    """
    if result.fusion_clean is None:
        if "dp" in result.fusion_view.public:
            raise ValueError(
                "a DP run's view holds noised Q-values only: run it with keep_clean=True to "
                "score the ranking against the clean ones"
            )
        return {p: v.copy() for p, v in record.inputs.items()}
    rounds: dict[int, dict[str, np.ndarray]] = {}
    for round_id, values in result.fusion_clean:
        rounds.setdefault(int(round_id), {}).update(values)
    if len(rounds) != record.inquiries:
        raise ValueError(f"the tap holds {len(rounds)} inquiries, the record {record.inquiries}")
    ordered = [rounds[r] for r in sorted(rounds)]
    return {p: np.stack([np.asarray(r[p], np.float64)[:, 0] for r in ordered])
            for p in record.parties}  # fmt: skip


def encrypted_records(result: RunResult) -> tuple[FusionRecord, FusionRecord]:
    """``(server's record, platforms' record)`` of a run under an encrypted transport.

    The platforms' record holds the Q-values each platform sent and the fused values it got
    back, from its own tap (``result.fusion_clean`` as ``(round, sent, got)`` entries); the
    server's is the same shape with every value zero: a ciphertext gives the server no value
    to fit (its message counts are the view's).

    Raises:
        ValueError: the view holds Q-values in the clear, or the run kept no platform tap.
    """
    view = result.fusion_view
    if "ckks" not in view.public:
        raise ValueError(f"the view of channel {view.channel!r} is not an encrypted channel's")
    tap = result.fusion_clean
    if not tap or len(tap[0]) != 3:
        raise ValueError(
            "an encrypted run's view holds ciphertexts only: run it with keep_clean=True to "
            "keep the platforms' own record of the inquiries (the scorer's truth)"
        )
    parties = tuple(view.parties)
    entries = sorted(tap, key=lambda entry: entry[0])
    sent = {p: np.stack([np.asarray(e[1][p], np.float64)[:, 0] for e in entries])
            for p in parties}  # fmt: skip
    got = {p: np.stack([np.asarray(e[2][p], np.float64)[:, 0] for e in entries])
           for p in parties}  # fmt: skip
    inquiries = view.count(kind="forward", tag=ACT)
    if inquiries != len(entries) and inquiries != len(entries) * len(parties):
        raise ValueError(f"the tap holds {len(entries)} inquiries, the view {inquiries}")
    counts = {
        "learning_forwards": view.count(kind="forward", network="online") - inquiries,
        "target_forwards": view.count(kind="forward", network="target"),
        "backwards": view.count(kind="backward"),
    }
    platforms = FusionRecord(parties=parties, inputs=sent, outputs=got, **counts)
    blank = {p: np.zeros_like(v) for p, v in sent.items()}
    server = FusionRecord(parties=parties, inputs=blank, outputs=blank, **counts)
    return server, platforms


def other_platform_inference(
    received: np.ndarray,
    own_observation: np.ndarray,
    target: np.ndarray,
    length: int,
    config: QLeakConfig,
) -> dict[str, float]:
    """What a platform learns about another's user from the fused values it receives.

    Per deployment: ridge on ``[features of the received fused values, own observation and
    its discounted sums, step basis]`` against ridge on ``[own observation, sums, step basis]``
    ("own"), both fitted on a labelled share of the users and scored (R^2 within each
    deployment, averaged) on the others; chance is the labelled users' mean (R^2 0).

    Args:
        received: ``(T, S, N)`` the fused values the platform received.
        own_observation: ``(T, S)`` its own observation of the user (noisy satisfaction).
        target: ``(T, S)`` the other platform's private quantity.
        length: episode length.
        config: the ridge's settings (labelled fraction, penalties, folds, seed).

    Returns:
        ``{"attack": R^2, "own": R^2, "chance": R^2 of the labelled mean}``.
    """
    total, members = target.shape
    rng = np.random.default_rng(config.seed)
    episodes = total // length
    known = np.repeat(labelled_users(episodes, members, config.labelled_fraction, rng), length, 0)
    groups = np.arange(total) // length
    basis = step_basis(np.arange(total) % length, length, config.step_bins)
    preds = {name: np.zeros((total, members)) for name in ("attack", "own", "chance")}
    for m in range(members):
        own = own_observation[:, m : m + 1]
        sums = [discounted_sums(own, length, d) for d in config.decays]
        x_own = np.concatenate([own, *sums, basis], axis=1)
        x_attack = np.concatenate([inquiry_features([received[:, m]], length, config), x_own], 1)
        train, y = known[:, m], target[:, m]
        for name, x in (("attack", x_attack), ("own", x_own)):
            preds[name][:, m] = ridge_fit(x, y, groups, train, config.alphas, config.folds, rng)[0]
        preds["chance"][:, m] = y[train].mean()
    held = ~known
    return {name: float(deployment_scores(p, target, held)["r2"]) for name, p in preds.items()}


def measure_fedslate_leak(
    config: FedSlateConfig, result: RunResult, *, labelled_fraction: float = 0.5
) -> dict[str, object]:
    """Every measure of the module docstring for one recorded run (two platforms, A with
    feedback).

    Args:
        config: the run's configuration.
        result: ``run_fedslate(config, keep_payloads=ALL_PAYLOADS)`` (``keep_clean=True``
            under DP).
        labelled_fraction: the share of users whose truth the attackers know.

    Returns:
        ``{"server_nke": {...}, "server_slate": {platform: {...}}, "other_platform": {...},
        "messages": {...}}``, each measure with its chance baseline.

    Raises:
        ValueError: not two platforms with A the only one with feedback, a view without every
            inquiry, or a DP run without the clean tap.
    """
    if config.num_platforms != 2 or tuple(config.feedback) != (True, False):
        raise ValueError("these measures are defined for platforms A (feedback) and B (none)")
    encrypted = "ckks" in result.fusion_view.public
    if encrypted:
        seen, record = encrypted_records(result)
        clean = {p: v.copy() for p, v in record.inputs.items()}
        rng = np.random.default_rng(CIPHERTEXT_GUESS_SEED)
        guesses = {p: top_n(rng.random(v.shape), config.slate_size) for p, v in clean.items()}
    else:
        record = seen = read_inquiries(result.fusion_view)
        clean = clean_inquiries(result, record)
        guesses = {p: top_n(v, config.slate_size) for p, v in record.inputs.items()}
    truth: HiddenStates = replay_truth(config, record, result)
    length, n, n_cand = config.steps_per_platform, config.slate_size, config.num_candidates
    qleak = QLeakConfig(labelled_fraction=labelled_fraction)
    server = verify_qvalue_leak(seen, truth, length, config=qleak, targets=("nke",),
                                shadow=False).targets["nke"]  # fmt: skip
    greedy_rows = (truth.slates == truth.greedy_slates).all(axis=-1)  # (T, S, K)
    slate = {}
    for p, name in enumerate(record.parties):
        guess = guesses[name]
        slate[name] = {
            "attack": slate_overlap(guess, top_n(clean[name], n)),
            "shown_greedy": (
                slate_overlap(guess, truth.slates[:, :, p], greedy_rows[:, :, p])
                if greedy_rows[:, :, p].any()
                else None  # every round explored: no greedy slate to score against
            ),
            "chance": n / n_cand,
        }
    other = other_platform_inference(
        record.outputs["B"],
        truth.target("observed_sat_B"),
        truth.target("recent_engagement_A"),
        length,
        qleak,
    )
    return {
        "server_nke": {
            "attack": server["attack"]["r2"],
            "step_only": server["step"]["r2"],
            "chance": server["mean"]["r2"],
        },
        "server_slate": slate,
        "other_platform": other | {"target": "recent_engagement_A"},
        "server_view": "ciphertexts" if encrypted else "values",
        "messages": {
            "acting_inquiries": record.inquiries,
            "learning_forwards": record.learning_forwards,
            "target_forwards": record.target_forwards,
            "backwards": record.backwards,
        },
    }
