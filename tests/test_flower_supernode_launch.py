"""The SuperNode launcher: Flower's 3 s wait after an empty pull shortened, everything else
passed through, and any Flower but the one it was read against refused by name."""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import time

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the launcher needs flwr (pip install securefed[flower])")

from securefed.flower import supernode_launch as launch
from securefed.flower.loopback import LoopbackFederation, missing_commands


class RecordingTime:
    """A stand-in for the ``time`` module that records the sleeps it is asked for."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    def monotonic(self) -> float:
        return 42.0


def test_the_proxy_shortens_only_flowers_three_second_sleep():
    real = RecordingTime()
    proxy = launch.PullWaitTime(real, launch.PullWait(0.1))
    for seconds in (3, 0.5, 3.0, 1, 0.05):
        proxy.sleep(seconds)
    assert real.slept == [0.1, 0.5, 0.1, 1, 0.05]
    assert proxy.monotonic() == 42.0  # every other name reaches the module


def test_the_proxy_of_the_real_time_module_passes_its_functions_through():
    proxy = launch.PullWaitTime(time, launch.PullWait(0.2))
    assert proxy.monotonic is time.monotonic and proxy.time is time.time
    assert proxy.perf_counter is time.perf_counter and proxy.struct_time is time.struct_time


@pytest.mark.parametrize("seconds", [0.0, 0.001, 3.5, float("nan"), float("inf"), -1.0])
def test_a_pull_wait_outside_its_range_is_refused(seconds):
    with pytest.raises(ValueError, match="pull wait must be in"):
        launch.PullWait(seconds)


def test_the_installed_flower_passes_the_checks():
    """Fails the day flwr is upgraded: read the new pull loop, then update the launcher."""
    launch.check_installed()


def test_install_replaces_the_modules_time_with_the_proxy(monkeypatch):
    module = pytest.importorskip(launch.MODULE)
    monkeypatch.setattr(module, "time", time)  # undone after the test
    proxy = launch.install(launch.PullWait(0.25))
    assert module.time is proxy and proxy.wait.seconds == 0.25
    assert module.time.monotonic is time.monotonic
    with pytest.raises(launch.UnsupportedFlower, match="not the time module"):
        launch.install(launch.PullWait(0.25))  # patched already: refused, not stacked


def test_another_flower_version_is_refused_by_name(monkeypatch):
    module = pytest.importorskip(launch.MODULE)
    monkeypatch.setattr(launch, "installed_flower_version", lambda: "1.43.0")
    with pytest.raises(launch.UnsupportedFlower, match=r"flwr 1\.43\.0 is installed.*1\.42\.0"):
        launch.install(launch.PullWait())
    assert module.time is time  # refused before anything changed
    with pytest.raises(launch.UnsupportedFlower, match=r"flwr 1\.43\.0"):
        launch.check_installed()


def test_a_changed_line_is_refused_naming_what_is_there():
    module = pytest.importorskip(launch.MODULE)
    lines, start = inspect.getsourcelines(getattr(module, launch.FUNCTION))
    launch.check_source(lines, start)
    at = launch.LINE - start
    moved = [*lines[:at], "                time.sleep(5)\n", *lines[at + 1 :]]
    with pytest.raises(launch.UnsupportedFlower, match=r"line 263 is 'time\.sleep\(5\)'"):
        launch.check_source(moved, start)
    with pytest.raises(launch.UnsupportedFlower, match="outside the function"):
        launch.check_source(lines[:10], start)


def _fake_flower(tmp_path, name: str, also_elsewhere: bool):
    """A module whose ``start_client_internal`` sleeps 3 s at line 263, as Flower 1.42's."""
    body = ["import time\n", "\n", "def start_client_internal():\n"]
    body += ["    x = 0\n"] * (launch.LINE - 1 - len(body))
    body += ["    time.sleep(3)\n", "\n", "\n", "def other():\n"]
    body += ["    time.sleep(3)\n" if also_elsewhere else "    time.sleep(0.5)\n"]
    path = tmp_path / f"{name}.py"
    path.write_text("".join(body))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_second_three_second_sleep_in_the_module_is_refused(tmp_path):
    launch.check_module(_fake_flower(tmp_path, "fake_once", False), launch.FLOWER_VERSION)
    twice = _fake_flower(tmp_path, "fake_twice", True)
    with pytest.raises(launch.UnsupportedFlower, match="in 2 places"):
        launch.check_module(twice, launch.FLOWER_VERSION)


def test_a_flower_without_its_source_is_refused(monkeypatch):
    module = pytest.importorskip(launch.MODULE)

    def no_source(_):
        raise OSError("could not get source code")

    monkeypatch.setattr(launch.inspect, "getsourcelines", no_source)
    with pytest.raises(launch.UnsupportedFlower, match=r"cannot read .* source"):
        launch.check_module(module, launch.FLOWER_VERSION)


def test_the_arguments_split_into_the_wait_and_flowers_flags():
    wait, flower = launch.parse_arguments(["--pull-wait", "0.2", "--", "--insecure", "--port", "1"])
    assert wait == launch.PullWait(0.2) and flower == ["--insecure", "--port", "1"]
    wait, flower = launch.parse_arguments(["--", "--insecure"])
    assert wait.seconds == launch.DEFAULT_PULL_WAIT and flower == ["--insecure"]
    with pytest.raises(SystemExit):  # Flower's flags only after --
        launch.parse_arguments(["--insecure"])


def test_the_loopback_nodes_run_through_the_launcher_unless_told_not_to(tmp_path):
    short = LoopbackFederation(tmp_path / "short", 2)
    node = short.supernode_command(0, root_certificates=None, private_key=None)
    assert node[:6] == [
        sys.executable,
        "-m",
        "securefed.flower.supernode_launch",
        "--pull-wait",
        "0.1",
        "--",
    ]
    assert node[node.index("--node-config") + 1].startswith("partition-id=0 ")
    stock = LoopbackFederation(tmp_path / "stock", 2, supernode_pull_wait=None)
    node = stock.supernode_command(0, root_certificates=None, private_key=None)
    assert node[0].endswith("flower-supernode") and "securefed.flower.supernode_launch" not in node
    with pytest.raises(ValueError, match="pull wait"):
        LoopbackFederation(tmp_path / "bad", 2, supernode_pull_wait=0.0)


def test_a_loopback_federation_refuses_another_flower_before_starting_anything(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(launch, "installed_flower_version", lambda: "1.41.1")
    federation = LoopbackFederation(tmp_path, 1)
    with pytest.raises(launch.UnsupportedFlower, match=r"flwr 1\.41\.1"), federation:
        pass
    assert federation.processes == [] and not (tmp_path / "superlink.log").exists()


@pytest.mark.slow
def test_stock_and_launched_supernodes_train_the_same_model(example, tmp_path):
    """Real processes: the same seeded secure-aggregation run under the stock
    ``flower-supernode`` and under the launcher ends with the same model; only the launched
    nodes print the launcher's banner."""
    if missing := missing_commands():
        pytest.skip(f"{missing} not installed (pip install securefed[flower])")
    models, banners = {}, {}
    for wait in (None, 0.1):
        name = "stock" if wait is None else "launched"
        out = tmp_path / name / "out"
        app = example.FedMFApp(
            seed=0, rounds=2, transport="secagg", min_nodes=2, output_dir=str(out), timeout=300.0
        )
        from securefed.recsys.fedmf_flower import write_fedmf_app

        federation = LoopbackFederation(tmp_path / name / "federation", 2, supernode_pull_wait=wait)
        with federation:
            federation.submit(write_fedmf_app(tmp_path / name / "app", app.run_config()))
            federation.wait_for(out / "result.json", timeout=900)
        assert json.loads((out / "result.json").read_text())["nodes"] == 2
        models[name] = np.load(out / "server.npz")["V"]
        logs = [log for log in federation.logs if log.stem.startswith("supernode")]
        banners[name] = ["pull wait" in log.read_text(errors="replace") for log in logs]
    np.testing.assert_allclose(models["launched"], models["stock"], atol=1e-12)
    assert banners == {"stock": [False, False], "launched": [True, True]}


def test_the_benchmarks_pull_waits_are_the_stock_node_and_validated_seconds():
    from securefed.bench.bench_flower_deploy import parse_pull_waits, pull_wait_label

    assert parse_pull_waits("flower,0.1") == [None, 0.1]
    assert [pull_wait_label(w) for w in (None, 0.1)] == ["Flower 3 s", "launcher 0.1 s"]
    for bad in ("flower,flower", "0", "fast", ""):
        with pytest.raises(ValueError, match="--deploy-pull-waits"):
            parse_pull_waits(bad)
