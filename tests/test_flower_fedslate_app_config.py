"""The FedSlate app's run config (``[tool.flwr.app.config]``, read by
``securefed.rl.flower_fedslate.run_from_config``): every FedSlateConfig field a user may set on
Flower is a key, derived from the dataclass, and a key the app does not read is refused by name
(fail closed), never ignored. Config-only: nothing here starts a run.
"""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

pytest.importorskip(
    "flwr", reason="Flower is not installed: pip install securefed[flower] (flwr[simulation])"
)

from securefed.rl import flower_fedslate as ffs
from securefed.rl.fedslate import FedSlateConfig, ckks_config

TINY = {
    "candidates": 6, "slate-size": 2, "members": 2, "episodes": 1, "steps": 2, "burn-in": 1,
    "learn-every": 2, "target-sync": 7, "buffer-size": 16, "batch-size": 4, "local-hidden": "8",
    "server-hidden": "4", "seed": 0,
}  # fmt: skip
"""A seeded tiny run (the keys of tests/test_flower_deploy_apps.py's)."""
TINY_CONFIG = {
    "num_candidates": 6, "slate_size": 2, "members": 2, "episodes": 1, "steps_per_platform": 2,
    "burn_in": 1, "learn_every": 2, "target_sync": 7, "buffer_size": 16, "batch_size": 4,
    "local_hidden": (8,), "server_hidden": (4,), "seed": 0,
}  # fmt: skip
"""What :data:`TINY` is as FedSlateConfig arguments."""


def template() -> dict[str, object]:
    """The app template's ``[tool.flwr.app.config]``."""
    text = (ffs.APP_DIR / "pyproject.toml").read_text()
    return dict(tomllib.loads(text)["tool"]["flwr"]["app"]["config"])


def run_config(**overrides) -> dict[str, object]:
    """The template with the tiny run and ``overrides`` (keys as the app spells them)."""
    return template() | TINY | overrides


def test_a_misspelt_key_is_refused_naming_it_and_the_nearest_key():
    with pytest.raises(ValueError, match=r"'dp-epsilom'.*did you mean 'dp-epsilon'"):
        ffs.run_from_config(run_config(fusion="dp", **{"dp-epsilom": 8.0}))
    with pytest.raises(ValueError, match=r"'activaton'.*did you mean 'activation'"):
        ffs.run_from_config(run_config(activaton="polynomial"))
    with pytest.raises(ValueError, match=r"'threads' is not an app key: .*OMP_NUM_THREADS"):
        ffs.run_from_config(run_config(threads=4))


def test_every_config_field_is_a_key_of_the_template_or_deliberately_not():
    """A new FedSlateConfig field fails here until it is in the template (with its default) or
    in APP_NOT_ON_FLOWER with the reason."""
    fields = {f.name for f in dataclasses.fields(FedSlateConfig)}
    reached = {name for name, _ in ffs.app_config_keys().values()}
    assert reached | set(ffs.APP_NOT_ON_FLOWER) == fields
    assert not reached & set(ffs.APP_NOT_ON_FLOWER)
    assert set(template()) == set(ffs.app_config_keys()) | set(ffs.APP_RUN_KEYS)
    # The template's values are the dataclass defaults, seed -1 the default secure mode.
    assert ffs.run_from_config(template()).config == FedSlateConfig()


def test_a_ckks_run_config_with_activation_builds_the_in_process_config():
    for hidden, circuit in (("16", "packed"), ("16,16", "monomials")):
        values = run_config(fusion="ckks", activation="polynomial", **{"server-hidden": hidden})
        config = ffs.run_from_config(values).config
        widths = tuple(int(w) for w in hidden.split(","))
        want = FedSlateConfig(
            **TINY_CONFIG | {"server_hidden": widths, "fusion": "ckks", "activation": "polynomial"}
        )
        assert config == want and ckks_config(config).circuit == circuit
    values = run_config(fusion="ckks", **{"server-activation": "polynomial", "ckks-scale-bits": 40})
    config = ffs.run_from_config(values).config
    assert (config.server_activation, config.activation, config.ckks_scale_bits) == (
        "polynomial", "silu", 40,
    )  # fmt: skip
    assert ckks_config(config).scale_bits == 40
    assert ffs.run_from_config(run_config(fusion="ckks+dp", **{"dp-epsilon": 8})).config == (
        FedSlateConfig(**TINY_CONFIG | {"fusion": "ckks+dp", "dp_epsilon": 8.0})
    )


def test_the_dp_levers_reach_the_config():
    dp = {"fusion": "dp", "dp-epsilon": 8.0}
    values = run_config(
        **dp, **{"dp-delta": 1e-6, "dp-clip": 0.5, "dp-grad-clip": 0.02, "dp-local-clip": 2.0,
                 "dp-local-noise": 1.5, "dp-local-training": "dp-sgd"},
    )  # fmt: skip
    config = ffs.run_from_config(values).config
    assert (config.dp_epsilon, config.dp_delta, config.dp_clip, config.dp_grad_clip) == (
        8.0, 1e-6, 0.5, 0.02,
    )  # fmt: skip
    assert (config.dp_local_clip, config.dp_local_noise, config.dp_local_training) == (
        2.0, 1.5, "dp-sgd",
    )  # fmt: skip
    # "none" is dp_local_training's own value (raw local training), "" its default (None).
    local = {"dp-local-training": "none"}
    assert ffs.run_from_config(run_config(**dp, **local)).config.dp_local_training == "none"
    assert ffs.run_from_config(run_config(**dp)).config.dp_local_training is None
    # Joint DP with sampled sums reaches FedSlateConfig; Flower refuses dp_acting 'own' by name.
    joint = run_config(
        **dp, **{"dp-acting": "own", "dp-learning": "sums", "dp-sampling": "poisson",
                 "dp-sample-rate": 0.25, "dp-server-clip": 0.5},
    )  # fmt: skip
    config = ffs.config_from_run_config(joint)
    assert (config.dp_acting, config.dp_learning, config.dp_sampling) == ("own", "sums", "poisson")
    assert (config.dp_sample_rate, config.dp_server_clip) == (0.25, 0.5)
    with pytest.raises(ValueError, match="dp_acting 'own' is not carried on Flower"):
        ffs.run_from_config(joint)
    diagnostic = run_config(**dp, **{"dp-diagnostic": "noiseless-rows"})
    assert ffs.run_from_config(diagnostic).config.dp_diagnostic == "noiseless-rows"


def test_the_kept_keys_keep_their_meaning_and_bad_values_are_named():
    assert ffs.run_from_config(template()).config.seed is None  # seed = -1: secure mode
    run = ffs.run_from_config(run_config(platforms=3, timeout=30, **{"output-dir": "/tmp/x"}))
    assert (run.nodes, run.timeout, run.output_dir, run.config.seed) == (4, 30.0, "/tmp/x", 0)
    assert ffs.run_from_config(run_config(**{"dp-epsilon": 0})).config.dp_epsilon is None
    assert ffs.run_from_config(run_config(feedback="true,true")).config.feedback == (True, True)
    with pytest.raises(ValueError, match="secure mode"):
        ffs.run_from_config(run_config(seed=-2))
    with pytest.raises(ValueError, match="local-hidden takes comma-separated widths"):
        ffs.run_from_config(run_config(**{"local-hidden": "8;8"}))
    with pytest.raises(ValueError, match="episodes takes an integer"):
        ffs.run_from_config(run_config(episodes=2.5))
    big = 2**60 + 1  # exact: not through a float
    assert ffs.run_from_config(run_config(seed=big)).config.seed == big
    assert ffs.run_from_config(run_config(seed="3")).config.seed == 3
    with pytest.raises(ValueError, match="dp-clip takes a finite number"):
        ffs.run_from_config(run_config(fusion="dp", **{"dp-epsilon": 8, "dp-clip": float("nan")}))
    with pytest.raises(ValueError, match="episodes takes a finite number"):
        ffs.run_from_config(run_config(episodes=float("inf")))
    with pytest.raises(ValueError, match="shared-corpus must be true or false"):
        ffs.run_from_config(run_config(**{"shared-corpus": 1}))
    with pytest.raises(ValueError, match="fusion takes a string"):
        ffs.run_from_config(run_config(fusion=3))
    with pytest.raises(ValueError, match="alignment 'item' is not carried on Flower"):
        ffs.run_from_config(run_config(alignment="item"))
    with pytest.raises(ValueError, match="dp_epsilon is required"):
        ffs.run_from_config(run_config(fusion="dp"))
