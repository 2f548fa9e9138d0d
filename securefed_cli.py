"""Entry point of the ``securefed`` console script.

It binds the name ``benchmarks`` to this distribution's app-layer package before importing the
CLI: Opacus 1.6 ships a stray top-level ``benchmarks`` package of its own, which would otherwise
shadow ours in editable installs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _bind_benchmarks() -> None:
    package_dir = Path(__file__).resolve().parent / "benchmarks"
    current = sys.modules.get("benchmarks")
    if current is not None and Path(getattr(current, "__file__", "") or "").parent == package_dir:
        return
    spec = importlib.util.spec_from_file_location(
        "benchmarks", package_dir / "__init__.py", submodule_search_locations=[str(package_dir)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = module
    spec.loader.exec_module(module)


def main(argv: list[str] | None = None) -> int:
    _bind_benchmarks()
    from benchmarks.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
