"""The wheel installs one import name: ``securefed`` (issue 16, "one import name").

The repository's layer folders install through pyproject.toml's package-dir mapping (recsys/ as
``securefed.recsys``, rl/ as ``securefed.rl``, attacks/ as ``securefed.attacks``, benchmarks/ as
``securefed.bench``). These tests build the wheel from a clean copy of the working tree, offline
(``pip wheel --no-deps --no-build-isolation --no-index``), and check what it holds and what an
install of it adds. .ci/run goes further: it installs the wheel with its extras into fresh virtual
environments and runs commands there.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
NOT_SOURCE = (".git", ".venv", "build", "dist", "results", "__pycache__", ".pytest_cache")
"""What a clean copy of the tree leaves out (build outputs and local state)."""


def package_folders(mapping: dict[str, str], root: Path = REPO_ROOT) -> dict[str, Path]:
    """Every package the mapped folders hold: ``{name: folder}``.

    A folder is a package when it and every folder between it and its mapped root have an
    ``__init__.py`` (recsys/flower_app/securefed_fedmf_app has one, but flower_app does not: the
    Flower app is package data, built by ``flwr run``, not an importable subpackage).
    """
    found = {}
    for package, folder in mapping.items():
        base = root / folder
        for init in sorted(base.rglob("__init__.py")):
            relative = init.parent.relative_to(base)
            chain = [base / Path(*relative.parts[:i]) for i in range(len(relative.parts) + 1)]
            if all((step / "__init__.py").is_file() for step in chain):
                found[".".join([package, *relative.parts])] = init.parent
    return found


DATA_PACKAGES = {
    "securefed.recsys.datasets": "recsys/datasets",
    "securefed.recsys.flower_app": "recsys/flower_app",
    "securefed.recsys.flower_app.securefed_fedmf_app": "recsys/flower_app/securefed_fedmf_app",
    "securefed.rl.flower_app": "rl/flower_app",
    "securefed.rl.flower_app.securefed_fedhpd_app": "rl/flower_app/securefed_fedhpd_app",
    "securefed.rl.flower_fedslate_app": "rl/flower_fedslate_app",
    "securefed.rl.flower_fedslate_app.securefed_fedslate_app": (
        "rl/flower_fedslate_app/securefed_fedslate_app"
    ),
}
"""Folders of package data, listed as packages so that setuptools ships them without warning
(the embedded data set and the Flower app, which ``flwr run`` builds rather than imports)."""


def test_the_packages_list_is_every_package_folder_and_the_data_folders():
    mapping = SETUPTOOLS["package-dir"]
    assert mapping == {
        "securefed": "securefed",
        "securefed.recsys": "recsys",
        "securefed.rl": "rl",
        "securefed.attacks": "attacks",
        "securefed.bench": "benchmarks",
    }
    assert all((REPO_ROOT / folder).is_dir() for folder in DATA_PACKAGES.values())
    assert sorted(SETUPTOOLS["packages"]) == sorted({*package_folders(mapping), *DATA_PACKAGES})


def test_the_console_script_is_the_lazy_cli():
    assert PYPROJECT["project"]["scripts"] == {"securefed": "securefed.bench.cli:main"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a clean copy of the working tree (offline)."""
    from importlib.metadata import version

    setuptools = version("setuptools")
    if int(setuptools.split(".")[0]) < 77:
        pytest.fail(f"building the wheel needs setuptools>=77 (the dev extra), found {setuptools}")
    source = tmp_path_factory.mktemp("source") / "securefed"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(*NOT_SOURCE, "*.egg-info", ".ruff_cache", ".hypothesis"),
    )
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    command += ["--no-index", "--verbose", "-w", str(out), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("securefed-*.whl")
    (out / "build.log").write_text(done.stdout + done.stderr)
    return built


def test_the_build_warns_of_no_package_it_would_ignore(wheel):
    """setuptools prints a ~30-line "Package would be ignored" banner for every folder of
    package data that is not a listed package (issue 29: three on every install)."""
    log = (wheel.parent / "build.log").read_text()
    assert "copying" in log  # the verbose build log was captured
    for banner in ("would be ignored", "is absent from the `packages` configuration"):
        assert banner not in log, log[log.find(banner) - 500 : log.find(banner) + 200]


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_holds_securefed_and_its_dist_info_alone(wheel):
    tops = {name.split("/")[0] for name in _names(wheel)}
    version = PYPROJECT["project"]["version"]
    assert tops == {"securefed", f"securefed-{version}.dist-info"}
    for stray in ("recsys", "rl", "attacks", "benchmarks", "securefed_cli.py", "tests"):
        assert stray not in tops


def test_every_module_lands_under_its_mapped_name(wheel):
    names = set(_names(wheel))
    expected = set()
    for package, folder in package_folders(SETUPTOOLS["package-dir"]).items():
        prefix = package.replace(".", "/")
        expected |= {f"{prefix}/{path.name}" for path in folder.glob("*.py")}
    assert expected <= names
    apps = (
        "securefed/recsys/flower_app/",
        "securefed/rl/flower_app/",
        "securefed/rl/flower_fedslate_app/",
    )
    assert {n for n in names if n.endswith(".py")} - expected == {
        n for n in names if n.startswith(apps) and n.endswith(".py")
    }


def test_the_embedded_data_set_and_the_flower_app_are_inside(wheel):
    names = set(_names(wheel))
    data = REPO_ROOT / "recsys" / "datasets" / "ml-latest-small"
    assert {f"securefed/recsys/datasets/ml-latest-small/{p.name}" for p in data.iterdir()} <= names
    assert "securefed/recsys/datasets/ml-latest-small/ratings.csv" in names
    # FedMF's, FedHPD's and FedSlate's Flower apps
    for folder in ("recsys/flower_app", "rl/flower_app", "rl/flower_fedslate_app"):
        app = REPO_ROOT / folder
        shipped = {
            f"securefed/{folder}/" + p.relative_to(app).as_posix()
            for p in app.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        assert shipped and shipped <= names
        assert f"securefed/{folder}/pyproject.toml" in names


def test_the_wheel_declares_the_console_script(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (entry,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        points = configparser.ConfigParser()
        points.read_string(archive.read(entry).decode())
        (top_level,) = [n for n in archive.namelist() if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["securefed"]
    assert dict(points["console_scripts"]) == {"securefed": "securefed.bench.cli:main"}


def test_an_install_adds_securefed_and_the_console_script_alone(wheel, tmp_path):
    target = tmp_path / "site"
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet"]
    command += ["--target", str(target), str(wheel)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    version = PYPROJECT["project"]["version"]
    assert sorted(p.name for p in target.iterdir()) == [
        "bin",
        "securefed",
        f"securefed-{version}.dist-info",
    ]
    assert [p.name for p in (target / "bin").iterdir()] == ["securefed"]
    # The installed copy, not this checkout, answers: -P keeps the working directory off the path.
    probe = (
        "import securefed, sys; from securefed.recsys.data import embedded_default_path; "
        "print(securefed.__file__); print(embedded_default_path()); "
        "from securefed.bench.cli import main; sys.exit(main(['fedmf', '--help']))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run(
        [sys.executable, "-P", "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    package_file, data_file = run.stdout.splitlines()[:2]
    assert Path(package_file).is_relative_to(target)
    assert Path(data_file).is_relative_to(target) and Path(data_file).name == "ratings.csv"
    assert "--transport" in run.stdout
