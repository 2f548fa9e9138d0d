"""Issue 17, items 9 and 10: secure by default, and no flag that silently does nothing.

The exploits: the command line always seeded its runs (seed 0 unless told), so every run's keys,
masks and noise were predictable; a secure-mode run wrote its root entropy into checkpoint.json
in the clear (FedRec's pseudo items and the client sampling follow from it) and could not resume;
``--epsilon`` on a transport without DP trained without noise and reported no epsilon; ``--rounds
0`` trained nothing and still reported an RMSE.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from securefed import PlaintextTransport, RunOptions, SeedTree, ServerView, run_rounds
from securefed.audit import audit
from securefed.bench.cli import main
from securefed.errors import CheckpointError
from securefed.recsys.fedmf import FedMF, FedMFConfig

KEY = b"a checkpoint key of 32 bytes...."


def _cli(tmp_path, *extra):
    out, view = tmp_path / "run.json", tmp_path / "view"
    # the default preset at dim 8: what is checked is the randomness, not the model (dim 100
    # through secure aggregation would mask 1M values per client and round)
    argv = ["fedmf", "--rounds", "2", "--dim", "8", "--no-progress", "--json", str(out)]
    argv += ["--save-view", str(view)]
    code = main([*argv, *extra])
    return code, (json.loads(out.read_text()) if out.exists() else None), view


def test_the_command_line_runs_in_secure_mode_unless_a_seed_is_given(tmp_path, capsys):
    code, record, view = _cli(tmp_path / "secure", "--transport", "secagg")
    assert code == 0 and record["randomness"] == "secure" and record["seed"] is None
    saved = ServerView.load(view)
    assert saved.public["seeds"]["secure"] is True
    assert all(r.public["secagg_secure_randomness"] for r in saved.rounds)
    assert "seeded" not in capsys.readouterr().err
    assert "seeded-randomness" not in audit(view).codes


def test_a_seeded_run_says_it_is_not_private(tmp_path, capsys):
    code, record, view = _cli(tmp_path / "seeded", "--transport", "secagg", "--seed", "3")
    assert code == 0 and record["randomness"] == "seeded: not private"
    assert "seeded: not private" in capsys.readouterr().err
    assert ServerView.load(view).public["randomness"] == "seeded: not private"
    assert "seeded-randomness" in [f.code for f in audit(view).errors]


def test_the_split_does_not_depend_on_the_run_seed(tmp_path):
    _, secure, _ = _cli(tmp_path / "a")
    _, seeded, _ = _cli(tmp_path / "b", "--seed", "5")
    assert (secure["n_train"], secure["n_test"]) == (seeded["n_train"], seeded["n_test"])


class _Interrupted(Exception):
    """Stands for a crash after a checkpoint."""


def _secure_run(split, directory, *, stop_after=None, key=KEY, rounds=6, entropy=None):
    seeds = SeedTree.secure_mode()
    if entropy is not None:
        seeds.resume_from(entropy)  # a secure tree with a known root, to compare two runs
    model = FedMF(split.train, FedMFConfig(rounds=rounds, dim=4, variant="fedrec"), seeds)

    def crash(round_id, metrics):
        if stop_after is not None and round_id + 1 == stop_after:
            raise _Interrupted(seeds.entropy)

    options = RunOptions(
        rounds=rounds, checkpoint_dir=directory, checkpoint_every=2, progress=False,
        checkpoint_key=key,
    )  # fmt: skip
    history = run_rounds(model, PlaintextTransport(), seeds, options, on_round=crash)
    return model, seeds, history


def test_a_secure_run_never_writes_its_entropy_in_the_clear_and_resumes(small_split, tmp_path):
    with pytest.raises(_Interrupted) as crashed:
        _secure_run(small_split, tmp_path / "run", stop_after=5)
    (entropy,) = crashed.value.args
    text = (tmp_path / "run" / "latest" / "checkpoint.json").read_text()
    saved = json.loads(text)["seeds"]
    assert "entropy" not in saved and saved["entropy_sealed"] and saved["secure"] is True
    assert str(entropy) not in text
    # A new process, a fresh secure tree: the checkpoint's sealed entropy is restored into it.
    model, seeds, history = _secure_run(small_split, tmp_path / "run")
    assert history.resumed_from == 4 and len(history.rounds) == 6
    assert seeds.entropy == entropy and seeds.secure
    # And the resumed run ends where the uninterrupted run of that entropy ends.
    unbroken, _, _ = _secure_run(small_split, tmp_path / "unbroken", entropy=entropy)
    np.testing.assert_array_equal(model.V, unbroken.V)
    np.testing.assert_array_equal(model.U, unbroken.U)


def test_a_secure_run_refuses_checkpoints_without_a_key(small_split, tmp_path):
    with pytest.raises(ValueError, match="checkpoint_key"):
        _secure_run(small_split, tmp_path, key=None)


def test_a_sealed_entropy_does_not_open_under_another_key_or_in_another_mode(small_split, tmp_path):
    _secure_run(small_split, tmp_path, rounds=2)
    with pytest.raises(CheckpointError, match=r"digest mismatch|cannot be decrypted"):
        _secure_run(small_split, tmp_path, rounds=2, key=b"another key of at least 16 b")
    seeds = SeedTree(0)
    model = FedMF(small_split.train, FedMFConfig(rounds=2, dim=4, variant="fedrec"), seeds)
    options = RunOptions(rounds=2, checkpoint_dir=tmp_path, progress=False, checkpoint_key=KEY)
    with pytest.raises(CheckpointError, match="seeded: not private"):
        run_rounds(model, PlaintextTransport(), seeds, options)


@pytest.mark.parametrize("transport", ["plaintext", "secagg"])
def test_a_privacy_option_on_a_transport_without_dp_is_refused(tmp_path, capsys, transport):
    code, record, _ = _cli(tmp_path, "--transport", transport, "--epsilon", "8")
    assert code == 2 and record is None
    assert "epsilon" in capsys.readouterr().err


def test_zero_rounds_are_refused(tmp_path, capsys):
    code, record, _ = _cli(tmp_path, "--rounds", "0")
    assert code == 2 and record is None
    assert "rounds must be >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        RunOptions(rounds=0)
