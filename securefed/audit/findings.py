"""The audit: read a run's public parameters and list what voids its privacy claims.

Each check is a small pure function ``check_*(config) -> list[Finding]`` over a flat mapping of
public parameters; a check whose keys are missing returns nothing. :func:`audit` gathers the
mapping (from a dict, a saved ServerView directory, a ``manifest.json`` or run JSON file, or a
live :class:`~securefed.views.ServerView`), runs every check and returns an
:class:`AuditReport` (the validator pattern of Opacus's ``ModuleValidator``: a list of findings,
or an exception in strict mode).

Keys read (all optional; see ``docs/privacy.md`` for the full table):

============================= ==============================================================
``protocol``, ``variant``     ``"fedmf"``; variant ``"fedmf"`` (vanilla), ``"fedrec"``,
                              ``"fedrec+"``
``transport``                 ``"plaintext"``, ``"secagg"``, ``"ckks"``, ``"dp"``,
                              compositions joined by ``+`` (``"secagg+dp"``)
``placement``/``dp_placement`` DP noise placement: ``"central"``, ``"local"``, ``"distributed"``
``upload``                    ``"part"`` (rated rows only) or ``"full"``
``virtual_ratings_on_scale``  bool (FedRec's hybrid filling)
``pseudo_items_resampled``    bool (FedRec's pseudo items drawn afresh every round)
``epsilon``, ``delta``,       privacy spent, its delta, the budget
``epsilon_budget``
``n_users``/``n_clients``     population size (``clients_per_round`` for secure aggregation)
``secagg_threshold``,         Shamir threshold t, SecAgg+ neighbour count k, expected dropout
``secagg_neighbours``,        fraction d in [0, 1), expected colluding clients c (count)
``expected_dropout``,
``expected_colluders``
``ckks_poly_modulus_degree``, CKKS parameters
``ckks_coeff_mod_bit_sizes``
``seeded``, ``secure``,       randomness (or ``seeds = {"seed": ..., "secure": ...}``);
``tests``                     ``tests = True`` accepts seeded randomness
``accountant_sampling``,      the sampling the accountant assumes vs the runtime's mode, and
``sampling``, ``sample_rate`` the rate charged
``aggregation``               FedMF's server denominator: ``"mean"``, ``"sum"``, ``"fixed"``
``uploads_reveal``            what one client's upload shows a reader of it in the clear
                              (:data:`REVEALS`; written by :func:`declare_uploads`)
``epsilon_server``            epsilon against the server itself (it picks and sees the
                              round's clients: no sampling amplification)
``flood_std``,                CKKS noise flooding on decryption and the decryption-error
``ckks_decryption_error``     bound it must exceed
============================= ==============================================================

The audit fails closed: every key it is given must be one it knows (:data:`KNOWN_KEYS`: the
keys above and every public parameter securefed's transports, recommenders and command line
record); an unknown key (a misspelling, or a field of a newer format) is an error naming it, and
a caller's own informational keys are passed as ``audit(..., extra_keys=...)``. A transport that
shows the server each update in the clear, carrying an algorithm that has not declared what its
uploads reveal, is an error too: nothing vouches for it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from securefed.crypto.flooding import MIN_FLOODING_SECURITY_BITS, flooding_floor
from securefed.errors import SecurefedError, ViewFormatError
from securefed.integrity import DIGEST_FIELD, verify

Severity = Literal["error", "warning", "info"]
OBSERVERS = ("released_model", "server")
"""Whom an epsilon holds against (the names of :data:`securefed.privacy.ledger.OBSERVERS`)."""
SEVERITIES = ("error", "warning", "info")

# Largest total coefficient-modulus bits at 128-bit classical security, by polynomial degree
# (the HomomorphicEncryption.org standard table that Microsoft SEAL enforces; specs/transport.md).
CKKS_MAX_COEFF_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}

# Base transports under which the server reads every client's update in the clear.
CLEAR_TRANSPORTS = ("plaintext", "dp")

REVEALS: dict[str, tuple[Severity, str]] = {
    "ratings": ("error", "the user's rating values themselves"),
    "per-item-gradients": (
        "error",
        "per-item gradients, from which the server solves for the ratings (Chai et al. 2020)",
    ),
    "rated-items": ("error", "which items the user interacted with"),
    "model-deltas": (
        "warning",
        "a model update of the client's own, open to gradient inversion and membership "
        "inference (Zhu et al. 2019, 'Deep Leakage from Gradients')",
    ),
    "policy-outputs": (
        "warning",
        "the client's policy outputs on public states (its recent return can be inferred)",
    ),
    "q-values": ("warning", "the client's Q-values (the user's hidden state can be inferred)"),
}
"""What an upload can show whoever reads it in the clear, with the severity of showing it."""

# The protocols whose leaks the audit knows itself (their own checks below).
KNOWN_PROTOCOLS = ("fedmf",)
FEDMF_VARIANTS = ("fedmf", "fedrec", "fedrec+")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Keys the checks read.
AUDITED_KEYS = _words(
    "protocol variant transport placement dp_placement upload virtual_ratings_on_scale "
    "pseudo_items_resampled epsilon delta epsilon_budget epsilon_server n_users n_clients "
    "clients_per_round secagg_threshold secagg_neighbours threshold neighbours secagg_t "
    "secagg_k secagg_n secagg_secure_randomness ckks_secure_randomness secagg_server server "
    "expected_dropout "
    "expected_colluders "
    "ckks_poly_modulus_degree ckks_coeff_mod_bit_sizes flood_std ckks_decryption_error "
    "ckks_flooding_security_bits ckks_flooding_unsafe_for_tests "
    "seeded secure seed seeds tests accountant_sampling sampling sample_rate dp_sample_rate "
    "aggregation uploads_reveal epsilon_budget_against randomness dp_mechanism ddp_wrap_bound "
    "dp_colluders"
)
# Keys that securefed's components record and the checks need not read (parameters of the
# mechanisms, the recommenders' hyper-parameters, run results and bookkeeping).
RECORDED_KEYS = _words(
    # secure aggregation
    "bits scale clip failure_target prg aead key_agreement kdf shamir_field secagg_graph_seed "
    "graph_epoch secagg_graph_round secagg_graph_redrawn "
    "secagg_parties secagg_users secagg_party_members secagg_party_learns "
    "secagg_scale secagg_error_bound_sum secagg_error_bound_mean out_of_range "
    "secagg_values_clipped signatures auth keep_masked view_keeps_masked "
    # CKKS
    "ckks_scheme ckks_total_coeff_bits ckks_max_coeff_bits_128 ckks_scale_bits ckks_slots "
    "ckks_levels ckks_data_primes ckks_encryption ckks_key_model key_model max_clients value_bound "
    "keep_ciphertext_bytes round_step key_id server_context_bytes server_context_sha256 "
    "ckks_values_per_client ckks_ciphertexts ckks_decryptor ckks_committee_bytes "
    "ckks_folded_into_state block_rows block_columns "
    # DP
    "accountant dp_clip dp_noise dp_noise_multiplier dp_sigma dp_sigma_effective "
    "inner_transport privacy_ledger noise_multiplier dp_modulus_bits dp_min_contributors "
    "dp_contributors ddp_bits ddp_gamma ddp_dim ddp_padded_dim ddp_chunks ddp_beta ddp_noise "
    "ddp_l2_units ddp_l1_units ddp_min_contributors dp_colluders_assumed dp_sigma_server "
    # FedMF and the command line's run record
    "dim lr server_lr reg_user reg_item row_reg_item init_std local_steps user_step "
    "gradient_user_vector offset rating_scale chunk_ratings count_cap min_item_weight "
    "filling_regularisation resample_pseudo rho tau virtual_on_scale virtual_rating "
    "virtual_rounding warmup_rounds warm_start_rounds weighting expected_clients server_state "
    "data n_items n_train n_test rounds resumed_from rmse train_rmse mae seconds bytes_up "
    "bytes_down bytes_up_per_client bytes_down_per_client view dropout"
)
KNOWN_KEYS = AUDITED_KEYS | RECORDED_KEYS
KNOWN_PREFIXES = ("hr@", "ndcg@", "precision@", "recall@")
"""Every key the audit accepts (anything else is an ``unknown-key`` error)."""


PROTOCOL_KEYS_GROUP = "securefed.audit_keys"
"""Entry-point group of the keys a protocol above this layer records (``securefed.recsys``'s
FedMF: ``fedmf = "securefed.recsys.fedmf:audit_keys"``): each names a function returning them."""
_REGISTERED: dict[str, frozenset[str]] = {}


def register_known_keys(owner: str, keys: Iterable[str]) -> None:
    """Declare the public keys ``owner`` (a protocol's name) records, for :func:`check_keys`.

    A protocol above the privacy layer (which the audit may not import) registers its keys,
    derived from its configuration's dataclass, when it is imported, and through the
    :data:`PROTOCOL_KEYS_GROUP` entry point for an audit in a process that never imported it.
    """
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"owner must be a non-empty name, got {owner!r}")
    names = frozenset(keys)
    if not all(isinstance(k, str) and k for k in names):
        raise ValueError(f"keys of {owner!r} must be non-empty strings")
    _REGISTERED[owner] = names


def known_keys() -> frozenset[str]:
    """:data:`KNOWN_KEYS`, the keys registered, and those of the installed entry points."""
    from importlib.metadata import entry_points

    for point in entry_points(group=PROTOCOL_KEYS_GROUP):
        if point.name not in _REGISTERED:
            register_known_keys(point.name, point.load()())
    return KNOWN_KEYS.union(*_REGISTERED.values())


@dataclass(frozen=True)
class Finding:
    """One problem (or note) found by the audit.

    Attributes:
        severity: ``"error"`` (the privacy claim does not hold), ``"warning"`` (it may not),
            ``"info"``.
        code: stable identifier, e.g. ``"fedmf-gradient-leak"``.
        cause: a sentence naming the cause and the fix.
    """

    severity: Severity
    code: str
    cause: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if not self.code:
            raise ValueError("a finding needs a code")

    def __str__(self) -> str:
        return f"[{self.severity}] {self.code}: {self.cause}"


class AuditFailed(SecurefedError, AssertionError):
    """The audit found errors (or an epsilon over the asserted maximum).

    Attributes:
        findings: the findings that made it fail.
    """

    def __init__(self, message: str, findings: Iterable[Finding] = ()) -> None:
        super().__init__(message)
        self.findings = list(findings)


@dataclass(frozen=True)
class AuditReport:
    """What :func:`audit` found.

    Attributes:
        findings: every finding, errors first.
        config: the flat mapping of public parameters that was audited.
        source: where the mapping came from (for messages).
    """

    findings: list[Finding]
    config: dict[str, object] = field(default_factory=dict)
    source: str = "<mapping>"

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    @property
    def ok(self) -> bool:
        """No error-severity finding."""
        return not self.errors

    @property
    def epsilon(self) -> float | None:
        """The epsilon the run reports against the released model (``None``: it reports none)."""
        return self.epsilon_against("released_model")

    def epsilon_against(self, observer: str) -> float | None:
        """The epsilon the run reports against ``observer`` (one of :data:`OBSERVERS`).

        ``inf`` against the server means it saw values un-noised (central DP); ``None``: the
        run states no figure for that observer.
        """
        if observer not in OBSERVERS:
            raise ValueError(f"observer must be one of {OBSERVERS}, got {observer!r}")
        value = self.config.get("epsilon" if observer == "released_model" else "epsilon_server")
        return None if value is None else float(value)

    def assert_ok(
        self, max_epsilon: float | None = None, *, against: Iterable[str] = OBSERVERS
    ) -> None:
        """Raise :class:`AuditFailed` on any error, or an epsilon over ``max_epsilon``.

        Args:
            max_epsilon: the largest epsilon accepted.
            against: the observers it must hold against: by default both the released
                model's observers and the server (central DP holds nothing against the
                server: its epsilon there is infinite). A run that states no epsilon for one
                of them fails too (nothing bounds it).
        """
        problems = list(self.errors)
        if max_epsilon is not None:
            for observer in against:
                problems.extend(self._epsilon_problems(observer, max_epsilon))
        if problems:
            lines = "\n".join(f"  {p}" for p in problems)
            raise AuditFailed(f"privacy audit of {self.source} failed:\n{lines}", problems)

    def _epsilon_problems(self, observer: str, max_epsilon: float) -> list[Finding]:
        epsilon = self.epsilon_against(observer)
        where = "the released model" if observer == "released_model" else "the server"
        if epsilon is None:
            return [
                Finding(
                    "error",
                    "epsilon-unknown",
                    f"an epsilon of at most {max_epsilon:g} against {where} was asserted but "
                    "the run reports none (not differentially private, no ledger attached, or "
                    "no figure for that observer)",
                )
            ]
        if epsilon > max_epsilon:
            return [
                Finding(
                    "error",
                    "epsilon-over-max",
                    f"epsilon {epsilon:.4g} against {where} exceeds the asserted maximum "
                    f"{max_epsilon:g}",
                )
            ]
        return []

    def __str__(self) -> str:
        if not self.findings:
            return f"privacy audit of {self.source}: no findings"
        lines = "\n".join(f"  {f}" for f in self.findings)
        return f"privacy audit of {self.source}: {len(self.findings)} finding(s)\n{lines}"


# --------------------------------------------------------------------------- helpers
def _get(config: Mapping[str, object], *keys: str) -> object:
    """The first of ``keys`` present with a non-None value (else None)."""
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _text(config: Mapping[str, object], *keys: str) -> str | None:
    value = _get(config, *keys)
    return None if value is None else str(value).strip().lower()


# Keys whose value may be +infinity: an epsilon against an observer who saw a value un-noised.
MAY_BE_INFINITE = ("epsilon_server",)


# Keys whose value must not be negative (an epsilon), or must be positive (a budget).
NON_NEGATIVE = ("epsilon", "epsilon_server")
POSITIVE = ("epsilon_budget",)


def _number(config: Mapping[str, object], key: str, findings: list[Finding]) -> float | None:
    """``config[key]`` as a float, or None (absent; or invalid, with an ``invalid-value``).

    Strict: only an ``int`` or ``float`` (a bool, a string such as ``"8"``, anything else is
    invalid: a check that converted it would read a value nobody recorded as a number); finite,
    except ``+inf`` for :data:`MAY_BE_INFINITE`; at least 0 for :data:`NON_NEGATIVE`, above 0
    for :data:`POSITIVE`.
    """
    value = config.get(key)
    if value is None:
        return None
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    if number == math.inf and key in MAY_BE_INFINITE:
        return number
    if not math.isfinite(number):
        findings.append(
            Finding(
                "error",
                "invalid-value",
                f"{key} = {value!r} is not a number (a finite int or float; a "
                f"{type(value).__name__} is not read as one)",
            )
        )
        return None
    if (key in NON_NEGATIVE and number < 0) or (key in POSITIVE and number <= 0):
        bound = "> 0" if key in POSITIVE else ">= 0"
        findings.append(Finding("error", "invalid-value", f"{key} = {value!r}: it must be {bound}"))
        return None
    return number


def _transport_parts(config: Mapping[str, object]) -> list[str]:
    transport = _text(config, "transport")
    return [] if transport is None else [p.strip() for p in transport.split("+") if p.strip()]


def server_sees_clear_updates(config: Mapping[str, object]) -> bool | None:
    """Whether the server reads individual updates un-noised (None when ``transport`` is unknown).

    Plaintext (alone or under central/distributed DP) shows every update; secure aggregation and
    CKKS hide them; local DP noises each one.
    """
    parts = _transport_parts(config)
    if not parts:
        return None
    if "dp" in parts and _text(config, "placement", "dp_placement") == "local":
        return False
    return parts[0] in CLEAR_TRANSPORTS


def sampling_mode(config: Mapping[str, object]) -> str | None:
    """The runtime's client sampling (``"all"``, ``"fixed"``, ``"poisson"``), however recorded."""
    sampling = config.get("sampling")
    if isinstance(sampling, Mapping):
        sampling = sampling.get("mode")
    return None if sampling is None else str(sampling).strip().lower()


def _population(config: Mapping[str, object], findings: list[Finding]) -> float | None:
    for key in ("n_users", "n_clients"):
        value = _number(config, key, findings)
        if value is not None:
            return value
    return None


# --------------------------------------------------------------------------- checks
def check_budget(config: Mapping[str, object]) -> list[Finding]:
    """Epsilon spent over the budget."""
    findings: list[Finding] = []
    epsilon = _number(config, "epsilon", findings)
    budget = _number(config, "epsilon_budget", findings)
    against = config.get("epsilon_budget_against") or ["released_model"]
    spent = {"released_model": epsilon, "server": _number(config, "epsilon_server", findings)}
    for observer in against:
        value = spent.get(str(observer))
        if value is not None and budget is not None and value > budget:
            findings.append(
                Finding(
                    "error",
                    "epsilon-over-budget",
                    f"epsilon {value:.4g} against the {observer} exceeds the budget {budget:g} "
                    "that binds it: the ledger should have refused the rounds past it",
                )
            )
    return findings


def check_delta(config: Mapping[str, object]) -> list[Finding]:
    """``delta >= 1/#users`` (Dwork and Roth 2014, section 2.3: delta must be << 1/n)."""
    findings: list[Finding] = []
    delta = _number(config, "delta", findings)
    n = _population(config, findings)
    if delta is None:
        return findings
    if not 0 < delta < 1:
        findings.append(Finding("error", "invalid-value", f"delta = {delta!r} is not in (0, 1)"))
        return findings
    if n is not None and n > 0 and delta >= 1 / n:
        findings.append(
            Finding(
                "error",
                "delta-too-large",
                f"delta {delta:g} >= 1/{int(n)} users: publishing one random user's data in full "
                "satisfies such a guarantee; use delta well below 1/n (e.g. 1e-5 for 943 users)",
            )
        )
    return findings


def check_fedmf_leak(config: Mapping[str, object]) -> list[Finding]:
    """Vanilla FedMF over a transport that shows the server each update."""
    if _text(config, "variant") != "fedmf" or not server_sees_clear_updates(config):
        return []
    return [
        Finding(
            "error",
            "fedmf-gradient-leak",
            "vanilla FedMF over a transport that shows the server each user's item gradients: "
            "from two consecutive gradients of a user the server solves for the ratings "
            "(Chai et al., 'Secure Federated Matrix Factorization', 2020); use secure "
            "aggregation, CKKS, local DP, or FedRec's hybrid filling",
        )
    ]


def check_fedrec_values(config: Mapping[str, object]) -> list[Finding]:
    """FedRec or FedRec+ over a transport that shows the server each update.

    The filling hides which rows a user rated, not what the ratings are: one round's rating grid
    gives the shape of ``r - m_u`` and the population its sign and shift (SECURITY.md: 95.0% and
    94.9% of ML-100K's training ratings exactly through central DP, every one in plaintext).
    """
    variant = _text(config, "variant")
    if variant not in ("fedrec", "fedrec+") or not server_sees_clear_updates(config):
        return []
    return [
        Finding(
            "error",
            "fedrec-values-leak",
            f"{variant} over a transport that shows the server each update "
            f"({_text(config, 'transport')}): the filling hides which rows are real, not the "
            "rating values, which the server reads from the rating grid (95-100% exactly on "
            "ML-100K; tests/test_attack_dp_preset.py); use secure aggregation, CKKS or local DP",
        )
    ]


def check_fedmf_variant(config: Mapping[str, object]) -> list[Finding]:
    """A record naming the FedMF protocol without one of its variants.

    The audit's FedMF checks key on the variant; a model that calls itself ``"fedmf"`` with
    none (or another) would pass them all unchecked, and skip the declaration of its uploads.
    """
    if _text(config, "protocol") != "fedmf" or _text(config, "variant") in FEDMF_VARIANTS:
        return []
    return [
        Finding(
            "error",
            "fedmf-variant-unknown",
            f"the record names protocol 'fedmf' with variant {config.get('variant')!r}, not one "
            f"of {FEDMF_VARIANTS}: the audit's FedMF checks do not apply to it; a model of your "
            "own takes a name of its own and declares its uploads (declare_uploads)",
        )
    ]


def check_test_record(config: Mapping[str, object]) -> list[Finding]:
    """A record that says it was made by a test (``tests: true``)."""
    if config.get("tests") is None or config.get("tests") is False:
        return []
    return [
        Finding(
            "error",
            "test-run-record",
            f"the record carries tests = {config.get('tests')!r}: a test run (seeded, or with "
            "test-only escape hatches) is not a private run, whatever else it says",
        )
    ]


def check_part_upload(config: Mapping[str, object]) -> list[Finding]:
    """FedMF part upload under a transport that shows which rows a client sent."""
    if _text(config, "upload") != "part" or not server_sees_clear_updates(config):
        return []
    if _text(config, "variant") in ("fedrec", "fedrec+"):
        return []  # FedRec hides the rated rows among pseudo items (checked below)
    return [
        Finding(
            "error",
            "part-upload-reveals-items",
            "part upload over a transport that shows each update: the rows a user sends are "
            "exactly the items it rated (Chai et al. 2020); upload the full block, or hide the "
            "rated rows (FedRec's pseudo items)",
        )
    ]


def check_virtual_ratings(config: Mapping[str, object]) -> list[Finding]:
    """FedRec virtual ratings that do not look like real ratings."""
    if config.get("virtual_ratings_on_scale") is not False:
        return []
    return [
        Finding(
            "error",
            "virtual-ratings-off-scale",
            "virtual ratings of the pseudo items are off the rating scale, so the server tells "
            "them from real ones and the rated items show (Lin et al., 'FedRec', 2020: fill with "
            "values on the scale, e.g. predicted ratings rounded to it)",
        )
    ]


def check_pseudo_items(config: Mapping[str, object]) -> list[Finding]:
    """FedRec pseudo items drawn afresh each round."""
    if config.get("pseudo_items_resampled") is not True:
        return []
    return [
        Finding(
            "error",
            "pseudo-items-resampled",
            "pseudo items are resampled every round: the rated items are the ones present in "
            "every round, so intersecting two rounds' rows reveals them; sample each user's "
            "pseudo items once and keep them (Lin et al., FedRec, 2020)",
        )
    ]


def check_secagg(config: Mapping[str, object]) -> list[Finding]:
    """Secure-aggregation threshold and neighbours against the stated dropout and collusion.

    Rule, for a sharing group of ``m`` clients (``m = k`` neighbours under SecAgg+, else the
    ``n`` clients of a round), threshold ``t``, dropout fraction ``d``, colluders ``c``:

    * ``t > min(c, m)``, else the colluding clients alone pool ``t`` shares of an honest client's
      mask secrets (error);
    * ``floor(m (1 - d)) >= t``, else rounds with the expected dropout cannot unmask (error);
    * ``t > (m + min(c, m)) / 2``, else a server that lies about who dropped can collect ``t``
      shares of both the self-mask seed and the pairwise secret of one client (Bonawitz et al.,
      CCS 2017; warning, since it takes an actively cheating server);
    * ``k (1 - d) >= ln n`` (warning: below the ``O(log n)`` degree of Bell et al., CCS 2020,
      the surviving masking graph falls apart; a necessary condition, not a sufficient one);
    * the malicious-server variant (warning when a round records ``secagg_server`` or
      ``server`` ``"honest_but_curious"``: without signatures and ConsistencyCheck a server that
      relays its own keys as a neighbour's and lies about who dropped decodes an update).
    """
    findings: list[Finding] = []
    parts = _transport_parts(config)
    if parts and not any(p.startswith("secagg") for p in parts):
        return findings
    if "honest_but_curious" in (config.get("secagg_server"), config.get("server")):
        findings.append(
            Finding(
                "warning",
                "secagg-honest-but-curious",
                "secure aggregation ran without signatures and ConsistencyCheck "
                "(server='honest_but_curious'): a server that relays its own keys as a "
                "neighbour's and lies about who dropped decodes an update (docs/secagg.md)",
            )
        )
    # A SecAggTransport's own public parameters name them "threshold" and "neighbours" (ints,
    # or a description of the automatic rule, which the transport itself enforces).
    # Its rounds record the values they used: secagg_t, secagg_k, secagg_n.
    fallback = {
        f"secagg_{name}": config[name]
        for name in ("threshold", "neighbours")
        if isinstance(config.get(name), int) and not isinstance(config.get(name), bool)
    }
    recorded = {
        "secagg_threshold": config.get("secagg_t"),
        "secagg_neighbours": config.get("secagg_k"),
        "clients_per_round": config.get("secagg_n"),
    }
    fallback |= {key: value for key, value in recorded.items() if value is not None}
    config = {**fallback, **config}
    t = _number(config, "secagg_threshold", findings)
    if t is None:
        return findings
    k = _number(config, "secagg_neighbours", findings)
    d = _number(config, "expected_dropout", findings)
    c = _number(config, "expected_colluders", findings)
    n = _number(config, "clients_per_round", findings)
    n = _population(config, findings) if n is None else n
    d = 0.0 if d is None else d
    c = 0.0 if c is None else c
    if t < 1 or not 0 <= d < 1 or c < 0 or (k is not None and k < 1):
        findings.append(
            Finding(
                "error",
                "invalid-value",
                "secure aggregation needs secagg_threshold >= 1, secagg_neighbours >= 1, "
                "expected_dropout in [0, 1) (a fraction) and expected_colluders >= 0 (a count)",
            )
        )
        return findings
    m = k if k is not None else n
    if m is None:
        return findings
    colluders = min(c, m)
    if t <= colluders:
        findings.append(
            Finding(
                "error",
                "secagg-threshold-collusion",
                f"threshold {int(t)} does not exceed the {int(colluders)} colluding clients: "
                "together with the server they reconstruct honest clients' masks",
            )
        )
    survivors = math.floor(m * (1 - d))
    if survivors < t:
        findings.append(
            Finding(
                "error",
                "secagg-threshold-dropout",
                f"with {d:.0%} dropout about {survivors} of {int(m)} "
                f"{'neighbours' if k is not None else 'clients'} survive, fewer than the "
                f"threshold {int(t)}: rounds cannot be unmasked",
            )
        )
    if t <= (m + colluders) / 2:
        findings.append(
            Finding(
                "warning",
                "secagg-threshold-minority",
                f"threshold {int(t)} <= (group {int(m)} + colluders {int(colluders)}) / 2: a "
                "server that lies about dropouts can unmask a client (Bonawitz et al. 2017)",
            )
        )
    sparse_graph = k is not None and n is not None and n > 1 and k < n - 1
    if sparse_graph and k * (1 - d) < math.log(n):
        findings.append(
            Finding(
                "warning",
                "secagg-neighbours-too-few",
                f"{int(k)} neighbours with {d:.0%} dropout leave fewer than ln({int(n)}) = "
                f"{math.log(n):.1f} surviving neighbours: the masking graph does not stay "
                "connected (Bell et al. 2020 need k = O(log n), with margin)",
            )
        )
    return findings


def check_ckks(config: Mapping[str, object]) -> list[Finding]:
    """CKKS coefficient modulus over the 128-bit security table."""
    findings: list[Finding] = []
    degree = _number(config, "ckks_poly_modulus_degree", findings)
    sizes = config.get("ckks_coeff_mod_bit_sizes")
    if degree is None or sizes is None:
        return findings
    try:
        total = int(sum(int(s) for s in sizes))  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return [Finding("error", "invalid-value", f"ckks_coeff_mod_bit_sizes = {sizes!r}")]
    limit = CKKS_MAX_COEFF_BITS_128.get(int(degree))
    if limit is None:
        findings.append(
            Finding(
                "error",
                "ckks-unknown-degree",
                f"poly modulus degree {int(degree)} is not in the 128-bit security table "
                f"({sorted(CKKS_MAX_COEFF_BITS_128)})",
            )
        )
    elif total > limit:
        findings.append(
            Finding(
                "error",
                "ckks-insecure-modulus",
                f"coefficient modulus of {total} bits at degree {int(degree)} exceeds the "
                f"{limit} bits allowed for 128-bit security: raise the degree or drop primes",
            )
        )
    return findings


def check_randomness(config: Mapping[str, object]) -> list[Finding]:
    """Seeded (predictable) randomness outside tests."""
    seeded, secure = config.get("seeded"), config.get("secure")
    seeds = config.get("seeds")
    if isinstance(seeds, Mapping):
        seeded = seeds.get("seed") is not None if seeded is None else seeded
        secure = seeds.get("secure") if secure is None else secure
    randomness = _text(config, "randomness")
    if seeded is None and randomness is not None:
        seeded = randomness.startswith("seeded")
    if seeded is None and config.get("seed") is not None:
        seeded = True  # a run record's seed: everything was derived from it
    if config.get("secagg_secure_randomness") is False:
        seeded = True  # the masks and keys of secure aggregation came from the seed tree
    if config.get("ckks_secure_randomness") is False:
        seeded = True  # the flooding noise of CKKS decryptions came from the seed tree
    if seeded is True:
        return [
            Finding(
                "error",
                "seeded-randomness",
                "the run is seeded: anyone with the seed regenerates its masks, keys and noise; "
                "use SeedTree.secure_mode() outside tests",
            )
        ]
    if secure is False:
        return [
            Finding(
                "warning",
                "insecure-randomness",
                "randomness is not from a cryptographic source (secure=False): numpy's generators "
                "are predictable from their output; use SeedTree.secure_mode()",
            )
        ]
    return []


def check_sampling(config: Mapping[str, object]) -> list[Finding]:
    """Poisson accounting while the runtime sampled a fixed number of clients, or all of them."""
    findings: list[Finding] = []
    assumed = _text(config, "accountant_sampling")
    runtime = sampling_mode(config)
    if assumed != "poisson" or runtime not in ("fixed", "all"):
        return findings
    if _text(config, "placement", "dp_placement") == "local":
        return findings  # local DP is charged at rate 1: no amplification is claimed
    rate = _number(config, "sample_rate", findings)
    if rate is None and runtime == "all":
        return findings
    if rate is None or rate < 1:
        rate_text = "an unstated rate" if rate is None else f"rate {rate:g}"
        findings.append(
            Finding(
                "error",
                "accountant-sampling-mismatch",
                f"the accountant assumes Poisson sampling at {rate_text} but the runtime "
                f"sampled {'every client' if runtime == 'all' else 'a fixed number of clients'}: "
                "the reported epsilon is too small (e.g. 3.58, not 2.10, at sigma 1, q 0.01, "
                "1000 rounds); use ClientSampling('poisson', ...)",
            )
        )
    return findings


def check_distributed_dp(config: Mapping[str, object]) -> list[Finding]:
    """Distributed DP noise without secure aggregation underneath."""
    parts = _transport_parts(config)
    if "dp" not in parts or _text(config, "placement", "dp_placement") != "distributed":
        return []
    if parts[0] not in ("plaintext",):
        return []
    return [
        Finding(
            "error",
            "distributed-dp-without-secagg",
            "distributed DP over plaintext: each update the server reads carries only 1/sqrt(n) "
            "of the noise; put secure aggregation underneath or use local placement",
        )
    ]


INTEGER_DP_MECHANISMS = ("discrete_gaussian", "skellam")
WRAP_WARNING = 1e-3
"""A round whose modular-wrap bound exceeds this is flagged (its sum may decode wrong)."""


def check_dp_mechanism(config: Mapping[str, object]) -> list[Finding]:
    """Float noise under secure aggregation (inexact), and integer noise that may wrap.

    Distributed DP whose noise is the continuous Gaussian (``dp_mechanism`` ``"gaussian"``, or
    absent: records made before the integer mechanisms) is rounded to fixed point and summed
    modulo ``2^bits`` by secure aggregation or approximated by CKKS: the continuous Gaussian's
    guarantee is not proven for what is released. The integer mechanisms' guarantee holds for
    the sum; a wrap bound above :data:`WRAP_WARNING` means the sum may decode wrong.
    """
    parts = _transport_parts(config)
    if "dp" not in parts or _text(config, "placement", "dp_placement") != "distributed":
        return []
    mechanism = _text(config, "dp_mechanism") or "gaussian"
    findings = []
    if mechanism not in INTEGER_DP_MECHANISMS and parts[0] in ("secagg", "ckks"):
        findings.append(
            Finding(
                "warning",
                "distributed-dp-inexact",
                f"distributed DP adds float Gaussian noise that {parts[0]} then rounds "
                "(and secure aggregation sums modulo 2^bits): the continuous Gaussian's "
                "epsilon is not proven for that release; use secagg+dp with "
                "mechanism=discrete_gaussian (or skellam), whose own accountant covers the "
                "rounded, modular sum",
            )
        )
    wrap = _number(config, "ddp_wrap_bound", findings)
    if wrap is not None and wrap > WRAP_WARNING:
        findings.append(
            Finding(
                "warning",
                "distributed-dp-wrap",
                f"the integer sum may wrap its modulus with probability up to {wrap:.3g} per "
                "round (then it decodes wrong); raise modulus_bits or lower wrap_target",
            )
        )
    return findings


def check_dp_denominator(config: Mapping[str, object]) -> list[Finding]:
    """FedMF under DP with a data-dependent denominator (``aggregation`` ``mean`` or ``sum``)."""
    aggregation = _text(config, "aggregation")
    if "dp" not in _transport_parts(config) or aggregation not in ("mean", "sum"):
        return []
    if _text(config, "protocol") not in (None, "fedmf"):
        return []
    return [
        Finding(
            "warning",
            "dp-data-dependent-denominator",
            f"FedMF aggregation={aggregation!r} under DP divides by uploader counts or weights "
            "that depend on who took part (a count column that also spends the clip); use "
            "aggregation='fixed' with a public expected_clients (user_level_dp_config)",
        )
    ]


def check_uploads(config: Mapping[str, object]) -> list[Finding]:
    """What the uploads reveal, under a transport that shows the server each one in the clear.

    An algorithm declares it with :func:`declare_uploads` (key ``uploads_reveal``); FedMF's
    leaks the audit knows itself (the checks above). An algorithm that declared nothing, over
    such a transport, is an error: nothing vouches for what the server reads.
    """
    if not server_sees_clear_updates(config):
        return []
    declared = config.get("uploads_reveal")
    if declared is None:
        if _text(config, "protocol") in (*KNOWN_PROTOCOLS, None) and _text(config, "variant") in (
            FEDMF_VARIANTS
        ):
            return []
        return [
            Finding(
                "error",
                "uploads-undeclared",
                f"the server reads every update in the clear ({_text(config, 'transport')}) "
                "and the algorithm has not declared what its uploads reveal: call "
                "securefed.audit.declare_uploads(transport, protocol=..., reveals=[...]) "
                f"(one of {sorted(REVEALS)}, or [] for nothing private), or use a hiding "
                "transport",
            )
        ]
    try:
        reveals = check_reveals(declared)
    except ValueError as error:
        return [Finding("error", "invalid-value", str(error))]
    return [
        Finding(
            REVEALS[reveal][0],
            "uploads-reveal-in-clear",
            f"each upload shows the server {REVEALS[reveal][1]} in the clear "
            f"({_text(config, 'transport')}): use secure aggregation, CKKS or local DP",
        )
        for reveal in reveals
    ]


def check_server_epsilon(config: Mapping[str, object]) -> list[Finding]:
    """An epsilon amplified by sampling where the server itself does the sampling.

    Under distributed placement the server picks each round's clients and sees who
    contributed, so sampling amplification does not hold against it: the epsilon it faces is
    the rate-1 figure. A record that states only the amplified epsilon overstates the
    guarantee against the server.
    """
    findings: list[Finding] = []
    if _text(config, "placement", "dp_placement") != "distributed":
        return findings
    rate = _number(config, "sample_rate", findings)
    rate = _number(config, "dp_sample_rate", findings) if rate is None else rate
    if rate is None or rate >= 1 or config.get("epsilon") is None:
        return findings
    if config.get("epsilon_server") is None:
        findings.append(
            Finding(
                "error",
                "epsilon-server-unstated",
                f"distributed DP charged at sample rate {rate:g}, but the server chooses and "
                "sees each round's clients, so that amplification does not hold against it; "
                "the record must state epsilon_server (charged at rate 1)",
            )
        )
    return findings


def check_dp_colluders(config: Mapping[str, object]) -> list[Finding]:
    """Distributed DP whose server epsilon assumes fewer colluders than the record states.

    ``dp_colluders`` (a count, or a fraction of each round's clients) is what the ledger's
    ``epsilon_server`` accounts for; ``expected_colluders`` (a count) is what the run says may
    collude. Fewer in the first overstates the guarantee against the server and them.
    """
    findings: list[Finding] = []
    if _text(config, "placement", "dp_placement") != "distributed":
        return findings
    assumed = _number(config, "dp_colluders", findings)
    expected = _number(config, "expected_colluders", findings)
    if assumed is None or expected is None or 0 < assumed < 1:
        return findings  # a fraction: its count depends on the round's clients
    if assumed < expected:
        findings.append(
            Finding(
                "error",
                "epsilon-server-ignores-colluders",
                f"the ledger's epsilon against the server assumes {assumed:g} colluding "
                f"client(s) (dp_colluders), the run expects {expected:g} "
                "(expected_colluders): each colluder subtracts its own noise share; set "
                "colluders on the DP transport to at least the expected number",
            )
        )
    return findings


def check_flooding(config: Mapping[str, object]) -> list[Finding]:
    """CKKS decryptions released without noise flooding above the decryption error.

    A CKKS decryption's error term depends on the secret key; released unflooded it leaks it
    (Li and Micciancio, Eurocrypt 2021). The flooding std must reach the floor that hides the
    decryption-error bound the transport states (``ckks_decryption_error``) at its stated level
    (``ckks_flooding_security_bits``: :func:`~securefed.crypto.flooding.flooding_floor`, the
    formula the transport itself applies); without a level, at least the bound itself.
    """
    findings: list[Finding] = []
    if "ckks" not in _transport_parts(config):
        return findings
    if config.get("ckks_flooding_unsafe_for_tests") is True:
        findings.append(
            Finding(
                "error",
                "ckks-flooding-unsafe",
                "the flooding was set with Flooding.unsafe_for_tests: below the floor that hides "
                "the decryption error; outside tests use the default (the floor at its level)",
            )
        )
    flood = _number(config, "flood_std", findings)
    bound = _number(config, "ckks_decryption_error", findings)
    level = _number(config, "ckks_flooding_security_bits", findings)
    if level is not None and level < MIN_FLOODING_SECURITY_BITS:
        findings.append(
            Finding(
                "error",
                "ckks-flooding-weak",
                f"the flooding's level is {level:g} bits, below the floor of "
                f"{MIN_FLOODING_SECURITY_BITS}: each released decryption leaks up to "
                f"2^-{level:g} of its key-dependent error (Li and Micciancio 2021); use the "
                "default level (40)",
            )
        )
    if flood is None or flood <= 0:
        findings.append(
            Finding(
                "error",
                "ckks-no-flooding",
                "CKKS decryptions are released without noise flooding (flood_std "
                f"{'unstated' if flood is None else f'{flood:g}'}): the decryption error "
                "reveals the secret key (Li and Micciancio 2021)",
            )
        )
    elif bound is None or bound <= 0:
        findings.append(
            Finding(
                "warning",
                "ckks-flooding-unjustified",
                f"flood_std {flood:g} is not set against a stated decryption-error bound "
                "(ckks_decryption_error): nothing shows that it hides the error",
            )
        )
    else:
        floor = bound if level is None else flooding_floor(bound, level)
        if flood < floor * (1 - 1e-12):
            at = "" if level is None else f" at {level:g}-bit security"
            findings.append(
                Finding(
                    "error",
                    "ckks-flooding-below-error",
                    f"flood_std {flood:g} is below {floor:g}, the floor that hides the "
                    f"decryption-error bound {bound:g}{at}: the key-dependent error shows "
                    "through (Li and Micciancio 2021)",
                )
            )
    return findings


def check_reveals(declared: object) -> list[str]:
    """The declared reveals as a list of :data:`REVEALS` names.

    Raises:
        ValueError: naming the entry that is not one.
    """
    if isinstance(declared, str) or not isinstance(declared, (list, tuple)):
        raise ValueError(f"uploads_reveal must be a list of names, got {declared!r}")
    unknown = [r for r in declared if r not in REVEALS]
    if unknown:
        raise ValueError(f"uploads_reveal names {unknown}, not among {sorted(REVEALS)}")
    return list(declared)


def declare_uploads(target: object, *, protocol: str, reveals: Iterable[str]) -> None:
    """Declare, in a transport's ServerView, what one client's upload of ``protocol`` reveals.

    The audit reads it: over a transport that shows the server each update (plaintext,
    central DP), each declared entry is a finding (:data:`REVEALS` gives its severity); an
    algorithm that declares nothing there is an error.

    Args:
        target: a transport (its ``view``) or a :class:`~securefed.views.ServerView`.
        protocol: the algorithm's name (``view.public["protocol"]``).
        reveals: names from :data:`REVEALS` (empty: nothing private is uploaded).

    Example:
        >>> from securefed import PlaintextTransport
        >>> transport = PlaintextTransport()
        >>> declare_uploads(transport, protocol="my-ncf", reveals=["model-deltas"])
        >>> audit(transport.view).codes
        ['uploads-reveal-in-clear']
    """
    if not isinstance(protocol, str) or not protocol:
        raise ValueError(f"protocol must be a non-empty name, got {protocol!r}")
    names = check_reveals(list(reveals))
    view = getattr(target, "view", target)
    public = getattr(view, "public", None)
    if not isinstance(public, dict):
        raise TypeError(f"declare_uploads takes a transport or a ServerView, got {target!r}")
    public["protocol"] = protocol
    public["uploads_reveal"] = names


CHECKS: tuple[Callable[[Mapping[str, object]], list[Finding]], ...] = (
    check_budget,
    check_delta,
    check_test_record,
    check_fedmf_variant,
    check_fedmf_leak,
    check_fedrec_values,
    check_part_upload,
    check_virtual_ratings,
    check_pseudo_items,
    check_secagg,
    check_ckks,
    check_randomness,
    check_sampling,
    check_distributed_dp,
    check_dp_mechanism,
    check_dp_denominator,
    check_uploads,
    check_server_epsilon,
    check_dp_colluders,
    check_flooding,
)


def check_keys(config: Mapping[str, object], extra_keys: Iterable[str] = ()) -> list[Finding]:
    """Every key must be one the audit knows: an unknown one goes unchecked (fail closed)."""
    import difflib

    known = known_keys() | frozenset(extra_keys)
    findings = []
    for key in sorted(config):
        if key in known or key.startswith(KNOWN_PREFIXES):
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        findings.append(
            Finding(
                "error",
                "unknown-key",
                f"{key!r} is not a key the audit knows{hint}, so nothing checks it; fix the "
                "name, or pass audit(..., extra_keys=[...]) for a key of your own",
            )
        )
    return findings


# --------------------------------------------------------------------------- input
def _merge_view(
    run_public: Mapping[str, object], rounds: Iterable[Mapping[str, object]], transport: str | None
) -> dict[str, object]:
    """Run-level public parameters win; per-round ones fill gaps.

    Of values that change from round to round, the audit keeps the weakest: the largest
    epsilon against each observer, and the secure-aggregation parameters of the round whose
    threshold had the least margin over half its neighbours.
    """
    rounds = list(rounds)
    merged: dict[str, object] = {}
    epsilons: dict[str, list[float]] = {"epsilon": [], "epsilon_server": []}
    weakest: Mapping[str, object] | None = None
    for public in [*rounds, run_public]:
        merged.update({k: v for k, v in public.items() if v is not None})
        for key, seen in epsilons.items():
            if public.get(key) is not None:
                seen.append(public[key])
        if _secagg_margin(public) < _secagg_margin(weakest):
            weakest = public
    if weakest is not None:
        merged.update({k: weakest[k] for k in ("secagg_t", "secagg_k", "secagg_n") if k in weakest})
    merged.update({k: v for k, v in run_public.items() if v is not None})
    merged.update({key: _largest_epsilon(seen) for key, seen in epsilons.items() if seen})
    for key in SECURE_RANDOMNESS_KEYS:  # one seeded round is enough
        if any(public.get(key) is False for public in [*rounds, run_public]):
            merged[key] = False
    if transport is not None:
        merged.setdefault("transport", transport)
    return merged


def _largest_epsilon(values: list[object]) -> object:
    """The largest of the epsilons recorded, or the first that is not a number (for the
    checks to refuse: the audit never converts a value itself)."""
    odd = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))]
    return odd[0] if odd else max(values)


SECURE_RANDOMNESS_KEYS = ("secagg_secure_randomness", "ckks_secure_randomness")
"""Per-round records of whether a transport's secrets came from a cryptographic source."""


def _secagg_margin(public: Mapping[str, object] | None) -> float:
    """``t - k/2`` of a round's secure aggregation (infinite for a round without one)."""
    if not public or public.get("secagg_t") is None or public.get("secagg_k") is None:
        return math.inf
    try:
        return float(public["secagg_t"]) - float(public["secagg_k"]) / 2
    except (TypeError, ValueError):
        return -math.inf  # unreadable: the weakest, so its values reach the checks


def _from_json(data: object, where: str) -> dict[str, object]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") == "securefed.server_view":
        return _merge_view(
            data.get("public") or {},
            [r.get("public") or {} for r in data.get("rounds", [])],
            data.get("transport"),
        )
    flat = {}
    for nested in ("config", "public"):
        if isinstance(data.get(nested), Mapping):
            flat.update(data[nested])
    flat.update({k: v for k, v in data.items() if k not in ("config", "public")})
    return flat


def load_config(source: object) -> tuple[dict[str, object], str]:
    """The flat mapping to audit and a description of where it came from.

    Args:
        source: a mapping; a :class:`~securefed.views.ServerView`; a path to a saved ServerView
            directory (its ``manifest.json``) or to a JSON file (a manifest or a run's JSON).

    Raises:
        FileNotFoundError: a path that does not exist or a directory without ``manifest.json``.
        ValueError: a file that is not a JSON object.
    """
    from securefed.views import ServerView

    if isinstance(source, ServerView):
        merged = _merge_view(source.public, [r.public for r in source.rounds], source.transport)
        return merged, f"ServerView({source.transport!r})"
    if isinstance(source, Mapping):
        return _from_json(source, "<mapping>"), "<mapping>"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            path = path / "manifest.json"
            if not path.is_file():
                raise FileNotFoundError(f"{path.parent} holds no manifest.json: not a saved view")
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from error
        return _from_json(data, str(path)), str(path)
    raise TypeError(f"audit() takes a mapping, a ServerView or a path, got {type(source).__name__}")


def _saved_file(source: object) -> Path | None:
    """The JSON file a path source names (a saved view's manifest), else None."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = Path(source)
    return path / "manifest.json" if path.is_dir() else path


def check_integrity(path: Path, key: bytes | None = None) -> list[Finding]:
    """The digests of a saved file (:mod:`securefed.integrity`): a view's manifest and arrays,
    or any document that carries a digest and the files it names.

    A saved view must carry its digest; a run's JSON record without one has nothing to check.
    A keyed (HMAC) file is checked with ``key``; without it, it cannot be, and that is a
    finding too: its parameters may have been edited by anyone.
    """
    from securefed.views import ARRAYS_FILE, FORMAT_NAME, FUSION_FORMAT_NAME

    data = json.loads(path.read_text())
    view = isinstance(data, Mapping) and data.get("format") in (FORMAT_NAME, FUSION_FORMAT_NAME)
    digest = data.get(DIGEST_FIELD) if isinstance(data, Mapping) else None
    if not view and digest is None:
        return []
    if view:
        files = [ARRAYS_FILE]
    else:
        named = digest.get("files") if isinstance(digest, Mapping) else None
        files = sorted(named) if isinstance(named, Mapping) else []
    try:
        verify(data, path, files, key=key, error=ViewFormatError)
    except ViewFormatError as error:
        return [
            Finding(
                "error",
                "view-integrity",
                f"{error}; the parameters audited may not be those the run recorded (give "
                "audit(..., key=...) for a keyed file)",
            )
        ]
    return []


def audit(
    config_or_path: object,
    *,
    strict: bool = False,
    extra_keys: Iterable[str] = (),
    key: bytes | None = None,
) -> AuditReport:
    """Audit a run's public parameters for choices that void its privacy claims.

    Args:
        config_or_path: a mapping of public parameters, a ``ServerView``, or a path to a saved
            ServerView directory or a JSON file (see the module docstring for the keys). A saved
            file's digests are verified (:func:`check_integrity`): a broken one is a finding.
        strict: raise :class:`AuditFailed` when any error-severity finding is present.
        extra_keys: informational keys of the caller's own, accepted without a finding.
        key: the HMAC key of a keyed saved file (``ServerView.save(..., key=...)``).

    Returns:
        The :class:`AuditReport` (errors first, then warnings, then notes).
    """
    config, source = load_config(config_or_path)
    findings = check_keys(config, extra_keys)
    saved = _saved_file(config_or_path)
    if saved is not None:
        findings.extend(check_integrity(saved, key))
    for check in CHECKS:
        findings.extend(check(config))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    report = AuditReport(findings, config, source)
    if strict and not report.ok:
        lines = "\n".join(f"  {f}" for f in report.errors)
        raise AuditFailed(f"privacy audit of {source} failed (strict):\n{lines}", report.errors)
    return report
