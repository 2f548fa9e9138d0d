"""FedSlate's local DP-SGD step by per-sample backpropagation (issue 34, the fast step).

:meth:`LocalDPSGD.step` and :meth:`LocalDPSGD.step_joint` compute each row's parameter gradient
from one batched backward to the layers' outputs (:func:`taped_row_gradients`) and sum rows by
unit with ``index_add`` (:func:`unit_sums`). The regression tests: with every generator fixed,
the released sums, the ledger and the updated weights equal those of the previous step
(``torch.func``'s ``vmap(grad)`` per row and a one-hot matrix product per unit, kept here as the
reference) within float tolerance, for ``dp_learning="rows"`` and ``"sums"``, with and without
``server_clip`` and Poisson sampling; and the per-row gradients equal a per-row loop of
ordinary backward passes. The release schedule and what is charged never depend on the path.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("gymnasium")

pytestmark = pytest.mark.usefixtures("torch_one_thread")


# -- the previous step, as the reference ---------------------------------------------------


def reference_unit_sums(rows: torch.Tensor, units: np.ndarray) -> torch.Tensor:
    """The previous :func:`unit_sums`: a one-hot ``(S, B, B)`` matrix times the rows."""
    members, batch = units.shape
    onehot = torch.zeros(members, batch, batch, dtype=rows.dtype)
    for s in range(members):
        _, slot = np.unique(units[s], return_inverse=True)
        onehot[s, torch.from_numpy(slot.reshape(-1)), torch.arange(batch)] = 1.0
    return torch.bmm(onehot, rows)


def reference_row_gradients(network, x: torch.Tensor, output_grads: torch.Tensor):
    """The previous :meth:`LocalDPSGD.row_gradients` (``vmap(grad)`` per row)."""
    from torch.func import functional_call, grad, vmap

    names = [name for name, _ in network.named_parameters()]
    params = {name: p.detach() for name, p in network.named_parameters()}

    def row_value(weights, x_row, g_row):
        out = functional_call(network, weights, (x_row[:, None, :],))
        return (out[:, 0, :] * g_row).sum()

    per_row = vmap(grad(row_value), in_dims=(None, 1, 1))(params, x, output_grads)
    s, b = x.shape[:2]
    return torch.cat([per_row[n].reshape(b, s, -1).transpose(0, 1) for n in names], dim=-1)


def reference_step(self, optimiser, x, output_grads, units):
    """The previous :meth:`LocalDPSGD.step`."""
    batch = x.shape[1]
    rows = reference_row_gradients(self.network, x, output_grads.detach() * batch).double()
    noised = self.release(reference_unit_sums(rows, units).numpy()) / batch
    flat = torch.from_numpy(noised)
    offset = 0
    for p in self.network.parameters():
        size = p[0].numel()
        p.grad = flat[:, offset : offset + size].reshape(p.shape).to(p.dtype).contiguous()
        offset += size
    optimiser.step()


def reference_step_joint(self, run, p, row_loss, x, extras, units):
    """The previous :meth:`LocalDPSGD.step_joint` (``vmap(grad)`` per row of both networks)."""
    from torch.func import functional_call, grad, vmap

    server, k_plat = run.channel.module, run.config.num_platforms
    local_named = list(self.network.named_parameters())
    server_named = list(server.named_parameters())
    local_params = {n: t.detach() for n, t in local_named}
    server_params = {n: t.detach() for n, t in server_named}

    def one_row(lw, sw, x_row, *extra_rows):
        q = functional_call(self.network, lw, (x_row[:, None, :],))
        ordered = [q] + [torch.zeros_like(q)] * (k_plat - 1)
        fused = functional_call(server, sw, (ordered,))
        return row_loss(fused, *[e[:, None] for e in extra_rows])

    in_dims = (None, None, 1, *([1] * len(extras)))
    g_local, g_server = vmap(grad(one_row, argnums=(0, 1)), in_dims=in_dims)(
        local_params, server_params, x, *extras
    )
    s, b = x.shape[:2]
    pieces = [g_local[n].reshape(b, s, -1) for n, _ in local_named]
    pieces += [g_server[n].reshape(b, s, -1) for n, _ in server_named]
    rows = torch.cat(pieces, dim=-1).transpose(0, 1).double()
    scale = b * (self.sample_rate or 1.0)
    local_size = sum(param[0].numel() for _, param in local_named)
    per_unit = self.split_clipped(reference_unit_sums(rows, units).numpy(), local_size)
    noised = torch.from_numpy(self.release_sampled(per_unit) / scale)
    offset = 0
    for _, param in local_named + server_named:
        size = param[0].numel()
        piece = noised[:, offset : offset + size].reshape(param.shape).to(param.dtype)
        param.grad = piece.contiguous()
        offset += size
    run.local_opt[p].step()
    run.channel.optimiser.step()
    run.updates[f"local_{run.names[p]}"] += 1
    run.updates["server"] += 1


# -- helpers ----------------------------------------------------------------------------------


def _run_steps(monkeypatch, config, steps: int, *, reference: bool):
    """A run of ``config`` learning ``steps`` times after its burn-in; returns the released
    sums (pre-noise inputs and outputs), the networks' weights and the ledgers' histories."""
    from securefed.rl import fedslate

    released = []
    with monkeypatch.context() as patch:
        if reference:
            patch.setattr(fedslate.LocalDPSGD, "step", reference_step)
            patch.setattr(fedslate.LocalDPSGD, "step_joint", reference_step_joint)
        original = fedslate.LocalDPSGD.release

        def recorded(self, unit_gradients):
            out = original(self, unit_gradients)
            released.append((self.party, np.array(unit_gradients), np.array(out)))
            return out

        patch.setattr(fedslate.LocalDPSGD, "release", recorded)
        run = fedslate.start_run(config)
        _fill_replay(run)
        for _ in range(steps):
            fedslate.learn(run)
    weights = [
        {n: t.detach().clone() for n, t in net.named_parameters()}
        for net in [*run.local, run.channel.module]
    ]
    ledgers = {p: copy.deepcopy(run.channel.ledgers[p].server_history) for p in run.names}
    return released, weights, ledgers


def _fill_replay(run) -> None:
    """Rounds played until the replay holds ``buffer_size`` rows (no learning)."""
    from securefed.rl.fedslate import acting_inquiry, choose_slates, play_round
    from securefed.rl.slateq import features

    config, episode = run.config, 0
    while run.rounds < config.buffer_size + config.steps_per_platform:
        run.env.reset()
        x = [features(run.env.observation(p), config) for p in range(config.num_platforms)]
        done = False
        while not done:
            run.channel.open_round(run.rounds)
            qf = acting_inquiry(run, x)
            slates = choose_slates(run, x, qf, config.epsilon(run.rounds))
            done = play_round(run, episode, x, slates)
            run.replay_unit[run.replay.head] = episode
            run.replay.commit(done)
            run.rounds += 1
        episode += 1


CASES = {
    "rows": {"dp_acting": "own"},
    "sums": {"dp_acting": "own", "dp_learning": "sums"},
    "sums-split": {"dp_acting": "own", "dp_learning": "sums", "dp_server_clip": 0.7},
    "sums-sampled": {
        "dp_acting": "own",
        "dp_learning": "sums",
        "dp_sampling": "poisson",
        "dp_sample_rate": 0.5,
    },
    "sums-split-sampled-ext": {
        "dp_acting": "own",
        "dp_learning": "sums",
        "dp_server_clip": 0.7,
        "dp_sampling": "poisson",
        "dp_sample_rate": 0.5,
        "variant": "extended",
    },
    "rows-flat-item": {"dp_acting": "own", "local_arch": "flat", "alignment": "item"},
}


# -- tests ------------------------------------------------------------------------------------


SLOW_CASES = ("sums-split-sampled-ext", "rows-flat-item")
"""The composite cases (every option at once, the other architectures): heavy, ``-m slow``."""


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in CASES],
    ids=list(CASES),
)
def test_fast_step_releases_and_weights_match_the_previous_step(monkeypatch, fedslate_small, case):
    from securefed.rl.fedslate import FedSlateConfig

    shape = fedslate_small | {"members": 3, "batch_size": 6, "buffer_size": 24, "episodes": 6}
    shape |= CASES[case]
    # A clip the gradients exceed (so clipping binds) and one they stay within.
    for clip in (0.01, 10.0):
        fields = shape | {"dp_local_clip": clip}
        if "dp_server_clip" in fields:  # given as a share of the clip
            fields["dp_server_clip"] = fields["dp_server_clip"] * clip
        config = FedSlateConfig(**fields, fusion="dp", dp_epsilon=8.0)
        new, new_weights, new_ledgers = _run_steps(monkeypatch, config, 6, reference=False)
        old, old_weights, old_ledgers = _run_steps(monkeypatch, config, 6, reference=True)
        assert new_ledgers == old_ledgers  # the same charges, before anything is released
        assert len(new) == len(old) > 0
        for (party, pre, out), (party_old, pre_old, out_old) in zip(new, old, strict=True):
            assert party == party_old and pre.shape == pre_old.shape and out.shape == out_old.shape
            scale = max(1e-12, np.abs(pre_old).max())
            np.testing.assert_allclose(pre, pre_old, rtol=1e-4, atol=1e-5 * scale)
            np.testing.assert_allclose(out, out_old, rtol=1e-4, atol=1e-5 * np.abs(out_old).max())
        for net_new, net_old in zip(new_weights, old_weights, strict=True):
            for name, value in net_new.items():
                torch.testing.assert_close(value, net_old[name], rtol=1e-4, atol=1e-5)


def test_unit_sums_equal_the_one_hot_product():
    from securefed.rl.fedslate import unit_sums

    rng = np.random.default_rng(3)
    rows = torch.from_numpy(rng.normal(size=(3, 9, 17)))
    units = rng.integers(0, 4, size=(3, 9))  # repeated units in every member
    torch.testing.assert_close(unit_sums(rows, units), reference_unit_sums(rows, units))
    out = unit_sums(rows, units)
    for s in range(3):
        distinct = np.unique(units[s]).size
        assert torch.all(out[s, distinct:] == 0)  # the slots no unit fills stay zero


def test_flat_row_gradients_equal_a_loop_of_backward_passes():
    """Against the plainest reference, one ordinary backward per (member, row), for the flat
    local network (the item network's: ``tests/test_fedslate_local_dp.py``)."""
    from securefed.privacy.noise import SeededGaussian
    from securefed.rl.fedslate import LocalDPSGD
    from securefed.rl.slateq import LocalQNetwork

    generator = torch.Generator().manual_seed(0)
    net = LocalQNetwork(2, 1 + 5 + 4, 5, (7, 6), arch="flat", generator=generator)
    trainer = LocalDPSGD("A", net, 1.0, 1.0, SeededGaussian(np.random.default_rng(0)))
    x = torch.randn(2, 4, 10, generator=generator)
    g = torch.randn(2, 4, 5, generator=generator)
    fast = trainer.row_gradients(x, g)
    for s in range(2):
        for b in range(4):
            net.zero_grad()
            (net(x)[s, b] * g[s, b]).sum().backward()
            loop = torch.cat([p.grad[s].reshape(-1) for p in net.parameters()])
            torch.testing.assert_close(fast[s, b], loop, rtol=1e-5, atol=1e-6)


def test_a_network_outside_the_taped_layers_is_refused():
    from securefed.rl.fedslate import taped, taped_row_gradients
    from securefed.rl.slateq import EnsembleMLP

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = EnsembleMLP(1, [3, 2])
            self.gain = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            return self.gain * self.mlp(x)

    net, tape = Scaled(), []
    with taped(net, tape):
        out = net(torch.randn(1, 4, 3))
    with pytest.raises(ValueError, match=r"'gain'.*no taped"):
        taped_row_gradients(out.sum(), tape, [net], 4)
    assert "forward" not in vars(net.mlp)  # the tape is gone after the block
