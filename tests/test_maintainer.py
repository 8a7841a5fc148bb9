"""The maintainer's day: re-judge and compare stored runs anywhere, the status by feature, the HTML page,
progress lines, paths checked up front, GPU profiles collected on CPU, other plugins' options, the update
command editing the file as a person would."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_simplefsdp.judge.known import signature
from pytest_simplefsdp.report import compare as report

from helpers import KF, fake_matrix, report_tool, run_doc

REPO = Path(__file__).resolve().parent.parent

# --- re-judging a run done elsewhere ------------------------------------------------------------------

SEED_AXES = {
    "model": "deepseek_v3",
    "dp_replicate": 1,
    "dp_shard": 4,
    "tp": 1,
    "ep": 2,
    "etp": 1,
    "pp": 1,
    "pp_schedule": "none",
    "compile": "compiled",
    "ac": "selective",
    "cp": 1,
    "feature": "none",
}


def gpu_run_of_the_seed_era():
    """A run as a person stores it from an 8-GPU host (seed era, no known failures applied there): three
    failures the shipped file covers, with their raw errors, and one pass."""

    def cell(cid, status, error=None, **axes):
        a = {**SEED_AXES, **axes}
        return {
            "id": cid,
            "axes": a,
            "status": status,
            "failure_class": "compile" if error else None,
            "row": cid,
            "column": a["compile"],
            "error_line": error,
            "error_text": error,
            "wall": 90.0,
        }

    return {
        "runs": [
            {
                "meta": {
                    "matrix": "matrix/titan02-h100x8.yaml",
                    "profile": "titan02-h100x8",
                    "target": "titan02",
                    "device": "cuda",
                    "launcher": "torchrun",
                    "cells": 4,
                    "versions": {"torch": "2.10.0", "torchtitan": "0.2.0"},
                },
                "cells": [
                    cell(
                        "hop",
                        "failed",
                        "torch._dynamo.exc.Unsupported: HigherOrderOperator: Mutating a variable not in "
                        "the current scope (SideEffects) at 0x7f3a2c1d9e80",
                    ),
                    cell("eq", "failed", "RuntimeError: Eq(u0 + u1, 6144)", pp=2, ac="none", pp_schedule="1F1B"),
                    cell(
                        "proxy",
                        "failed",
                        "AssertionError: s27 (FakeTensor) is not tracked with proxy",
                        pp=2,
                        tp=2,
                        dp_shard=2,
                        ac="none",
                        pp_schedule="Interleaved1F1B",
                        ep=1,
                    ),
                    cell("ok", "passed", compile="eager", ac="none"),
                ],
            }
        ]
    }


def test_the_report_tool_rejudges_a_stored_run_against_the_shipped_known_failures(tmp_path):
    run = tmp_path / "gpu-run.json"
    run.write_text(json.dumps(gpu_run_of_the_seed_era()))
    stored = report_tool(run, "--as-stored")
    assert stored.returncode == 0 and stored.stdout.count("FAIL compile") == 3
    proc = report_tool(run, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    # a stored run of an older format names no known-failures file: the shipped one judges it, and it says so
    assert f"re-judged against the shipped {REPO / 'known_failures.yaml'} (the run does not say" in proc.stderr
    cells = {c["id"]: c for c in json.loads(proc.stdout)["runs"][0]["cells"]}
    assert {k: (c["status"], c["known_failure"]) for k, c in cells.items()} == {
        "hop": ("xfailed", "seed-ep-ac-compile-hop-side-effect"),
        "eq": ("xfailed", "seed-pp-ep-compile-unbacked-eq"),
        "proxy": ("xfailed", "seed-pp-tp-compile-proxy"),
        "ok": ("passed", None),
    }
    assert cells["hop"]["signature"].endswith("(SideEffects) at 0xADDR")  # normalised (it was NxADDR)
    assert cells["eq"]["signature"] == "RuntimeError: Eq(uN + uN, N)"
    md = report_tool(run, "--format", "md").stdout
    assert (
        "🚧[^1]" in md
        and "[^1]: `hop`: known failure `seed-ep-ac-compile-hop-side-effect` "
        "(https://github.com/pytorch/torchtitan/issues/1935)"
        in md
    )
    # another file, other verdicts: with no entry the failures are new again
    empty = tmp_path / "none.yaml"
    empty.write_text("[]\n")
    again = json.loads(report_tool(run, "--format", "json", "--known-failures", empty).stdout)
    assert [c["status"] for c in again["runs"][0]["cells"]] == ["failed", "failed", "failed", "passed"]


def test_rejudging_in_gate_mode_fails_a_known_failure_that_passed(tmp_path):
    doc = gpu_run_of_the_seed_era()
    doc["runs"][0]["cells"][0].update(status="passed", failure_class=None, error_line=None, error_text=None)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(doc))
    for args, status in (((), "xpassed"), (("--gate",), "failed")):
        cell = json.loads(report_tool(run, "--format", "json", *args).stdout)["runs"][0]["cells"][0]
        assert cell["status"] == status and "no longer fails" in cell["verdict"]
    assert report_tool(run, "--as-stored", "--gate").returncode == 2  # contradictory: refused


def test_the_report_tool_refuses_bad_known_failures_and_missing_files(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(gpu_run_of_the_seed_era()))
    bad = tmp_path / "kf.yaml"
    bad.write_text(KF.replace("kind: xfail", "kind: sometimes"))
    proc = report_tool(run, "--known-failures", bad)
    assert proc.returncode == 1 and f"{bad}:4: entry 'fake-known': kind 'sometimes'" in proc.stderr
    proc = report_tool(run, "--compare", tmp_path / "missing.json")
    assert proc.returncode == 2 and "missing.json: No such file or directory" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- compare: offline, across rootdirs, in gate mode ------------------------------------------------


def rec(status, failure_class=None, known_failure=None, signature=""):
    return {
        "id": "c",
        "status": status,
        "failure_class": failure_class,
        "known_failure": known_failure,
        "signature": signature,
    }


# every verdict a stored cell can have: what it ran as (broken: it failed, known or not)
VERDICTS = {
    "passed": rec("passed"),
    "flaky pass": dict(rec("passed", known_failure="flaky-entry"), flaky=True),
    "xpassed": rec("xpassed", known_failure="entry"),
    "gate xpass": rec("failed", known_failure="entry"),  # a known failure that passed, failed by the gate
    "failed": rec("failed", "runtime", signature="RuntimeError: a"),
    "xfailed": rec("xfailed", "runtime", "entry", signature="RuntimeError: a"),
    "failed other": rec("failed", "runtime", signature="RuntimeError: b"),
    "skipped": rec("skipped", known_failure="skip-entry"),
}
GOOD, BAD = ("passed", "flaky pass", "xpassed", "gate xpass"), ("failed", "xfailed", "failed other")
EXPECTED = {}
for _old in VERDICTS:
    for _new in VERDICTS:
        if "skipped" in (_old, _new):
            EXPECTED[_old, _new] = None  # it did not run on one side: nothing to compare
        elif "flaky pass" in (_old, _new) and (_old in BAD or _new in BAD):
            EXPECTED[_old, _new] = "flaky flip"  # a known flaky cell is never newly broken or fixed
        elif _old in GOOD:
            EXPECTED[_old, _new] = "newly broken" if _new in BAD else None
        elif _new in GOOD:
            EXPECTED[_old, _new] = "newly fixed"
        else:  # both broken: the same error, or not
            same = (_old == "failed other") == (_new == "failed other")
            EXPECTED[_old, _new] = None if same else "changed signature"


@pytest.mark.parametrize("old,new", list(EXPECTED), ids=[f"{o}->{n}" for o, n in EXPECTED])
def test_compare_gives_each_verdict_pair_its_change(old, new):
    meta = {"profile": "p", "matrix": "m.yaml"}
    changes = report.compare_runs(
        {"runs": [{"meta": meta, "cells": [VERDICTS[old]]}]},
        {"runs": [{"meta": {**meta, "matrix": "elsewhere/m.yaml"}, "cells": [VERDICTS[new]]}]},
    )
    assert changes.get("p::c") == EXPECTED[old, new]


def test_compare_matches_cells_across_rootdirs_and_in_gate_mode(run_matrix, pytester):
    """A run started from the matrix's folder and one from its parent name the file differently; they compare
    by profile and cell id. In gate mode a known failure that now passes is newly fixed, not a changed signature."""
    (pytester.path / "sub").mkdir()
    kf = pytester.path / "kf.yaml"
    kf.write_text(KF.replace("{mode: fail}", "{mode: pass}"))  # the passing cell is a known failure
    text = fake_matrix(modes=["pass", "fail"])
    old, md = pytester.path / "old.json", pytester.path / "status.md"
    run_matrix(text, f"--simplefsdp-json={old}", f"--simplefsdp-known-failures={kf}", name="sub/fake.yaml")
    stored = json.loads(old.read_text())
    assert stored["runs"][0]["meta"]["matrix"] == "sub/fake.yaml"
    for cell in stored["runs"][0]["cells"]:
        if cell["id"] == "pass-r2":  # yesterday it failed as its entry said
            cell.update(status="xfailed", failure_class="runtime", signature="RuntimeError: fake failure on purpose")
    old.write_text(json.dumps(stored))
    new = pytester.path / "new.json"
    result = run_matrix(
        text,
        f"--simplefsdp-compare={old}",
        f"--simplefsdp-status-md={md}",
        "--simplefsdp-gate",
        f"--simplefsdp-known-failures={kf}",
        f"--simplefsdp-json={new}",
        f"--rootdir={pytester.path / 'sub'}",
        name="sub/fake.yaml",
    )
    assert run_doc(new)["meta"]["matrix"] == "fake.yaml"
    result.stdout.fnmatch_lines(["*simplefsdp: changes since*", "newly fixed: fake::pass-r2"])
    assert "changed signature" not in result.stdout.str()
    status = md.read_text()
    assert "❌[^1]🎉" in status and "None" not in status
    assert "[^1]: `pass-r2`: `known failure fake-known no longer fails: delete it" in status  # a code span
    # the same comparison offline, from the report tool, run from yet another folder
    proc = report_tool(new, "--compare", old, "--known-failures", kf, "--gate", cwd=pytester.path / "sub")
    assert "changes since" in proc.stdout and "  newly fixed: fake::pass-r2" in proc.stdout


# --- paths and other plugins, before anything runs ------------------------------------------------


def no_cell_ran(pytester):
    return not (pytester.path / "runs" / "results.jsonl").exists()


@pytest.mark.parametrize(
    "option,make,message",
    [
        ("compare", lambda p: p / "typo.json", "--simplefsdp-compare: {path}: no such file"),
        (
            "compare",
            lambda p: (p / "cut.json").write_text('{"runs": [') and p / "cut.json",
            "--simplefsdp-compare: {path}:1: not valid JSON (cut short?)*",
        ),
        (
            "json",
            lambda p: (p / "afile").write_text("x") and p / "afile" / "run.json",
            "--simplefsdp-json: {path}: {parent} is a file, not a folder",
        ),
        ("status-md", lambda p: p, "--simplefsdp-status-md: {path}: is a folder; name a file"),
        (
            "html",
            lambda p: (p / "page").write_text("x") and p / "page",
            "--simplefsdp-html: {path}: is a file; name a folder",
        ),
        ("baseline", lambda p: p / "nope.json", "--simplefsdp-baseline: {path}: no such file"),
    ],
)
def test_every_path_option_is_checked_before_the_first_cell(run_matrix, pytester, option, make, message):
    path = make(pytester.path)
    result = run_matrix(fake_matrix(), f"--simplefsdp-{option}={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message.format(path=path, parent=path.parent)}"])
    assert no_cell_ran(pytester)


@pytest.mark.parametrize(
    "args,message",
    [
        (("--reruns", "2"), "ERROR: --reruns 2 (pytest-rerunfailures): a matrix cell is not rerun; *kind: flaky*"),
        (
            ("--timeout", "5"),
            "ERROR: --timeout 5 (pytest-timeout): a cell is timed by its supervisor, *use --simplefsdp-timeout=5",
        ),
    ],
)
def test_rerun_and_timeout_plugins_are_refused_with_the_way_out(run_matrix, pytester, args, message):
    pytest.importorskip("pytest_rerunfailures")
    pytest.importorskip("pytest_timeout")
    result = run_matrix(fake_matrix(), *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert no_cell_ran(pytester)


def test_an_ini_pytest_timeout_leaves_cells_to_their_supervisor(run_matrix, pytester):
    """A project's `timeout = 1` (pytest-timeout) would interrupt a 3 s cell mid-run and lose its record."""
    pytest.importorskip("pytest_timeout")
    pytester.makeini("[pytest]\ntimeout = 1\n")
    js = pytester.path / "run.json"
    result = run_matrix(fake_matrix(args=', "--startup", "3"'), f"--simplefsdp-json={js}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["simplefsdp: the ini timeout (1 s, pytest-timeout) does not apply to cells*"])
    assert run_doc(js)["cells"][0]["wall"] >= 3


def test_a_gpu_profile_is_collected_on_a_cpu_host_and_its_cells_skipped(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    listed = pytester.runpytest_subprocess("--simplefsdp-matrix", "--simplefsdp-profile=h100x8", "--co", "-q")
    assert listed.ret == pytest.ExitCode.OK
    ids = [line for line in listed.stdout.lines if "h100x8.yaml::" in line]
    assert len(ids) > 100
    one = ids[0].split("::")[-1]
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-profile=h100x8",
        "-k",
        one,
        "-rs",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*profile h100x8 needs 8 CUDA devices, 0 visible*"])
    # the dry run lists the commands (nothing launches anyway) and says the cells cannot run here
    dry = pytester.runpytest_subprocess(
        "--simplefsdp-matrix", "--simplefsdp-profile=h100x8", "-k", one, "--simplefsdp-dry-run"
    )
    dry.stdout.fnmatch_lines(
        [
            "matrix/h100x8.yaml: * valid cells, * n/a; not on this machine: profile h100x8 needs "
            "8 CUDA devices, 0 visible*"
        ]
    )


def test_a_node_id_from_a_failed_line_runs_that_cell_and_test_paths_are_refused(run_matrix, pytester):
    result = run_matrix(fake_matrix(modes=["pass", "fail", "exit3"]))
    line = next(ln for ln in result.stdout.lines if ln.startswith("FAILED "))
    nodeid = line.split()[1]
    assert nodeid == "fake.yaml::fail-r2"
    again = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        "--simplefsdp-launcher=local",
        nodeid,
        f"--simplefsdp-artifacts={pytester.path / 'runs2'}",
    )
    again.assert_outcomes(failed=1, deselected=2)
    pytester.makepyfile(test_plain="def test_x(): pass")
    refused = pytester.runpytest_subprocess("--simplefsdp-matrix", "test_plain.py")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(
        ["ERROR: test_plain.py: not a matrix file or a cell of one; *drop it to run test files*"]
    )
    unknown = pytester.runpytest_subprocess("--simplefsdp-matrix", "fake.yaml::nosuch-r2")
    unknown.stderr.fnmatch_lines(["ERROR: *fake.yaml: no valid cell nosuch-r2*"])
    near = pytester.runpytest_subprocess("--simplefsdp-matrix", "fake.yaml::fial-r2")
    assert near.ret == pytest.ExitCode.USAGE_ERROR
    near.stderr.fnmatch_lines(["ERROR: *fake.yaml: no valid cell fial-r2; did you mean 'fail-r2'? *"])
    assert "collected" not in near.stdout.str()  # refused before anything is collected


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["--simplefsdp-launcher=forkk"],
            "--simplefsdp-launcher: unknown launcher 'forkk'; built in: *; did you mean 'fork'?",
        ),
        (["--simplefsdp-profile=cpuu"], "--simplefsdp-profile: unknown profile 'cpuu'; known: *; did you mean 'cpu'?"),
    ],
    ids=["launcher", "profile"],
)
def test_a_near_miss_of_an_option_value_says_what_was_meant(pytester, args, said):
    result = pytester.runpytest_subprocess("--simplefsdp-matrix", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {said}"])


def test_a_near_miss_in_a_file_says_what_was_meant(run_matrix, pytester):
    """A known-failures condition on `reduse` (the axis is `reduce`), a matrix key `world_size` (`world_sizes`)."""
    kf = pytester.path / "kf.yaml"
    kf.write_text(
        "- id: x\n  when: {reduse: sum}\n  error: e\n  kind: xfail\n  link: https://github.com/a/b/issues/1\n"
        "  reason: r\n"
    )
    matrix = fake_matrix(modes=["pass"]).replace("  mode: [", "  reduce: [sum]\n  mode: [", 1)
    bad_kf = run_matrix(matrix, f"--simplefsdp-known-failures={kf}")
    bad_kf.stderr.fnmatch_lines(["*kf.yaml:2*condition on unknown axis 'reduse'*; did you mean 'reduce'?"])
    bad_matrix = run_matrix(fake_matrix().replace("world_sizes:", "world_size:"))
    bad_matrix.stderr.fnmatch_lines(["*fake.yaml:*unknown * key 'world_size'*; did you mean 'world_sizes'?"])


# --- while it runs, and what it leaves --------------------------------------------------------------


def test_each_cell_ends_its_line_with_its_time_and_the_runs_progress(run_matrix, pytester):
    result = run_matrix(fake_matrix(modes=["pass", "fail"]))
    result.stdout.re_match_lines(
        [
            r"fake\.yaml::pass-r2 PASSED \d+s \(1/2 cells, \d+s elapsed, ETA \d+s\) +\[ 50%\]",
            r"fake\.yaml::fail-r2 FAILED \d+s \(2/2 cells, \d+s elapsed, ETA 0s\) +\[100%\]",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED fake.yaml::fail-r2 - fail-r2: ?runtime? RuntimeError*"])  # the summary: plain
    quiet = run_matrix(fake_matrix(modes=["pass"]), "-q")
    assert "cells," not in quiet.stdout.str()  # -q keeps pytest's dots


FEATURES = """\
axes:
  mode: [pass, fail]
  ranks: [2]
  compile: [eager, jit]
  memory_policy: [none, full]
exclude:
  - {memory_policy: full, mode: fail}
"""


def test_status_by_feature_rolls_the_cells_up_beside_the_grid(run_matrix, pytester):
    kf = pytester.path / "kf.yaml"
    kf.write_text(KF.replace("{mode: fail}", "{mode: fail, compile: jit}"))
    text = fake_matrix().replace("axes:\n  mode: ['pass']\n  ranks: [2]\n", FEATURES)
    md, js, html = pytester.path / "status.md", pytester.path / "run.json", pytester.path / "html"
    result = run_matrix(
        text,
        f"--simplefsdp-known-failures={kf}",
        f"--simplefsdp-status-md={md}",
        f"--simplefsdp-json={js}",
        f"--simplefsdp-html={html}",
    )
    result.assert_outcomes(passed=4, failed=1, xfailed=1)
    status = md.read_text()
    view = status[status.index("**Status by feature**") : status.index("### fake.yaml")]
    assert (
        "*Compile modes*\n\n- [Failing] compile eager: 2 of 3 cells pass\n"
        "- [In progress] compile jit: 2 of 3 cells pass; known failures: "
        "[`fake-known`](https://github.com/pytorch/torchtitan/pull/1529)\n" in view
    )
    assert "*Memory policies*\n\n- [Done] memory policy full: 2 of 2 cells pass\n" in view
    assert "### fake.yaml: 6 of 6 valid cells run" in status
    assert "| layout   | eager none   | eager full   | jit none   | jit full   |" in status  # the grid follows
    assert "host " in status and "torch rev " in status  # where it ran and from which source
    if importlib.util.find_spec("matplotlib"):
        assert "Wall time per cell: [walltime.png](runs/walltime.png)" in status  # relative: it works when pasted
    again = report_tool(js, "--format", "md", "--known-failures", kf).stdout
    assert again == status  # from the JSON alone, byte for byte


class Page(HTMLParser):
    """What a browser rendered: the text of each table cell and its links."""

    def __init__(self):
        super().__init__()
        self.cells, self.links, self._td, self._text = [], {}, False, []

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self._td, self._text = True, []
        if tag == "a":
            self.links.setdefault("cell" if self._td else "other", []).append(dict(attrs)["href"])

    def handle_endtag(self, tag):
        if tag == "td":
            self.cells.append("".join(self._text).strip())
            self._td = False

    def handle_data(self, data):
        if self._td:
            self._text.append(data)


def test_the_html_page_shows_the_grid_and_links_a_failing_cell_to_its_log(run_matrix, pytester, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless browser (Debian: apt-get install chromium; .ci/run installs it)")
    js = pytester.path / "run.json"
    run_matrix(fake_matrix(modes=["pass", "fail"]), f"--simplefsdp-json={js}")
    proc = report_tool(js, "--as-stored", "--html", pytester.path / "page")
    assert proc.returncode == 0 and f"html: {pytester.path / 'page' / 'index.html'}" in proc.stderr
    for folder in ("page", "runs"):  # the page and the run move together (links are relative)
        shutil.move(pytester.path / folder, tmp_path / "moved" / folder)
    page = tmp_path / "moved" / "page" / "index.html"
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert dom.returncode == 0 and "<table>" in dom.stdout, dom.stderr[-2000:]
    seen = Page()
    seen.feed(dom.stdout)
    assert "pass" in seen.cells and "fail" in seen.cells
    assert any(re.fullmatch(r"❌ FAIL runtime \d+s", c) for c in seen.cells), seen.cells
    assert "#cell-fail-r2" in seen.links["cell"]  # the grid's cell leads to its details, which link its logs
    log = next(h for h in seen.links["other"] if "fail-r2" in h and h.endswith("rank1.log"))  # the failing rank
    assert "RuntimeError: fake failure on purpose" in (page.parent / log).resolve().read_text()


# --- the known-failures file, edited as a person would ----------------------------------------------

SECTIONS = """\
# known failures of the fake target

# --- section one
- id: keep-me
  when: {mode: exit3}
  error: "crash"
  kind: xfail
  link: 'https://github.com/pytorch/torchtitan/issues/1'
  reason: stays as written
# now-passes' own comment, which goes with it
- id: now-passes
  when: {mode: pass}
  error: 'anything'
  kind: xfail
  link: https://github.com/pytorch/torchtitan/issues/3013
  reason: used to fail

# --- section two
- id: fake-fail
  when: {mode: fail}
  error: 'an older error'
  kind: xfail
  link: https://github.com/pytorch/torchtitan/issues/2
  reason: the cell's own entry
- id: other-matrix
  when: {profile: not-loaded-here, layout: fsdp}
  error: 'x'
  kind: xfail
  link: https://github.com/pytorch/torchtitan/issues/4
  reason: an entry of another matrix file
"""


def test_update_keeps_untouched_lines_and_section_comments_and_follows_a_changed_signature(run_matrix, pytester):
    kf = pytester.path / "kf.yaml"
    kf.write_text(SECTIONS)
    result = run_matrix(
        fake_matrix(modes=["pass", "fail", "exit3"]),
        f"--simplefsdp-known-failures={kf}",
        "--simplefsdp-update-known-failures",
    )
    result.stdout.fnmatch_lines(
        ["simplefsdp: 1 known-failure entries are for profiles not loaded here (not checked): other-matrix"]
    )
    result.stdout.fnmatch_lines(
        [
            "*removed now-passes: every cell it covers passed",
            "*changed signature: fake-fail now expects /RuntimeError: fake failure on purpose/ (was /an older error/)",
            "*added fake-exit3 for 1 cell (link: 'TODO*",
        ]
    )
    new = kf.read_text()
    before = SECTIONS.splitlines(keepends=True)
    assert new.startswith("".join(before[:9]) + "\n# --- section two\n- id: fake-fail\n")  # quoting kept
    assert "now-passes" not in new
    assert "  error: 'RuntimeError: fake failure on purpose'  # signature changed " in new
    assert "".join(before[-6:]) in new and new.splitlines()[-6] == "- id: fake-exit3"


def test_signature_keeps_addresses_as_documented():
    assert signature("at 0x7f3a2c1d9e80 in rank 3") == "at 0xADDR in rank N"


def test_the_grid_tells_a_cell_not_run_from_a_combination_the_matrix_excludes(run_matrix, pytester):
    """A blank is a combination `exclude` removed; a valid cell this run did not select shows as "·" (the
    terminal table, the status table and the stored run alike)."""
    text = fake_matrix().replace("axes:\n  mode: ['pass']\n  ranks: [2]\n", FEATURES)
    md, js = pytester.path / "status.md", pytester.path / "run.json"
    result = run_matrix(
        text, "-k", "not (pass and jit and none)", f"--simplefsdp-status-md={md}", f"--simplefsdp-json={js}"
    )
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.re_match_lines(
        [
            r"layout +eager none +eager full +jit none +jit full$",
            r"pass r2 +pass \d+s +pass \d+s +· +pass \d+s$",
            r"fail r2 +FAIL runtime \d+s +FAIL runtime \d+s$",
            r"· valid, not run this time · blank: not in the profile \(its `exclude`\)$",
        ]
    )
    status = md.read_text()
    assert re.search(r"^\| pass r2 +\| ✅ +\| ✅ +\| · +\| ✅ +\|$", status, re.M), status
    assert re.search(r"^\| fail r2 +\| ❌\[\^1\] +\| +\| ❌\[\^2\] +\| +\|$", status, re.M), status
    assert report_tool(js, "--format", "md").stdout == status  # from the stored run alone
