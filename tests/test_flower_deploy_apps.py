"""FedHPD and FedSlate submitted with ``flwr run`` to real processes (a SuperLink and SuperNodes on
127.0.0.1, ``securefed.flower.loopback``), each against its in-process run with the same seed.

The claims: FedSlate's app (``rl/flower_fedslate_app``, read by
``securefed.rl.flower_fedslate.run_from_config``) on Flower's deployment engine is the in-process
``run_fedslate`` bit for bit (the episode rewards, the server network the ServerApp wrote, both
platforms' local networks), and so is FedHPD's app under malicious-server secure aggregation
with both merges of its message rounds (every agent's parameters as ``ReferenceRun`` with
in-process secure aggregation). The real-process runs are slow (a message round costs seconds
there: docs/flower.md, "Cost per message round"); the run-config checks are not.
"""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from securefed.rl import flower_fedslate as ffs
from securefed.rl.fedslate import run_fedslate

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SEED = 0
# Two platforms (A with rewards, B without), 2 members, one episode of 2 rounds: one learning
# step (Algorithms 1 and 2), 21 message rounds in all.
FEDSLATE_TINY = {
    "candidates": 6, "slate-size": 2, "members": 2, "episodes": 1, "steps": 2, "burn-in": 1,
    "learn-every": 2, "target-sync": 7, "buffer-size": 16, "batch-size": 4, "local-hidden": "8",
    "server-hidden": "4", "seed": SEED, "timeout": 900.0,
}  # fmt: skip


ONE_THREAD = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05", "OMP_NUM_THREADS": "1"}
"""The federations' environment: the SuperExec's fast poll (``loopback.FAST_TASK_POLL``) and
torch on one thread in every app process, as in the in-process run."""


def fedslate_run_config(**overrides) -> dict[str, object]:
    """The FedSlate app's ``[tool.flwr.app.config]`` with the tiny run and ``overrides``."""
    text = (ffs.APP_DIR / "pyproject.toml").read_text()
    values = dict(tomllib.loads(text)["tool"]["flwr"]["app"]["config"])
    return values | FEDSLATE_TINY | overrides


def test_the_fedslate_app_template_is_secure_mode_and_reads_its_keys():
    text = (ffs.APP_DIR / "pyproject.toml").read_text()
    template = tomllib.loads(text)["tool"]["flwr"]["app"]["config"]
    assert template["seed"] == -1 and ffs.run_from_config(template).config.seed is None
    run = ffs.run_from_config(fedslate_run_config(fusion="dp", **{"dp-epsilon": 8.0}))
    config = run.config
    assert (config.seed, config.fusion, config.dp_epsilon, run.nodes) == (SEED, "dp", 8.0, 3)
    assert (config.local_hidden, config.server_hidden, config.steps_per_platform) == ((8,), (4,), 2)
    assert ffs.run_from_config(fedslate_run_config()).config.dp_epsilon is None
    with pytest.raises(ValueError, match="local-hidden takes comma-separated widths"):
        ffs.run_from_config(fedslate_run_config(**{"local-hidden": "8;8"}))
    with pytest.raises(ValueError, match="not carried on Flower"):
        ffs.run_from_config(fedslate_run_config(alignment="item"))
    with pytest.raises(ValueError, match="secure mode"):
        ffs.run_from_config(fedslate_run_config(seed=-2))


def _fedslate_node_config(directory, secure: bool) -> dict[int, dict[str, object]]:
    """Each role's ``--node-config`` (``partition-id`` is the loopback federation's): in secure
    mode its provisioned relay identity."""
    if not secure:
        return {}
    digest = ffs.provision_relay_identities(directory, 2)
    return {
        role: {
            ffs.IDENTITY_PATH: str(directory / f"identity-{role}.bin"),
            ffs.REGISTRY_PATH: str(directory / "registry.bin"),
            ffs.REGISTRY_DIGEST: digest,
        }
        for role in range(3)
    }


def run_fedslate_app(tmp_path, values: dict, node_config=None, timeout: float = 2400.0):
    """The app submitted with ``flwr run`` to a SuperLink and 3 SuperNodes (the simulator and two
    platforms); what the server and the nodes wrote."""
    from securefed.flower.loopback import LoopbackFederation

    out = tmp_path / "out"
    values = values | {"output-dir": str(out)}
    run = ffs.run_from_config(values)
    with LoopbackFederation(
        tmp_path / "federation", run.nodes, node_config=node_config, env=ONE_THREAD
    ) as federation:
        federation.submit(ffs.write_fedslate_app(tmp_path / "app", values), timeout=600)
        federation.wait_for(out / "result.json", timeout=timeout)
    summary, server = ffs.server_results(out)
    return run, summary, server, ffs.node_results(out, run.config)


def fedslate_differences(run, server, nodes, reference) -> dict[str, float]:
    """Max absolute difference to the in-process run: rewards, server and local networks."""
    diffs = {
        "rewards": float(np.abs(nodes["simulator"]["rewards"] - reference.episode_rewards).max())
    }
    diffs["server"] = max(
        float(np.abs(server[name] - want.numpy()).max())
        for name, want in reference.networks["server"].state_dict().items()
    )
    for platform in ("A", "B"):
        diffs[f"local_{platform}"] = max(
            float(np.abs(nodes[platform][f"local.{name}"] - want.numpy()).max())
            for name, want in reference.networks[f"local_{platform}"].state_dict().items()
        )
    return diffs


@pytest.mark.slow
def test_the_fedslate_app_on_real_processes_equals_in_process(tmp_path):
    """A seeded FedSlate run submitted with ``flwr run`` to real processes: the rewards, the
    server network the ServerApp wrote and both local networks are ``run_fedslate``'s, bit for
    bit (the same torch calls on one thread in every process)."""
    from securefed.flower.loopback import missing_commands

    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    run, summary, server, nodes = run_fedslate_app(tmp_path, fedslate_run_config())
    reference = run_fedslate(run.config)
    assert fedslate_differences(run, server, nodes, reference) == {
        "rewards": 0.0, "server": 0.0, "local_A": 0.0, "local_B": 0.0
    }  # fmt: skip
    assert summary["learn_steps"] == reference.learn_steps == 1
    assert summary["secure_mode"] is False and summary["message_rounds"] == 21
    assert summary["messages"] == dict(ffs.drive_in_process(run).messages)  # kind by kind
    assert summary["message_bytes"]["down"] > 0 and summary["message_bytes"]["up"] > 0


def fedhpd_run_config(**overrides) -> dict[str, object]:
    """FedHPD's app config: 3 CartPole agents of two architectures, a 40-state ``S_p`` in parts
    of 25 (the schedule of tests/test_flower_fedhpd_recovery.py), and ``overrides``."""
    from securefed.rl.flower_fedhpd import APP_DIR

    text = (APP_DIR / "pyproject.toml").read_text()
    values = dict(tomllib.loads(text)["tool"]["flwr"]["app"]["config"])
    values |= {
        "agents": "0,2,5", "d": 2, "rounds": 5, "public-size": 40, "part-size": 25,
        "distill-loops": 2, "virtual-rounds": 8,
    }  # fmt: skip
    return values | overrides


def fedhpd_parameters(out_dir) -> dict[int, np.ndarray]:
    """Each agent's final parameters, from the files its node wrote after evaluating."""
    params = {}
    for path in sorted(out_dir.glob("node-*.npz")):
        with np.load(path) as saved:
            params |= {k: saved[f"param{k}"] for k in saved["agents"].tolist()}
    return params


@pytest.mark.slow
def test_the_fedhpd_app_with_merged_secure_aggregation_on_real_processes_equals_in_process(
    tmp_path,
):
    """FedHPD's app, malicious-server secure aggregation with ShareKeys + MaskedInput merged and
    the next AdvertiseKeys on Unmasking, on a SuperLink and two SuperNodes: every agent's
    parameters as ``ReferenceRun`` with in-process secure aggregation (one event of one loop x 2
    parts: 2 transport rounds, 4 + 3 message rounds)."""
    from securefed.flower.loopback import LoopbackFederation, missing_commands
    from securefed.rl.fast import make_public_states
    from securefed.rl.fedhpd import ReferenceRun, RunSpec
    from securefed.rl.flower_fedhpd import FedHPDApp, write_fedhpd_app
    from securefed.transport.secagg import SecAggTransport

    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    out = tmp_path / "out"
    values = fedhpd_run_config(
        seed=SEED,
        rounds=2,
        transport="secagg",
        **{
            "distill-loops": 1,
            "output-dir": str(out),
            "timeout": 900.0,
            "secagg-merge": True,
            "secagg-advertise-ahead": True,
        },
    )
    app = FedHPDApp.from_run_config(values)
    with LoopbackFederation(tmp_path / "federation", 2, env=ONE_THREAD) as federation:
        federation.submit(write_fedhpd_app(tmp_path / "app", values), timeout=600)
        federation.wait_for(out / "result.json", timeout=2400)
        federation.wait_for(out / "node-1.npz", timeout=120)
    config = app.run.config
    spec = RunSpec(
        config, SEED, SecAggTransport(app.secagg), public_states=make_public_states(config)
    )
    reference = ReferenceRun(spec).run()
    params = fedhpd_parameters(out)
    # within 1e-6 as tests/test_flower_fedhpd.py's in-process comparison (measured: 0)
    diff = max(np.abs(params[k] - reference.params[k]).max() for k in range(config.n_agents))
    assert diff <= 1e-6
    result = json.loads((out / "result.json").read_text())
    assert result["secure_mode"] is False and result["transport"] == "secagg"
    counts = {k: n for k, n in result["message_rounds"].items() if k != "evaluate"}
    # the run's nonces once; merged; the second round's AdvertiseKeys ahead
    assert sum(counts.values()) == 1 + 4 + 3
