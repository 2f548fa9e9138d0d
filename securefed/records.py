"""Result records as strict JSON (RFC 8259): no ``Infinity`` or ``NaN`` tokens.

Python's :func:`json.dumps` writes a non-finite float as the bare tokens ``Infinity``,
``-Infinity`` and ``NaN``, which no strict JSON parser reads (JavaScript's ``JSON.parse``, jq,
most other languages). Every record securefed writes goes through :func:`dumps_record` instead,
which writes such a float as the *string* ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``: an
``epsilon_server`` of ``"Infinity"`` still says "no privacy against the server", and Python's
``float("Infinity")`` reads it back. :func:`loads_record` restores those strings to floats (it
also reads records written before, with the bare tokens).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping

__all__ = ["NON_FINITE_STRINGS", "dumps_record", "jsonable_record", "loads_record"]

NON_FINITE_STRINGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}
"""The strings a record holds for non-finite floats, and the floats they stand for."""


def _non_finite_string(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _strict(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else _non_finite_string(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_strict(item) for item in value]
    return value


def jsonable_record(value: object, *, default: Callable[[object], object] | None = None) -> object:
    """``value`` as the JSON values it writes (tuples as lists, keys as strings), non-finite
    floats as the strings of :data:`NON_FINITE_STRINGS`.

    Args:
        value: the record.
        default: converts the values JSON does not know, as in :func:`json.dumps`.
    """
    return _strict(json.loads(json.dumps(value, default=default)))


def dumps_record(
    value: object,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    default: Callable[[object], object] | None = None,
) -> str:
    """``value`` as strict JSON text; non-finite floats become strings (module docstring).

    Args:
        value: the record.
        indent: as in :func:`json.dumps`.
        sort_keys: as in :func:`json.dumps`.
        default: converts the values JSON does not know, as in :func:`json.dumps`.
    """
    strict = jsonable_record(value, default=default)
    return json.dumps(strict, indent=indent, sort_keys=sort_keys, allow_nan=False)


def _restore(value: object) -> object:
    if isinstance(value, str):
        return NON_FINITE_STRINGS.get(value, value)
    if isinstance(value, list):
        return [_restore(item) for item in value]
    return value


def _restore_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    return {key: _restore(item) for key, item in pairs}


def loads_record(text: str | bytes) -> object:
    """A record written by :func:`dumps_record`, its non-finite strings back as floats."""
    loaded = json.loads(text, object_pairs_hook=_restore_object)
    return _restore(loaded) if not isinstance(loaded, Mapping) else loaded
