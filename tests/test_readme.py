"""The README's complete example of a matrix of one's own program runs as shown: its files, written as the README
has them, and its command give the outcome and the table the README states."""

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def examples():
    """{name: text} of every block the README marks with ``<!-- readme-example: NAME -->``."""
    text = README.read_text()
    out = {}
    for m in re.finditer(r"<!-- readme-example: (\S+) -->\n(```\w*\n(.*?)```|((?:    [^\n]*\n)+))", text, re.S):
        out[m.group(1)] = (
            m.group(3) if m.group(3) is not None else "".join(line[4:] + "\n" for line in m.group(4).splitlines())
        )
    return out


def test_the_readme_example_of_a_command_target_runs_as_shown(pytester):
    found = examples()
    assert set(found) == {"toy_train.py", "toy.yaml", "known_failures.yaml", "command"}
    for name in ("toy_train.py", "toy.yaml", "known_failures.yaml"):
        (pytester.path / name).write_text(found[name])
    argv = shlex.split(found["command"].strip())
    assert argv[:2] == ["pytest", "--simplefsdp-matrix"]
    result = pytester.runpytest_subprocess(*argv[1:], "-p", "no:cacheprovider", timeout=600)
    result.assert_outcomes(passed=3, xfailed=2)
    said = README.read_text().split("<!-- readme-example: command -->", 1)[1]
    table = re.search(r"and this table:\n\n((?:    .*\n)+)", said).group(1)
    for line in table.splitlines():  # the README's table, its times (and so its column widths) aside
        result.stdout.fnmatch_lines(["*".join(re.sub(r"\d+s\b", "*s", line).split())])
    result.stdout.fnmatch_lines(
        [
            "*dp2-sum: [[]xfailed numerics[]] known failure toy-summed-gradients *"
            "loss differs from baseline dp1-mean at step 2*"
        ]
    )
    # without the entry the same run is red: its summed cells (those the entry matched; the passing ones and their
    # baseline do not read the file) fail and the run exits 1
    (pytester.path / "known_failures.yaml").unlink()
    again = pytester.runpytest_subprocess(*argv[1:], "-k", "sum", "-p", "no:cacheprovider", timeout=600)
    again.assert_outcomes(failed=2)
    again.stdout.fnmatch_lines(["*dp2-sum: [[]failed numerics[]] loss differs from baseline *dp1-mean at step 2*"])
    assert again.ret == 1


def first_commands():
    """The pytest commands of the README's first command block, in order, without their comments."""
    block = re.search(r"\n\n((?:    \S[^\n]*\n)+)", README.read_text()).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip().startswith("pytest")]


def test_the_readme_starts_with_what_launches_nothing_then_the_smoke_tier(pytester):
    """A newcomer's first command shows what would run and launches nothing; the second runs the few smoke cells;
    the whole profile (25 minutes on CPU) only after. The first, run as shown, says it in a screenful or so."""
    pytest.importorskip("torchtitan")
    commands = first_commands()
    assert commands[0] == "pytest --simplefsdp-matrix --simplefsdp-dry-run", commands
    assert commands[1] == "pytest --simplefsdp-matrix -m smoke", commands
    result = pytester.runpytest_subprocess(*shlex.split(commands[0])[1:], "-p", "no:cacheprovider", timeout=600)
    assert result.ret == 0, result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert "simplefsdp dry run: cells" in out and len(out) < 64_000, len(out)
    assert not (pytester.path / ".simplefsdp").exists()  # nothing launched, nothing written
