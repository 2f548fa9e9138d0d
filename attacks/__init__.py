"""Attacks that replay what an honest-but-curious server saw (a ServerView) and measure the leak.

* :mod:`securefed.attacks.gradient_inversion`: FedMF gradient inversion (Chai et al. 2020;
  specs/fedmf.md section 2): closed form from two rounds, rating-grid search from one.
* :mod:`securefed.attacks.offset_inversion`: the values behind a private per-user offset and an
  unknown DP clip (the DP preset), and the algebra of an item-bias column.
* :mod:`securefed.attacks.item_inference`: which uploaded rows are rated items under hybrid filling
  (specs/fedmf.md section 3).
* :mod:`securefed.attacks.metrics`: exact share, RMSE, precision / recall / F1.
* :func:`verify`: every applicable attack on a view, with the chance baseline (docs/attacks.md).
* :mod:`securefed.attacks.policy_leak`: FedHPD, an agent's recent return from its uploaded action
  distributions (:func:`verify_policy_leak`).
* :mod:`securefed.attacks.qvalue_leak`: FedSlate, the user's hidden state from the platforms'
  Q-values in the fusion channel's view (:func:`read_inquiries`, :func:`verify_qvalue_leak`).

The two RL modules need torch and gymnasium (the ``rl`` extra); their names are exported lazily,
so ``import securefed.attacks`` works without them.

Note: ``securefed.attacks.verify`` is the function; the module of that name is in ``sys.modules``
(import its helpers with ``from securefed.attacks.verify import ...``).
"""

from securefed.attacks.gradient_inversion import (
    ClientUpload,
    FedMFProtocol,
    Inversion,
    InversionError,
    extract_upload,
    invert_one_round,
    invert_two_rounds,
)
from securefed.attacks.item_inference import (
    combine_tests,
    intersection_test,
    rating_scale_test,
    update_consistency_test,
    upload_order_test,
)
from securefed.attacks.metrics import UserSets, item_metrics, overall_metrics, rating_metrics
from securefed.attacks.verify import ITEM_ATTACKS, LeakReport, verify

_LAZY = {
    "CloneConfig": "securefed.attacks.policy_leak",
    "PolicyLeakReport": "securefed.attacks.policy_leak",
    "PolicyProtocol": "securefed.attacks.policy_leak",
    "verify_policy_leak": "securefed.attacks.policy_leak",
    "FusionRecord": "securefed.attacks.qvalue_leak",
    "QLeakConfig": "securefed.attacks.qvalue_leak",
    "QValueLeakReport": "securefed.attacks.qvalue_leak",
    "read_inquiries": "securefed.attacks.qvalue_leak",
    "replay_truth": "securefed.attacks.qvalue_leak",
    "verify_qvalue_leak": "securefed.attacks.qvalue_leak",
}


def __getattr__(name: str):
    """Import the RL attacks' names on first use (they need torch and gymnasium)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'securefed.attacks' has no attribute {name!r}")


__all__ = [
    "ITEM_ATTACKS",
    "ClientUpload",
    "FedMFProtocol",
    "Inversion",
    "InversionError",
    "LeakReport",
    "UserSets",
    "combine_tests",
    "extract_upload",
    "intersection_test",
    "invert_one_round",
    "invert_two_rounds",
    "item_metrics",
    "overall_metrics",
    "rating_metrics",
    "rating_scale_test",
    "update_consistency_test",
    "upload_order_test",
    "verify",
    *_LAZY,
]
