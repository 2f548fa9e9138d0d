"""``ckks``: securefed's CKKS transport (TenSEAL), sized for FedMF-style row blocks.

Chai et al.'s key model (users share the secret key, the server holds the public context);
``TransportOptions.extra["ckks"]`` overrides any :class:`~securefed.transport.ckks.CKKSConfig`
field, e.g. ``{"key_model": "committee"}`` or ``{"value_bound": 2**20}``.
"""

from __future__ import annotations

from securefed.bench.transports import TransportOptions, register
from securefed.transport.ckks import CKKSConfig, CKKSTransport


def ckks_config(options: TransportOptions) -> CKKSConfig:
    """Parameters wide enough for FedMF blocks on MovieLens 100K.

    Values up to 2^16 (FedRec+'s squared-gradient statistics reach about 4e4 on ML-100K) from up
    to max(1024, n_clients) clients; with 1024 clients that leaves a 32-bit scale in a 60-bit
    decryption prime at degree 8192 (errors about 2e-6 per client and value).
    """
    max_clients = max(1024, options.n_clients or 0)
    settings = {"max_clients": max_clients} | options.extra.get("ckks", {})
    return CKKSConfig(**settings)


def _ckks(options: TransportOptions) -> CKKSTransport:
    return CKKSTransport(
        ckks_config(options),
        keep_payloads=options.keep_payloads,
        total_rounds=options.total_rounds,
    )


register("ckks", _ckks)
