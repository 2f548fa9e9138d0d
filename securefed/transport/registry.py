"""Transports by name: the one place where a transport is built from a name or a spec string.

The command line, the benchmarks, the Flower apps and the RL runners all build their transports
here, and a new transport registers here once (:func:`register_transport`)::

    from securefed.transport import build_transport

    transport = build_transport("secagg+dp:noise_multiplier=1.0,dp.clip=0.5", n_clients=943)
    transport = build_transport("ckks", n_clients=943, total_rounds=500)
    transport = build_transport("dp", {"epsilon": 4.0}, total_rounds=100, sample_rate=1.0)

Spec strings: ``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE``. Values read as ``none``, ``true`` /
``false``, integers (also ``2**20``), floats, else strings. A key is an option of one of the
transport's option groups (``secagg``, ``ckks``, ``dp``), written ``group.field`` or just
``field`` where only one group has it (``secagg+dp`` has two ``clip`` options: ``secagg.clip``
and ``dp.clip``). An unknown name, an unknown option, or an option of a group the transport does
not have is refused with a ``ValueError`` that lists what exists.

Names (:func:`available_transports` says which can be built here and why not):

=============  =================================================================================
plaintext      no protection: the reference every private transport is measured against
secagg         secure aggregation (SecAgg+ masks): the server learns the sum only
ckks           CKKS encryption (TenSEAL; extra ``he``): the server adds ciphertexts
dp             central DP (extra ``dp``): clipped updates in the clear, noise at the server
dp-local       local DP: every client noises its own clipped update
secagg+dp      distributed DP: clients add 1/n of the noise variance, under secure aggregation
ckks+dp        distributed DP under CKKS encryption (extras ``he`` and ``dp``; not on Flower)
=============  =================================================================================

Options per group (frozen dataclasses, validated): :class:`SecAggOptions`, :class:`CKKSOptions`,
:class:`DPOptions`. Their defaults are the ones every recorded figure was made with (64-bit ring,
clip 2^20 and scale 2^20 for secure aggregation, ``expected_dropout`` the run's dropout; CKKS
sized for ``max(1024, n_clients)`` clients; DP clip 1.0, noise calibrated by
:func:`~securefed.privacy.calibration.noise_for_target` when an epsilon target is given).

Every DP transport built here carries a :class:`~securefed.privacy.ledger.PrivacyLedger`: the
one passed as ``ledger`` (a warm start shares its run's), else a fresh one whose budget is
``(epsilon * 1.0001, delta)`` when an epsilon target is given (the slack absorbs the
calibration's rounding, so that the calibrated run itself fits) and unbounded otherwise.

This module imports nothing heavy (no tenseal, opacus, torch or scipy): the command line imports
it to build its parser. Each transport's module is imported when it is built.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from securefed.errors import TransportUnavailable
from securefed.transport.capabilities import DP_PLACEMENTS
from securefed.views import NO_PAYLOADS, RoundSelection

if TYPE_CHECKING:
    from securefed.privacy.ledger import PrivacyLedger
    from securefed.transport.base import Transport
    from securefed.transport.ckks import CKKSConfig
    from securefed.transport.secagg import SecAggConfig

BUDGET_SLACK = 1.0001
"""An epsilon target's budget is ``epsilon * BUDGET_SLACK`` (see the module docstring)."""
DEFAULT_CKKS_CLIENTS = 1024
KEY_MODELS = ("shared", "committee")


# ----------------------------------------------------------------------------- typed options
def _coerce(owner: str, name: str, value: object, hint: object) -> object:
    """``value`` as the type ``hint`` of field ``name`` (int, float, bool, str, optional)."""
    kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    optional = type(None) in kinds
    kind = next(k for k in kinds if k is not type(None))
    number = not isinstance(value, bool)
    if value is None and optional:
        return None
    if int in kinds and float in kinds and number and isinstance(value, numbers.Real):
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and number and isinstance(value, numbers.Integral):
        return int(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is float and number and isinstance(value, numbers.Real):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    expected = kind.__name__ + (" or None" if optional else "")
    raise ValueError(f"{owner} option {name!r} must be {expected}, got {value!r}")


def _typed(options: object) -> None:
    """Coerce every field of an options dataclass to its annotated type (or refuse it)."""
    hints = typing.get_type_hints(type(options))
    owner = type(options).__name__
    for item in fields(options):
        value = _coerce(owner, item.name, getattr(options, item.name), hints[item.name])
        object.__setattr__(options, item.name, value)


def _finite_positive(owner: str, name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{owner} option {name!r} must be finite and > 0, got {value!r}")


@dataclass(frozen=True)
class SecAggOptions:
    """Options of secure aggregation (``secagg``, ``secagg+dp``): ``SecAggConfig``'s fields.

    The defaults are sized for FedMF blocks (gradients, counts and statistics rows): a 64-bit
    ring, values within +-2^20 (FedRec+'s squared-gradient statistics reach about 4e4 on
    ML-100K and 6.9e4 = 2^16.1 in ml-latest-small's first rounds; a value outside is refused,
    ``out_of_range``) and scaled by 2^20, so the sum of n clients cannot wrap while
    ``n * 2 * 2^20 * 2^20 < 2^64`` (n < 2^23), and the recovered sum is within ``n / 2^20`` of
    the true one (about 1e-3 for 943 clients). The clip was 2^12 until the encoder stopped
    clipping silently: FedRec+'s statistics rows were clipped then, in a run's first rounds.
    The scale stays fixed here, with room for the range check of the decoded sum;
    ``scale=none`` takes secure aggregation's automatic scale instead (the largest power of two
    at which the round's clients cannot wrap the ring: 2^33 for 943 clients at these bits and
    clip, docs/secagg.md).

    Attributes:
        bits, scale, clip, neighbours, threshold, prg, aead, failure_target, out_of_range: as
            :class:`~securefed.transport.secagg.SecAggConfig` (validated by it; ``scale`` None
            is automatic per round).
        expected_dropout: the dropout the automatic neighbourhood size plans for (``None``: the
            run's dropout).
        remote_clients: the clients run elsewhere (the server of ``securefed.flower``).
        server: the threat model, ``malicious`` (default) or ``honest_but_curious``
            (:attr:`~securefed.transport.secagg.SecAggConfig.server`; ``securefed.flower``
            carries only the latter and says so).
        auth: the malicious variant's authentication, ``signatures`` (default: Ed25519,
            resists key-compromise impersonation) or ``macs`` (opt-in, not KCI-resistant;
            :attr:`~securefed.transport.secagg.SecAggConfig.auth`).
        keep_masked: in the rounds the view keeps, keep each client's masked integers too
            (by default their SHA-256 only: :class:`~securefed.transport.secagg.SecAggTransport`).
    """

    bits: int = 64
    scale: float | None = 2.0**20
    clip: float = 2.0**20
    neighbours: int | None = None
    threshold: int | None = None
    prg: str = "aes-256-ctr"
    aead: str = "aes-256-gcm"
    expected_dropout: float | None = None
    failure_target: float = 1e-3
    out_of_range: str = "refuse"
    remote_clients: bool = False
    server: str = "malicious"
    auth: str = "signatures"
    keep_masked: bool = False

    def __post_init__(self) -> None:
        _typed(self)
        self.config(0.0)  # SecAggConfig validates the protocol's parameters

    def config(self, dropout: float) -> SecAggConfig:
        """The protocol's configuration for a run whose clients drop at rate ``dropout``."""
        from securefed.transport.secagg import SecAggConfig

        return SecAggConfig(
            bits=self.bits,
            scale=self.scale,
            clip=self.clip,
            neighbours=self.neighbours,
            threshold=self.threshold,
            prg=self.prg,
            aead=self.aead,
            expected_dropout=dropout if self.expected_dropout is None else self.expected_dropout,
            failure_target=self.failure_target,
            out_of_range=self.out_of_range,
            server=self.server,
            auth=self.auth,
        )


@dataclass(frozen=True)
class CKKSOptions:
    """Options of CKKS aggregation (``ckks``, ``ckks+dp``).

    The defaults fit FedMF blocks on MovieLens 100K: values up to 2^16 (FedRec+'s squared-gradient
    statistics reach about 4e4) from up to ``max(1024, n_clients)`` clients; with 1024 clients
    that leaves a 32-bit scale in a 60-bit decryption prime at degree 8192 (errors about 2e-6 per
    client and value).

    Attributes:
        key_model: ``"shared"`` (Chai et al.: every user holds the secret key) or
            ``"committee"`` (clients hold the public context; key holders decrypt).
        max_clients: most clients per round (``None``: ``max(1024, n_clients)``).
        value_bound, poly_modulus_degree, scale_bits, keep_ciphertext_bytes: as
            :class:`~securefed.transport.ckks.CKKSConfig` (validated by it at build).
        flood_std, flood_step: the key holder's flooding noise and rounding (``None``:
            :class:`~securefed.crypto.ckks.Flooding`'s defaults: the std is then the floor for
            the parameters' decryption-error bound; a std below it is refused at build).
        flood_security_bits: the flooding's level (``None``: 40; see
            :func:`~securefed.crypto.ckks.flooding_floor`).
        secret_context: path of a secret-context file (``securefed.flower.ckks.provision_keys``)
            to use instead of fresh keys.
        public_context: path of the server's public-context file: the transport then holds no
            secret key (the server of a federation whose nodes encrypt and decrypt).
    """

    key_model: str = "shared"
    max_clients: int | None = None
    value_bound: float = 65536.0
    poly_modulus_degree: int | None = None
    scale_bits: int | None = None
    flood_std: float | None = None
    flood_step: float | None = None
    flood_security_bits: float | None = None
    keep_ciphertext_bytes: bool = False
    secret_context: str = ""
    public_context: str = ""

    def __post_init__(self) -> None:
        _typed(self)
        owner = type(self).__name__
        if self.key_model not in KEY_MODELS:
            raise ValueError(
                f"{owner} key_model must be one of {KEY_MODELS}, got {self.key_model!r}"
            )
        for name in ("max_clients", "poly_modulus_degree", "scale_bits"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{owner} option {name!r} must be >= 1 or None, got {value}")
        _finite_positive(owner, "value_bound", self.value_bound)
        for name in ("flood_std", "flood_step"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{owner} option {name!r} must be finite and >= 0, got {value!r}")
        if self.flood_std is not None and self.flood_std == 0:
            raise ValueError(
                f"{owner} option 'flood_std' = 0 disables the flooding of CKKS decryptions, which "
                "then reveal the secret key (Li and Micciancio 2021); leave it unset for the floor"
            )
        bits = self.flood_security_bits
        if bits is not None and not (math.isfinite(bits) and bits <= 128):
            raise ValueError(
                f"{owner} option 'flood_security_bits' must be a number <= 128, got {bits!r}"
            )  # the floor (MIN_FLOODING_SECURITY_BITS) is the Flooding's own, refused at build
        if self.secret_context and self.public_context:
            raise ValueError(
                "give CKKS either secret_context (the key holders' file) or public_context (the "
                "server's file), not both"
            )

    def config(self, n_clients: int | None) -> CKKSConfig:
        """The transport's configuration for a run of ``n_clients`` (validated by CKKSConfig)."""
        from securefed.crypto.ckks import Flooding
        from securefed.transport.ckks import CKKSConfig

        flooding = Flooding()
        if self.flood_std is not None:
            flooding = replace(flooding, std=self.flood_std)
        if self.flood_step is not None:
            flooding = replace(flooding, step=self.flood_step)
        if self.flood_security_bits is not None:
            flooding = replace(flooding, security_bits=self.flood_security_bits)
        max_clients = (
            max(DEFAULT_CKKS_CLIENTS, n_clients or 0)
            if self.max_clients is None
            else self.max_clients
        )
        return CKKSConfig(
            key_model=self.key_model,
            max_clients=max_clients,
            value_bound=self.value_bound,
            poly_modulus_degree=self.poly_modulus_degree,
            scale_bits=self.scale_bits,
            flooding=flooding,
            keep_ciphertext_bytes=self.keep_ciphertext_bytes,
        )


@dataclass(frozen=True)
class DPOptions:
    """Options of client-level DP (``dp``, ``dp-local``, ``secagg+dp``, ``ckks+dp``).

    Attributes:
        clip: L2 bound on each client's whole update.
        noise_multiplier: ``sigma`` (noise std on the sum over ``clip``); ``None``: calibrated to
            ``epsilon`` over the run's rounds at its sample rate.
        epsilon: the run's target epsilon (also the ledger's budget, times ``BUDGET_SLACK``).
        delta: the delta of ``epsilon``.
        placement: ``"central"``, ``"local"`` or ``"distributed"`` (``None``: the name's:
            ``dp`` central, ``dp-local`` local, ``secagg+dp`` and ``ckks+dp`` distributed).
        secure: cryptographic noise only (a seeded run is refused).
        mechanism: ``"gaussian"`` (float noise; under ``secagg+dp`` inexact after the rounding
            and the wrap, which the audit flags), ``"discrete_gaussian"`` or ``"skellam"``
            (integer noise summed exactly under secure aggregation, ``secagg+dp`` only: its
            secure aggregation then runs a 32-bit ring at scale 1, and ``epsilon`` is met by
            the mechanism's own accountant at the first round, :mod:`securefed.transport.ddp`).
            ``None`` (the default): the transport's own (:func:`default_mechanism`):
            ``"discrete_gaussian"`` for ``secagg+dp`` at the distributed placement,
            ``"gaussian"`` for ``dp`` and ``dp-local``; ``ckks+dp`` has none and refuses to
            guess (set ``mechanism=gaussian``). Over remote (Flower) clients the nodes encode
            the integer mechanisms themselves (``securefed.flower.dp``).
        modulus_bits, wrap_target, min_contributors: the integer mechanisms' modulus bits,
            wrap bound and minimum of contributors (``None``: every client asked).
        colluders: clients assumed to collude with the server under the distributed placement
            (a count, or a fraction in ``[0, 1)`` of a round's clients; default ``0``): the
            epsilon against the server counts the honest clients' noise only, and an integer
            mechanism's calibration meets ``epsilon`` against the server with them.
        correlation: noise correlated across rounds (central ``dp`` only,
            :mod:`securefed.transport.correlated`): ``"independent"`` (DP-FedAvg's i.i.d. noise),
            ``"tree"`` (DP-FTRL tree aggregation, one tree per pass over the groups) or
            ``"banded"`` (banded matrix mechanism); ``None`` (the default): the plain
            ``DPTransport``, accounted by sampling rate.
        groups: the cyclic schedule of ``correlation`` (``ClientSampling('cyclic', groups=b)``).
        bands: the banded strategy's bands (default ``groups``).
        restart: the tree's rounds between restarts (default ``groups``, one tree per pass; the
            run's rounds for a single tree).

    Raises:
        ValueError: neither ``epsilon`` nor ``noise_multiplier`` given, or a value out of range.
    """

    clip: float = 1.0
    noise_multiplier: float | None = None
    epsilon: float | None = None
    delta: float = 1e-5
    placement: str | None = None
    secure: bool = False
    mechanism: str | None = None
    modulus_bits: int = 20
    wrap_target: float = 1e-6
    min_contributors: int | None = None
    colluders: int | float = 0
    correlation: str | None = None
    groups: int | None = None
    bands: int | None = None
    restart: int | None = None

    def __post_init__(self) -> None:
        _typed(self)
        owner = type(self).__name__
        self._check_correlation(owner)
        from securefed.transport.ddp import MECHANISMS
        from securefed.transport.dp import check_colluders

        check_colluders(self.colluders)

        if self.mechanism not in (None, *MECHANISMS):
            raise ValueError(
                f"{owner} mechanism must be one of {MECHANISMS}, got {self.mechanism!r}"
            )
        for name in ("clip", "noise_multiplier", "epsilon"):
            _finite_positive(owner, name, getattr(self, name))
        if not 0 < self.delta < 1:
            raise ValueError(f"{owner} option 'delta' must lie in (0, 1), got {self.delta!r}")
        if self.placement not in (None, *DP_PLACEMENTS):
            raise ValueError(
                f"{owner} placement must be one of {DP_PLACEMENTS}, got {self.placement!r}"
            )
        if self.noise_multiplier is None and self.epsilon is None:
            raise ValueError(
                "a DP transport needs epsilon (a target for the whole run, --epsilon) or "
                "noise_multiplier (--noise-multiplier)"
            )

    def _check_correlation(self, owner: str) -> None:
        from securefed.privacy.correlated import CORRELATIONS

        if self.correlation is None:
            if self.groups is not None or self.bands is not None or self.restart is not None:
                raise ValueError(
                    f"{owner} options 'groups', 'bands' and 'restart' belong to correlated "
                    "noise: set "
                    "correlation (independent, tree or banded) or leave them unset"
                )
            return
        if self.correlation not in CORRELATIONS:
            raise ValueError(
                f"{owner} correlation must be one of {CORRELATIONS}, got {self.correlation!r}"
            )
        if self.groups is None or self.groups < 1:
            raise ValueError(
                f"{owner} correlation {self.correlation!r} needs groups >= 1 (the cyclic "
                "schedule its sensitivity is computed for)"
            )
        if self.mechanism not in (None, "gaussian") or self.colluders or self.min_contributors:
            raise ValueError(
                f"{owner} correlation {self.correlation!r} is central Gaussian noise: mechanism, "
                "colluders and min_contributors belong to the distributed placement"
            )

    def resolved_noise(self, sample_rate: float, total_rounds: int | None) -> float:
        """The noise multiplier: given, or calibrated to ``epsilon`` over the run's rounds."""
        if self.noise_multiplier is not None:
            return self.noise_multiplier
        from securefed.privacy.calibration import noise_for_target

        return noise_for_target(self.epsilon, self.delta, sample_rate, total_rounds or 1)

    def budget(self) -> tuple[float, float] | None:
        """The ledger's budget: ``(epsilon * BUDGET_SLACK, delta)``, or none without a target."""
        return None if self.epsilon is None else (self.epsilon * BUDGET_SLACK, self.delta)


OPTION_GROUPS: dict[str, type] = {"secagg": SecAggOptions, "ckks": CKKSOptions, "dp": DPOptions}
"""Option groups by name: the dataclass of each (a transport takes the groups it names)."""


# ----------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class BuildContext:
    """What a transport is built for: the run's facts, as every builder receives them.

    Attributes:
        keep_payloads: rounds whose per-client payloads the view keeps.
        total_rounds: the run's rounds (``RoundSelection(last=k)``; DP calibration).
        n_clients: clients of the run (CKKS sizing).
        dropout: fraction of a round's clients expected to drop (secure aggregation's graph).
        sample_rate: the clients' sampling rate per round (DP accounting and calibration).
        ledger: the privacy ledger a DP transport charges (``None``: a fresh one).
    """

    keep_payloads: RoundSelection = NO_PAYLOADS
    total_rounds: int | None = None
    n_clients: int | None = None
    dropout: float = 0.0
    sample_rate: float = 1.0
    ledger: PrivacyLedger | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.keep_payloads, RoundSelection):
            raise ValueError(f"keep_payloads must be a RoundSelection, got {self.keep_payloads!r}")
        if self.total_rounds is not None and self.total_rounds < 0:
            raise ValueError(f"total_rounds must be >= 0 or None, got {self.total_rounds}")
        if self.n_clients is not None and self.n_clients < 1:
            raise ValueError(f"n_clients must be >= 1 or None, got {self.n_clients}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must lie in (0, 1], got {self.sample_rate!r}")


Builder = Callable[[Mapping[str, object], BuildContext], "Transport"]
"""Builds a transport from its resolved option groups and the run's :class:`BuildContext`."""


@dataclass(frozen=True)
class _Entry:
    name: str
    summary: str
    groups: tuple[str, ...]
    build: Builder
    extras: tuple[tuple[str, str], ...]  # (module, the securefed extra that installs it)


_ENTRIES: dict[str, _Entry] = {}
_REFUSED: dict[str, str] = {
    "secagg+ckks": "CKKS already hides every update and the sum from the server; securefed does "
    "not mask ciphertexts. Use 'ckks' or 'secagg'",
    "ckks+secagg": "CKKS already hides every update and the sum from the server; securefed does "
    "not mask ciphertexts. Use 'ckks' or 'secagg'",
    "dp+secagg": "DP wraps the transport that carries the updates: write 'secagg+dp'",
    "dp+ckks": "DP wraps the transport that carries the updates: write 'ckks+dp'",
    "plaintext+dp": "write 'dp' (central noise) or 'dp-local' (each client noises its update)",
    "dp+dp": "DP is applied once: write 'dp', 'dp-local', 'secagg+dp' or 'ckks+dp'",
}
_NAME = re.compile(r"[a-z][a-z0-9_-]*(\+[a-z][a-z0-9_-]*)*")


def register_transport(
    name: str,
    build: Builder,
    *,
    summary: str,
    groups: tuple[str, ...] = (),
    extras: tuple[tuple[str, str], ...] = (),
) -> None:
    """Make ``name`` buildable by :func:`build_transport` (the one place a transport registers).

    Args:
        name: lower-case, ``+`` between composed parts (e.g. ``"secagg+dp"``).
        build: ``build(options, context)``: ``options`` maps each of ``groups`` to its resolved
            options dataclass; ``context`` is the run's :class:`BuildContext`.
        summary: one line for :func:`available_transports`.
        groups: the option groups it takes (keys of :data:`OPTION_GROUPS`).
        extras: ``(module, extra)`` pairs: the optional packages it needs and the securefed
            extra that installs each (``("tenseal", "he")``).

    Raises:
        ValueError: a malformed or taken name, or an unknown option group.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"transport name {name!r} must be lower-case words joined by '+'")
    if name in _ENTRIES or name in _REFUSED:
        raise ValueError(f"transport {name!r} is already registered")
    unknown = [group for group in groups if group not in OPTION_GROUPS]
    if unknown:
        raise ValueError(f"unknown option group(s) {unknown}; known: {', '.join(OPTION_GROUPS)}")
    _ENTRIES[name] = _Entry(name, summary, tuple(groups), build, tuple(extras))


def transport_names() -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(_ENTRIES)


def _entry(name: str) -> _Entry:
    if name in _REFUSED:
        raise ValueError(f"transport {name!r} is not offered: {_REFUSED[name]}")
    if name not in _ENTRIES:
        raise ValueError(f"unknown transport {name!r}; known: {', '.join(_ENTRIES)}")
    return _ENTRIES[name]


def option_groups(name: str) -> tuple[str, ...]:
    """The option groups the transport ``name`` takes (e.g. ``("secagg", "dp")``)."""
    return _entry(name).groups


def option_names(name: str) -> tuple[str, ...]:
    """Every option of transport ``name``, as ``group.field``."""
    return tuple(
        f"{group}.{item.name}"
        for group in option_groups(name)
        for item in fields(OPTION_GROUPS[group])
    )


@dataclass(frozen=True)
class TransportAvailability:
    """Whether a registered transport can be built here.

    Attributes:
        name: the transport's name.
        summary: what it is, in one line.
        available: it can be built here.
        reason: why not (the missing package and the extra to install), else ``None``.
    """

    name: str
    summary: str
    available: bool
    reason: str | None = None


def _module_present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        return False


def _unavailable_reason(entry: _Entry, module: str, extra: str) -> str:
    return (
        f"transport {entry.name!r} needs the {module!r} package, which is not installed: "
        f"pip install 'securefed[{extra}]'"
    )


def _missing(entry: _Entry) -> str | None:
    for module, extra in entry.extras:
        if not _module_present(module):
            return _unavailable_reason(entry, module, extra)
    return None


def available_transports() -> tuple[TransportAvailability, ...]:
    """Every registered transport, with whether it can be built here and why not.

    Looks for the optional packages without importing them (cheap).
    """
    rows = []
    for entry in _ENTRIES.values():
        reason = _missing(entry)
        rows.append(TransportAvailability(entry.name, entry.summary, reason is None, reason))
    return tuple(rows)


# ----------------------------------------------------------------------------- spec strings
@dataclass(frozen=True)
class TransportSpec:
    """A parsed spec string: the transport's name and the options written after it.

    Attributes:
        name: a registered transport name.
        options: option names (``field`` or ``group.field``) and their values.
    """

    name: str
    options: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _entry(self.name)  # refuses unknown names, listing the known ones
        object.__setattr__(self, "options", types.MappingProxyType(dict(self.options)))

    def __str__(self) -> str:
        if not self.options:
            return self.name
        written = ",".join(f"{key}={_write_value(value)}" for key, value in self.options.items())
        return f"{self.name}:{written}"


def _parse_value(text: str) -> object:
    lowered = text.lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if match := re.fullmatch(r"(\d+)\*\*(\d+)", text):
        return int(match.group(1)) ** int(match.group(2))
    try:
        return float(text)
    except ValueError:
        return text


def _write_value(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def parse_transport_spec(text: str) -> TransportSpec:
    """``"secagg+dp:noise_multiplier=1,dp.clip=0.5"`` -> ``TransportSpec("secagg+dp", {...})``.

    Raises:
        ValueError: an empty spec, an unknown name (listing the known ones), or an option that is
            not ``KEY=VALUE`` or is given twice.
    """
    if not isinstance(text, str):
        raise ValueError(f"a transport spec is a string, got {text!r}")
    name, colon, rest = text.strip().partition(":")
    name = name.strip().lower()
    if not name:
        raise ValueError(f"empty transport spec {text!r}; known: {', '.join(_ENTRIES)}")
    options: dict[str, object] = {}
    if colon:
        if not rest.strip():
            raise ValueError(f"transport spec {text!r} has ':' but no KEY=VALUE options")
        for item in rest.split(","):
            key, equals, value = item.partition("=")
            key = key.strip()
            if not equals or not key:
                raise ValueError(f"transport spec {text!r}: {item!r} is not KEY=VALUE")
            if key in options:
                raise ValueError(f"transport spec {text!r} gives {key!r} twice")
            options[key] = _parse_value(value.strip())
    return TransportSpec(name, options)


def resolve_options(
    spec: str | TransportSpec, given: Mapping[str, object] | None = None
) -> dict[str, object]:
    """The option groups of the transport ``spec`` names, from its options and ``given``.

    Args:
        spec: a name or spec string, or a parsed :class:`TransportSpec`.
        given: more option values by ``field`` or ``group.field``; a group's name may also map
            to a whole options instance (``{"secagg": SecAggOptions(remote_clients=True)}``),
            which the field values then override.

    Returns:
        Each of the transport's groups mapped to its validated options dataclass.

    Raises:
        ValueError: an option the transport does not take (listing the ones it takes), an
            ambiguous short name, a field given twice with different values, a value of the
            wrong type or range.
    """
    parsed = spec if isinstance(spec, TransportSpec) else parse_transport_spec(spec)
    name = parsed.name
    entry = _entry(name)
    given = _merge(parsed.options, given)
    valid = option_names(name)
    listing = ", ".join(valid) if valid else "none"
    starts: dict[str, object] = {}
    values: dict[str, dict[str, object]] = {group: {} for group in entry.groups}
    for key, value in given.items():
        if key in entry.groups:
            if not isinstance(value, OPTION_GROUPS[key]):
                raise ValueError(
                    f"option group {key!r} of transport {name!r} takes a "
                    f"{OPTION_GROUPS[key].__name__}, got {type(value).__name__}"
                )
            starts[key] = value
            continue
        group, dot, field_name = key.partition(".")
        if dot:
            owners = [group] if group in entry.groups and f"{group}.{field_name}" in valid else []
        else:
            field_name = key
            owners = [g for g in entry.groups if f"{g}.{key}" in valid]
        if not owners:
            raise ValueError(
                f"transport {name!r} takes no option {key!r}; its options: {listing} (the group "
                "prefix may be left out where only one group has the field)"
            )
        if len(owners) > 1:
            raise ValueError(
                f"option {key!r} of transport {name!r} is ambiguous: write "
                + " or ".join(f"{g}.{key}" for g in owners)
            )
        group_values = values[owners[0]]
        if field_name in group_values and group_values[field_name] != value:
            raise ValueError(
                f"option {owners[0]}.{field_name} of transport {name!r} is given twice with "
                f"different values ({group_values[field_name]!r}, {value!r})"
            )
        group_values[field_name] = value
    resolved = {}
    for group in entry.groups:
        start = starts.get(group)
        kind = OPTION_GROUPS[group]
        resolved[group] = replace(start, **values[group]) if start else kind(**values[group])
    return resolved


def _merge(written: Mapping[str, object], given: Mapping[str, object] | None) -> dict:
    merged = dict(written)
    for key, value in (given or {}).items():
        if key in merged and merged[key] != value:
            raise ValueError(
                f"option {key!r} is given twice with different values ({merged[key]!r} in the "
                f"spec string, {value!r} in options)"
            )
        merged[key] = value
    return merged


def build_transport(
    spec: str | TransportSpec,
    options: Mapping[str, object] | None = None,
    *,
    keep_payloads: RoundSelection = NO_PAYLOADS,
    total_rounds: int | None = None,
    n_clients: int | None = None,
    dropout: float = 0.0,
    sample_rate: float = 1.0,
    ledger: PrivacyLedger | None = None,
) -> Transport:
    """Build the transport ``spec`` names, with its options, for a run.

    Args:
        spec: a name or spec string (module docstring), or a parsed :class:`TransportSpec`.
        options: more option values (:func:`resolve_options`); one also written in the spec
            must agree with it.
        keep_payloads, total_rounds, n_clients, dropout, sample_rate: the run
            (:class:`BuildContext`).
        ledger: the ledger a DP transport charges (a warm start shares its run's); ``None``: a
            fresh one (module docstring). Refused for a transport without DP.

    Raises:
        ValueError: an unknown name or option (naming what exists), a bad value, a ledger for a
            transport that adds no noise.
        TransportUnavailable: an optional package the transport needs is missing (naming the
            extra to install).
    """
    parsed = spec if isinstance(spec, TransportSpec) else parse_transport_spec(spec)
    entry = _entry(parsed.name)
    reason = _missing(entry)
    if reason is not None:
        raise TransportUnavailable(reason)
    resolved = resolve_options(parsed, options)
    if ledger is not None and "dp" not in entry.groups:
        raise ValueError(f"transport {parsed.name!r} adds no noise: it takes no privacy ledger")
    context = BuildContext(keep_payloads, total_rounds, n_clients, dropout, sample_rate, ledger)
    try:
        return entry.build(resolved, context)
    except ModuleNotFoundError as error:
        extra = dict(entry.extras).get(error.name or "")
        if extra is None:
            raise
        raise TransportUnavailable(_unavailable_reason(entry, error.name, extra)) from error


# ----------------------------------------------------------------------------- the builders
def _plaintext(options: Mapping[str, object], run: BuildContext) -> Transport:
    from securefed.transport.plaintext import PlaintextTransport

    return PlaintextTransport(keep_payloads=run.keep_payloads, total_rounds=run.total_rounds)


def _secagg(options: Mapping[str, object], run: BuildContext) -> Transport:
    from securefed.transport.secagg import SecAggTransport

    secagg: SecAggOptions = options["secagg"]
    return SecAggTransport(
        secagg.config(run.dropout),
        keep_payloads=run.keep_payloads,
        total_rounds=run.total_rounds,
        remote_clients=secagg.remote_clients,
        keep_masked=secagg.keep_masked,
    )


def _ckks(options: Mapping[str, object], run: BuildContext) -> Transport:
    from securefed.crypto.ckks import load_public_context, load_secret_context
    from securefed.transport.ckks import CKKSTransport

    ckks: CKKSOptions = options["ckks"]
    secret = load_secret_context(ckks.secret_context) if ckks.secret_context else None
    public = load_public_context(ckks.public_context) if ckks.public_context else None
    return CKKSTransport(
        ckks.config(run.n_clients),
        secret=secret,
        public=public,
        keep_payloads=run.keep_payloads,
        total_rounds=run.total_rounds,
    )


def default_mechanism(name: str, options: Mapping[str, object], placement: str) -> str:
    """The noise mechanism of a DP transport whose options leave ``mechanism`` unset.

    ``secagg+dp`` at the distributed placement: ``"discrete_gaussian"``, the exact one (the
    float Gaussian's epsilon does not survive secure aggregation's rounding and modular sum).
    ``dp``, ``dp-local`` (whatever their placement) and any other placement: ``"gaussian"`` (no
    secure aggregation rounds their noise; ``dp:placement=distributed`` is the plaintext
    simulation, which warns).

    Raises:
        InsecureParameterError: ``ckks+dp`` (CKKS sums approximately: no integer mechanism):
            it refuses to fall back silently to the inexact float Gaussian, and names the
            option.
    """
    from securefed.errors import InsecureParameterError

    dp: DPOptions = options["dp"]
    if dp.mechanism is not None:
        return dp.mechanism
    if (dp.placement or placement) != "distributed" or name not in ("secagg+dp", "ckks+dp"):
        return "gaussian"
    if name == "ckks+dp":
        raise InsecureParameterError(
            "ckks+dp has no exact integer mechanism (CKKS sums approximately), and the float "
            "Gaussian's epsilon is not proven after its encoding: set mechanism=gaussian to run "
            "it anyway (flagged distributed-dp-inexact by the audit)"
        )
    return "discrete_gaussian"  # remote (Flower) clients encode it on their nodes too


def _with_dp(inner: Builder, placement: str, name: str) -> Builder:
    """A builder of ``DPTransport`` around what ``inner`` builds, ``placement`` by default.

    The mechanism left unset is the transport's default (:func:`default_mechanism`).
    """

    def build(options: Mapping[str, object], run: BuildContext) -> Transport:
        from dataclasses import replace

        from securefed.privacy.ledger import PrivacyLedger
        from securefed.transport.dp import DPTransport

        dp: DPOptions = options["dp"]
        if dp.correlation is not None:
            return _correlated_dp(inner, options, run, dp.placement or placement, name)
        if dp.mechanism is None:
            dp = replace(dp, mechanism=default_mechanism(name, options, placement))
            options = {**options, "dp": dp}
        ledger = run.ledger if run.ledger is not None else PrivacyLedger(budget=dp.budget())
        if dp.mechanism != "gaussian":
            return _integer_dp(options, run, ledger)
        noise_multiplier = dp.resolved_noise(run.sample_rate, run.total_rounds)
        return DPTransport(
            inner(options, run),
            clip=dp.clip,
            noise_multiplier=noise_multiplier,
            placement=dp.placement or placement,
            ledger=ledger,
            sample_rate=run.sample_rate,
            secure=dp.secure,
            delta=dp.delta,
            colluders=dp.colluders,
        )

    return build


def _correlated_dp(
    inner: Builder, options: Mapping[str, object], run: BuildContext, placement: str, name: str
) -> Transport:
    """``dp`` with ``correlation``: :class:`~securefed.transport.correlated.CorrelatedDPTransport`
    (central only; the noise calibrated over the run's rounds for its cyclic schedule).

    Raises:
        InsecureParameterError: a placement other than central.
        ValueError: a run of unknown length.
    """
    from securefed.privacy.correlated import CyclicParticipation, correlation_named
    from securefed.privacy.ledger import PrivacyLedger
    from securefed.transport.correlated import (
        CorrelatedDPTransport,
        noise_for_correlated_target,
        refuse_correlated,
    )

    dp: DPOptions = options["dp"]
    refuse_correlated(placement, name)
    if not run.total_rounds:
        raise ValueError("correlated noise is calibrated for the run's rounds: give total_rounds")
    strategy = correlation_named(
        dp.correlation, groups=dp.groups, bands=dp.bands, restart=dp.restart
    )
    noise_multiplier = dp.noise_multiplier
    if noise_multiplier is None:
        noise_multiplier = noise_for_correlated_target(
            dp.epsilon, dp.delta, strategy, CyclicParticipation(dp.groups), run.total_rounds
        )
    ledger = run.ledger if run.ledger is not None else PrivacyLedger(budget=dp.budget())
    return CorrelatedDPTransport(
        inner(options, run),
        clip=dp.clip,
        noise_multiplier=noise_multiplier,
        correlation=strategy,
        groups=dp.groups,
        total_rounds=run.total_rounds,
        ledger=ledger,
        delta=dp.delta,
        secure=dp.secure,
    )


def _integer_dp(options: Mapping[str, object], run: BuildContext, ledger) -> Transport:
    """``secagg+dp`` with an integer mechanism: secure aggregation at scale 1 in a 32-bit ring.

    The ring's clip is the most a client's integers may reach with ``max(n, 1024)`` clients in
    ``Z_{2^32}``; ``DPTransport`` checks it against the mechanism's per-client bound. With an
    epsilon target the noise is calibrated at the first round by the mechanism's accountant.
    """
    from dataclasses import replace

    from securefed.transport.secagg import SecAggTransport

    dp: DPOptions = options["dp"]
    secagg: SecAggOptions | None = options.get("secagg")
    if secagg is None:
        raise ValueError(
            f"mechanism {dp.mechanism!r} sums integers under secure aggregation: use 'secagg+dp'"
        )
    if (dp.placement or "distributed") != "distributed":
        raise ValueError(f"mechanism {dp.mechanism!r} takes the distributed placement only")
    defaults = SecAggOptions()
    chosen = {name: getattr(secagg, name) for name in ("bits", "scale", "clip", "out_of_range")}
    if chosen != {name: getattr(defaults, name) for name in chosen}:
        raise ValueError(
            f"mechanism {dp.mechanism!r} sets secure aggregation's ring itself (32 bits, scale 1, "
            f"clip from the clients): leave secagg bits, scale, clip and out_of_range at their "
            f"defaults (given {chosen}), or set mechanism=gaussian (float noise, inexact after "
            "the rounding and the wrap, flagged by the audit)"
        )
    ring_clients = max(run.n_clients or 0, 1024)
    config = replace(
        secagg.config(run.dropout), bits=32, scale=1.0, clip=float(((1 << 31) - 1) // ring_clients)
    )
    inner = SecAggTransport(
        config,
        keep_payloads=run.keep_payloads,
        total_rounds=run.total_rounds,
        remote_clients=secagg.remote_clients,
        keep_masked=secagg.keep_masked,
    )
    return integer_dp_around(inner, dp, ledger, run.sample_rate, run.total_rounds)


def integer_dp_around(
    inner: Transport,
    dp: DPOptions,
    ledger,
    sample_rate: float,
    total_rounds: int | None,
) -> Transport:
    """The integer-mechanism ``DPTransport`` of ``dp``'s options around ``inner``.

    ``secagg+dp`` builds it around its secure aggregation; a benchmark's warm start around
    plaintext, which sums the same integers exactly (a stand-in whose view is discarded,
    ``securefed.bench.experiment.warm_start_transport``). With an epsilon target the noise is
    calibrated at the first round by the mechanism's accountant.
    """
    from securefed.transport.dp import DPTransport

    placeholder = 1.0 if dp.noise_multiplier is None else dp.noise_multiplier
    return DPTransport(
        inner,
        clip=dp.clip,
        noise_multiplier=placeholder,
        placement="distributed",
        ledger=ledger,
        sample_rate=sample_rate,
        secure=dp.secure,
        delta=dp.delta,
        mechanism=dp.mechanism,
        modulus_bits=dp.modulus_bits,
        wrap_target=dp.wrap_target,
        min_contributors=dp.min_contributors,
        colluders=dp.colluders,
        target_epsilon=None if dp.noise_multiplier is not None else dp.epsilon,
        target_rounds=None if dp.noise_multiplier is not None else (total_rounds or 1),
    )


HE, DP = ("tenseal", "he"), ("dp_accounting", "dp")
register_transport("plaintext", _plaintext, summary="no protection: the reference")
register_transport(
    "secagg",
    _secagg,
    summary="secure aggregation (SecAgg+ pairwise masks): the server learns the sum only",
    groups=("secagg",),
)
register_transport(
    "ckks",
    _ckks,
    summary="CKKS encryption (TenSEAL): the server adds ciphertexts, key holders decrypt the sum",
    groups=("ckks",),
    extras=(HE,),
)
register_transport(
    "dp",
    _with_dp(_plaintext, "central", "dp"),
    summary="central DP: clipped updates in the clear, Gaussian noise added at the server",
    groups=("dp",),
    extras=(DP,),
)
register_transport(
    "dp-local",
    _with_dp(_plaintext, "local", "dp-local"),
    summary="local DP: every client adds all the noise to its clipped, densified update",
    groups=("dp",),
    extras=(DP,),
)
register_transport(
    "secagg+dp",
    _with_dp(_secagg, "distributed", "secagg+dp"),
    summary="distributed DP: each client adds 1/n of the noise variance, under secure aggregation",
    groups=("secagg", "dp"),
    extras=(DP,),
)
register_transport(
    "ckks+dp",
    _with_dp(_ckks, "distributed", "ckks+dp"),
    summary="distributed DP under CKKS: each client noises, encrypts; key holders decrypt the sum",
    groups=("ckks", "dp"),
    extras=(HE, DP),
)
