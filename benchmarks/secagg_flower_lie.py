"""The lying server against Flower 1.42's SecAgg+ (``flwr.client.mod.secaggplus_mod``).

A server that plays Flower's SecAgg+ workflow honestly through AdvertiseKeys (Flower's "setup"),
ShareKeys and the masked-vector collection, then lies at Unmasking about who dropped. Flower's
server (``SecAggPlusWorkflow.unmask_stage``) sends each node two lists of its neighbours,
``active_node_ids`` and ``dead_node_ids``; the node (``secaggplus_mod._unmask``) returns the share
of the self-mask seed of every node in the first and the share of the mask key (``sk1``) of
every node in the second. It checks neither that the lists are disjoint nor that the server
holds the masked vector of a node it calls dead, and nothing is signed. Two lies:

* ``"both lists"``: the victim in both lists of every neighbour's request; one message each.
* ``"split"``: half of the victim's neighbours are told it dropped, the others that it is active
  (each node answers once; Flower lets the threshold be a minority of the neighbours).

Each node here is driven through Flower's own mod function with Flower's own messages, in one
process (no simulation engine): what the server sends is exactly what ``SecAggPlusWorkflow``
would send but for the lie. The server then decodes the victim's vector with Flower's own
primitives (``combine_shares``, ``pseudo_rand_gen``, ECDH on P-384, ``dequantize``).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

LIES = ("both lists", "split")


def _flower() -> SimpleNamespace:
    """Flower's names this module uses, imported when used (flwr is an optional extra)."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import ConfigRecord, Context, Message, Metadata, RecordDict
    from flwr.app.message_type import MessageType
    from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
    from flwr.common import Code, FitRes, Status, bytes_to_ndarray, ndarrays_to_parameters
    from flwr.common.secure_aggregation import ndarrays_arithmetic as arithmetic
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.quantization import dequantize
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    return SimpleNamespace(
        compat=compat,
        ConfigRecord=ConfigRecord,
        Context=Context,
        Message=Message,
        Metadata=Metadata,
        RecordDict=RecordDict,
        MessageType=MessageType,
        secaggplus_mod=secaggplus_mod,
        Code=Code,
        FitRes=FitRes,
        Status=Status,
        bytes_to_ndarray=bytes_to_ndarray,
        ndarrays_to_parameters=ndarrays_to_parameters,
        arithmetic=arithmetic,
        combine_shares=combine_shares,
        generate_shared_key=generate_shared_key,
        dequantize=dequantize,
        RECORD_KEY_CONFIGS=RECORD_KEY_CONFIGS,
        Key=Key,
        Stage=Stage,
        pseudo_rand_gen=pseudo_rand_gen,
        bytes_to_private_key=bytes_to_private_key,
        bytes_to_public_key=bytes_to_public_key,
    )


def run_flower_lie(
    lie: str,
    *,
    nodes: int = 7,
    threshold: int = 3,
    length: int = 1000,
    victim_index: int = 2,
    clip: float = 1.0,
    target_range: int = 2**22,
    mod_range: int = 2**32,
    seed: int = 0,
) -> dict[str, object]:
    """Run Flower's SecAgg+ nodes under a lying server; return what it yields.

    Args:
        lie: one of :data:`LIES`.
        nodes: the nodes, all neighbours of each other (Flower's ``num_shares = nodes``).
        threshold: Flower's ``reconstruction_threshold``.
        length: values per node (uniform in ``[-clip, clip]``).
        victim_index: which node the server decodes.

    Returns:
        A JSON-ready record: whether the server decoded the victim's vector, the largest error
        against the victim's true input, Flower's quantization step, the shares collected of each
        secret, and any refusal a node raised.

    Raises:
        ValueError: an unknown lie.
    """
    if lie not in LIES:
        raise ValueError(f"lie must be one of {LIES}, got {lie!r}")
    fl = _flower()
    rng = np.random.default_rng(seed)
    inputs = rng.uniform(-clip, clip, (nodes, length))
    ids = [1000 + 17 * i for i in range(nodes)]  # Flower node ids (any distinct ints)
    victim = ids[victim_index]
    contexts = {
        nid: fl.Context(run_id=1, node_id=nid, node_config={}, state=fl.RecordDict(), run_config={})
        for nid in ids
    }

    key = fl.Key

    def send(nid: int, config: dict[str, object], content=None) -> dict[str, object]:
        record = fl.ConfigRecord(config)
        content = fl.RecordDict() if content is None else content
        content.config_records[fl.RECORD_KEY_CONFIGS] = record
        # The server's instruction message, with the metadata a SuperLink would set.
        metadata = fl.Metadata(
            run_id=1,
            message_id=f"{nid}-{config[key.STAGE]}",
            src_node_id=0,
            dst_node_id=nid,
            reply_to_message_id="",
            group_id="1",
            created_at=time.time(),
            ttl=3600.0,
            message_type=fl.MessageType.TRAIN,
        )
        message = fl.Message(content=content, metadata=metadata)
        row = inputs[ids.index(nid)]

        def fit(msg, ctxt):  # the node's training: its input, weight (num_examples) 1
            res = fl.FitRes(fl.Status(fl.Code.OK, ""), fl.ndarrays_to_parameters([row]), 1, {})
            return SimpleNamespace(content=fl.compat.fitres_to_recorddict(res, keep_input=True))

        reply = fl.secaggplus_mod(message, contexts[nid], fit)
        return dict(reply.content.config_records[fl.RECORD_KEY_CONFIGS])

    setup = {
        key.STAGE: fl.Stage.SETUP,
        key.SAMPLE_NUMBER: nodes,
        key.SHARE_NUMBER: nodes,
        key.THRESHOLD: threshold,
        key.CLIPPING_RANGE: clip,
        key.TARGET_RANGE: target_range,
        key.MOD_RANGE: mod_range,
        key.MAX_WEIGHT: 1.0,
    }
    public = {}
    for nid in ids:
        reply = send(nid, dict(setup))
        public[nid] = [reply[key.PUBLIC_KEY_1], reply[key.PUBLIC_KEY_2]]
    forward: dict[int, tuple[list[int], list[bytes]]] = {nid: ([], []) for nid in ids}
    for nid in ids:
        reply = send(nid, {key.STAGE: fl.Stage.SHARE_KEYS, **{str(v): public[v] for v in ids}})
        for dst, blob in zip(reply[key.DESTINATION_LIST], reply[key.CIPHERTEXT_LIST], strict=True):
            forward[dst][0].append(nid)
            forward[dst][1].append(blob)
    masked = {}
    for nid in ids:
        reply = send(
            nid,
            {
                key.STAGE: fl.Stage.COLLECT_MASKED_VECTORS,
                key.CIPHERTEXT_LIST: forward[nid][1],
                key.SOURCE_LIST: forward[nid][0],
            },
            fl.compat.fitins_to_recorddict(
                SimpleNamespace(parameters=fl.ndarrays_to_parameters([]), config={}), True
            ),
        )
        masked[nid] = [fl.bytes_to_ndarray(b) for b in reply[key.MASKED_PARAMETERS]]
    # The lie. The server holds every masked vector, the victim's included.
    others = [nid for nid in ids if nid != victim]
    told_dead = set(others[: len(others) // 2]) if lie == "split" else set(others)
    seed_shares, key_shares, refusals = [], [], {}
    for nid in others:
        active = [v for v in ids if not (v == victim and lie == "split" and nid in told_dead)]
        dead = [victim] if nid in told_dead else []
        try:
            reply = send(
                nid,
                {
                    key.STAGE: fl.Stage.UNMASK,
                    key.ACTIVE_NODE_ID_LIST: active,
                    key.DEAD_NODE_ID_LIST: dead,
                },
            )
        except Exception as error:  # a node's refusal is what is being measured
            refusals[str(nid)] = f"{type(error).__name__}: {error}"
            continue
        # Flower's reply lists the active nodes' seed shares first, then the dead nodes' sk1 ones.
        pairs = zip(reply[key.NODE_ID_LIST], reply[key.SHARE_LIST], strict=True)
        for position, (owner, share) in enumerate(pairs):
            if owner == victim:
                (seed_shares if position < len(active) else key_shares).append(share)
    record: dict[str, object] = {
        "lie": lie,
        "flwr_module": "flwr.client.mod.secaggplus_mod (driven directly, one process)",
        "nodes": nodes,
        "num_shares": nodes,
        "reconstruction_threshold": threshold,
        "length": length,
        "clipping_range": clip,
        "quantization_range": target_range,
        "modulus_range": mod_range,
        "victim_self_mask_seed_shares": len(seed_shares),
        "victim_mask_key_shares": len(key_shares),
        "node_refusals": refusals,
    }
    if len(seed_shares) < threshold or len(key_shares) < threshold:
        return record | {"decoded": False, "max_abs_error": None}
    decoded = _decode(
        fl,
        masked[victim],
        seed_shares,
        key_shares,
        victim,
        ids,
        public,
        clip,
        target_range,
        mod_range,
    )
    error = float(np.max(np.abs(decoded - inputs[victim_index])))
    return record | {
        "decoded": True,
        "max_abs_error": error,
        "quantization_step": 2 * clip / target_range,
    }


def _decode(fl, masked, seed_shares, key_shares, victim, ids, public, clip, target, mod):
    """The victim's vector from its masked upload and its two rebuilt secrets (Flower's code)."""
    arithmetic = fl.arithmetic
    shape = arithmetic.get_parameters_shape(masked)
    rd_seed = fl.combine_shares(seed_shares)
    sk1 = fl.combine_shares(key_shares)
    vector = arithmetic.parameters_subtraction(masked, fl.pseudo_rand_gen(rd_seed, mod, shape))
    for other in ids:
        if other == victim:
            continue
        shared = fl.generate_shared_key(
            fl.bytes_to_private_key(sk1), fl.bytes_to_public_key(public[other][0])
        )
        mask = fl.pseudo_rand_gen(shared, mod, shape)
        # The victim added the mask when its id is larger, subtracted it otherwise: undo it.
        if victim > other:
            vector = arithmetic.parameters_subtraction(vector, mask)
        else:
            vector = arithmetic.parameters_addition(vector, mask)
    vector = arithmetic.parameters_mod(vector, mod)
    q_ratio, vector = arithmetic.factor_extract(vector)
    values = fl.dequantize(vector, clip, target)[0]
    return np.asarray(values, dtype=np.float64) * (target / q_ratio)
