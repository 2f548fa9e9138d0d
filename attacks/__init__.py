"""Attacks that replay what an honest-but-curious server saw (a ServerView) and measure the leak.

* :mod:`attacks.gradient_inversion`: FedMF gradient inversion (Chai et al. 2020; specs/fedmf.md
  section 2): closed form from two rounds, rating-grid search from one.
* :mod:`attacks.item_inference`: which uploaded rows are rated items under hybrid filling
  (specs/fedmf.md section 3).
* :mod:`attacks.metrics`: exact share, RMSE, precision / recall / F1.
* :func:`verify`: every applicable attack on a view, with the chance baseline (docs/attacks.md).
* :mod:`attacks.policy_leak`: FedHPD, an agent's recent return from its uploaded action
  distributions (:func:`verify_policy_leak`).
* :mod:`attacks.qvalue_leak`: FedSlate, the user's hidden state from the platforms' Q-values
  (:class:`FusionRecorder`, :func:`verify_qvalue_leak`).

The two RL modules need torch and gymnasium (the ``rl`` extra); their names are exported lazily,
so ``import attacks`` works without them.

Note: ``attacks.verify`` is the function; the module is ``attacks.verify`` in ``sys.modules``
(import its helpers with ``from attacks.verify import ...``).
"""

from attacks.gradient_inversion import (
    ClientUpload,
    FedMFProtocol,
    Inversion,
    InversionError,
    extract_upload,
    invert_one_round,
    invert_two_rounds,
)
from attacks.item_inference import (
    combine_tests,
    intersection_test,
    rating_scale_test,
    update_consistency_test,
    upload_order_test,
)
from attacks.metrics import UserSets, item_metrics, overall_metrics, rating_metrics
from attacks.verify import ITEM_ATTACKS, LeakReport, verify

_LAZY = {
    "CloneConfig": "attacks.policy_leak",
    "PolicyLeakReport": "attacks.policy_leak",
    "PolicyProtocol": "attacks.policy_leak",
    "verify_policy_leak": "attacks.policy_leak",
    "FusionRecorder": "attacks.qvalue_leak",
    "QLeakConfig": "attacks.qvalue_leak",
    "QValueLeakReport": "attacks.qvalue_leak",
    "replay_truth": "attacks.qvalue_leak",
    "verify_qvalue_leak": "attacks.qvalue_leak",
}


def __getattr__(name: str):
    """Import the RL attacks' names on first use (they need torch and gymnasium)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attacks' has no attribute {name!r}")


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
