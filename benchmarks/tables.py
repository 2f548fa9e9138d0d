"""The one markdown-table writer of the benchmarks (through ``tabulate``'s GitHub format).

Every benchmark formats its own cells (digits, units, "–" for none) and hands the strings here;
nothing is re-parsed as a number, so a cell reads exactly as it was formatted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tabulate import tabulate


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub markdown table; ``None`` cells are empty, others ``str()`` as given.

    Raises:
        ValueError: a row with more cells than there are headers.
    """
    headers = [str(h) for h in headers]
    body = []
    for row in rows:
        cells = ["" if cell is None else str(cell) for cell in row]
        if len(cells) > len(headers):
            raise ValueError(f"a row of {len(cells)} cells under {len(headers)} headers")
        body.append(cells + [""] * (len(headers) - len(cells)))
    return tabulate(body, headers=headers, tablefmt="github", disable_numparse=True)
