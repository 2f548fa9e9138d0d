"""Record-level DP-SGD for a client's local torch model, a thin wrapper over Opacus.

Where the local models are torch modules (FedSlate's Q-networks, FedHPD's policies), Opacus's
``PrivacyEngine`` gives record-level DP-SGD (Abadi et al., "Deep Learning with Differential
Privacy", CCS 2016): per-example gradients clipped to ``max_grad_norm``, Gaussian noise of std
``noise_multiplier * max_grad_norm`` on their sum, batches drawn by Poisson sampling at rate
``1 / len(data_loader)``. :func:`make_private` returns the wrapped objects together with a
:class:`PrivateTraining` handle whose :meth:`~PrivateTraining.ledger` and
:meth:`~PrivateTraining.report` speak the same language as :class:`PrivacyLedger` (history of
``(sigma, q, steps)``, epsilon at a delta), so record-level and client-level spending are
reported alike. Record-level DP is a guarantee about one client's *records* with respect to what
its model updates reveal; it composes with, and does not replace, client-level DP.

Randomness: in ``secure_mode`` Opacus draws noise and batches from ``torchcsprng`` (which must
be installed) and refuses a seed; otherwise the noise comes from a ``torch.Generator`` seeded
from ``seeds`` (stream ``("dpsgd",)`` unless another path is given), while Poisson batch sampling
uses torch's default generator (Opacus offers no seed for it outside secure mode).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from securefed.errors import InsecureParameterError
from securefed.privacy.ledger import PrivacyLedger, _check_accountant
from securefed.randomness import SeedTree


@dataclass(frozen=True)
class DPSGDReport:
    """What a DP-SGD run spent (JSON-ready through :meth:`to_dict`).

    Attributes:
        accountant: ``"rdp"`` or ``"prv"``.
        noise_multiplier: sigma of the optimizer.
        max_grad_norm: per-example clip norm.
        sample_rate: Poisson rate of the data loader (``1 / len(data_loader)``).
        steps: optimizer steps taken.
        epsilon: spent at ``delta``.
        delta: the delta.
        sampling: ``"poisson"`` or ``"fixed"`` (the batches as the data loader drew them).
        secure_mode: whether the noise was cryptographic.
        history: ``(sigma, q, steps)`` triples from Opacus's accountant.
    """

    accountant: str
    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    steps: int
    epsilon: float
    delta: float
    sampling: str
    secure_mode: bool
    history: tuple[tuple[float, float, int], ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["history"] = [list(h) for h in self.history]
        return out


@dataclass(eq=False)
class PrivateTraining:
    """The objects :func:`make_private` returns, plus the privacy bookkeeping.

    Attributes:
        module: the wrapped module (an Opacus ``GradSampleModule``): train it as usual.
        optimizer: the ``DPOptimizer``: clips per example, adds noise, steps the accountant.
        data_loader: the Poisson-sampling data loader.
        engine: the underlying ``opacus.PrivacyEngine``.
        noise_multiplier: sigma.
        max_grad_norm: per-example clip norm.
        sampling: ``"poisson"`` or ``"fixed"``.
        secure_mode: whether the noise is cryptographic.
    """

    module: Any
    optimizer: Any
    data_loader: Any
    engine: Any
    noise_multiplier: float
    max_grad_norm: float
    sampling: str
    secure_mode: bool

    @property
    def accountant(self) -> str:
        return self.engine.accountant.mechanism()

    @property
    def history(self) -> list[tuple[float, float, int]]:
        return [(float(s), float(q), int(n)) for s, q, n in self.engine.accountant.history]

    def epsilon(self, delta: float) -> float:
        """Epsilon spent so far at ``delta`` (through the same functions as the ledger)."""
        return self.ledger().epsilon(delta)

    def ledger(self) -> PrivacyLedger:
        """A :class:`PrivacyLedger` holding the steps taken so far (a snapshot)."""
        # Poisson batches are drawn where the model trains: whoever receives the model, the
        # server included, does not see which records took part, so the same figure holds.
        return PrivacyLedger.of_history(
            self.history, self.accountant, sampling=self.sampling, server_history=self.history
        )

    def report(self, delta: float) -> DPSGDReport:
        """The spending so far at ``delta``."""
        history = tuple(self.history)
        return DPSGDReport(
            accountant=self.accountant,
            noise_multiplier=float(self.noise_multiplier),
            max_grad_norm=float(self.max_grad_norm),
            sample_rate=max((q for _, q, _ in history), default=0.0),
            steps=sum(n for _, _, n in history),
            epsilon=self.epsilon(delta),
            delta=float(delta),
            sampling=self.sampling,
            secure_mode=self.secure_mode,
            history=history,
        )


def make_private(
    module,
    optimizer,
    data_loader,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    accountant: str = "rdp",
    secure_mode: bool = False,
    seeds: SeedTree | None = None,
    seed_path: tuple[int | str, ...] = ("dpsgd",),
    poisson_sampling: bool = True,
) -> PrivateTraining:
    """Make ``module``/``optimizer``/``data_loader`` private with Opacus's ``PrivacyEngine``.

    Args:
        module: a torch ``nn.Module`` (Opacus-compatible layers).
        optimizer: its torch optimizer.
        data_loader: a torch ``DataLoader`` over the client's records.
        noise_multiplier: sigma (> 0).
        max_grad_norm: per-example L2 clip norm (> 0).
        accountant: ``"rdp"`` (default) or ``"prv"``.
        secure_mode: cryptographic noise (needs ``torchcsprng``); refuses ``seeds`` that are
            seeded.
        seeds: where a seeded noise generator comes from (ignored in secure mode).
        seed_path: the stream of ``seeds`` to seed the noise from.
        poisson_sampling: draw batches by Poisson sampling (what the accountant assumes).

    Returns:
        A :class:`PrivateTraining` with the wrapped module, optimizer and data loader.

    Raises:
        InsecureParameterError: secure mode with a seeded ``SeedTree``.
        ValueError: a non-positive noise multiplier or clip norm, an unknown accountant.
    """
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm!r}")
    _check_accountant(accountant)
    if secure_mode and seeds is not None and not seeds.secure:
        raise InsecureParameterError(
            "secure_mode refuses a seeded SeedTree: use SeedTree.secure_mode() or no seeds"
        )
    import torch
    from opacus import PrivacyEngine

    generator = None
    if seeds is not None and not secure_mode:
        seed = int.from_bytes(seeds.key(*seed_path, nbytes=8), "little") & ((1 << 63) - 1)
        generator = torch.Generator().manual_seed(seed)
    engine = PrivacyEngine(accountant=accountant, secure_mode=secure_mode)
    private_module, private_optimizer, private_loader = engine.make_private(
        module=module,
        optimizer=optimizer,
        data_loader=data_loader,
        noise_multiplier=float(noise_multiplier),
        max_grad_norm=float(max_grad_norm),
        poisson_sampling=poisson_sampling,
        noise_generator=generator,
    )
    return PrivateTraining(
        module=private_module,
        optimizer=private_optimizer,
        data_loader=private_loader,
        engine=engine,
        noise_multiplier=float(noise_multiplier),
        max_grad_norm=float(max_grad_norm),
        sampling="poisson" if poisson_sampling else "fixed",
        secure_mode=secure_mode,
    )
