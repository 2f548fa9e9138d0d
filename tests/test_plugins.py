"""Leak-utility plug-ins: registration from Python and entry points, usage errors (issue 19)."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from securefed import PlaintextTransport
from securefed.bench import plugins
from securefed.bench.cli import main
from securefed.bench.leak_utility import LeakUtilityConfig, load_split, run_cell
from securefed.bench.plugins import (
    AttackPlugin,
    LeakMeasure,
    ModelPlugin,
    ModelRun,
    attack_plugin,
    model_plugin,
    register_attack,
    register_model,
)


class _Counter:
    """A minimal FederatedAlgorithm: each client submits its id; the model is the mean."""

    def __init__(self, n_clients: int) -> None:
        self.n_clients = n_clients
        self.value = 0.0

    def run_round(self, round_id, clients, transport, seeds):
        rnd = transport.open_round(round_id, clients, shape=(1, 1), seeds=seeds)
        for client in clients.tolist():
            rnd.submit(client, np.array([float(client)]), weight=1.0)
        self.value = float(rnd.result().mean()[0, 0])
        return {"value": self.value}

    def state_dict(self):
        return {"value": np.array(self.value)}

    def load_state_dict(self, state):
        self.value = float(state["value"])


def build_counter(context):
    algorithm = _Counter(8)
    return ModelRun(algorithm, lambda: {"distance": abs(algorithm.value - 3.5)}, truth=8)


def read_ids(view, truth):
    """Guess each client's id from its payload (chance: one in ``truth``)."""
    last = view.round(view.rounds_with_payloads()[-1])
    found = [c for c in last.clients.tolist() if "values" in last.payload(int(c))]
    return [LeakMeasure("ids_read", len(found) / truth, 1.0 / truth)]


COUNTER = ModelPlugin("counter", build_counter, utility_columns=("distance",), attacks=("ids",))
IDS = AttackPlugin("ids", read_ids)


@pytest.fixture
def registered():
    register_model(COUNTER)
    register_attack(IDS)
    yield
    plugins.unregister("counter")
    plugins.unregister("ids")


def test_built_ins_are_fedmf_and_gradient_inversion():
    assert model_plugin("fedmf").attacks == ("gradient-inversion",)
    assert model_plugin("fedmf").variants == ("fedmf", "fedrec", "fedrec+")
    assert attack_plugin("gradient-inversion").table_measures == (
        "exact_share",
        "rmse",
        "f1",
        "filled_identified",  # under hybrid filling only (issue 20)
    )


def test_a_python_plugin_runs_through_the_benchmark(registered):
    config = LeakUtilityConfig(rounds=2, model="counter", progress=False, max_users=5)
    split = load_split(config)
    plain = run_cell(split, "default", "plaintext", config)
    masked = run_cell(split, "default", "secagg", config)
    assert plain["status"] == masked["status"] == "ok"
    assert plain["model"] == "counter" and plain["distance"] == pytest.approx(0.0)
    assert plain["leak_ids_read"] == 1.0 and plain["chance_ids_read"] == 0.125
    assert masked["leak_ids_read"] == 0.0  # the masked payloads hold no value to read
    assert masked["distance"] == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="already registered"):
        register_model(COUNTER)


class _EntryPoint:
    def __init__(self, name, value, loaded):
        self.name, self.value, self._loaded = name, value, loaded

    def load(self):
        return self._loaded


def test_entry_points_register_models_and_attacks(monkeypatch):
    model = ModelPlugin("ep-counter", build_counter, utility_columns=("distance",))
    points = {
        plugins.MODEL_GROUP: [_EntryPoint("ep-counter", "pkg.mod:MODEL", lambda: model)],
        plugins.ATTACK_GROUP: [
            _EntryPoint("ep-ids", "pkg.mod:IDS", AttackPlugin("ep-ids", read_ids))
        ],
    }
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points.get(group, []))
    try:
        assert "ep-counter" in plugins.model_names() and "ep-ids" in plugins.attack_names()
        assert model_plugin("ep-counter") is model  # a factory function is called
        assert attack_plugin("ep-ids").attack is read_ids
    finally:
        plugins.unregister("ep-counter")
        plugins.unregister("ep-ids")
    wrong = {plugins.MODEL_GROUP: [_EntryPoint("other-name", "pkg.mod:X", model)]}
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: wrong.get(group, []))
    with pytest.raises(ValueError, match="must give a ModelPlugin named 'other-name'"):
        model_plugin("other-name")


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        (["--transports", "plaintext,sekagg"], "unknown transport 'sekagg'"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--attacks", "nope"], "unknown attack 'nope'"),
        (["--variants", "fedmf,svd"], "no variant 'svd'"),
        (["--transports", "dp:lots"], "could not convert"),
    ],
)
def test_an_unknown_name_is_a_usage_error(argument, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as caught:
        main(["bench", "leak-utility", *argument, "--out", str(tmp_path)])
    assert caught.value.code == 2
    error = capsys.readouterr().err
    assert "usage:" in error and message in error
    assert not any(tmp_path.iterdir())  # nothing ran


def test_help_documents_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "leak-utility", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    options = [
        "--data",
        "--split",
        "--model",
        "--variants",
        "--attacks",
        "--transports",
        "--rounds",
        "--seed",
        "--max-users",
        "--max-items",
        "--dp-clip",
        "--transport-rounds",
        "--model-option",
        "--dp-model-option",
        "--workers",
        "--out",
    ]
    for option in options:
        assert option in text
    assert text.count("default") >= len(options)
    assert "dp:EPS" in text and "known here: fedmf" in text


def test_a_plugin_must_return_a_federated_algorithm():
    with pytest.raises(Exception, match="n_clients"):
        ModelRun(object(), lambda: {}, None)
    assert PlaintextTransport  # the import the plugin module's users need
