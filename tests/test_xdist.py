"""pytest-xdist: cells run on workers, their records ride on the test reports, the controller builds the
table, the JSON and results.jsonl from them (as a serial run does from its own reports)."""

import json
import re

import pytest

from helpers import NUMERICS, fake_matrix, run_doc

pytest.importorskip("xdist", reason="pytest-xdist is a test dependency (tox)")


def run(run_matrix, pytester, name, *args):
    out = pytester.path / f"{name}.json"
    result = run_matrix(
        fake_matrix(modes=["pass", "perturb", "nan", "fail"], args=', "--delta", "0.002"', extra=NUMERICS),
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / name}",
        *args,
    )
    result.assert_outcomes(passed=1, failed=3)
    table = [
        " ".join(re.sub(r"\d+s\b", "", line).split())
        for line in result.stdout.lines  # no times, no padding
        if line.startswith(("layout", "pass ", "perturb ", "nan ", "fail "))
    ]
    cells = [
        {k: c[k] for k in ("id", "status", "failure_class", "losses", "error_line", "failing_rank")}
        for c in run_doc(out)["cells"]
    ]
    return result, table, cells


def test_two_workers_give_the_table_and_json_of_a_serial_run(run_matrix, pytester):
    _, serial_table, serial_cells = run(run_matrix, pytester, "serial")
    result, table, cells = run(run_matrix, pytester, "xdist", "-n", "2")
    result.stdout.fnmatch_lines(["*created: 2/2 workers*", "*4 of 4 valid cells run (3 failed, 1 passed)*"])
    assert len(serial_table) == 5 and table == serial_table
    assert cells == serial_cells and [c["status"] for c in cells] == ["passed", "failed", "failed", "failed"]
    lines = [json.loads(x) for x in (pytester.path / "xdist" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in lines if r.get("type") == "cell") == sorted(c["id"] for c in cells)
    # one writer: the controller; each worker's cells, seeds and baselines live in its own folder
    logs = {c["id"]: c["log_dir"] for c in run_doc((pytester.path / "xdist.json"))["cells"]}
    assert all(re.search(r"/xdist/gw[01]/fake/", d) for d in logs.values()), logs


@pytest.mark.parametrize(
    "extra, message",
    [
        ("--simplefsdp-jobs=2", "--simplefsdp-jobs packs cells in one process; with pytest-xdist (-n) choose one"),
        ("--simplefsdp-dry-run", "--simplefsdp-dry-run lists the commands in one process: drop -n"),
    ],
    ids=["jobs", "dry-run"],
)
def test_what_cannot_work_under_xdist_says_so_at_start(run_matrix, extra, message):
    result = run_matrix(fake_matrix(), "-n", "2", extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])
