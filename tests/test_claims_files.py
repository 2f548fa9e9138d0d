"""Claim: a corrupt or modified saved file never loads (issue 17, item 8).

The exploit: of 33 corruptions tried on saved views and checkpoints, 10 ended in a raw
``BadZipFile``/``EOFError``/``KeyError`` and 4 loaded silently with wrong content (a flipped bit
turned ``"public"`` into ``"puclic"`` and the view loaded with no public parameters; ``secagg_t``
edited from 3 to 1; a duplicated round; a payload of a client not in that round).

Here every saved artefact (a ServerView, a checkpoint, a privacy-ledger file) goes through a
matrix of corruptions: truncations, deletions, bit flips spread over every file, JSON edits, and
edits whose digest was recomputed (what a buggy writer, or an attacker without the HMAC key,
produces). Each must raise ``ViewFormatError`` or ``CheckpointError`` naming the file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from securefed import (
    ALL_PAYLOADS,
    CheckpointError,
    ClientSampling,
    PlaintextTransport,
    RunOptions,
    SeedTree,
    ServerView,
    ViewFormatError,
    run_rounds,
)
from securefed.privacy import PrivacyLedger
from securefed.transport.dp import DPTransport
from securefed.transport.secagg import SecAggConfig, SecAggTransport

FILE_ERRORS = (ViewFormatError, CheckpointError)
KEY = bytes(range(32))


# ----------------------------------------------------------------------------- the artefacts
def _save_view(directory: Path, key: bytes | None = None) -> Path:
    """A secure-aggregation view of two rounds, payloads kept, one dropout (threshold t = 3)."""
    transport = SecAggTransport(SecAggConfig(neighbours=4, threshold=3), keep_payloads=ALL_PAYLOADS)
    for round_id in range(2):
        rnd = transport.open_round(round_id, range(5), shape=(1, 3), seeds=SeedTree(round_id))
        for client in range(4):
            rnd.submit(client, np.full(3, 0.25))
        rnd.drop(4)
        rnd.result()
    assert transport.view.round(0).public["secagg_t"] == 3
    transport.view.save(directory, **_keyed(key))
    return directory


def _keyed(key: bytes | None) -> dict[str, bytes]:
    """``key=`` only when there is one (the unkeyed calls are the original API)."""
    return {} if key is None else {"key": key}


def _load_view(directory: Path, key: bytes | None = None) -> None:
    ServerView.load(directory, **_keyed(key))


class _Averager:
    """Clients send copies of a target; the server moves halfway to the mean."""

    n_clients = 6

    def __init__(self):
        self.state = np.zeros(3)

    def run_round(self, round_id, clients, transport, seeds):
        rnd = transport.open_round(round_id, clients, shape=(1, 3), seeds=seeds)
        rnd.broadcast("state", self.state)
        for client in clients:
            rnd.submit(int(client), np.full(3, 0.5) - self.state)
        self.state = self.state + 0.5 * rnd.result().total.ravel() / max(len(clients), 1)
        return {"norm": float(np.linalg.norm(self.state))}

    def state_dict(self):
        return {"state": self.state}

    def load_state_dict(self, state):
        self.state = np.array(state["state"])


def _dp_transport() -> DPTransport:
    return DPTransport(
        PlaintextTransport(keep_payloads=ALL_PAYLOADS),
        clip=1.0,
        noise_multiplier=2.0,
        ledger=PrivacyLedger(budget=(50.0, 1e-5)),
        sample_rate=0.5,
        sampling="poisson",
    )


def _checkpoint_run(directory: Path, rounds: int, key: bytes | None = None):
    algorithm, transport = _Averager(), _dp_transport()
    options = RunOptions(
        rounds=rounds,
        sampling=ClientSampling("poisson", 3),
        checkpoint_dir=directory,
        checkpoint_every=2,
        progress=False,
        fingerprint={"test": "files"},
        **({} if key is None else {"checkpoint_key": key}),
    )
    history = run_rounds(algorithm, transport, SeedTree(4), options)
    return algorithm, transport, history


def _save_checkpoint(directory: Path, key: bytes | None = None) -> Path:
    """A checkpoint directory after 4 of 6 rounds (its files are under ``latest/``)."""
    _checkpoint_run(directory, 4, key)
    return directory


def _load_checkpoint(directory: Path, key: bytes | None = None) -> None:
    _checkpoint_run(directory, 6, key)


def _save_ledger(directory: Path, key: bytes | None = None) -> Path:
    ledger = PrivacyLedger(budget=(8.0, 1e-5), sampling="poisson")
    ledger.charge(1.1, 0.05, steps=7)
    ledger.charge(0.9, 1.0)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ledger.json"
    ledger.save(path, **_keyed(key))
    return path


def _load_ledger(path: Path, key: bytes | None = None) -> None:
    PrivacyLedger.load(path, **_keyed(key))


ARTEFACTS = {
    "view": (_save_view, _load_view),
    "checkpoint": (_save_checkpoint, _load_checkpoint),
    "ledger": (_save_ledger, _load_ledger),
}


def _files(root: Path) -> list[Path]:
    return [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())


def _refused(load: Callable[[], None], named: Path | str) -> str:
    with pytest.raises(FILE_ERRORS) as caught:
        load()
    message = str(caught.value)
    assert str(named) in message, f"the error does not name {named}: {message}"
    return message


# ----------------------------------------------------------------------------- the matrix
def _flip(path: Path, position: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(bytes(data))


def _positions(size: int, count: int, seed: int) -> list[tuple[int, int]]:
    """The first, last and ``count`` spread positions of a file, each with a bit to flip."""
    rng = np.random.default_rng(seed)
    spread = np.linspace(0, size - 1, count).astype(int).tolist()
    return [(p, int(rng.integers(8))) for p in sorted({0, size - 1, *spread})]


@pytest.mark.parametrize("artefact", sorted(ARTEFACTS))
def test_every_file_truncated_emptied_or_deleted_is_refused(artefact, tmp_path):
    save, load = ARTEFACTS[artefact]
    pristine = save(tmp_path / "pristine")
    for k, target in enumerate(_files(pristine)):
        for damage in ("truncate", "empty", "delete"):
            root = tmp_path / f"{damage}-{k}"
            _copy(pristine, root)
            victim = root / target.relative_to(pristine) if pristine.is_dir() else root
            if damage == "delete":
                victim.unlink()
            else:
                size = 0 if damage == "empty" else len(victim.read_bytes()) // 2
                victim.write_bytes(victim.read_bytes()[:size])
            _refused(lambda root=root: load(root), victim)


@pytest.mark.parametrize("artefact", sorted(ARTEFACTS))
def test_a_bit_flipped_anywhere_in_any_file_is_refused(artefact, tmp_path):
    save, load = ARTEFACTS[artefact]
    pristine = save(tmp_path / "pristine")
    for k, target in enumerate(_files(pristine)):
        for position, bit in _positions(len(target.read_bytes()), 12, seed=k):
            root = tmp_path / f"flip-{k}-{position}-{bit}"
            _copy(pristine, root)
            victim = root / target.relative_to(pristine) if pristine.is_dir() else root
            _flip(victim, position, bit)
            _refused(lambda root=root: load(root), victim)
            _remove(root)


def test_public_flipped_to_puclic_is_refused(tmp_path):
    """The exploit's bit flip: ``"public"`` -> ``"puclic"`` loaded a view with no parameters."""
    view = _save_view(tmp_path / "view")
    manifest = view / "manifest.json"
    data = manifest.read_bytes()
    position = data.index(b'"public"') + 3  # the b
    _flip(manifest, position, 0)
    assert b'"puclic"' in manifest.read_bytes()
    _refused(lambda: _load_view(view), manifest)


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document, indent=1))


def _duplicate_round(m):
    m["rounds"].append(dict(m["rounds"][0]))


def _foreign_payload(m):
    m["rounds"][0]["payload_fields"]["99"] = ["masked"]


def _set_threshold(m):
    m["rounds"][0]["public"]["secagg_t"] = 1


VIEW_EDITS = {
    "secagg_t 3 -> 1": _set_threshold,
    "duplicated round": _duplicate_round,
    "removed round": lambda m: m["rounds"].pop(),
    "payload of a client outside the round": _foreign_payload,
    "dropped client removed": lambda m: m["rounds"][1]["dropped"].clear(),
    "public parameter removed": lambda m: m["public"].pop("aead"),
    "transport renamed": lambda m: m.update(transport="plaintext"),
    "digest removed": lambda m: m.pop("digest"),
    "format": lambda m: m.update(format="securefed.something_else"),
    "version 1 (no digest)": lambda m: m.update(version=1),
}


@pytest.mark.parametrize("edit", sorted(VIEW_EDITS))
def test_a_json_edit_of_a_view_is_refused(edit, tmp_path):
    view = _save_view(tmp_path / "view")
    _edit_json(view / "manifest.json", VIEW_EDITS[edit])
    _refused(lambda: _load_view(view), view / "manifest.json")


def _history_steps(state):
    state["history"][0][2] = 1


CHECKPOINT_EDITS = {
    "next_round": lambda m: m.update(next_round=2),
    "ledger history shortened": lambda m: _history_steps(m["ledgers"][0]),
    "ledger removed": lambda m: m["ledgers"].clear(),
    "ledger budget raised": lambda m: m["ledgers"][0]["budget"].update(epsilon=1e6),
    "history round dropped": lambda m: m["history"].pop(0),
    "seed entropy": lambda m: m["seeds"].update(entropy="5"),
    "version 1": lambda m: m.update(version=1),
    "digest removed": lambda m: m.pop("digest"),
}


@pytest.mark.parametrize("edit", sorted(CHECKPOINT_EDITS))
def test_a_json_edit_of_a_checkpoint_is_refused(edit, tmp_path):
    run = _save_checkpoint(tmp_path / "run")
    meta = run / "latest" / "checkpoint.json"
    _edit_json(meta, CHECKPOINT_EDITS[edit])
    _refused(lambda: _load_checkpoint(run), meta)


LEDGER_EDITS = {
    "history shortened": _history_steps,
    "budget raised": lambda s: s["budget"].update(epsilon=1e6),
    "accountant": lambda s: s.update(accountant="prv"),
    "version": lambda s: s.update(version=7),
    "format": lambda s: s.update(format="securefed.checkpoint"),
    "digest removed": lambda s: s.pop("digest"),
}


@pytest.mark.parametrize("edit", sorted(LEDGER_EDITS))
def test_a_json_edit_of_a_ledger_file_is_refused(edit, tmp_path):
    path = _save_ledger(tmp_path)
    _edit_json(path, LEDGER_EDITS[edit])
    _refused(lambda: _load_ledger(path), path)


# ----------------------------------------------------------------------------- re-sealed edits
def _reseal(path: Path, files: list[str], key: bytes | None = None) -> None:
    from securefed.integrity import write_sealed_json

    document = json.loads(path.read_text())
    write_sealed_json(path, document, files, key=key)


def _add_foreign_payload_array(view: Path) -> None:
    """Make the foreign payload self-consistent: its array exists and is named."""
    with np.load(view / "arrays.npz") as stored:
        arrays = {name: stored[name] for name in stored.files}
    arrays["r0/payload/99/masked"] = arrays["r0/packed/c_public/values"][:32]
    np.savez(view / "arrays.npz", **arrays)
    _edit_json(view / "manifest.json", lambda m: m.update(arrays=sorted(arrays)))


RESEALED_VIEW_EDITS = {
    "duplicated round": (_duplicate_round, "appears twice"),
    "payload of a client outside the round": (_foreign_payload, "not in the round"),
    "puclic": (
        lambda m: m["rounds"][0].update(puclic=m["rounds"][0].pop("public")),
        "unknown fields ['puclic']",
    ),
    "dropped client outside the round": (
        lambda m: m["rounds"][1]["dropped"].append(42),
        "not in the round",
    ),
    "round id not an integer": (lambda m: m["rounds"][0].update(round="0"), "must be a int"),
}


@pytest.mark.parametrize("edit", sorted(RESEALED_VIEW_EDITS))
def test_a_view_edit_with_a_recomputed_digest_is_refused_by_its_structure(edit, tmp_path):
    view = _save_view(tmp_path / "view")
    change, cause = RESEALED_VIEW_EDITS[edit]
    if edit == "payload of a client outside the round":
        _add_foreign_payload_array(view)
    _edit_json(view / "manifest.json", change)
    _reseal(view / "manifest.json", ["arrays.npz"])
    message = _refused(lambda: _load_view(view), view / "manifest.json")
    assert cause in message


def test_a_resealed_array_no_round_names_is_refused(tmp_path):
    view = _save_view(tmp_path / "view")
    with np.load(view / "arrays.npz") as stored:
        arrays = {name: stored[name] for name in stored.files}
    arrays["r7/clients"] = np.arange(3)
    np.savez(view / "arrays.npz", **arrays)
    _reseal(view / "manifest.json", ["arrays.npz"])  # the manifest does not list it
    _refused(lambda: _load_view(view), view / "arrays.npz")


def _one_round_earlier(m):
    m["history"] = [r for r in m["history"] if r["round"] < 3]
    m["next_round"] = 3  # the view still holds round 3


def test_a_checkpoint_edit_with_a_recomputed_digest_is_refused_by_its_structure(tmp_path):
    def duplicate_history(m):
        m["history"].append(dict(m["history"][-1]))

    for name, edit, cause in [
        ("a", duplicate_history, "increasing"),
        ("b", lambda m: m.update(next_round=1), "next_round"),
        ("c", _one_round_earlier, "at or after the checkpoint's next round"),
    ]:
        run = _save_checkpoint(tmp_path / name)
        meta = run / "latest" / "checkpoint.json"
        _edit_json(meta, edit)
        _reseal(meta, _CHECKPOINT_FILES)
        message = _refused(lambda run=run: _load_checkpoint(run), meta)
        assert cause in message


# ----------------------------------------------------------------------------- keyed digests
@pytest.mark.parametrize("artefact", sorted(ARTEFACTS))
def test_a_keyed_file_needs_its_key_and_refuses_a_re_sealed_edit(artefact, tmp_path):
    save, load = ARTEFACTS[artefact]
    root = save(tmp_path / "keyed", key=KEY)
    load(root, key=KEY)  # the pristine keyed file loads with its key
    sealed = root if root.is_file() else root / _main_file(artefact)
    assert sealed.is_file()
    _refused(lambda: load(root), sealed)  # without the key: cannot be checked
    _refused(lambda: load(root, key=bytes(32)), sealed)  # another key
    # An attacker without the key edits and re-seals with a plain SHA-256:
    files = {"view": ["arrays.npz"], "checkpoint": _KEYED_CHECKPOINT_FILES, "ledger": []}[artefact]
    _reseal(sealed, files)
    _refused(lambda: load(root, key=KEY), sealed)


_CHECKPOINT_FILES = ["state.npz", "view/manifest.json", "view/arrays.npz"]
# With a key the algorithm's state is sealed (issue 30, item 7): state.npz.sealed.
_KEYED_CHECKPOINT_FILES = ["state.npz.sealed", "view/manifest.json", "view/arrays.npz"]


def _main_file(artefact: str) -> str:
    return {"view": "manifest.json", "checkpoint": "latest/checkpoint.json"}[artefact]


def test_pristine_artefacts_load(tmp_path):
    _load_view(_save_view(tmp_path / "view"))
    _load_ledger(_save_ledger(tmp_path / "ledger"))
    run = _save_checkpoint(tmp_path / "run")
    algorithm, transport, history = _checkpoint_run(run, 6)
    assert history.resumed_from == 4 and transport.ledger.steps == 6
    reference_algorithm, reference, _ = _checkpoint_run(tmp_path / "whole", 6)
    assert transport.ledger.history == reference.ledger.history
    assert np.array_equal(algorithm.state, reference_algorithm.state)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def _copy(source: Path, destination: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, destination)
    else:
        shutil.copyfile(source, destination)
