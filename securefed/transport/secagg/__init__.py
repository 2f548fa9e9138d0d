"""Secure aggregation by pairwise masking: Bonawitz et al. (CCS 2017) with SecAgg+'s sparse graph.

The server learns the sum of the surviving clients' (weighted) updates and nothing else about any
single update, against an honest-but-curious server (and clients who do not collude with it beyond
the threshold). Every message of the protocol is really produced and consumed, with the real
cryptography (X25519, HKDF-SHA256, AES-GCM / ChaCha20-Poly1305, AES-256-CTR / ChaCha20 masks,
Shamir over GF(2^256 + 297)); the network is simulated in one process, or real across machines
with ``securefed.flower``.

Stages (Bonawitz et al. 2017, Fig. 4; Bell et al. 2020, Sec. 4) and where they run here:

0. Graph (:meth:`SecAggTransport.open_round`). From public randomness of the round every party
   derives the same random ``k``-regular neighbourhood graph (a Harary graph on a random relabelling
   of the clients; ``k`` defaults to ``ceil(2 log2 n)``; ``k = n - 1`` is the complete graph of the
   original protocol). Secrets are shared, and masks agreed, with neighbours only.
1. AdvertiseKeys (``open_round``). Each client makes two X25519 key pairs: ``c`` (to encrypt shares)
   and ``s`` (to agree on pairwise mask seeds); the server relays the public keys to the neighbours.
2. ShareKeys (``open_round``). Each client ``u`` draws a self-mask seed ``b_u``, Shamir-shares
   ``b_u`` and its ``s`` private key ``t``-out-of-``k`` among its neighbours, and seals
   ``share(b_u) || share(s_u)`` for neighbour ``v`` with an AEAD under
   ``HKDF(X25519(c_u, c_v), info = round, {u, v})`` and associated data ``(round, u, v)``. The
   server relays the ciphertexts (:attr:`SecAggRound.share_store`) and cannot read them.
3. MaskedInputCollection (``submit``/``submit_batch`` -> ``_accept``). Client ``u`` encodes
   ``w_u x_u`` (and ``w_u``) in fixed point and uploads, in Z_{2^bits},
   ``y_u = x_u + PRG(b_u) + sum_{v in N(u), v > u} PRG(s_uv) - sum_{v in N(u), v < u} PRG(s_uv)``
   with ``s_uv = HKDF(X25519(s_u, s_v), info = round, {u, v})``.
4. Unmasking (``result`` -> ``_finish``). The clients that submitted and are still there ("helpers")
   decrypt the shares they hold and, for each neighbour, reveal the share of ``b_u`` if ``u``
   submitted, or the share of ``s_u`` if it did not; never both. The server reconstructs the
   ``b_u`` of every contributor (a client that dropped *after* submitting is one) and the ``s_u`` of
   every non-contributor with a contributing neighbour, checking every share it received against
   the others (a wrong one is corrected and its helper excluded when the spare shares allow,
   Berlekamp-Welch), removes those masks, checks the sum against the range ``n`` clipped inputs
   allow, and decodes.

What a client checks before it answers (Bonawitz et al. 2017, Sec. 4 and Fig. 4), so that a
server that deviates from the protocol learns no single input: each stage is answered once and in
order (so it never reveals both shares of a peer, nor masks twice); ``k/2 < t <= k`` at
ShareKeys; masking with at least ``t`` neighbours, all of whom it shared with; revealing only when
it is among the contributors and at least ``t`` of its neighbours are; every peer's public key is
canonical and not of low order (:class:`~securefed.crypto.keys.InvalidPublicKeyError`).

Refusals (no output, :class:`~securefed.errors.AggregationError` unless noted): a sum that could
wrap the modulus (:class:`~securefed.crypto.fixed_point.ModulusOverflowError`, at ``open_round``);
a threshold ``t <= k/2`` or ``t > k``, or ``k = 1`` on more than two clients
(:class:`~securefed.errors.InsecureParameterError`); a needed secret with fewer than ``t`` helpers
among its owner's neighbours; contributors whose part of the graph falls apart (the server would
learn each part's sum); a share that fails authentication (tampered, misrouted or replayed:
:class:`~securefed.crypto.keys.ShareDecryptionError`); an advertised public key that is malformed,
non-canonical or of low order (:class:`~securefed.crypto.keys.InvalidPublicKeyError`); a masked
input or shares that arrive after unmasking began; revealed shares that disagree beyond what the
spare shares correct (naming the helpers), a response a helper cannot have given, a rebuilt mask
key that does not match its public key, an unmasked sum outside ``[-n L, n L]``
(``L = ceil(clip scale)``); NaN/inf, wrong lengths, weights above ``clip`` (``ValueError``). A
refused round stays refused.

Threat model (``SecAggConfig.server``): ``"malicious"``, the default, adds Bonawitz et al.'s
active-adversary variant (2017, Sec. 6; :mod:`~securefed.transport.secagg.signatures`): every
advertisement is authenticated and checked against a key registry whose digest every client
pinned at enrolment (there is no PKI), and a ConsistencyCheck round between masking and
unmasking, where each helper authenticates the survivor set it was told and reveals nothing
without ``t`` valid authenticators of its neighbours on the same set (and, when it holds a
minimum of contributors, that many survivors' signatures). The authentication
(``SecAggConfig.auth``) is Ed25519 signatures (``"signatures"``, the default) or, as an opt-in,
HMAC-SHA256 under static pairwise keys agreed once from the registry's long-term X25519 keys
(``"macs"``), which is *not* resistant to key-compromise impersonation
(:mod:`~securefed.transport.secagg.signatures`); with ``SecAggConfig.graph_epoch > 1`` either
keeps its pair keys for an epoch (signatures: one signed epoch session, MACs under epoch pair
keys in between; opt-in, trade-off in SECURITY.md). ``"honest_but_curious"`` runs without
them: there a server that relays its own keys in place of ``2t - k`` of a victim's neighbours
and lies about who dropped decodes the victim (tests/test_secagg_malicious.py). Either way a
server that tells different helpers different survivor sets cannot learn both secrets of a
client on its own (each helper answers once, and two disjoint groups of ``t > k/2`` helpers do
not fit in ``k`` neighbours), but it can with ``2t - k`` of the client's neighbours colluding
(the bound the malicious variant assumes).

Every client checks the ``k`` and ``t`` it is sent against its own floor, the colluder bound of
``SecAggConfig.colluders`` for the round's ``n`` (issue 30). Not covered (see docs/secagg.md):
the graph and the round's ``n`` come from the server. A wrong share among
exactly ``t`` shares of a secret is caught only by the public key (mask keys) or the range of the
sum (self-mask seeds).

The clients' side of each stage is :class:`SecAggClient`; the server's side is
:class:`SecAggRound`, whose stage methods (``receive_keys``, ``share_request``/``receive_shares``,
``mask_request``/``receive_masked``, ``unmask_requests``/``receive_reveals``) are public so that
the same protocol runs across machines (``SecAggTransport(remote_clients=True)``; in one process the
round drives simulated clients through the same methods).

Modules, one per part of the protocol:

* :mod:`~securefed.transport.secagg.config`: :class:`SecAggConfig` and the pure sizing functions
  (neighbour count, threshold, the unmasking failure bound);
* :mod:`~securefed.transport.secagg.graph`: the graph seed, the Harary graph and the unmasking
  plan;
* :mod:`~securefed.transport.secagg.client`: :class:`SecAggClient`, its randomness, and the
  server's requests to it;
* :mod:`~securefed.transport.secagg.server`: :class:`SecAggRound`, the server's round;
* :mod:`~securefed.transport.secagg.signatures`: the malicious-server variant's long-term keys,
  the key registry, the signed or MAC'd messages and each client's side of checking them;
* :mod:`~securefed.transport.secagg.transport`: :class:`SecAggTransport`.

Randomness: with ``seeds.secure`` key pairs come from ``X25519PrivateKey.generate()`` and seeds,
Shamir coefficients, nonces and rounding keys from ``os.urandom``. Otherwise (seeded mode, for
tests and benchmarks only: every secret is reproducible from the run's seed) they come from
``seeds.key("secagg", round_id, client, ...)``.
"""

from __future__ import annotations

from securefed.transport.secagg.client import (
    SEALED_SHARE_BYTES,
    SECRET_FIELDS,
    SHARE_PLAINTEXT_BYTES,
    STAGE_NAMES,
    STAGES,
    MaskRequest,
    SecAggClient,
    ShareRequest,
    UnmaskRequest,
    encode_input,
    masking_workspace,
    pack_values,
    rounding_key,
)
from securefed.transport.secagg.config import (
    SecAggConfig,
    binomial_cdf,
    check_round_parameters,
    check_threshold,
    corrupt_count,
    corrupt_neighbour_bound,
    default_neighbours,
    default_threshold,
    effective_neighbours,
    hypergeometric_tail,
    neighbours_for_dropout,
    threshold_for_colluders,
    unmasking_failure_bound,
)
from securefed.transport.secagg.graph import (
    UnmaskingPlan,
    graph_seed,
    neighbour_graph,
    plan_unmasking,
)
from securefed.transport.secagg.server import ID_BYTES, SecAggRound, check_weights
from securefed.transport.secagg.signatures import (
    AUTH_MODES,
    ClientAuthentication,
    ConsistencyError,
    KeyRegistry,
    SignatureError,
    SigningKey,
    SimulatedSigners,
)
from securefed.transport.secagg.transport import SecAggTransport

__all__ = [
    "AUTH_MODES",
    "ID_BYTES",
    "SEALED_SHARE_BYTES",
    "SECRET_FIELDS",
    "SHARE_PLAINTEXT_BYTES",
    "STAGES",
    "STAGE_NAMES",
    "ClientAuthentication",
    "ConsistencyError",
    "KeyRegistry",
    "MaskRequest",
    "SecAggClient",
    "SecAggConfig",
    "SecAggRound",
    "SecAggTransport",
    "ShareRequest",
    "SignatureError",
    "SigningKey",
    "SimulatedSigners",
    "UnmaskRequest",
    "UnmaskingPlan",
    "binomial_cdf",
    "check_round_parameters",
    "check_threshold",
    "check_weights",
    "corrupt_count",
    "corrupt_neighbour_bound",
    "default_neighbours",
    "default_threshold",
    "effective_neighbours",
    "encode_input",
    "graph_seed",
    "hypergeometric_tail",
    "masking_workspace",
    "neighbour_graph",
    "neighbours_for_dropout",
    "pack_values",
    "plan_unmasking",
    "rounding_key",
    "threshold_for_colluders",
    "unmasking_failure_bound",
]
