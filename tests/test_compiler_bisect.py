"""--simplefsdp-bisect=compiler: the search over the compile ladder and the graph passes (session.compiling), on a
scripted probe, and the whole path on fake ranks that run named passes and fail where some of them ran: the step
named in the terminal, the JSON, the issue body and the known-failures entry's reason."""

import html
import json
import textwrap

from pytest_simplefsdp.session.compiling import ddmin, search
from pytest_simplefsdp.versions.bisect import FAILS, OTHER, PASSES, UNTESTABLE, Probe

from helpers import FAKE_RANK

PASSES_RAN = ["dce", "canonicalize", "bucketing", "regional"]


def scripted(rule, mandatory=()):
    """probe(step) for a cell that fails where ``rule(mode, passes that ran)`` says; the steps it was asked, kept."""
    asked = []

    def probe(step):
        asked.append(step.words)
        mode = dict(step.axes).get("compile", "aot_fx_trace")
        off = step.passes.off if step.passes else ()
        if any(p in mandatory for p in off):
            return Probe(step.words, UNTESTABLE)
        ran = (
            []
            if mode == "eager"
            else [p for p in PASSES_RAN if not (step.passes and step.passes.every) and p not in off]
        )
        return Probe(
            step.words, FAILS if rule(mode, ran) else PASSES, "RuntimeError: broken" if rule(mode, ran) else ""
        )

    return probe, asked


def test_one_pass_is_named_after_the_ladder_and_one_probe_per_pass():
    probe, asked = scripted(lambda mode, ran: "bucketing" in ran)
    probes, named, culprits = search({"compile": "aot_fx_trace", "memory_policy": "default"}, PASSES_RAN, probe)
    assert culprits == ["bucketing"]
    assert named == (
        "fails with pass bucketing on, passes with it off; with only it on it fails; "
        "aot_fx_trace with no graph pass passes; eager passes"
    )
    assert asked == [
        "eager",
        "aot_fx_trace with no graph pass",
        "without dce",
        "without canonicalize",
        "without bucketing",
        "without regional",
        "only bucketing on",
    ]
    assert len(probes) == len(asked)


def test_two_passes_that_break_it_only_together_are_named_together():
    probe, _ = scripted(lambda mode, ran: {"canonicalize", "regional"} <= set(ran))
    _, named, culprits = search({"compile": "aot_fx_trace"}, PASSES_RAN, probe)
    assert culprits == ["canonicalize", "regional"]
    assert named.startswith("fails with passes canonicalize + regional on together, passes with either off;")


def test_either_of_two_passes_breaks_it_delta_debugging_finds_one():
    """No pass is needed on its own (each off, the other still breaks it): ddmin finds a smallest failing set."""
    probe, asked = scripted(lambda mode, ran: bool({"dce", "regional"} & set(ran)))
    _, named, culprits = search({"compile": "aot_fx_trace"}, PASSES_RAN, probe)
    assert culprits in (["dce"], ["regional"]), (culprits, asked)
    assert named.startswith(f"fails with pass {culprits[0]} on")


def test_the_ladder_stops_at_the_first_rung_that_fails():
    probe, asked = scripted(lambda mode, ran: mode != "eager")
    _, named, culprits = search({"compile": "aot_fx_trace"}, PASSES_RAN, probe)
    assert (named, culprits, asked) == (
        "fails at the rung 'aot_fx_trace with no graph pass' already; eager passes",
        [],
        ["eager", "aot_fx_trace with no graph pass"],
    )
    probe, asked = scripted(lambda mode, ran: True)
    assert search({"compile": "aot_fx_trace"}, PASSES_RAN, probe)[1] == "fails in eager mode too: not a compiler step"
    # jit (0.2: compiled) on inductor: the rung below is the aot_eager backend; no graph pass to search after it
    probe, asked = scripted(lambda mode, ran: mode != "eager")
    probes, named, _ = search({"compile": "compiled", "backend": "aot_eager"}, [], probe)
    assert (asked, named) == (
        ["eager"],
        "fails only compiled (compiled on the aot_eager backend); eager passes; no graph pass ran",
    )
    probe, asked = scripted(lambda mode, ran: False)
    search({"compile": "jit", "backend": "inductor"}, [], probe)
    assert asked == ["eager", "jit on the aot_eager backend"]


def test_a_rung_with_a_failure_of_its_own_is_skipped_not_the_step():
    """Eager fails otherwise (deepseek_v3 TP+PP's own eager numerics): the ladder goes on, and says so."""

    def probe(step):
        mode = dict(step.axes).get("compile", "aot_fx_trace")
        if mode == "eager":
            return Probe(step.words, OTHER, "numerics: grad_norm of layers.N.ffn_norm.weight")
        return Probe(step.words, FAILS, "AssertionError: stable topological sort of region failed")

    probes, named, culprits = search({"compile": "aot_fx_trace"}, PASSES_RAN, probe)
    assert named == (
        "fails at the rung 'aot_fx_trace with no graph pass' already; "
        "eager other (numerics: grad_norm of layers.N.ffn_norm.weight)"
    )
    assert (culprits, len(probes)) == ([], 2)


def test_a_pass_that_cannot_be_turned_off_is_untestable_not_innocent():
    probe, _ = scripted(lambda mode, ran: {"canonicalize", "bucketing"} <= set(ran), mandatory=("canonicalize",))
    probes, named, culprits = search({"compile": "aot_fx_trace"}, PASSES_RAN, probe, mandatory=["canonicalize"])
    assert "without canonicalize" not in [p.version for p in probes]  # (the failing run's record: mandatory)
    assert culprits == ["bucketing"]  # (canonicalize runs in every probe: what can be named is bucketing)
    assert named.startswith("fails with pass bucketing on (with canonicalize, which run in every probe), passes")
    # a pass mandatory only where a probe turned it off: that probe says so, as untestable
    probes, _, culprits = search({"compile": "aot_fx_trace"}, PASSES_RAN, probe)
    assert {p.version: p.outcome for p in probes}["without canonicalize"] == UNTESTABLE


def test_ddmin_finds_a_one_minimal_failing_subset():
    calls = []

    def fails(subset):
        calls.append(list(subset))
        return {"c", "f"} <= set(subset)

    assert ddmin(list("abcdefgh"), fails) == ["c", "f"]
    assert len(calls) < 2**8  # (not every subset)


MATRIX = f"""\
profile: fake
target:
  command: ["{{python}}", "{FAKE_RANK}", "--mode", "pass", "--dump", "{{dump_folder}}", "--steps", "3",
            "--compile", "{{compile}}", "--graph-passes", "dce,canonicalize,bucketing,regional",
            "--passes-off", "{{passes_off}}", "--breaks-with", "{{breaks}}"]
device: cpu
world_sizes: [2]
degrees: [ranks]
timeout: 30
axes:
  breaks: [bucketing, canonicalize+bucketing, trace]
  compile: [aot_fx_trace]
  ranks: [2]
ids:
  ranks: {{prefix: r}}
"""


def test_the_compiler_step_lands_in_the_terminal_json_issue_and_entry(run_matrix, pytester):
    """Three cells: one pass breaks it, two passes only together, the trace itself. Each bisection's step reaches
    the terminal, the run's JSON (its bisections and the cell's record), the page, the issue body beside the run,
    the entry that matched (its reason ends with the step) and the new entries drafted; the file loads again."""
    trace_words = "fails at the rung 'aot_fx_trace with no graph pass' already; eager passes"
    kf = pytester.path / "kf.yaml"
    kf.write_text(
        textwrap.dedent("""\
        # ours
        - id: fake-bucketing
          when: {breaks: bucketing}
          error: "fake miscompile"
          kind: xfail
          link: https://example.com/issues/1
          reason: >-
            The bucketing pass breaks
            the graph.
        """)
    )
    out = pytester.path / "run.json"
    result = run_matrix(
        MATRIX,
        "-k",
        "bucketing or trace",
        "--simplefsdp-bisect=compiler",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-known-failures={kf}",
        "--simplefsdp-update-known-failures",
    )
    result.assert_outcomes(failed=2, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*simplefsdp bisect compiler: fake::bucketing-aot_fx_trace-r2: fails with pass bucketing on, passes with "
            "it off; with only it on it fails; aot_fx_trace with no graph pass passes; eager passes*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*7 probes in *s; the failing run's graph passes: dce, canonicalize, bucketing, "
            "regional; its ranks failed inside bucketing; issue body: *"
        ]
    )
    doc = json.loads(out.read_text())
    found = {b["cell"]: b for b in doc["bisections"]}
    cells = {c["id"]: c for run in doc["runs"] for c in run["cells"]}
    assert cells["trace-aot_fx_trace-r2"]["compiler_step"] == trace_words  # the cell's record says it too
    page = (pytester.path / "runs" / "index.html").read_text()
    assert "<h2 id='bisections'>Bisections</h2>" in page and html.escape(f"(compiler step: {trace_words})") in page
    assert found["fake::canonicalize_bucketing-aot_fx_trace-r2"]["culprits"] == ["canonicalize", "bucketing"]
    trace = found["fake::trace-aot_fx_trace-r2"]
    assert trace["culprits"] == [] and trace["found"] == trace_words
    assert [p["version"] for p in trace["probes"]] == ["eager", "aot_fx_trace with no graph pass"]
    issue = (pytester.path / "runs" / "bisect" / "bucketing-aot_fx_trace-r2-compiler.md").read_text()
    assert "**Found:** fails with pass bucketing on" in issue and "`--compile.disable_passes bucketing` added" in issue
    assert "| without bucketing | passes | 1x passes |" in issue
    text = kf.read_text()
    assert text.startswith("# ours\n- id: fake-bucketing\n")
    assert "The bucketing pass breaks the graph. Compiler bisection (" in text.replace("\n    ", " ")
    assert "7 probes): fails with pass bucketing on, passes with it off" in text.replace("\n    ", " ")
    # the new failures' drafted entries end with theirs too, and the file loads again
    assert "fails with passes canonicalize + bucketing on together" in text.replace("\n    ", " ")
    assert (
        "  reason: >-\n    The bucketing pass breaks\n    the graph.\n    Compiler bisection (" in text
    )  # (lines kept)
    again = run_matrix(
        MATRIX,
        "-k",
        "bucketing and not canonicalize",
        "--simplefsdp-bisect=compiler",
        f"--simplefsdp-known-failures={kf}",
        "--simplefsdp-update-known-failures",
    )
    again.assert_outcomes(xfailed=1)  # the file the update wrote loads, and judges the cell
    assert kf.read_text().count("Compiler bisection (") == 3  # the entry's sentence replaced, not added twice
