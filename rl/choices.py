"""The names FedSlate's and SlateQ's options choose among, importable without torch.

The command line builds its ``--help`` from these (``securefed fedslate --help`` imports no
torch); :mod:`securefed.rl.slateq` and :mod:`securefed.rl.fedslate` define what each means.
"""

from __future__ import annotations

SLATE_METHODS = ("topk", "greedy", "lp")
LOCAL_ARCHS = ("item", "flat")
CHOICE_MODEL_NAMES = ("true", "paper_code")
PLATFORM_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
VARIANTS = ("fedslate", "extended", "fedq", "linear")
SERVER_ARCHS = ("position", "flat")
ALIGNMENTS = ("position", "item")
PLATFORM_NAMES = tuple(PLATFORM_LETTERS)
