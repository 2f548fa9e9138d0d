"""Issue 30, item 7: checkpoints hold client secrets, so they are sealed, under purpose keys.

The exploits: a secure run's root entropy was sealed, but ``state.npz`` beside it held every
user's private vector ``U`` and FedRec's pseudo-item sets (derived from the entropy) in the
clear; the key that sealed the entropy also HMAC'd the view; a key file readable by the group or
the world was accepted. Every test runs the real runtime and reads the bytes of the real files.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from securefed import PlaintextTransport, RunOptions, SeedTree, ServerView, run_rounds
from securefed.bench.cli import main
from securefed.errors import CheckpointError, InsecureParameterError, ViewFormatError
from securefed.integrity import KEY_PURPOSES, derive_key, read_key_file
from securefed.recsys.fedmf import FedMF, FedMFConfig
from securefed.runtime import Checkpoints

KEY = b"a checkpoint key of 32 bytes...."


class _Interrupted(Exception):
    """Stands for a crash after a checkpoint."""


def _run(split, directory, *, variant="fedrec", stop_after=None, entropy=None, rounds=4):
    seeds = SeedTree.secure_mode()
    if entropy is not None:
        seeds.resume_from(entropy)  # a secure tree with a known root, to compare two runs
    # FedRec with stable pseudo sets (resampled ones are redrawn from the sealed entropy and
    # never stored; the audit requires stable ones): the sets are then part of the state.
    config = FedMFConfig(rounds=rounds, dim=4, variant=variant, resample_pseudo=False)
    model = FedMF(split.train, config, seeds)
    saved = {}

    def crash(round_id, metrics):
        if round_id + 1 == 2:
            # what the checkpoint after round 2 holds (copies: the model keeps training)
            saved.update({k: np.array(v) for k, v in model.state_dict().items()})
        if stop_after is not None and round_id + 1 == stop_after:
            raise _Interrupted(seeds.entropy, saved)

    options = RunOptions(
        rounds=rounds,
        checkpoint_dir=directory,
        checkpoint_every=2,
        progress=False,
        checkpoint_key=KEY,
    )
    run_rounds(model, PlaintextTransport(), seeds, options, on_round=crash)
    return model, seeds


def _files(directory):
    return [p for p in sorted(directory.rglob("*")) if p.is_file()]


@pytest.mark.parametrize("variant", ["fedrec", "fedrec+"])
def test_no_checkpoint_file_holds_a_users_vector_or_pseudo_items_in_the_clear(
    small_split, tmp_path, variant
):
    with pytest.raises(_Interrupted) as crashed:
        _run(small_split, tmp_path / "run", variant=variant, stop_after=3)
    _, state = crashed.value.args
    secrets = {
        "U": state["U"],
        "a user's U row": state["U"][7],
        "pseudo_items": state["pseudo_items"],
        "pseudo_chosen": state["pseudo_chosen"],
    }
    assert state["pseudo_items"].size > 50  # FedRec filled: the sets are there to be found
    files = _files(tmp_path / "run")
    assert any(p.name.startswith("state") for p in files)
    as_text = [repr(float(value)) for value in state["U"][7]]  # a JSON dump of a row
    for path in files:
        data = path.read_bytes()
        for name, array in secrets.items():
            needle = np.ascontiguousarray(array).tobytes()
            assert needle not in data, f"{name} in the clear in {path}"
        text = data.decode("latin-1")
        assert not [value for value in as_text if value in text], f"U as text in {path}"


def test_a_sealed_state_resumes_to_the_uninterrupted_result(small_split, tmp_path):
    with pytest.raises(_Interrupted) as crashed:
        _run(small_split, tmp_path / "run", stop_after=3)
    entropy, _ = crashed.value.args
    resumed, seeds = _run(small_split, tmp_path / "run")
    assert seeds.entropy == entropy
    unbroken, _ = _run(small_split, tmp_path / "unbroken", entropy=entropy)
    np.testing.assert_array_equal(resumed.U, unbroken.U)
    np.testing.assert_array_equal(resumed.V, unbroken.V)
    np.testing.assert_array_equal(resumed.pseudo_items, unbroken.pseudo_items)


def test_a_sealed_state_edited_or_under_another_key_is_refused(small_split, tmp_path):
    _run(small_split, tmp_path / "run", rounds=2)
    (state,) = [p for p in _files(tmp_path / "run" / "latest") if p.name.startswith("state")]
    seeds = SeedTree.secure_mode()
    config = FedMFConfig(rounds=2, dim=4, variant="fedrec", resample_pseudo=False)
    model = FedMF(small_split.train, config, seeds)
    other = Checkpoints(tmp_path / "run", key=b"another key of at least 16 bytes")
    with pytest.raises(CheckpointError):
        other.restore(model, PlaintextTransport().view, seeds, {})
    data = bytearray(state.read_bytes())
    data[-5] ^= 1
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="state"):
        Checkpoints(tmp_path / "run", key=KEY).restore(model, PlaintextTransport().view, seeds, {})


def test_keys_are_separated_by_purpose(small_split, tmp_path):
    derived = {purpose: derive_key(KEY, purpose) for purpose in KEY_PURPOSES}
    assert len(set(derived.values())) == len(KEY_PURPOSES) == 3
    assert KEY not in derived.values()
    assert set(KEY_PURPOSES) == {"entropy", "client-state", "view-mac"}
    with pytest.raises(ValueError, match="purpose"):
        derive_key(KEY, "anything")
    _run(small_split, tmp_path / "run", rounds=2)
    view = tmp_path / "run" / "latest" / "view"
    # The view's MAC key is neither the checkpoint key nor the sealing keys.
    for key in (KEY, derived["entropy"], derived["client-state"]):
        with pytest.raises(ViewFormatError, match="digest mismatch"):
            ServerView.load(view, key=key)
    assert ServerView.load(view, key=derived["view-mac"]).rounds


# ----------------------------------------------------------------------------- key files
def _key_file(path, mode):
    path.write_bytes(KEY)
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_file_readable_by_others_is_refused(tmp_path, mode):
    path = _key_file(tmp_path / "key", mode)
    with pytest.raises(InsecureParameterError, match="chmod 600") as refused:
        read_key_file(path)
    assert str(path) in str(refused.value)


def test_a_private_key_file_is_read(tmp_path):
    path = _key_file(tmp_path / "key", 0o600)
    assert read_key_file(path) == KEY
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_cli_refuses_a_world_readable_checkpoint_key(tmp_path, capsys):
    path = _key_file(tmp_path / "key", 0o644)
    out = tmp_path / "run.json"
    argv = ["fedmf", "--rounds", "1", "--no-progress", "--json", str(out)]
    code = main(
        [*argv, "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-key-file", str(path)]
    )
    assert code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert str(path) in err and "chmod 600" in err
