"""Shared by the FedSlate relay-key tests (pinning, freshness, their ``enrolment`` fixture in
conftest.py): an honest relay of one message round through the nodes' ``handle``."""

from securefed.flower import records as rec
from securefed.rl import flower_fedslate as ffs


def honest_exchange(run, stores, node_configs):
    """One message round handled by the nodes (their state round-tripped as Flower keeps it)."""

    def exchange(op, requests):
        replies = {}
        for role, (arrays, config) in requests.items():
            body = rec.content(arrays, config)
            records = body.array_records
            sent = rec.record_arrays(records[rec.ARRAYS]) if rec.ARRAYS in records else {}
            store = stores.setdefault(role, {})
            replies[role] = ffs.handle(
                run,
                role,
                store,
                dict(body.config_records[rec.CONFIG]),
                sent,
                node_config=node_configs.get(role, {}),
            )
        return replies

    return exchange
