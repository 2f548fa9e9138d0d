"""The canary hooks: the generic transport hook (FedMF, FedHPD, torch) and FedSlate's fusion."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

from securefed import SeedTree
from securefed.audit.faults import inject_dp_fault
from securefed.audit.hooks import CanaryRound, CanaryTransport
from securefed.audit.whitebox import (
    CanaryHook,
    WhiteBoxConfig,
    canary_directions,
    canary_schedule,
)
from securefed.transport import build_transport
from securefed.transport.base import RowUpdates


def _rounds(transport, rounds: int, real: int, dim: int) -> None:
    rng = np.random.default_rng(3)
    for t in range(rounds):
        rnd = transport.open_round(t, np.arange(real), shape=(1, dim), seeds=SeedTree(1))
        for client in range(real):
            rnd.submit_batch(RowUpdates.single(client, rng.normal(0, 0.1, dim)))
        rnd.result()
        rnd.result()  # cached: the canaries submit once, the round is recorded once


def _hooked(spec: str, fault: str | None, n: int = 200, rounds: int = 2):
    dim, real = 1024, 5
    directions = canary_directions(3 * n, dim, np.random.default_rng(0))
    hook = CanaryHook(directions[:n], canary_schedule(n, 0, rounds), 10.0, real, (1, dim))
    inner = build_transport(
        spec,
        {"epsilon": 1.0, "dp.clip": 1.0},
        total_rounds=rounds,
        n_clients=real + n,
        sample_rate=1.0,
    )
    transport = CanaryTransport(inner, hook)
    with inject_dp_fault(fault) if fault else contextlib.nullcontext():
        _rounds(transport, rounds, real, dim)
    config = WhiteBoxConfig(n_constant=n, n_alternating=0, n_held_out=2 * n, rounds=rounds, dim=dim)
    return transport, transport.report(directions[n:], config)


@pytest.mark.parametrize("spec", ["dp", pytest.param("secagg+dp", marks=pytest.mark.slow)])
def test_canary_transport_catches_overstated_noise_with_real_clients_in_the_rounds(spec):
    transport, correct = _hooked(spec, None)
    assert len(transport.released) == 2 and not correct.caught, correct.to_dict()
    assert transport.ledger is transport.transport.ledger  # the audited transport's ledger
    _, broken = _hooked(spec, "noise/3")
    assert broken.caught and broken.contradicted["released_model/noise"], broken.to_dict()


def test_canary_transport_passes_other_shapes_through_and_refuses_clashing_ids():
    directions = canary_directions(8, 16, np.random.default_rng(0))
    hook = CanaryHook(directions[:4], canary_schedule(4, 0, 1), 10.0, 3, (1, 16))
    inner = build_transport("plaintext", n_clients=7)
    transport = CanaryTransport(inner, hook)
    other = transport.open_round(0, [0, 1], shape=(1, 2), seeds=SeedTree(0))
    assert not isinstance(other, CanaryRound)
    assert isinstance(transport.open_round(1, [0], shape=(1, 16), seeds=SeedTree(0)), CanaryRound)
    with pytest.raises(ValueError, match="below the canaries"):
        transport.open_round(2, [0, 3], shape=(1, 16), seeds=SeedTree(0))
    with pytest.raises(ValueError, match="nothing to audit"):
        transport.run()


def test_canary_transport_audits_a_fedmf_run_unchanged():
    from securefed import ClientSampling, RunOptions, run_rounds
    from securefed.recsys.data import synthetic_ratings
    from securefed.recsys.fedmf import FedMF, user_level_dp_config

    def audit(fault):
        train = synthetic_ratings(60, 100, 900, seed=1)
        config = user_level_dp_config(rounds=2, dim=3)
        model = FedMF(train, config, SeedTree(0))
        block = (model.n_items + 2, config.dim + 1)
        directions = canary_directions(300, block[0] * block[1], np.random.default_rng(7))
        hook = CanaryHook(
            directions[:100], canary_schedule(100, 0, 2), 10.0, model.n_clients, block
        )
        inner = build_transport(
            "dp", {"epsilon": 1.0}, total_rounds=2, n_clients=model.n_clients + 100
        )
        transport = CanaryTransport(inner, hook)
        options = RunOptions(rounds=2, sampling=ClientSampling(), progress=False)
        with inject_dp_fault(fault) if fault else contextlib.nullcontext():
            run_rounds(model, transport, SeedTree(0), options)
        config = WhiteBoxConfig(
            n_constant=100, n_alternating=0, n_held_out=200, rounds=2, dim=directions.shape[1]
        )
        return transport.report(directions[100:], config)

    correct = audit(None)
    assert not correct.caught, correct.to_dict()
    assert correct.epsilon_ledger["released_model"] == pytest.approx(1.0, abs=0.01)
    assert audit("noise/3").caught


# ----------------------------------------------------------------------------- FedSlate
def _fusion(fusion: str, fault: str | None, units: int = 100, rows: int | None = None):
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    from securefed.attacks.whitebox_hooks import FusionCanaryConfig, fusion_whitebox_audit
    from securefed.rl.fedslate import FedSlateConfig, start_run

    config = FedSlateConfig(
        num_candidates=6, slate_size=2, episodes=2, members=2, fusion=fusion, dp_epsilon=4.0
    )
    run = start_run(config)
    with inject_dp_fault(fault) if fault else contextlib.nullcontext():
        return run, fusion_whitebox_audit(
            run.channel,
            6,
            FusionCanaryConfig(n_units=units, rows_per_unit=rows),
            np.random.default_rng(0),
        )


def test_fusion_frames_are_orthonormal():
    from securefed.attacks.whitebox_hooks import fusion_canary_frames

    frames = fusion_canary_frames(5, 6, np.random.default_rng(1))
    for frame in frames:
        assert np.allclose(frame @ frame.T, np.eye(6), atol=1e-12)
    with pytest.raises(ValueError, match="width"):
        fusion_canary_frames(5, 1, np.random.default_rng(1))


def test_fedslate_fusion_canaries_fast():
    # Units of 400 rows, not the 4036 the ledger allows one: a weaker unit (its mu is
    # sqrt(400 / 4036) of the ledger's), so no false alarm, and only a gross fault shows.
    run, correct = _fusion("dp", None, units=50, rows=400)
    assert not correct.caught, correct.to_dict()
    assert type(run.channel.inner).__name__ != "RowRecorder"  # put back after the exchanges
    _, broken = _fusion("dp", "noise/10", units=50, rows=400)
    assert broken.contradicted["server/own-noise"], broken.to_dict()


@pytest.mark.slow
def test_fedslate_fusion_canaries_catch_faults_of_its_dp_rows():
    run, correct = _fusion("dp", None)
    assert not correct.caught, correct.to_dict()
    ledger = correct.epsilon_ledger["server"]
    assert ledger == pytest.approx(4.0, abs=0.01)
    # The noise family: the declared sensitivity 2 C K over the spread of 500 null projections.
    noise = correct.estimates["server/own-noise"]
    per_unit = run.channel.options.releases_per_unit
    expected_mu = math.sqrt(per_unit) / run.channel.noise_multiplier
    assert noise.mu == pytest.approx(expected_mu, rel=0.15)
    assert correct.rigorous["server"].epsilon_lower <= ledger
    _, broken = _fusion("dp", "noise/1.5")
    assert broken.contradicted["server/own-noise"], broken.to_dict()
    _, unclipped = _fusion("dp", "clip-off")
    assert unclipped.contradicted["server/own-payloads"], unclipped.to_dict()


# ----------------------------------------------------------------------------- the benches
def test_privacy_audit_matrix_runs_a_row_and_exits_1_when_it_contradicts(tmp_path, capsys):
    pytest.importorskip("torch")
    import json

    from securefed.bench.bench_privacy_audit import main

    argv = [
        "privacy-audit",
        "--recommenders=torch",
        "--matrix-transports=dp",
        "--canaries=30",
        f"--out={tmp_path}",
    ]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "privacy_audit_matrix.json").read_text())["rows"]
    released = next(r for r in rows if r["observer"] == "released_model")
    assert released["recommender"] == "torch" and released["canaries"] == 30
    assert released["lower_bound"] <= released["epsilon_ledger"]
    assert released["noise_estimate_low"] < released["epsilon_ledger"]
    assert main([*argv, "--fault=no-noise"]) == 1
    assert "torch over dp (released_model) contradicts" in capsys.readouterr().err


def test_whitebox_bench_is_registered_and_exits_1_on_a_missed_fault(tmp_path):
    from securefed.bench.bench_privacy_audit_whitebox import largest_contradicted, main
    from securefed.bench.registry import BENCHES

    assert BENCHES["privacy-audit-whitebox"].register.endswith(
        "bench_privacy_audit_whitebox:register"
    )
    small = [
        "--epsilons=1",
        "--constant=40",
        "--held-out=40",
        "--seeds-correct=2",
        "--seeds-fault=2",
        f"--out={tmp_path}",
    ]
    assert main([*small, "--faults=none,no-noise", "--alternating=4"]) == 0
    # Without alternating canaries reused noise only shrinks the constant family: missed.
    assert main([*small, "--faults=noise-reused", "--alternating=0"]) == 1
    row = {"transport": "dp", "epsilon_target": 1.0, "seeds": 10, "epsilon_ledger": 0.99}
    rows = [{**row, "fault": "none", "caught": 0}, {**row, "fault": "noise/1.5", "caught": 9}]
    assert largest_contradicted(rows) == 0.99
    assert largest_contradicted([rows[0], {**rows[1], "caught": 8}]) is None


def test_privacy_audit_matrix_names_a_missing_extra(monkeypatch, tmp_path):
    import securefed.bench.privacy_audit_matrix as matrix_module
    from securefed.bench.bench_privacy_audit import main
    from securefed.bench.registry import ExtraNotInstalled

    monkeypatch.setattr(matrix_module, "extra_installed", lambda extra: extra != "rl")
    with pytest.raises(ExtraNotInstalled, match="'rl'"):
        main(["privacy-audit", "--recommenders=fedmf,fedslate", f"--out={tmp_path}"])
    assert not (tmp_path / "privacy_audit_matrix.json").exists()  # refused before any row
