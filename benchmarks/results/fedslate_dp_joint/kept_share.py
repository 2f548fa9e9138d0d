"""A's kept share of the mean and final (last 50 episodes) gain over random, per member and over
the members together, from the bench's run records (``python kept_share.py DIR TAG NAME...``:
``DIR/TAG_plaintext.json`` and ``DIR/TAG_random.json`` are the references)."""

import json
import sys

import numpy as np


def platform_a(directory: str, name: str) -> np.ndarray:
    """``(episodes, members)`` platform A's episode rewards of one run record."""
    with open(f"{directory}/{name}.json") as handle:
        return np.array(json.load(handle)["rewards"])[:, :, 0]


def main(directory: str, tag: str, names: list[str]) -> None:
    plain, rand = platform_a(directory, f"{tag}_plaintext"), platform_a(directory, f"{tag}_random")
    for name in names:
        a = platform_a(directory, name)
        per_member = (a.mean(0) - rand.mean(0)) / (plain.mean(0) - rand.mean(0))
        kept = (a.mean() - rand.mean()) / (plain.mean() - rand.mean())
        final = (a[-50:].mean() - rand[-50:].mean()) / (plain[-50:].mean() - rand[-50:].mean())
        print(
            f"{name}: A mean {a.mean():.1f}, kept {kept:.2f} (per member "
            f"{np.round(per_member, 2).tolist()}), final {a[-50:].mean():.1f}, kept {final:.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
