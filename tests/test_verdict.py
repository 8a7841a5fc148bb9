"""Known failures: signatures, validation, verdicts as pytest outcomes, gate mode, file updates."""

import json
import shutil
import textwrap

import pytest

from pytest_simplefsdp.judge.known import load_known_failures, signature
from pytest_simplefsdp.spec.matrix import MatrixError

from helpers import KF_EQ, cells_of, fake_matrix

# error texts as torchtitan / PyTorch print them (see the upstream issues the entries link)
HOP_NEW = (
    "torch._dynamo.exc.Unsupported: HOP: Unsafe side effect\n  Higher Order Operator: "
    "torch.utils.checkpoint.checkpoint\n  Explanation: Mutating a variable from outside the scope of this "
    "HOP is not supported.\n  Developer debug context: Attempted to mutate UserDefinedObjectVariable("
    "ExpertParallel)"
)
HOP_SEED = (
    "torch._dynamo.exc.Unsupported: HigherOrderOperator: Mutating a variable not in the current scope (SideEffects)"
)


@pytest.mark.parametrize(
    "a, b",
    [
        ("RuntimeError: Eq(u0 + u1, 6144)", "RuntimeError: Eq(u12 + u13, 3072)"),
        (
            "AssertionError: should have been constant, but got u4 + u5 + u6 + u7",
            "AssertionError: should have been constant, but got u0 + u1 + u2 + u3",
        ),
        (
            "torch._inductor.exc.InductorError: AssertionError: For u6 + u7, expected [u6, u7] to have been codegen-ed.",
            "torch._inductor.exc.InductorError: AssertionError: For u2 + u3, expected [u2, u3] to have been codegen-ed.",
        ),
        (
            "AssertionError: Node tangents_2 was invalid, but is output",
            "AssertionError: Node tangents_5 was invalid, but is output",
        ),
        (
            "ValueError: Forward graph outputs require backward-only inputs: ['arg36_1']",
            "ValueError: Forward graph outputs require backward-only inputs: ['arg7_1']",
        ),
        (
            "RuntimeError: bad graph <torch.fx.graph_module.GraphModule object at 0x7f3a2c1d5e10>",
            "RuntimeError: bad graph <torch.fx.graph_module.GraphModule object at 0x55d0aa0b1c20>",
        ),
        ("[rank3]: FileNotFoundError: /tmp/torchinductor_root/ab/cabc12.py", "FileNotFoundError: /tmp/tmpx81/q/z.py"),
        ("RuntimeError: shape s27 vs s3", "RuntimeError: shape s0 vs s1"),
    ],
)
def test_signature_normalises_what_changes_between_runs(a, b):
    assert signature(a) == signature(b)


def test_signature_keeps_what_identifies_the_error():
    assert signature(HOP_NEW) != signature(HOP_SEED)
    assert signature("RuntimeError: Eq(u0 + u1, 6144)") == "RuntimeError: Eq(uN + uN, N)"
    assert "Mutating a variable from outside the scope of this HOP" in signature(HOP_NEW)


def kf_file(pytester, text=KF_EQ):
    path = pytester.path / "known_failures.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def with_error(error):
    return fake_matrix(modes=["pass", "fail"], args=', "--error", "{error}"').replace(
        "settings:\n  steps: 3", f"settings:\n  steps: 3\n  error: '{error}'"
    )


def test_xfailed_when_signature_matches(run_matrix, pytester):
    path = kf_file(pytester)
    result = run_matrix(
        with_error("RuntimeError: Eq(u0 + u1, 3072)"), f"--simplefsdp-known-failures={path}", "-rxX", "-v"
    )
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*fail-r2 XFAIL*",
            "fail * xfail *",
            "*XFAIL fake.yaml::fail-r2 - known failure fake-eq "
            "(https://github.com/pytorch/torchtitan/pull/1529): unbacked symbol*",
        ]
    )


def test_different_signature_fails_naming_expected_and_got(run_matrix, pytester):
    path = kf_file(pytester)
    result = run_matrix(with_error("RuntimeError: something new"), f"--simplefsdp-known-failures={path}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*failed with a different error than known: expected fake-eq: /Eq*/; got: RuntimeError: something new*"]
    )


def test_failure_outside_the_entry_conditions_fails(run_matrix, pytester):
    path = kf_file(pytester, KF_EQ.replace('ranks: ">1"', 'ranks: ">2"'))
    text = (
        with_error("RuntimeError: Eq(u0 + u1, 3072)")
        .replace("ranks: [2]", "ranks: [2, 3]")
        .replace("world_sizes: [2]", "world_sizes: [2, 3]")
    )
    result = run_matrix(text, f"--simplefsdp-known-failures={path}", "-v")
    result.assert_outcomes(passed=2, failed=1, xfailed=1)
    result.stdout.fnmatch_lines(["*fail-r2 FAILED*", "*fail-r3 XFAIL*"])


def test_xpass_is_reported_and_fails_in_gate_mode(run_matrix, pytester):
    path = kf_file(pytester, KF_EQ.replace("mode: fail", "mode: pass"))
    text = fake_matrix(modes=["pass"])
    result = run_matrix(text, f"--simplefsdp-known-failures={path}", "-rX")
    result.assert_outcomes(xpassed=1)
    assert result.ret == 0
    result = run_matrix(text, f"--simplefsdp-known-failures={path}", "--simplefsdp-gate")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*pass-r2: [[]XPASS(strict)[]] known failure fake-eq no longer fails: delete it from *known_failures.yaml:2*"]
    )


def test_gate_from_ini(run_matrix, pytester):
    path = kf_file(pytester, KF_EQ.replace("mode: fail", "mode: pass"))
    pytester.makeini("[pytest]\nsimplefsdp_gate = true\n")
    result = run_matrix(fake_matrix(modes=["pass"]), f"--simplefsdp-known-failures={path}")
    result.assert_outcomes(failed=1)


def test_skip_entry_does_not_launch(run_matrix, pytester):
    path = kf_file(pytester, KF_EQ.replace("kind: xfail", "kind: skip").replace("mode: fail", "mode: hang"))
    result = run_matrix(fake_matrix(modes=["pass", "hang"], timeout=600), f"--simplefsdp-known-failures={path}", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*known failure fake-eq: unbacked symbol equality*"])
    assert not (pytester.path / "runs" / "fake" / "hang-r2").exists()
    assert not list(pytester.path.glob("*.json"))  # a cell that never launched writes nothing into the rootdir


def test_a_flaky_entry_is_proven_by_a_rerun_that_passes_never_by_its_word(run_matrix, pytester, monkeypatch):
    """Issue 58, Why 2: a kind: flaky entry states its pass rate (0.8: 3 runs make a pass 99 % likely); a failure it
    matches runs again until one passes: `flaky` fails once and passes its rerun (xfailed, known flaky), `fail` fails
    every run: new, naming the entry (on the landed revision both were xfailed without a rerun)."""
    says, out = pytester.path / "says.txt", pytester.path / "run.json"
    monkeypatch.setenv("FAKE_TORCHTITAN_SAYS", str(says))
    says.write_text("fail\nflaky flaky\n")
    path = kf_file(
        pytester,
        "- id: fake-flaky\n  when: {mode: [pass, fail, flaky]}\n  error: 'fake failure'\n  kind: flaky\n"
        "  pass_rate: 0.8\n  link: https://github.com/pytorch/torchtitan/pull/1529\n  reason: a flaky fake\n",
    )
    result = run_matrix(
        fake_matrix(modes=["pass", "fail", "flaky"], args=', "--torchtitan-says"'),
        f"--simplefsdp-known-failures={path}",
        f"--simplefsdp-json={out}",
    )
    result.assert_outcomes(passed=1, failed=1, xfailed=1)
    cells = cells_of(out)
    fail, flaky = cells["fail-r2"], cells["flaky-r2"]
    assert (fail["status"], fail["known_failure"], fail["confirm"]["runs"], fail["confirm"]["passed"]) == (
        "failed",
        None,
        3,
        0,
    )
    assert fail["verdict"] == (
        "new: entry fake-flaky (https://github.com/pytorch/torchtitan/pull/1529) says it passes 80% of runs; "
        "it failed 3 of 3"
    )
    assert (flaky["status"], flaky["known_failure"], flaky["confirm"]["runs"], flaky["confirm"]["passed"]) == (
        "xfailed",
        "fake-flaky",
        2,
        1,
    )
    assert flaky["verdict"].startswith("known flaky fake-flaky (https://github.com/pytorch/torchtitan/pull/1529): ")
    assert cells["pass-r2"]["status"] == "passed" and cells["pass-r2"]["confirm"] is None


def test_a_flaky_entry_without_a_pass_rate_is_refused_with_its_file_and_line(tmp_path):
    path = tmp_path / "kf.yaml"
    path.write_text(KF_EQ.replace("kind: xfail", "kind: flaky"))
    with pytest.raises(MatrixError, match=r"kf.yaml:5: entry 'fake-eq': kind flaky needs `pass_rate`"):
        load_known_failures(path, {"mode", "ranks"})
    path.write_text(KF_EQ.replace("kind: xfail", "kind: flaky\n  pass_rate: 1"))
    with pytest.raises(MatrixError, match=r"kf.yaml:6: entry 'fake-eq': pass_rate 1 must be a number between 0 and 1"):
        load_known_failures(path, {"mode", "ranks"})


@pytest.mark.parametrize(
    "classes, outcome", [("[runtime]", "xfailed"), ("[runtime, hang]", "xfailed"), ("[hang]", "failed")]
)
def test_classes_limit_what_an_entry_accepts(run_matrix, pytester, classes, outcome):
    """The error matches, but an entry with `classes:` accepts only failures of those classes."""
    path = kf_file(pytester, KF_EQ.replace("  kind: xfail", f"  classes: {classes}\n  kind: xfail"))
    result = run_matrix(with_error("RuntimeError: Eq(u0 + u1, 3072)"), f"--simplefsdp-known-failures={path}")
    result.assert_outcomes(passed=1, **{outcome: 1})
    if outcome == "failed":
        result.stdout.fnmatch_lines(["*fail-r2: [[]runtime[]] RuntimeError: Eq(u0 + u1, 3072)*"])


def test_device_condition(run_matrix, pytester):
    """`device` in `when` is the profile's device: a cpu entry applies here; a cuda one could apply to no cell
    of any profile that has a `mode` axis, and is refused before anything runs."""
    text = with_error("RuntimeError: Eq(u0 + u1, 3072)")
    path = kf_file(pytester, KF_EQ.replace("mode: fail,", "mode: fail, device: cpu,"))
    run_matrix(text, f"--simplefsdp-known-failures={path}").assert_outcomes(passed=1, xfailed=1)
    shutil.rmtree(pytester.path / "runs")
    path = kf_file(pytester, KF_EQ.replace("mode: fail,", "mode: fail, device: cuda,"))
    result = run_matrix(text, f"--simplefsdp-known-failures={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*entry 'fake-eq' matches no valid cell of any profile*"])
    assert not (pytester.path / "runs" / "fake").exists()


GPU_ONLY = """\
- id: qwen3-on-eight-gpus
  when: {{profile: h100x8, model: qwen3{extra}}}
  error: 'boom'
  kind: xfail
  link: https://github.com/pytorch/torchtitan/pull/1529
  reason: matches a cell of a shipped profile this session does not run
"""


def test_every_known_failures_file_is_checked_against_the_shipped_cells_expanded_once(
    run_matrix, pytester, tmp_path, monkeypatch
):
    """The shipped profiles are expanded once per content key (the slow half of a session's start); an edited
    known-failures file is checked against those kept cells: an entry matching a shipped cell loads, one matching
    none is refused, and the kept file is neither rewritten nor joined by another."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    text = with_error("RuntimeError: Eq(u0 + u1, 3072)")
    path = kf_file(pytester, KF_EQ + GPU_ONLY.format(extra=""))
    run_matrix(text, f"--simplefsdp-known-failures={path}").assert_outcomes(passed=1, xfailed=1)
    (kept,) = (tmp_path / "cache" / "pytest-simplefsdp" / "known-check").glob("shipped-*.json")
    cells = dict((env["profile"], c) for env, c in json.loads(kept.read_text())["cells"])
    assert any(c["model"] == "qwen3" for c in cells["h100x8"]) and not any(c["model"] == "qwen3" for c in cells["cpu"])
    written = kept.stat().st_mtime_ns
    path = kf_file(pytester, KF_EQ + GPU_ONLY.format(extra=", device: cpu"))  # h100x8's cells are cuda ones
    result = run_matrix(text, f"--simplefsdp-known-failures={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*known_failures.yaml:8: entry 'qwen3-on-eight-gpus' matches no valid cell of any*"])
    assert [p.name for p in kept.parent.glob("shipped-*.json")] == [kept.name]
    assert kept.stat().st_mtime_ns == written


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("link: https://github.com/pytorch/torchtitan/pull/1529", "link: see the chat"),
            "known_failures.yaml:6: entry 'fake-eq': link 'see the chat' is not a URL",
        ),
        (
            ("  link: https://github.com/pytorch/torchtitan/pull/1529\n", ""),
            "known_failures.yaml:2: entry 'fake-eq': missing `link`",
        ),
        (
            ("error: 'Eq", "error: '(Eq"),
            "known_failures.yaml:4: entry 'fake-eq': error '(Eq*' is not a regex RE2 can "
            "match in linear time: missing )*",
        ),
        (
            ("error: 'Eq", "error: '(Eq)\\1 Eq"),
            "known_failures.yaml:4: entry 'fake-eq': error * is not a regex RE2 can "
            "match in linear time: invalid escape sequence: \\1",
        ),
        (("mode: fail", "mood: fail"), "known_failures.yaml:3: entry 'fake-eq': condition on unknown axis 'mood'"),
        (("kind: xfail", "kind: maybe"), "known_failures.yaml:5: entry 'fake-eq': kind 'maybe' is not one of"),
        (("reason:", "why:"), "known_failures.yaml:7: entry 'fake-eq': unknown key 'why'"),
        (("mode: fail", "mode: explode"), "entry 'fake-eq' matches no valid cell of any profile"),
        (
            ("  kind: xfail", "  classes: [runtme]\n  kind: xfail"),
            "known_failures.yaml:5: entry 'fake-eq': classes ?'runtme'?: not a list of failure classes (invalid_config, ",
        ),
        (
            ("# a comment that survives updates\n", KF_EQ.replace("# a comment that survives updates\n", "")),
            "known_failures.yaml:7: duplicate entry id 'fake-eq' (first at *known_failures.yaml:1)",
        ),
    ],
)
def test_bad_known_failures_are_usage_errors(run_matrix, pytester, change, message):
    path = kf_file(pytester, KF_EQ.replace(*change, 1))
    result = run_matrix(fake_matrix(modes=["pass", "fail"]), f"--simplefsdp-known-failures={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_version_conditions(tmp_path):
    path = tmp_path / "kf.yaml"
    path.write_text(KF_EQ.replace('ranks: ">1"', 'ranks: ">1", torch: ">=2.13,<2.14"'))
    kf = load_known_failures(path, {"mode", "ranks"})
    axes = {"mode": "fail", "ranks": 2}
    assert kf.for_cell(axes, {"torch": "2.13.0+cpu"})
    assert not kf.for_cell(axes, {"torch": "2.14.1"})
    assert not kf.for_cell({"mode": "fail", "ranks": 1}, {"torch": "2.13.0"})
    path.write_text(KF_EQ.replace('ranks: ">1"', 'torch: "newest"'))
    with pytest.raises(MatrixError, match="kf.yaml:3: entry 'fake-eq': torch: 'newest' is not a version range"):
        load_known_failures(path, {"mode", "ranks"})


def test_a_window_decides_where_an_entry_holds(tmp_path):
    """fixed_in torch 2.15.0: a pass there is a plain pass (the window says so), a pass on 2.14.1 is XPASS, and the
    same failure on 2.15.0 is not this known failure."""
    from pytest_simplefsdp.judge.results import CellResult
    from pytest_simplefsdp.judge.verdict import judge
    from pytest_simplefsdp.kinds import FailureClass, Status

    path = tmp_path / "kf.yaml"
    path.write_text(KF_EQ + "  fixed_in: {torch: 2.15.0}\n")
    entries = load_known_failures(path, {"mode", "ranks"}).for_cell({"mode": "fail", "ranks": 2}, {})

    def verdict(status, torch):
        failed = status == Status.FAILED
        result = CellResult(
            "c",
            {"mode": "fail", "ranks": 2},
            status=status,
            versions={"torch": torch},
            failure_class=FailureClass.RUNTIME if failed else None,
            error_line="RuntimeError: Eq(u0 + u1, 6144)" if failed else None,
        )
        return judge(result, entries, gate=False)

    fixed = verdict(Status.PASSED, "2.15.0")
    assert fixed.outcome == Status.PASSED and fixed.message == (
        "passes, as known failure fake-eq "
        "(https://github.com/pytorch/torchtitan/pull/1529)'s "
        "window says: torch 2.15.0 has its fix (torch 2.15.0)"
    )
    assert verdict(Status.PASSED, "2.14.1+cu130").outcome == Status.XPASSED
    assert verdict(Status.FAILED, "2.14.1").outcome == Status.XFAILED
    wrong = verdict(Status.FAILED, "2.15.0")
    assert wrong.outcome == Status.FAILED and "has its fix (torch 2.15.0): its window is wrong" in wrong.message


def test_update_known_failures_adds_and_removes_keeping_comments(run_matrix, pytester):
    text = KF_EQ + textwrap.dedent("""\
        - id: now-passes
          when: {mode: pass}
          error: 'anything'
          kind: xfail
          link: https://github.com/pytorch/torchtitan/issues/3013
          reason: used to fail
        """)
    path = kf_file(pytester, text)
    result = run_matrix(
        with_error("RuntimeError: brand new failure 42"),
        f"--simplefsdp-known-failures={path}",
        "--simplefsdp-update-known-failures",
    )
    result.stdout.fnmatch_lines(
        ["*removed now-passes: every cell it covers passed*", "*added fake-fail for 1 cell (link: 'TODO*"]
    )
    new = path.read_text()
    assert new.startswith("# a comment that survives updates\n- id: fake-eq\n")
    assert "now-passes" not in new and "id: fake-fail" in new and "link: 'TODO: the upstream issue'" in new
    assert "  error: 'RuntimeError: brand new failure N'\n" in new
    # the next run accepts the file: the new entry judges its cell, and the header asks for its link
    result = run_matrix(with_error("RuntimeError: brand new failure 42"), f"--simplefsdp-known-failures={path}")
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        ["simplefsdp: 1 known-failure entries have no link yet (TODO: name the upstream issue): fake-fail"]
    )


def test_signature_matching_is_linear_time():
    """`(a+)+$` against a 200-character line backtracks for minutes in Python's re; RE2 answers at once."""
    from pytest_simplefsdp.judge.known import compile_signature

    assert compile_signature("(a+)+$").search("a" * 200 + "b") is None
    assert compile_signature("(a+)+$").search("RuntimeError: " + "a" * 200)


def test_a_shipped_profile_that_does_not_load_is_named_not_skipped(pytester, monkeypatch):
    """The known-failures check loads every shipped profile; a broken one is a usage error naming it (it was
    skipped, and an entry on its axes then failed as "condition on unknown axis")."""
    from pytest_simplefsdp.paths import MATRIX_DIR
    from pytest_simplefsdp.spec import profiles

    shipped = pytester.path / "shipped"
    shipped.mkdir()
    for p in MATRIX_DIR.glob("*.yaml"):
        (shipped / p.name).write_text(p.read_text())
    shutil.copytree(MATRIX_DIR / "noise", shipped / "noise")  # (the CPU profile's measured noise, beside it)
    (shipped / "h100x8.yaml").write_text(
        (MATRIX_DIR / "h100x8.yaml").read_text().replace("  model: [llama3,", "  model: [gemma,")
    )
    monkeypatch.setattr(profiles, "MATRIX_DIR", shipped)
    (pytester.path / "fake.yaml").write_text(fake_matrix())
    result = pytester.runpytest_inprocess(
        "--simplefsdp-matrix", "--simplefsdp-matrix-file=fake.yaml", "--simplefsdp-dry-run", "--co", "-q"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*a shipped profile does not load: */shipped/h100x8.yaml:*: *gemma*"])
    # an upstream profile with a wrong target is broken too; only a suite not installed here is skipped (its
    # error said "source upstream" as well, and the check once went by that text)
    (shipped / "h100x8.yaml").write_text((MATRIX_DIR / "h100x8.yaml").read_text())
    assert (
        pytester.runpytest_inprocess(
            "--simplefsdp-matrix", "--simplefsdp-matrix-file=fake.yaml", "--simplefsdp-dry-run", "--co", "-q"
        ).ret
        == pytest.ExitCode.OK
    )
    upstream = shipped / "upstream.yaml"
    upstream.write_text(upstream.read_text().replace("target: titan03", "target: titan3"))
    result = pytester.runpytest_inprocess(
        "--simplefsdp-matrix", "--simplefsdp-matrix-file=fake.yaml", "--simplefsdp-dry-run", "--co", "-q"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*a shipped profile does not load: */shipped/upstream.yaml:*: source upstream needs "
            "target titan03 or titan02, got 'titan3'"
        ]
    )
