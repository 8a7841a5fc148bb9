"""History per cell (store.history, judge.history): every judged cell appended to one SQLite file across runs;
a new failure that failed the same way before on the same versions and passed since gets more confirming runs
(never a flaky verdict of its own); the report tool's --format history shows each cell's streak."""

import json
import subprocess
import sys

from pytest_simplefsdp.store.history import History

from helpers import fake_matrix, run_doc


def cell(status, error=None, versions=None, cell_id="c"):
    return {
        "id": cell_id,
        "status": status,
        "failure_class": "runtime" if error else None,
        "signature": error,
        "versions": versions or {"torch": "2.14.1", "torchtitan": "0.3.0"},
        "log_dir": "",
    }


def test_rows_are_kept_per_profile_cell_and_versions_newest_first(tmp_path):
    h = History(tmp_path / "h.sqlite")
    assert h.of("cpu", "c", {"torch": "2.14.1"}) == []  # no file yet: nothing, and nothing made
    assert not (tmp_path / "h.sqlite").exists()
    h.append("runs/1", "2026-12-01T00:00:00", "cpu", cell("failed", "RuntimeError: boom"))
    h.append("runs/2", "2026-12-02T00:00:00", "cpu", cell("passed"))
    h.append(
        "runs/3", "2026-12-03T00:00:00", "cpu", cell("passed", versions={"torch": "2.15.0", "torchtitan": "0.3.0"})
    )
    h.append("runs/3", "2026-12-03T00:00:00", "gpu", cell("failed", "RuntimeError: boom"))
    h.close()
    got = History(tmp_path / "h.sqlite").of("cpu", "c", {"python": "3.11", "torch": "2.14.1", "torchtitan": "0.3.0"})
    assert [(r["run"], r["status"], r["signature"]) for r in got] == [
        ("runs/2", "passed", None),
        ("runs/1", "failed", "RuntimeError: boom"),
    ]
    assert len(History(tmp_path / "h.sqlite").of("cpu", "c", {"torch": "2.14.1", "torchtitan": "0.3.0"}, limit=1)) == 1
    streaks = History(tmp_path / "h.sqlite").streaks()
    assert [(p, v["torch"], len(r)) for p, c, v, r in streaks] == [
        ("cpu", "2.14.1", 2),
        ("cpu", "2.15.0", 1),
        ("gpu", "2.14.1", 1),
    ]


def test_a_failure_that_fails_every_run_is_new_whatever_its_history_says(run_matrix, pytester, monkeypatch):
    """Issue 58, Why 1: one history store, one fake cell (its torchtitan's says-file decides): a failure whose
    confirming run passes (flaky, new), a clean run, then the same error on every run. The third run's own runs all
    fail: new (on the landed revision: `flaky, new: failed the same way in run ...`), after more runs than
    --simplefsdp-confirm for its flaky past (history 1 pass in 2: 7 runs make a pass 99 % likely); the report tool
    shows the streak and judges the stored run the same."""
    says, out = pytester.path / "says.txt", pytester.path / "run.json"
    monkeypatch.setenv("FAKE_TORCHTITAN_SAYS", str(says))
    text = fake_matrix(modes=["pass"], args=', "--torchtitan-says"')

    def run(said, *args):
        says.write_text(said)
        return run_matrix(text, f"--simplefsdp-json={out}", *args)

    run("pass flaky\n", "--simplefsdp-confirm=2").assert_outcomes(failed=1)  # fails its first run, passes its second
    first = run_doc(out)["cells"][0]
    assert (first["flaky"], first["history"], first["confirm"]["runs"]) == (True, None, 2)
    assert first["verdict"].startswith("flaky, new: passed 1 of 2 runs")
    run("").assert_outcomes(passed=1)
    result = run("pass fail\n")  # (--simplefsdp-confirm=1: no confirming run but for its past)
    result.assert_outcomes(failed=1)
    again = run_doc(out)["cells"][0]
    assert again["flaky"] is False
    assert again["confirm"]["runs"] == 7 and again["confirm"]["passed"] == 0
    assert again["confirm"]["why"].startswith("its history shows it flaky: it failed the same way in run ")
    assert again["verdict"].startswith("new: failed in every one of 7 runs; its history shows it flaky: ")
    assert again["verdict"].endswith("so it was run more times, and failed every one")
    assert [r["status"] for r in again["history"]["runs"]] == ["passed", "failed"]
    store = pytester.path / ".simplefsdp" / "history.sqlite"
    report = subprocess.run(
        [sys.executable, "-m", "pytest_simplefsdp.report", str(store), "--format", "history"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "history: 1 cells (per profile and versions), their last 10 runs at most; 1 both passed and failed" in report
    line = next(x for x in report.splitlines() if "pass-r2" in x)
    assert "1/3" in line and "1 failed" in line and "[runtime]" in line
    # the stored run judged again by the report tool: new, as the live run said
    rejudged = json.loads(
        subprocess.run(
            [sys.executable, "-m", "pytest_simplefsdp.report", str(out), "--format", "json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert (rejudged["runs"][0]["cells"][0]["verdict"], rejudged["runs"][0]["cells"][0]["flaky"]) == (
        again["verdict"],
        False,
    )


def test_collecting_or_history_off_writes_no_store(run_matrix, pytester):
    run_matrix(fake_matrix(modes=["pass"]), "--co")
    assert not (pytester.path / ".simplefsdp" / "history.sqlite").exists()
    run_matrix(fake_matrix(modes=["pass"]), "--simplefsdp-history=off").assert_outcomes(passed=1)
    assert not (pytester.path / ".simplefsdp" / "history.sqlite").exists()
    elsewhere = pytester.path / "h" / "mine.sqlite"
    run_matrix(fake_matrix(modes=["pass"]), f"--simplefsdp-history={elsewhere}").assert_outcomes(passed=1)
    assert [(p, c, [r["status"] for r in rows]) for p, c, _, rows in History(elsewhere).streaks()] == [
        ("fake", "pass-r2", ["passed"])
    ]


def test_the_report_tool_refuses_a_file_that_is_not_a_history_store(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "pytest_simplefsdp.report", str(bad), "--format", "history"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and f"{bad}: not a history store" in done.stderr


def test_an_unreadable_store_warns_and_judges_without_history(run_matrix, pytester, monkeypatch):
    """A history file that is not SQLite (a half-copied store, another file at its path): the failing cell is judged
    new as without history, the run's records stand, and the store's trouble is said once, not raised."""
    says, out, store = pytester.path / "says.txt", pytester.path / "run.json", pytester.path / "h.sqlite"
    monkeypatch.setenv("FAKE_TORCHTITAN_SAYS", str(says))
    says.write_text("pass fail\n")
    store.write_bytes(b"not a database, " * 256)
    result = run_matrix(
        fake_matrix(modes=["pass"], args=', "--torchtitan-says"'),
        f"--simplefsdp-json={out}",
        f"--simplefsdp-history={store}",
    )
    result.assert_outcomes(failed=1)
    rec = run_doc(out)["cells"][0]
    assert (rec["status"], rec["flaky"], rec["history"]) == ("failed", False, None)
    result.stdout.fnmatch_lines([f"*the history store {store} could not be read (file is not a database)*"])
    assert store.read_bytes() == b"not a database, " * 256  # left as it was
