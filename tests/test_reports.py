"""Reports that never say more than what ran: counts of the valid cells run, features Partly run, rows not run shown
as ·; no report written without a run; the update command leaves a file the next run accepts; a known flaky cell is
never newly broken or fixed; the report tool judges with the file that judged the run; text from a rank stays text
in every output; which combination fails; the triage page in a real headless browser; progress while a cell runs."""

import json
import os
import shutil
import subprocess
import textwrap
import xml.etree.ElementTree as ET

import pytest

from helpers import KF, NUMERICS, fake_matrix, report_tool, run_doc

pytestmark = pytest.mark.fake

TWELVE = """\
profile: twelve
target:
  command: ["{python}", "%s", "--mode", "pass", "--dump", "{dump_folder}", "--steps", "3"]
device: cpu
world_sizes: [2]
timeout: 30
settings: {steps: 3}
axes:
  model: [llama3, deepseek_v3]
  pp: [1, 2]
  compile: [eager, aot_fx_trace, jit]
ids:
  pp: {prefix: pp, omit: 1}
"""


def test_a_k_run_says_how_many_cells_ran_and_never_calls_a_feature_done(run_matrix, pytester):
    """12 valid fake cells; -k runs 3 of them: the markdown and the page say "3 of 12 valid cells run", PP (2 of its
    6 cells ran) is Partly run and never Done, and the model that did not run is in the grids, as ·."""
    from helpers import FAKE_RANK

    md, html = pytester.path / "status.md", pytester.path / "page.html"
    result = run_matrix(
        TWELVE % FAKE_RANK,
        "-k",
        "llama3 and (eager or pp2) and not jit",
        f"--simplefsdp-status-md={md}",
        f"--simplefsdp-html={html}",
    )
    result.assert_outcomes(passed=3)
    status = md.read_text()
    assert "## Profile twelve — 3 of 12 valid cells run (3 passed); 0 combinations n/a" in status
    assert "- [Partly run] PP (pp > 1): 2 of 6 cells run, 2 pass" in status
    assert "[Done]" not in status  # nothing ran all of its valid cells
    assert "### deepseek_v3: 0 of 6 valid cells run" in status  # a model that did not run is shown
    assert "·" in status.split("### deepseek_v3")[1]
    page = html.read_text()
    assert "3 of 12 valid cells run" in page and "[Partly run] PP (pp &gt; 1): 2 of 6 cells run, 2 pass" in page


def test_collect_only_dry_run_and_plan_write_no_report(run_matrix, pytester):
    """Every report option set (the ini keys too): --co, the dry run and the plan leave existing files as they were."""
    out = {name: pytester.path / name for name in ("s.md", "r.json", "page.html", "cov.md")}
    run_matrix(
        fake_matrix(),
        *(f"--simplefsdp-{o}={out[n]}" for o, n in (("status-md", "s.md"), ("json", "r.json"), ("html", "page.html"))),
    )
    before = {n: p.read_bytes() for n, p in out.items() if p.exists()}
    assert set(before) == {"s.md", "r.json", "page.html"}
    runs = sorted((pytester.path / "runs").rglob("*"))
    pytester.makeini(f"[pytest]\nsimplefsdp_status_md = {out['s.md']}\nsimplefsdp_json = {out['r.json']}\n")
    for extra in (["--co"], ["--simplefsdp-dry-run"], ["--simplefsdp-plan"]):
        result = run_matrix(
            fake_matrix(), *extra, f"--simplefsdp-html={out['page.html']}", f"--simplefsdp-coverage={out['cov.md']}"
        )
        assert result.ret in (0, 5), result.stdout.str()[-2000:]
        assert {n: p.read_bytes() for n, p in out.items() if p.exists()} == before, extra
        assert sorted((pytester.path / "runs").rglob("*")) == runs, extra  # no stored run touched


@pytest.mark.parametrize(
    "held",
    ["", "[]\n", "# only a comment\n", "# header\n[]  # none yet\n", KF],
    ids=["empty", "empty-list", "comment-only", "comment-and-list", "entries"],
)
def test_the_update_command_leaves_a_file_the_next_run_accepts(run_matrix, pytester, held):
    kf = pytester.path / "kf.yaml"
    kf.write_text(held)
    modes = ["pass", "fail", "exit3"]
    run_matrix(
        fake_matrix(modes=modes), f"--simplefsdp-known-failures={kf}", "--simplefsdp-update-known-failures"
    ).stdout.fnmatch_lines(["*added fake-exit3 for 1 cell (link: 'TODO: *"])
    new = kf.read_text()
    for line in held.splitlines():
        if line.startswith("#"):
            assert line in new  # comments stay
    assert "- id: fake-exit3" in new and not list(pytester.path.glob(".kf.yaml.*"))  # no temporary file left
    again = run_matrix(fake_matrix(modes=modes), f"--simplefsdp-known-failures={kf}")
    again.assert_outcomes(passed=1, xfailed=2)
    again.stdout.fnmatch_lines(["*known-failure entries have no link yet (TODO*fake-exit3*"])
    assert "XPASS" not in again.stdout.str()


def test_a_green_run_says_its_numerics_and_evidence_in_a_few_lines_and_lists_them_under_v(run_matrix):
    """pytest's convention: details for failures, more with -v. Four passing cells compared with their baseline:
    no line per cell unless asked."""
    text = fake_matrix(modes=["pass", "perturb"], ranks=(2, 4), args=', "--delta", "0.00002"', extra=NUMERICS)
    quiet = run_matrix(text)
    quiet.assert_outcomes(passed=4)
    out = quiet.stdout.str()
    quiet.stdout.fnmatch_lines(
        [
            "numerics: 4 cells compared with their baselines (2 bitwise equal, 2 within their tolerances)",
            "    (-v lists them per cell)",
        ]
    )
    assert " vs pass-r" not in out and "numerics (" not in out
    section = out.split("simplefsdp composability")[1]
    assert len(section.splitlines()) <= 14, section
    verbose = run_matrix(text, "-v")
    verbose.stdout.fnmatch_lines(["numerics (*", "    pass-r2 vs pass-r2: lane exact*", "    perturb-r4 vs pass-r4*"])


FLAKY_KF = (
    KF.replace("fake-known", "fake-flaky")
    .replace("mode: fail", "mode: pass")
    .replace("kind: xfail", "kind: flaky\n  pass_rate: 0.5")
)


def test_the_status_markdown_pastes_as_it_is(run_matrix, pytester):
    """No machine path as text, every ➖ with its rule's reason, a known flaky cell that passed shown as a pass,
    counts in the singular where they are one."""
    kf = pytester.path / "kf.yaml"
    kf.write_text(FLAKY_KF + KF)
    md = pytester.path / "out" / "status.md"
    rule = (
        "rules:\n  - name: exit3-on-two\n    drop_if: \"mode == 'exit3' and ranks == 4\"\n    reason: two ranks only\n"
    )
    run_matrix(
        fake_matrix(modes=["pass", "fail", "exit3"], ranks=(2, 4), extra=rule),
        f"--simplefsdp-known-failures={kf}",
        f"--simplefsdp-status-md={md}",
    ).assert_outcomes(passed=2, xfailed=2, failed=1)
    first = run_matrix(fake_matrix(), f"--simplefsdp-json={pytester.path / 'old.json'}")
    assert first.ret == 0
    again = run_matrix(
        fake_matrix(modes=["pass", "fail", "exit3"], ranks=(2, 4), extra=rule),
        f"--simplefsdp-known-failures={kf}",
        f"--simplefsdp-status-md={md}",
        f"--simplefsdp-compare={pytester.path / 'old.json'}",
    )
    text = md.read_text()
    assert str(pytester.path) not in text, [line for line in text.splitlines() if str(pytester.path) in line]
    assert "judged against `../kf.yaml`" in text and "**Changes since `../old.json`:**" in text
    assert "| exit3    | ❌[^" in text and "ruled out by rule `exit3-on-two`: `two ranks only`" in text
    grid_row = next(line for line in text.splitlines() if line.startswith("| pass "))
    assert grid_row.count("✅🔁") == 2, grid_row
    assert "1 combination n/a" in text and "- mode=exit3: 1 cell:" in text
    assert again.ret == 1


def test_a_plain_run_writes_its_page_beside_its_records_and_says_where(run_matrix, pytester):
    result = run_matrix(fake_matrix(modes=["pass", "fail"]))
    page = pytester.path / "runs" / "index.html"
    result.stdout.fnmatch_lines(
        [
            "results: runs/results.jsonl",  # (relative to the rootdir, as pytest's paths)
            "html page: runs/index.html (--simplefsdp-html=PATH writes it elsewhere*",
        ]
    )
    text = page.read_text()
    assert "fail-r2" in text and "RuntimeError: fake failure on purpose" in text


def test_the_update_command_drafts_one_entry_per_bug_with_the_axes_it_needs(run_matrix, pytester):
    """Four cells fail, two bugs (two signatures), on both rank counts: two entries, each pinned to the mode alone
    (the rank count is no condition: cells of every count fail and pass). The next run xfails all four."""
    kf = pytester.path / "kf.yaml"
    kf.write_text("")
    matrix = fake_matrix(modes=["pass", "fail", "exit3"], ranks=(2, 4))
    result = run_matrix(matrix, f"--simplefsdp-known-failures={kf}", "--simplefsdp-update-known-failures")
    result.stdout.fnmatch_lines(["*added fake-fail for 2 cells (link: 'TODO*", "*added fake-exit3 for 2 cells*"])
    new = kf.read_text()
    assert new.count("- id: ") == 2 and "when: {profile: fake, mode: fail}" in new, new
    assert "2 cells: fail-r2, fail-r4" in new
    again = run_matrix(matrix, f"--simplefsdp-known-failures={kf}")
    again.assert_outcomes(passed=2, xfailed=4)


def test_a_drafted_entry_names_the_values_of_an_axis_its_cells_differ_on(tmp_path):
    """A failure on tp 2 and 4 (never 1) is one entry with ``tp: [2, 4]``, which loads and matches both."""
    from pytest_simplefsdp.judge.known import applies, load_known_failures
    from pytest_simplefsdp.judge.results import CellResult
    from pytest_simplefsdp.judge.update import drafts, update_file

    def cell(tp, pp):
        return CellResult(
            f"tp{tp}-pp{pp}",
            {"tp": tp, "pp": pp},
            status="failed",
            failure_class="runtime",
            error_line="boom",
            signature="boom",
        )

    failing = [cell(2, 2), cell(4, 2)]
    passing = [{"tp": t, "pp": p} for t, p in ((1, 1), (1, 2), (2, 1), (4, 1))]
    (draft,) = drafts("p", failing, passing)
    assert draft.id == "p-tp2_4-pp2" and draft.when == [("tp", [2, 4]), ("pp", 2)]
    kf = tmp_path / "kf.yaml"
    update_file(kf, [draft], set(), "2026-12-04", check=lambda p: load_known_failures(p, {"tp", "pp"}))
    (entry,) = load_known_failures(kf, {"tp", "pp"}).entries
    assert "when: {profile: p, tp: [2, 4], pp: 2}" in kf.read_text()
    env = {"profile": "p"}
    assert [applies(entry, c.axes, env) for c in failing] == [True, True]
    assert not any(applies(entry, axes, env) for axes in passing)


def test_the_update_never_replaces_the_file_with_one_that_would_not_load(tmp_path):
    from pytest_simplefsdp.judge.known import load_known_failures
    from pytest_simplefsdp.judge.results import CellResult
    from pytest_simplefsdp.judge.update import Draft, update_file
    from pytest_simplefsdp.yamlio import MatrixError

    kf = tmp_path / "kf.yaml"
    kf.write_text(KF)
    result = CellResult(
        "c", {"mode": "x"}, status="failed", failure_class="runtime", error_line="boom", signature="boom"
    )
    with pytest.raises(MatrixError):  # the check refuses the new text: the old file stays byte for byte
        update_file(
            kf,
            [Draft("fake", [result], [("mode", "x")])],
            set(),
            "2026-12-03",
            check=lambda p: load_known_failures(p, {"no-such-axis"}),
        )
    assert kf.read_text() == KF and not list(tmp_path.glob(".kf.yaml.*"))


def test_a_known_flaky_cell_that_flips_is_a_flip_never_newly_broken_or_fixed():
    from pytest_simplefsdp.report.compare import compare_runs

    meta = {"profile": "p"}

    def run(status, cls):
        return {
            "runs": [
                {
                    "meta": meta,
                    "cells": [
                        {
                            "id": "c",
                            "status": status,
                            "failure_class": cls,
                            "flaky": True,
                            "known_failure": "f",
                            "signature": "boom",
                        }
                    ],
                }
            ]
        }

    assert compare_runs(run("passed", None), run("xfailed", "crash")) == {"p::c": "flaky flip"}
    assert compare_runs(run("xfailed", "crash"), run("passed", None)) == {"p::c": "flaky flip"}


def test_the_report_tool_judges_with_the_runs_own_file_says_so_and_gates(run_matrix, pytester):
    kf = pytester.path / "mine.yaml"
    kf.write_text(KF)
    js = pytester.path / "run.json"
    run_matrix(
        fake_matrix(modes=["pass", "fail", "exit3"]), f"--simplefsdp-known-failures={kf}", f"--simplefsdp-json={js}"
    )
    assert run_doc(js)["meta"]["known_failures"]["path"] == str(kf.resolve())
    proc = report_tool(js)
    assert proc.returncode == 0 and f"re-judged against {kf.resolve()}, the file that judged the run" in proc.stderr
    assert "xfail" in proc.stdout  # fail-r2 stays a known failure: not re-judged against the shipped file
    gate = report_tool(js, "--gate")
    assert gate.returncode == 1 and "gate: 1 cell fails: exit3-r2" in gate.stderr
    kf.write_text(KF + "# changed\n")
    assert "(changed since: it no longer has the bytes that judged the run)" in report_tool(js).stderr


HOSTILE = (
    "RuntimeError: <script>alert(1)</script> | <img src=x onerror=alert(2)> **bold** [x](javascript:alert(3)) `tick`"
)


def test_text_from_a_rank_is_data_in_markdown_page_and_junit(run_matrix, pytester):
    md, html, xml = pytester.path / "s.md", pytester.path / "page.html", pytester.path / "junit.xml"
    run_matrix(
        fake_matrix(modes=["fail"], args=', "--error", %s' % json.dumps(HOSTILE)),
        f"--simplefsdp-status-md={md}",
        f"--simplefsdp-html={html}",
        f"--junitxml={xml}",
    )
    status = md.read_text()
    assert f"`` {HOSTILE} ``" in status  # a code span (a fence longer than the backtick inside): shown, not rendered
    page = html.read_text()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img src=x" not in page
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).iter("property")}
    assert props["error_line"] == HOSTILE  # plain text in an attribute, escaped by junit-xml


def test_which_combination_fails_on_a_grid_where_the_answer_is_known():
    """Cells fail exactly where pp=2 and compile=aot_fx_trace (any model): that pair, nothing more, nothing less."""
    from pytest_simplefsdp.report.combos import failing_combinations

    cells = []
    for model in ("llama3", "deepseek_v3"):
        for pp in (1, 2):
            for compile_ in ("eager", "aot_fx_trace", "jit"):
                bad = pp == 2 and compile_ == "aot_fx_trace"
                cells.append(
                    {
                        "id": f"{model}-{pp}-{compile_}",
                        "axes": {"model": model, "pp": pp, "compile": compile_},
                        "status": "failed" if bad else "passed",
                        "failure_class": "compile" if bad else None,
                        "signature": "dynamic shapes: Eq(uN + uN, N)" if bad else "",
                    }
                )
    found = failing_combinations({"cells": cells})
    assert len(found) == 1 and found[0].label() == "pp=2 + compile=aot_fx_trace" and found[0].separated
    assert sorted(found[0].cells) == ["deepseek_v3-2-aot_fx_trace", "llama3-2-aot_fx_trace"]
    alone = failing_combinations({"cells": [c for c in cells if c["status"] == "failed"]})
    assert not alone[0].separated  # no passing neighbour ran: only what they share, said so


def test_which_combination_fails_names_every_axis_the_failure_needs_when_no_neighbour_is_one_axis_away():
    """The shipped profile's shape: eager cells have memory_policy none, aot_fx_trace cells mp_default, so an eager
    cell and its compiled twin differ in two axes. TP fails only compiled with PP (16 of 20 TP cells pass): the
    answer is tp + pp + compile, not "tp=2". One bug whose losses differ in size (10.7, 1e+12, nan) is one line."""
    from pytest_simplefsdp.report.combos import failing_combinations

    cells = []
    for dp, tp in ((d, t) for d in (1, 2) for t in (1, 2, 4)):
        for pp in (1, 2):
            for compile_, mp in (("eager", "none"), ("aot_fx_trace", "mp_default")):
                axes = {"model": "llama3", "dp_shard": dp, "tp": tp, "pp": pp, "compile": compile_, "memory_policy": mp}
                bad = tp > 1 and pp == 2 and compile_ == "aot_fx_trace"
                loss = {(1, 2): "10.7", (2, 2): "1.5e+12"}.get((dp, tp), "nan")
                cells.append(
                    {
                        "id": f"dp{dp}-tp{tp}-pp{pp}-{compile_}",
                        "axes": axes,
                        "status": "failed" if bad else "passed",
                        "failure_class": "numerics" if bad else None,
                        "error_line": f"loss is {loss} at step 2" if bad else None,
                    }
                )
    found = failing_combinations({"cells": cells})
    assert [(c.label(), len(c.cells), c.separated) for c in found] == [
        ("tp=2|4 + pp=2 + compile=aot_fx_trace", 4, True)
    ]
    only_tp2 = [c for c in cells if c["axes"]["tp"] != 4]
    assert [c.label() for c in failing_combinations({"cells": only_tp2})] == ["tp=2 + pp=2 + compile=aot_fx_trace"]


def test_options_only_a_matrix_run_reads_are_refused_without_it(pytester):
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("--simplefsdp-json=x.json", "--simplefsdp-matrix-file=m.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*--simplefsdp-matrix-file, --simplefsdp-json: only a matrix run reads these options;"
            " add --simplefsdp-matrix*"
        ]
    )
    help_ = pytester.runpytest_subprocess("--help").stdout.str()
    assert (
        "--simplefsdp-json=PATH" in help_ and "--simplefsdp-timeout=SECONDS" in help_ and "SIMPLEFSDP_JSON" not in help_
    )
    for profile in ("cpu", "h100x8", "h100x4", "titan02-cpu", "titan02-h100x8", "titan02-h100x4", "upstream"):
        assert profile in help_


def test_a_bare_compare_takes_the_newest_stored_run_of_the_profile_and_names_it(run_matrix, pytester):
    first = pytester.path / ".simplefsdp" / "runs"
    run_matrix(fake_matrix(modes=["pass", "fail"]), f"--simplefsdp-artifacts={first / '20260101-000000'}")
    result = run_matrix(
        fake_matrix(modes=["pass", "fail"]),
        "--simplefsdp-compare",
        f"--simplefsdp-artifacts={first / '20260101-000100'}",
    )
    result.stdout.fnmatch_lines(
        [f"*simplefsdp: changes since {first / '20260101-000000' / 'results.jsonl'}*", "no cell changed"]
    )


def test_the_running_cells_line_says_how_long_it_has_run_against_its_expected_time(run_matrix, pytester):
    """Not a TTY (as here): a plain line while the cell runs (every minute; a second here), then its outcome."""
    pytester.makeconftest("from pytest_simplefsdp.session import controller\ncontroller.Ticker.PLAIN_S = 1.0\n")
    result = run_matrix(fake_matrix(args=', "--startup", "3"'))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["    fake.yaml::pass-r2: running *s of ~*s expected", "fake.yaml::pass-r2 PASSED *"])


def test_the_running_cells_line_says_what_it_waits_for(run_matrix, pytester):
    """Its baseline (run before the comparison), then a confirming run of a failure: named, with their own time."""
    pytester.makeconftest("from pytest_simplefsdp.session import controller\ncontroller.Ticker.PLAIN_S = 1.0\n")
    text = fake_matrix(modes=["pass", "perturb"], args=', "--startup", "3", "--delta", "0.5"', extra=NUMERICS)
    result = run_matrix(text, "-k", "perturb", "--simplefsdp-confirm=2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "    fake.yaml::perturb-r2: running *s of ~*s expected: its baseline for *s",
            "    fake.yaml::perturb-r2: running *s of ~*s expected: confirming run 2 of 2 for *s",
            "fake.yaml::perturb-r2 FAILED *",
        ]
    )


@pytest.fixture
def browser():
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        pytest.skip("no headless browser (Debian: apt-get install chromium; .ci/run installs it)")
    return found


def headless(browser, tmp_path, *args):
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )


def test_the_page_puts_failures_first_in_a_real_browser(run_matrix, pytester, browser, tmp_path):
    """A run with a new failure, a known failure and passes, written as one self-contained page: Chromium renders
    it (a screenshot in the test's folder), the DOM has the failures first, grouped, each with its error line,
    rank, entry and log; the n/a cell's rule is its title; the filter (#only=failed) hides the passing cells."""
    kf = pytester.path / "kf.yaml"
    kf.write_text(KF)
    page = pytester.path / "page.html"
    text = (
        fake_matrix(
            modes=["pass", "fail", "exit3"],
            extra=textwrap.dedent("""\
        rules:
          - {name: no-exit3-on-4, drop_if: "mode == 'exit3' and ranks == 4", reason: exit3 runs on 2 ranks only}
        """),
        )
        .replace("ranks: [2]", "ranks: [2, 4]")
        .replace("world_sizes: [2]", "world_sizes: [2, 4]")
    )
    run_matrix(text, f"--simplefsdp-known-failures={kf}", f"--simplefsdp-html={page}")
    shot = pytester.path / "page.png"
    assert headless(browser, tmp_path, f"--screenshot={shot}", "--window-size=1280,900", page.as_uri()).returncode == 0
    assert shot.stat().st_size > 10_000
    dom = headless(browser, tmp_path, "--dump-dom", page.as_uri()).stdout
    assert dom.index('id="failures"') < dom.index('id="cells"')  # failures first, then the cells
    new = dom[dom.index('id="failures-new"') :]
    assert "fake::exit3-r2" in new and "fake::exit3-r4" not in dom.split('id="failures-known"')[0]
    known = dom[dom.index('id="failures-known"') :]
    assert "fake-known" in known and "https://github.com/pytorch/torchtitan/pull/1529" in known
    assert 'title="n/a: rule no-exit3-on-4: exit3 runs on 2 ranks only"' in dom
    filtered = headless(browser, tmp_path, "--dump-dom", page.as_uri() + "#only=failed").stdout
    passed_detail = filtered[filtered.index('id="cell-pass-r2"') :].split(">", 1)[0]
    assert "hidden" in passed_detail  # the passing cell's details are hidden by the filter
    failed_detail = filtered[filtered.index('id="cell-exit3-r2"') :].split(">", 1)[0]
    assert "hidden" not in failed_detail
