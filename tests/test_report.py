"""Reports: status markdown from a run and from its JSON, comparison with a stored run, reproducers."""

import fnmatch
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

from pytest_simplefsdp.judge.known import signature
from pytest_simplefsdp.judge.results import error_site, last_exception

from helpers import KF, fake_matrix, report_tool, run_doc


def test_status_md_is_regenerated_byte_for_byte_from_json(run_matrix, pytester):
    kf = pytester.path / "kf.yaml"
    kf.write_text(KF)
    md, js = pytester.path / "status.md", pytester.path / "run.json"
    run_matrix(
        fake_matrix(modes=["pass", "fail", "segv"]),
        f"--simplefsdp-status-md={md}",
        f"--simplefsdp-json={js}",
        f"--simplefsdp-known-failures={kf}",
    )
    text = md.read_text()
    assert text.startswith("# SimpleFSDP composability status\n\n✅ passes")
    assert "| pass     | ✅     |" in text and "| fail     | 🚧[^1] |" in text and "| segv     | ❌[^2] |" in text
    assert (
        "[^1]: `fail-r2`: known failure `fake-known` (https://github.com/pytorch/torchtitan/pull/1529): "
        "`RuntimeError: fake failure on purpose`" in text
    )  # a rank's text is a code span: never markup
    assert "[^2]: `segv-r2`: crash: `rank 1 killed by SIGSEGV`" in text
    for source in (js, pytester.path / "runs" / "results.jsonl"):
        for judged in (["--known-failures", str(kf)], ["--as-stored"]):  # judged again with the same file, or not
            again = subprocess.run(
                [sys.executable, "-m", "pytest_simplefsdp.report", str(source), "--format", "md", *judged],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert again == text


def test_compare_lists_and_marks_changes(run_matrix, pytester):
    first = pytester.path / "first.json"
    text = fake_matrix(modes=["pass", "fail", "exit3"])
    run_matrix(text, f"--simplefsdp-json={first}")
    doc = json.loads(first.read_text())
    for cell in doc["runs"][0]["cells"]:  # pretend the stored run saw the opposite / another error
        if cell["id"] == "pass-r2":
            cell["status"] = "failed"
        elif cell["id"] == "fail-r2":
            cell["status"] = "passed"
        else:
            cell["signature"] = cell["error_line"] = cell["error_text"] = "RuntimeError: something else"
    first.write_text(json.dumps(doc))
    md = pytester.path / "status.md"
    result = run_matrix(text, f"--simplefsdp-compare={first}", f"--simplefsdp-status-md={md}")
    result.stdout.fnmatch_lines(
        [
            "*simplefsdp: changes since *first.json*",
            "newly fixed: fake::pass-r2",
            "newly broken: fake::fail-r2",
            "changed signature: fake::exit3-r2",
        ]
    )
    status = md.read_text()
    assert "✅🎉" in status and "❌[^1]🆕" in status and "❌[^2]🔀" in status


def test_reproducer_reruns_the_cell_alone_with_the_same_signature(run_matrix, pytester):
    js = pytester.path / "run.json"
    result = run_matrix(fake_matrix(modes=["fail"], timeout=120), f"--simplefsdp-json={js}", launcher="torchrun")
    result.assert_outcomes(failed=1)
    rec = run_doc(js)["cells"][0]
    command = open(f"{rec['log_dir']}/command.txt").read()
    assert command.strip() == rec["reproducer"]
    rerun = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert rerun.returncode != 0
    head = "Traceback (most recent call last):"
    blocks = (rerun.stdout + rerun.stderr).split(head)[1:]  # the rank's, then torchrun's own
    # the identity (judge.identity): the error and the frame that raised it, the same when rerun alone
    assert rec["signature"] in {f"{signature(last_exception(head + b)[1])} @ {error_site(head + b)}" for b in blocks}


def test_junit_has_one_property_per_axis(run_matrix, pytester):
    xml = pytester.path / "junit.xml"
    run_matrix(fake_matrix(modes=["fail"]), f"--junitxml={xml}")
    case = next(ET.parse(xml).getroot().iter("testcase"))
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["axis.mode"] == "fail" and props["axis.ranks"] == "2"
    assert props["failure_class"] == "runtime" and float(props["wall_s"]) > 0


def test_the_report_tool_refuses_malformed_input_naming_file_record_and_field(run_matrix, pytester):
    js = pytester.path / "run.json"
    run_matrix(fake_matrix(modes=["pass", "fail"]), f"--simplefsdp-json={js}")
    doc, lines = json.loads(js.read_text()), (pytester.path / "runs" / "results.jsonl").read_text().splitlines()
    bad = pytester.path / "bad.json"
    for name, text, message in [
        ("cut short", js.read_text()[: len(js.read_text()) // 2], f"{bad}:* not valid JSON (cut short?): "),
        ("empty", "", f"{bad}: empty: no run recorded"),
        (
            "no row",
            json.dumps(
                {
                    "runs": [
                        {
                            **doc["runs"][0],
                            "cells": [{k: v for k, v in doc["runs"][0]["cells"][0].items() if k != "row"}],
                        }
                    ]
                }
            ),
            f"{bad}: not a simplefsdp run: runs.0.cells.0.row: Field required",
        ),
        (
            "bad status",
            json.dumps({"runs": [{**doc["runs"][0], "cells": [dict(doc["runs"][0]["cells"][0], status="passd")]}]}),
            f"{bad}: not a simplefsdp run: runs.0.cells.0.status: Input should be *(got 'passd')",
        ),
        ("line without meta", "\n".join(lines[1:]) + "\n", f"{bad}: records of fake.yaml come without its meta record"),
        (
            "line missing a field",
            "\n".join([lines[0], json.dumps({k: v for k, v in json.loads(lines[1]).items() if k != "axes"}), lines[2]])
            + "\n",
            f"{bad}:2: cell record: axes: Field required",
        ),
    ]:
        bad.write_text(text)
        proc = report_tool(bad)
        assert proc.returncode == 1 and fnmatch.fnmatch(proc.stderr.strip(), message + "*"), (name, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert report_tool(js).returncode == 0  # the good one still renders
