"""The README's quickstart runs as written, and what it prints says what the README claims."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_code() -> str:
    """The first python block under the README's "## Quickstart" heading."""
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    if match is None:
        raise AssertionError("the README's Quickstart section has no python block")
    return match.group(1)


def test_the_readme_stays_short():
    assert len(README.read_text().splitlines()) < 200


def test_the_quickstart_runs_and_secure_aggregation_costs_no_accuracy(capsys):
    code = quickstart_code()
    assert len(code.splitlines()) <= 30
    exec(compile(code, str(README), "exec"), {"__name__": "readme_quickstart"})
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["plaintext", "secagg", "secagg+dp:epsilon=8"]
    rmse = {line.split()[0]: float(re.search(r"RMSE (\S+)", line).group(1)) for line in lines}
    assert abs(rmse["plaintext"] - rmse["secagg"]) < 1e-3  # fixed-point error only
    assert rmse["secagg+dp:epsilon=8"] > rmse["plaintext"]  # the noise costs some accuracy
    against = {line.split()[0]: re.search(r"server\s+(\S+)", line).group(1) for line in lines}
    assert against["plaintext"] == "inf" and float(against["secagg+dp:epsilon=8"]) <= 8.0 + 1e-9
    # every leak is printed beside its chance level; under masks the server is left at chance
    shares = {
        line.split()[0]: re.search(r"recovered (\S+)% \(chance (\S+)%\)", line).groups()
        for line in lines
    }
    assert shares["secagg"][0] == shares["secagg"][1] != shares["plaintext"][0]
    assert all(re.search(r"F1 \S+ \(chance \S+\)", line) for line in lines)
