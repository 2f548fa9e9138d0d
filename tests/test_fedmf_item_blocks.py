"""FedMF's public item blocks (``item_blocks``): less to mask, the same sums, the same leak.

A round of ``item_blocks=B`` aggregates only the public block ``t mod B`` of the item matrix.
The tests check that its sums are exactly the dense design's restricted to the block, that only
the block steps, and that under secure aggregation the server's view says no more than chance
about which items a user rated (an attack that reads the rated rows off a clear dense upload is
run on the masked one).
"""

from __future__ import annotations

import numpy as np
import pytest

from securefed import ALL_PAYLOADS, PlaintextTransport, SeedTree
from securefed.attacks.verify import verify
from securefed.recsys.data import synthetic_ratings
from securefed.recsys.fedmf import FedMF, FedMFConfig, item_block
from securefed.transport.secagg import SecAggConfig, SecAggTransport

ROUND = 3
RATINGS = synthetic_ratings(60, 40, 900, seed=1)
# 64-bit ring with a clip far above FedMF's gradients: the fixed point's error is then ~1e-13
# (the round's public secagg_error_bound_sum), and no value is clipped.
SECAGG = SecAggConfig(clip=64.0, bits=64, server="honest_but_curious")


def one_round(config: FedMFConfig, transport, ratings=RATINGS, round_id: int = ROUND):
    """A model after one round over every user, with that round's aggregate total."""
    seeds = SeedTree(0)
    model = FedMF(ratings, config, seeds)
    rnd, clients = model.open_round(round_id, np.arange(ratings.n_users), transport, seeds)
    model.client_step(round_id, clients, seeds, rnd.submit_batch)
    total = rnd.result().total
    model.close_round(rnd)
    return model, total


def test_blocks_partition_the_catalogue():
    blocks = [item_block(t, 10, 4) for t in range(8, 12)]
    assert np.array_equal(np.sort(np.concatenate(blocks)), np.arange(10))
    assert np.array_equal(item_block(5, 10, 4), [1, 5, 9])
    assert np.array_equal(item_block(7, 10, 1), np.arange(10))


@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_item_blocks_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="item_blocks"):
        FedMFConfig(item_blocks=value)


def test_item_blocks_refused_with_an_encrypted_state():
    with pytest.raises(ValueError, match="item_blocks=4 with server_state='encrypted'"):
        FedMFConfig(item_blocks=4, server_state="encrypted", aggregation="sum")


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"variant": "fedrec"},
        {"variant": "fedrec+"},
        {"aggregation": "fixed", "offset": "user_mean"},
        {"biases": True, "offset": "user_mean", "weighting": "count"},
    ],
    ids=["fedmf", "fedrec", "fedrec+", "fixed", "biases"],
)
def test_blocked_sums_are_the_dense_sums_restricted_to_the_block(options):
    _, dense = one_round(FedMFConfig(**options), PlaintextTransport())
    model, blocked = one_round(FedMFConfig(item_blocks=4, **options), PlaintextTransport())
    rows = model.block_rows(ROUND)
    assert blocked.shape == (len(rows), dense.shape[1]) and len(rows) == 10 + 2
    # Each row's sum adds the same client terms in the same order: equal to the bit.
    assert np.array_equal(blocked, dense[rows])


@pytest.mark.parametrize(
    "options",
    [{}, {"aggregation": "fixed", "offset": "user_mean"}, {"server_optimiser": "adam"}],
    ids=["mean", "fixed", "adam"],
)
def test_only_the_round_block_steps(options):
    dense_model, _ = one_round(FedMFConfig(**options), PlaintextTransport())
    model, _ = one_round(FedMFConfig(item_blocks=4, **options), PlaintextTransport())
    start = FedMF(RATINGS, FedMFConfig(**options), SeedTree(0)).V
    block = item_block(ROUND, RATINGS.n_items, 4)
    outside = np.setdiff1d(np.arange(RATINGS.n_items), block)
    assert np.array_equal(model.V[outside], start[outside])
    assert not np.array_equal(model.V[block], start[block])
    assert np.array_equal(model.V[block], dense_model.V[block])
    assert np.array_equal(model.U, dense_model.U)  # users step on all their ratings


def test_secagg_masks_a_quarter_and_sums_the_same():
    transport = SecAggTransport(SECAGG, keep_payloads=ALL_PAYLOADS, keep_masked=True)
    model, masked_sum = one_round(FedMFConfig(item_blocks=4), transport)
    _, dense = one_round(FedMFConfig(), PlaintextTransport())
    rows = model.block_rows(ROUND)
    bound = transport.view.round(ROUND).public["secagg_error_bound_sum"]
    assert np.max(np.abs(masked_sum - dense[rows])) <= bound
    payload = transport.view.round(ROUND).payloads[0]
    assert payload["masked"].size == len(rows) * (model.config.width + 1)
    assert transport.view.round(ROUND).public["item_block"] == {"offset": 3, "stride": 4}


def _rated_row_auc(scores: np.ndarray, rated: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for telling rated rows from the others
    (Mann-Whitney; ties count a half)."""
    positive, negative = scores[rated], scores[~rated]
    greater = (positive[:, None] > negative[None, :]).sum()
    ties = (positive[:, None] == negative[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(positive) * len(negative)))


def _row_magnitudes(values: np.ndarray, n_rows: int) -> np.ndarray:
    """The attacker's score of each row of one client's block: the size of what it carries."""
    return np.abs(np.asarray(values, dtype=np.float64).reshape(n_rows, -1)).sum(axis=1)


def _rated_in_block(model: FedMF, client: int, block: np.ndarray) -> np.ndarray:
    items = model.items[model.indptr[client] : model.indptr[client + 1]]
    return np.isin(block, items)


def test_secagg_view_of_a_blocked_round_is_at_chance_for_rated_items():
    ratings = synthetic_ratings(120, 40, 1800, seed=2)
    block = item_block(ROUND, ratings.n_items, 4)
    n_rows = len(block) + 2

    # The attack works: on a clear dense upload of the block the rated rows are the non-zero ones.
    clear = PlaintextTransport(keep_payloads=ALL_PAYLOADS)
    model, _ = one_round(FedMFConfig(item_blocks=4, upload="full"), clear, ratings)
    scores, rated = [], []
    for client, payload in clear.view.round(ROUND).payloads.items():
        dense = np.zeros((n_rows, model.config.width + 1))
        dense[payload["rows"]] = payload["values"]
        scores.append(_row_magnitudes(dense, n_rows)[:-2])
        rated.append(_rated_in_block(model, client, block))
    assert _rated_row_auc(np.concatenate(scores), np.concatenate(rated)) > 0.99

    # The same attack on the masked uploads of the same round is at chance.
    masked = SecAggTransport(SECAGG, keep_payloads=ALL_PAYLOADS, keep_masked=True)
    model, _ = one_round(FedMFConfig(item_blocks=4), masked, ratings)
    scores, rated = [], []
    for client, payload in masked.view.round(ROUND).payloads.items():
        scores.append(_row_magnitudes(payload["masked"], n_rows)[:-2])
        rated.append(_rated_in_block(model, client, block))
    rated = np.concatenate(rated)
    auc = _rated_row_auc(np.concatenate(scores), rated)
    # About 300 rated against 900 other rows: a chance AUC has standard deviation ~0.02, and
    # 0.1 is five of them.
    assert 300 < rated.sum() < 900 and abs(auc - 0.5) < 0.1

    # The project's attack suite sees nothing per client either: every user gets the baseline.
    report = verify(masked.view, ratings)
    assert report.attacks_applied == ("baseline",)
    assert report.overall["f1"] == pytest.approx(report.baseline["f1"])


def test_plaintext_attack_reads_blocked_payloads_in_catalogue_rows():
    clear = PlaintextTransport(keep_payloads=ALL_PAYLOADS)
    one_round(FedMFConfig(item_blocks=4), clear)
    report = verify(clear.view, RATINGS)
    block = set(item_block(ROUND, RATINGS.n_items, 4).tolist())
    predicted = report.recovered.select(report.rated)
    attacked = [k for k, method in enumerate(report.method) if method != "baseline"]
    named = np.concatenate(
        [predicted.items[predicted.indptr[k] : predicted.indptr[k + 1]] for k in attacked]
    )
    # Every item the attack names for a user with an upload lies in the round's block (plaintext
    # leaks the block's rated items, and only those), and the uploaded rows are all rated.
    assert len(named) > 0 and set(named.tolist()) <= block
    for k in attacked:
        user = int(report.users[k])
        named = predicted.items[predicted.indptr[k] : predicted.indptr[k + 1]]
        rated = RATINGS.items[RATINGS.users == user]
        assert set(named.tolist()) <= set(rated.tolist()) & block


def test_leak_utility_keeps_a_row_of_other_model_options_beside_the_default(tmp_path):
    from securefed.bench.experiment import save_json
    from securefed.bench.leak_utility import merge_rows, model_options_text

    meta = {"data": "d", "rounds": 2, "seed": 0}
    dense = {"variant": "fedmf", "transport": "secagg", "rmse": 1.0}
    save_json({"meta": meta, "rows": [dense]}, tmp_path / "leak_utility.json")
    blocked = dense | {"model_options": model_options_text({"item_blocks": 8}), "rmse": 1.1}
    merged = merge_rows(tmp_path / "leak_utility.json", meta, [blocked])
    assert merged == [dense, blocked] and blocked["model_options"] == "item_blocks=8"
    again = blocked | {"rmse": 1.2}  # the same cell re-run replaces its own row only
    assert merge_rows(tmp_path / "leak_utility.json", meta, [again]) == [dense, again]


def test_the_audit_knows_a_blocked_round_and_finds_no_leak_under_secure_aggregation():
    from securefed.audit.findings import audit

    transport = SecAggTransport(SECAGG)
    one_round(FedMFConfig(item_blocks=4), transport)
    codes = {finding.code for finding in audit(transport.view).findings}
    assert "unknown-key" not in codes
    clear = PlaintextTransport()
    one_round(FedMFConfig(item_blocks=4), clear)
    assert "fedmf-gradient-leak" in {finding.code for finding in audit(clear.view).findings}


def test_the_command_line_takes_item_blocks_and_refuses_what_does_not_apply(capsys):
    from securefed.bench.cli import main

    argv = ["fedmf", "--rounds", "1", "--no-progress", "--preset", "paper"]
    assert main([*argv, "--item-blocks", "0"]) == 2
    assert "item_blocks must be >= 1" in capsys.readouterr().err
    encrypted = ["--server-state", "encrypted", "--aggregation", "sum"]
    assert main([*argv, "--item-blocks", "4", *encrypted]) == 2
    assert "item_blocks=4 with server_state='encrypted'" in capsys.readouterr().err
