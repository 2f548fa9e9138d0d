"""``securefed bench startup`` in an install without some extras (CI's [he,dp] wheel venv).

``securefed fedslate --help`` without the ``rl`` extra answers in one line and exit 2 by design;
the start-up bench must leave that screen out and say why, not crash on it.
"""

from __future__ import annotations

from securefed.bench import bench_startup, registry


def test_a_help_screen_whose_extra_is_missing_is_skipped_and_named(monkeypatch):
    monkeypatch.setattr(registry, "extra_installed", lambda extra: extra != "rl")
    screens = bench_startup.help_screens()
    assert ("fedslate", "--help") not in screens
    assert ("fedmf", "--help") in screens and ("--help",) in screens
    assert bench_startup.skipped_screens() == {"securefed fedslate --help": "needs the extra(s) rl"}
    assert all("fedslate" not in name for name in bench_startup.timed_commands("python"))


def test_with_every_extra_no_screen_is_skipped(monkeypatch):
    monkeypatch.setattr(registry, "extra_installed", lambda extra: True)
    assert bench_startup.help_screens() == bench_startup.HELP_SCREENS
    assert bench_startup.skipped_screens() == {}
