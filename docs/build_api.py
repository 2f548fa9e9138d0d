"""Build the API reference from the docstrings (pdoc), failing on any warning of pdoc's.

Run: ``python docs/build_api.py [OUTPUT_DIR]`` (default ``build/api``; ``make docs``). Every
module of the installed ``securefed`` package is documented: a package that defines ``__all__``
shows only those names, so its modules are listed explicitly. Each warning pdoc raises (a type
annotation that does not resolve, a name in ``__all__`` that does not exist, a module that fails
to import) is an error: the build prints them and exits 1. Warnings of third-party packages raised
while importing securefed's optional extras are not pdoc's and are ignored.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from pathlib import Path


def module_names(root: str = "securefed") -> list[str]:
    """Every module under ``root``, parents before children, sorted."""
    package = importlib.import_module(root)
    names = [root]
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{root}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # running it would start the command line
        names.append(info.name)
    return sorted(names)


def pdoc_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """The warnings pdoc itself raised, as lines."""
    return [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if "pdoc" in Path(w.filename).parts and issubclass(w.category, UserWarning)
    ]


def main(argv: list[str]) -> int:
    import pdoc
    import pdoc.render

    output = Path(argv[0] if argv else "build/api")
    pdoc.render.configure(docformat="google", search=True, show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*module_names(), output_directory=output)
    problems = pdoc_warnings(caught)
    for line in problems:
        print(line, file=sys.stderr)
    pages = len(list(output.rglob("*.html")))
    print(f"API reference: {pages} pages in {output}; {len(problems)} pdoc warnings")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
