"""Every recommender with every registered transport, and the transport registry itself.

The matrix: FedMF (vanilla part and full uploads, FedRec, FedRec+, the encrypted item matrix, the
DP preset) and FedHPD (a tiny CartPole schedule) x every name the registry holds. Each pairing
either runs one short round or is refused when the run is built, with an
:class:`~securefed.errors.UnsupportedTransport` naming the option; nothing else may happen. A
transport whose optional extra is missing here is skipped with the registry's reason.

The privacy capabilities each transport declares are checked against what its ServerView
recorded in those runs (a transport may claim less than it does, never more).
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from securefed import (
    ALL_PAYLOADS,
    PlaintextTransport,
    RunOptions,
    SeedTree,
    TransportUnavailable,
    UnsupportedTransport,
    run_rounds,
)
from securefed.errors import InsecureParameterError
from securefed.privacy.ledger import PrivacyLedger
from securefed.recsys.data import ML100K_SCALE, random_split, synthetic_ratings
from securefed.recsys.fedmf import FedMF, FedMFConfig, user_level_dp_config
from securefed.transport import (
    DPOptions,
    SecAggOptions,
    TransportCapabilities,
    TransportNeeds,
    available_transports,
    build_transport,
    capability_findings,
    option_groups,
    option_names,
    parse_transport_spec,
    register_transport,
    registry,
    require_capabilities,
    resolve_options,
    transport_names,
)

NAMES = transport_names()
DIM = 4
FEDMF_CONFIGS = {
    "vanilla-part": FedMFConfig(dim=DIM, rounds=1),
    "vanilla-full": FedMFConfig(dim=DIM, rounds=1, upload="full"),
    "fedrec": FedMFConfig(variant="fedrec", dim=DIM, rounds=1),
    "fedrec+": FedMFConfig(variant="fedrec+", dim=DIM, rounds=1),
    "encrypted-state": FedMFConfig(dim=DIM, rounds=1, aggregation="sum", server_state="encrypted"),
    "dp-preset": user_level_dp_config(dim=DIM, rounds=1),
}


def test_the_matrix_covers_every_transport_the_design_names():
    assert {"plaintext", "secagg", "ckks", "dp", "dp-local", "secagg+dp", "ckks+dp"} <= set(NAMES)


@pytest.fixture(scope="module")
def split():
    ratings = synthetic_ratings(14, 12, 90, rank=3, noise=0.3, scale=ML100K_SCALE, seed=5)
    return random_split(ratings, 0.2, np.random.default_rng(0))


def dp_options(name: str, clip: float = 1.0) -> dict | None:
    """A fixed noise multiplier for the transports that take DP options.

    ``ckks+dp`` has no default mechanism (its float Gaussian is chosen explicitly, flagged by
    the audit); ``secagg+dp`` runs its default, the exact discrete Gaussian.
    """
    if "dp" not in option_groups(name):
        return None
    options = {"noise_multiplier": 1.0, "dp.clip": clip}
    if name == "ckks+dp":
        options["mechanism"] = "gaussian"
    return options


def build_or_skip(name: str, *, n_clients: int, clip: float = 1.0, **run):
    try:
        return build_transport(name, dp_options(name, clip), n_clients=n_clients, **run)
    except TransportUnavailable as missing:
        pytest.skip(str(missing))


def check_claims(transport, n_rows: int, clip: float) -> None:
    """The view shows no more than the transport's capabilities say the server sees."""
    caps = transport.capabilities
    payloads = [payload for rnd in transport.view for payload in rnd.payloads.values()]
    assert payloads, "the matrix keeps every payload"
    for payload in payloads:
        if caps.hides_updates:
            assert not {"rows", "values"} & set(payload), (transport.name, sorted(payload))
        if caps.dense_wire and "rows" in payload:
            assert len(payload["rows"]) == n_rows, transport.name
        if caps.server_sees == "clipped updates":
            assert np.linalg.norm(payload["values"]) <= clip * (1 + 1e-9)


# ----------------------------------------------------------------------------- FedMF x transports
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", list(FEDMF_CONFIGS))
def test_fedmf_runs_a_round_or_is_refused_when_built(split, case, name):
    config = FEDMF_CONFIGS[case]
    users = split.train.n_users
    transport = build_or_skip(name, n_clients=users, total_rounds=1, keep_payloads=ALL_PAYLOADS)
    model = FedMF(split.train, config, SeedTree(0))
    before = model.V.copy()
    needs_state = config.server_state == "encrypted"
    if needs_state and not transport.capabilities.encrypted_state:
        with pytest.raises(UnsupportedTransport) as refusal:
            run_rounds(model, transport, SeedTree(0), RunOptions(rounds=1, progress=False))
        message = str(refusal.value)
        assert "server_state='encrypted' needs a transport with encrypted server state" in message
        assert f"{transport.name!r} has none" in message
        assert len(transport.view.rounds) == 0  # refused before any round ran
        if transport.ledger is not None:
            assert transport.ledger.steps == 0  # nothing was charged either
        return
    history = run_rounds(model, transport, SeedTree(0), RunOptions(rounds=1, progress=False))
    assert len(history.rounds) == 1 and len(transport.view.rounds) == 1
    assert np.isfinite(model.V).all() and not np.array_equal(model.V, before)
    if needs_state:  # the server added ciphertexts into [[V]]: no aggregate was decrypted
        assert "total" not in transport.view.rounds[0].aggregate
    if "dp" in option_groups(name):
        assert isinstance(transport.ledger, PrivacyLedger) and transport.ledger.steps == 1
        assert transport.epsilon() > 0
    rows = split.train.n_items + (0 if needs_state else 2)
    check_claims(transport, rows, clip=1.0)


def test_fedmf_refuses_the_encrypted_state_even_outside_run_rounds(split):
    model = FedMF(split.train, FEDMF_CONFIGS["encrypted-state"], SeedTree(0))
    with pytest.raises(UnsupportedTransport, match="server_state='encrypted'"):
        model.run_round(0, np.arange(4), PlaintextTransport(), SeedTree(0))


# ----------------------------------------------------------------------------- FedHPD x transports
@pytest.fixture(scope="module")
def hpd():
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    from securefed.rl.fast import make_public_states
    from securefed.rl.fedhpd import FedHPDConfig
    from securefed.rl.policies import AGENTS

    cartpole = AGENTS["cartpole"]
    config = FedHPDConfig(
        task="cartpole",
        d=1,
        rounds=2,
        agent_specs=(cartpole[0], cartpole[5]),
        public_size=100,
        part_size=100,
        distill_loops=1,
        virtual_rounds=4,
    )
    return config, make_public_states(config)


@pytest.mark.parametrize("name", NAMES)
def test_fedhpd_runs_a_round_over_every_transport(hpd, name, torch_one_thread):
    from securefed.rl.fast import train_population
    from securefed.rl.fedhpd import RunSpec

    config, public = hpd
    clip = math.sqrt(config.part_size)  # a part of probability rows has norm <= sqrt(rows)
    transport = build_or_skip(
        name,
        n_clients=config.n_agents,
        clip=clip,
        total_rounds=config.aggregation_rounds(),
        keep_payloads=ALL_PAYLOADS,
    )
    (result,) = train_population([RunSpec(config, 20, transport, public)])
    assert result.returns.shape == (2, config.n_agents) and np.isfinite(result.returns).all()
    assert len(transport.view.rounds) == config.aggregation_rounds() >= 1
    if "dp" in option_groups(name):
        assert transport.ledger.steps == config.aggregation_rounds()
    check_claims(transport, config.part_size, clip)


def test_fedhpd_refuses_a_transport_whose_clients_are_elsewhere_when_built(hpd, tmp_path):
    pytest.importorskip("tenseal")
    from securefed.crypto.ckks import save_public_context
    from securefed.rl.fedhpd import RunSpec

    config, public = hpd
    keys = build_transport("ckks", n_clients=2)
    path = save_public_context(keys.server_context, tmp_path / "public.ctx")
    server_half = build_transport(f"ckks:public_context={path}")
    assert not server_half.capabilities.in_process_clients
    with pytest.raises(UnsupportedTransport, match=r"FedHPD's learners .* needs a transport whose"):
        RunSpec(config, 20, server_half, public)
    with pytest.raises(UnsupportedTransport, match="run_rounds"):
        model = FedMF(*_tiny_train(), SeedTree(0))
        run_rounds(model, server_half, SeedTree(0), RunOptions(rounds=1, progress=False))


def _tiny_train():
    ratings = synthetic_ratings(6, 5, 20, rank=2, scale=ML100K_SCALE, seed=1)
    return ratings, FedMFConfig(dim=2, rounds=1)


# ----------------------------------------------------------------------------- the registry
def test_spec_strings_parse_into_typed_options():
    spec = parse_transport_spec(
        "secagg+dp:noise_multiplier=1,dp.clip=0.5,scale=2**16,neighbours=none,remote_clients=true"
    )
    assert spec.name == "secagg+dp"
    assert parse_transport_spec(str(spec)) == spec  # the written form reads back
    groups = resolve_options(spec)
    assert groups["secagg"] == SecAggOptions(scale=65536.0, remote_clients=True)
    assert groups["dp"] == DPOptions(clip=0.5, noise_multiplier=1.0)
    assert isinstance(groups["dp"].noise_multiplier, float)  # "1" is read as an int, typed here
    assert parse_transport_spec("  CKKS ").name == "ckks"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("rot13", r"unknown transport 'rot13'; known: plaintext, secagg, ckks, dp, dp-local"),
        ("", "empty transport spec"),
        ("secagg:", "no KEY=VALUE"),
        ("secagg:bits", "'bits' is not KEY=VALUE"),
        ("secagg:bits=32,bits=64", "gives 'bits' twice"),
        ("secagg+ckks", "not offered: CKKS already hides every update"),
        ("dp+secagg", "write 'secagg\\+dp'"),
    ],
)
def test_bad_spec_strings_are_refused_naming_the_cause(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_transport_spec(spec)


def test_options_are_refused_unless_the_transport_takes_them():
    with pytest.raises(ValueError, match=r"takes no option 'bitz'; its options: secagg.bits, "):
        build_transport("secagg:bitz=32")
    with pytest.raises(
        ValueError, match="'plaintext' takes no option 'epsilon'; its options: none"
    ):
        build_transport("plaintext", {"epsilon": 8.0})
    with pytest.raises(ValueError, match=r"ambiguous: write secagg\.clip or dp\.clip"):
        build_transport("secagg+dp", {"clip": 1.0, "noise_multiplier": 1.0})
    with pytest.raises(ValueError, match="'bits' must be int, got 'abc'"):
        build_transport("secagg:bits=abc")
    with pytest.raises(ValueError, match="bits"):  # SecAggConfig's own validation
        build_transport("secagg:bits=48")
    with pytest.raises(ValueError, match=r"needs epsilon .* or noise_multiplier"):
        build_transport("dp")
    with pytest.raises(ValueError, match="given twice with different values"):
        build_transport("secagg:bits=32", {"bits": 64})
    with pytest.raises(ValueError, match="given twice with different values"):
        build_transport("dp:clip=0.5", {"dp.clip": 2.0, "noise_multiplier": 1.0})
    with pytest.raises(ValueError, match="adds no noise: it takes no privacy ledger"):
        build_transport("secagg", ledger=PrivacyLedger())
    assert "dp.epsilon" in option_names("ckks+dp") and "ckks.key_model" in option_names("ckks+dp")


def test_defaults_are_the_recorded_ones():
    from securefed.privacy.calibration import noise_for_target

    secagg = build_transport("secagg", dropout=0.1, n_clients=943)
    # Clip 2^20 (2^12 before the encoder stopped clipping silently: FedRec+'s statistics rows
    # exceed 2^12 in a run's first rounds); the scale is the recorded figures' 2^20.
    assert (secagg.config.bits, secagg.config.clip, secagg.config.scale) == (64, 2.0**20, 2.0**20)
    assert secagg.config.out_of_range == "refuse"
    assert secagg.config.expected_dropout == 0.1
    dp = build_transport("dp", {"epsilon": 4.0}, total_rounds=20, sample_rate=0.5)
    assert dp.config.clip == 1.0 and dp.config.placement == "central"
    assert dp.config.noise_multiplier == noise_for_target(4.0, 1e-5, 0.5, 20)
    assert dp.ledger.budget.epsilon == 4.0 * 1.0001 and dp.ledger.budget.delta == 1e-5
    assert build_transport("dp-local", {"noise_multiplier": 2.0}).ledger.budget is None
    distributed = build_transport("secagg+dp", {"noise_multiplier": 1.0})
    assert distributed.config.placement == "distributed" and distributed.inner.name == "secagg"
    # The distributed placement's default noise is the exact discrete Gaussian (issue 21).
    assert distributed.config.mechanism == "discrete_gaussian"
    assert distributed.inner.config.scale == 1.0 and distributed.inner.config.bits == 32
    with pytest.warns(UserWarning, match="distributed DP over the 'plaintext' transport"):
        simulated = build_transport("dp:placement=distributed,noise_multiplier=1")
    assert simulated.config.placement == "distributed"
    pytest.importorskip("tenseal")
    from securefed.transport.ckks import KEY_MODELS

    assert registry.KEY_MODELS == KEY_MODELS  # the registry validates without importing tenseal
    with pytest.raises(InsecureParameterError, match="set mechanism=gaussian"):
        build_transport("ckks+dp", {"noise_multiplier": 1.0}, n_clients=4)
    assert build_transport("ckks", n_clients=10).config.max_clients == 1024
    assert build_transport("ckks", n_clients=2000).config.max_clients == 2000


def test_every_dp_transport_carries_a_ledger():
    shared = PrivacyLedger(budget=(8.0, 1e-5))
    private = [name for name in NAMES if "dp" in option_groups(name)]
    assert {"dp", "dp-local", "secagg+dp", "ckks+dp"} <= set(private)
    for name in private:
        try:
            options = {"noise_multiplier": 1.0}
            if name == "ckks+dp":  # it has no default mechanism
                options["mechanism"] = "gaussian"
            fresh = build_transport(name, options, n_clients=4)
            joined = build_transport(name, options, n_clients=4, ledger=shared)
        except TransportUnavailable:
            continue
        assert isinstance(fresh.ledger, PrivacyLedger) and fresh.ledger is not shared
        assert joined.ledger is shared
    for name in set(NAMES) - set(private):
        try:
            assert build_transport(name, n_clients=4).ledger is None
        except TransportUnavailable:
            continue


@pytest.mark.parametrize(("module", "extra", "names"), [
    ("tenseal", "he", ("ckks", "ckks+dp")),
    ("dp_accounting", "dp", ("dp", "dp-local", "secagg+dp", "ckks+dp")),
])  # fmt: skip
def test_a_missing_extra_names_what_to_install(monkeypatch, module, extra, names):
    monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    for name in names:
        with pytest.raises(TransportUnavailable, match=rf"pip install 'securefed\[{extra}\]'"):
            build_transport(name, {"noise_multiplier": 1.0} if "dp" in name else None)
    rows = {row.name: row for row in available_transports()}
    for name in names:
        assert not rows[name].available and f"needs the {module!r} package" in rows[name].reason
    assert rows["plaintext"].available and rows["secagg"].available
    assert rows["plaintext"].reason is None


def test_an_import_that_fails_while_building_is_reported_as_the_extra(monkeypatch):
    def fails(options, context):
        import tenseal_that_is_not_there  # noqa: F401

    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))
    register_transport(
        "ghost", fails, summary="needs a package that is missing",
        extras=(("tenseal_that_is_not_there", "he"),),
    )  # fmt: skip
    monkeypatch.setattr(registry, "_module_present", lambda module: True)
    with pytest.raises(
        TransportUnavailable, match=r"'ghost' needs .*: pip install 'securefed\[he\]'"
    ):
        build_transport("ghost")


def test_a_new_transport_registers_in_one_place(monkeypatch):
    monkeypatch.setattr(registry, "_ENTRIES", dict(registry._ENTRIES))

    def build(options, context):
        return PlaintextTransport(keep_payloads=context.keep_payloads)

    register_transport("clear", build, summary="plaintext under another name")
    assert "clear" in transport_names()
    assert build_transport("clear", keep_payloads=ALL_PAYLOADS).view.keep_payloads is not None
    assert any(row.name == "clear" and row.available for row in available_transports())
    with pytest.raises(ValueError, match="already registered"):
        register_transport("clear", build, summary="again")
    with pytest.raises(ValueError, match="already registered"):
        register_transport("secagg+ckks", build, summary="a refused name")
    with pytest.raises(ValueError, match="unknown option group"):
        register_transport("odd", build, summary="", groups=("paillier",))
    with pytest.raises(ValueError, match="lower-case"):
        register_transport("Bad Name", build, summary="")


def test_the_registry_imports_nothing_heavy():
    heavy = ("tenseal", "opacus", "torch", "scipy")
    code = (
        "import sys; import securefed.transport.registry as r; r.available_transports(); "
        "r.parse_transport_spec('secagg+dp:noise_multiplier=1'); "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- capabilities
def test_capabilities_are_declared_and_composed():
    plain = build_transport("plaintext").capabilities
    assert plain == TransportCapabilities(server_sees="updates")
    assert not plain.hides_updates and not plain.encrypted_state
    central = build_transport("dp", {"noise_multiplier": 1.0}).capabilities
    assert central.server_sees == "clipped updates" and central.dp_placement == "central"
    assert not central.dense_wire
    local = build_transport("dp-local", {"noise_multiplier": 1.0}).capabilities
    assert local.server_sees == "noisy updates" and local.dense_wire
    assert build_transport("secagg").capabilities.shapes == ("aggregation",)
    pytest.importorskip("tenseal")
    ckks = build_transport("ckks", n_clients=4).capabilities
    assert ckks.hides_updates and ckks.encrypted_state and ckks.dense_wire
    wrapped = build_transport(
        "ckks+dp", {"noise_multiplier": 1.0, "mechanism": "gaussian"}, n_clients=4
    ).capabilities
    assert wrapped.server_sees == "ciphertexts" and wrapped.dp_placement == "distributed"
    assert not wrapped.encrypted_state  # noise is added around released rounds only
    committee = build_transport("ckks:key_model=committee", n_clients=4).capabilities
    assert committee.in_process_clients and not committee.encrypted_state


def test_secure_aggregation_declares_what_it_hides_once_it_declares_anything():
    """SecAggTransport inherits the conservative default until its module declares its own
    (docs/privacy.md's table); from then on the declaration must be this one."""
    from securefed.transport.secagg import SecAggTransport

    if "capabilities" not in vars(SecAggTransport):
        assert build_transport("secagg").capabilities == TransportCapabilities()
        return
    local = build_transport("secagg").capabilities
    assert local == TransportCapabilities(
        dense_wire=True, server_sees="masked updates", min_round_clients=2
    )
    remote = build_transport("secagg:remote_clients=true").capabilities
    assert not remote.in_process_clients
    wrapped = build_transport("secagg+dp", {"noise_multiplier": 1.0}).capabilities
    assert wrapped.server_sees == "masked updates" and wrapped.dp_placement == "distributed"


def test_findings_name_every_unmet_need():
    caps = TransportCapabilities(in_process_clients=False)
    needs = TransportNeeds(
        "Toy", shape="fusion", in_process_clients="run_rounds", encrypted_state="state='enc'"
    )
    findings = capability_findings("wire", caps, needs)
    assert len(findings) == 3
    assert "Toy runs fusion rounds; 'wire' serves aggregation rounds only" in findings[0]
    assert findings[1].startswith("state='enc' needs a transport with encrypted server state")
    assert findings[2].startswith("run_rounds needs a transport whose clients submit")
    assert (
        capability_findings("wire", replace(caps, in_process_clients=True), TransportNeeds("T"))
        == []
    )
    with pytest.raises(UnsupportedTransport, match="Toy cannot run over the 'plaintext' transport"):
        require_capabilities(PlaintextTransport(), needs)
    with pytest.raises(ValueError, match="server_sees"):
        TransportCapabilities(server_sees="everything")
    with pytest.raises(ValueError, match="shape"):
        TransportNeeds("T", shape="vertical")


def test_ckks_plus_dp_releases_the_same_noisy_sum_as_secagg_plus_dp():
    """Distributed DP under encryption: the clients' seeded noise, summed under CKKS, equals the
    same noise summed under masks (to both transports' numerical error)."""
    pytest.importorskip("tenseal")
    x = np.random.default_rng(3).normal(size=(5, 6)) * 0.2
    totals = {}
    for name in ("secagg+dp", "ckks+dp"):
        options = {"noise_multiplier": 1.0, "dp.clip": 1.0, "mechanism": "gaussian"}
        transport = build_transport(name, options, n_clients=5)
        rnd = transport.open_round(0, range(5), shape=(2, 3), seeds=SeedTree(7))
        for client in range(5):
            rnd.submit(client, x[client])
        totals[name] = rnd.result().total
        assert transport.ledger.steps == 1
    np.testing.assert_allclose(totals["ckks+dp"], totals["secagg+dp"], atol=1e-3)
    assert not np.allclose(totals["ckks+dp"], x.sum(0).reshape(2, 3), atol=1e-2)  # noised
