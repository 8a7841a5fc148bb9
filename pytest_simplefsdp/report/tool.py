"""The report tool: a stored run rendered again, judged again against a known-failures file, compared with an
older run (``python -m pytest_simplefsdp.report RUN.json[l] [--format text|md|json]``)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import sys
from pathlib import Path

from ..judge.decision import rejudge
from ..judge.known import load_known_failures
from ..kinds import Status
from ..paths import KNOWN_FAILURES, MATRIX_DIR
from ..spec.matrix import load_matrix
from ..spec.upstream import UPSTREAM_AXES
from ..store.history import WINDOW, History
from ..store.runs import RunError, load_run
from ..versions.git import Commit
from ..words import plural
from ..yamlio import MatrixError
from . import document, history, memory, noise, page
from .compare import change_lines
from .markdown import render_md
from .tables import render_text


def known_for(path, doc):
    """A known-failures file loaded to re-judge a stored run: conditions may name the run's axes, the shipped
    profiles' axes and upstream's (an entry for another matrix simply matches nothing here)."""
    names = set(UPSTREAM_AXES) | {
        a for run in doc["runs"] for rec in run["cells"] + run["dropped"] for a in rec["axes"]
    }
    for p in MATRIX_DIR.glob("*.yaml"):
        try:
            names |= set(load_matrix(p).axes)
        except MatrixError:
            pass  # an upstream-sourced profile whose torchtitan is not installed here
    return load_known_failures(path, names)


def rejudged(doc, known, gate=False):
    """The run with every cell judged again against ``known`` (decision.rejudge, as the live run decides), the
    environment read from each matrix's meta record (report.document sums up its sections again after)."""
    runs = []
    for run in doc["runs"]:
        meta = run["meta"]
        v = meta.get("versions") or {}
        commit = meta.get("torchtitan_commit")
        env = {
            "profile": meta.get("profile"),
            "target": meta.get("target"),
            "device": meta.get("device"),
            "tier": meta.get("tier", "real"),
            "torch": v.get("torch"),
            "torchtitan": v.get("torchtitan"),
            "torchtitan_commit": Commit(commit["sha"], commit["repo"]) if commit else None,
        }
        runs.append({**run, "cells": [rejudge(rec, known, env, gate, meta.get("base")) for rec in run["cells"]]})
    return {**doc, "runs": runs}


def judged_by(doc, chosen):
    """(the known-failures file to judge the run with, the line that says which): the one named, else the file
    the run recorded as its judge (each meta record says; a changed or vanished file is said), else the shipped
    one (a run stored before runs recorded it)."""
    if chosen:
        return chosen, f"re-judged against {chosen} (--known-failures)"
    recorded = next(
        (run["meta"].get("known_failures") for run in doc["runs"] if run["meta"].get("known_failures")), None
    )
    if recorded is None:
        return (
            KNOWN_FAILURES,
            f"re-judged against the shipped {KNOWN_FAILURES} (the run does not say which file judged it)",
        )
    path = Path(recorded["path"])
    if not path.is_file():
        return None, f"the run's known-failures file {path} is gone: showing the verdicts as stored"
    same = hashlib.sha256(path.read_bytes()).hexdigest() == recorded.get("sha256")
    return path, (
        f"re-judged against {path}, the file that judged the run"
        + ("" if same else " (changed since: it no longer has the bytes that judged the run)")
    )


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_simplefsdp.report",
        description="Render a stored simplefsdp run (JSON or JSON lines), judged again against the known-failures "
        "file that judged it (or another), optionally compared with an older run. Exits 1 under --gate "
        "when any cell fails.",
    )
    parser.add_argument(
        "run",
        metavar="RUN",
        help="a --simplefsdp-json document or a run's results.jsonl (with "
        "--format history: the history store, .simplefsdp/history.sqlite)",
    )
    parser.add_argument(
        "--format",
        choices=("text", "md", "json", "noise", "memory", "history"),
        default="text",
        help="text (the terminal table), md (the status markdown), json (the run document), noise "
        "(each layout's noise, as a profile's numerics `noise` file holds it), memory (the bytes "
        "each rank of each cell held after step 1, against its layout; with --compare, against "
        "the older run's), history (each cell's streak and pass rate in the history store RUN)",
    )
    parser.add_argument(
        "--last",
        metavar="N",
        type=int,
        default=WINDOW,
        help=f"--format history: the runs per cell to read (default {WINDOW})",
    )
    parser.add_argument(
        "--known-failures",
        metavar="YAML",
        type=Path,
        default=None,
        help="re-judge every cell against this file (default: the file the run records as its "
        "judge; for runs that do not say: the shipped one)",
    )
    parser.add_argument(
        "--as-stored", action="store_true", help="show the verdicts the run stored, without judging again"
    )
    parser.add_argument(
        "--gate",
        action="store_true",
        help="judge as --simplefsdp-gate does (an XPASS fails), and exit 1 when any cell fails",
    )
    parser.add_argument(
        "--compare",
        metavar="OLD",
        type=Path,
        help="an older stored run: list newly broken, newly fixed and changed-signature cells "
        "(matched by profile and cell id) and mark them in the tables",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="text: list every cell's numerics and evidence (default: summed up; failures in full)",
    )
    parser.add_argument(
        "--html",
        metavar="PATH",
        type=Path,
        help="also write the run as an HTML page: DIR/index.html, or one self-contained FILE.html",
    )
    return parser


def show_history(parser, args) -> int:
    """--format history: each cell's streak in the history store RUN."""
    if not Path(args.run).is_file():
        parser.error(f"{args.run}: no such history store")
    if args.last < 1:
        parser.error(f"--last: at least 1 run, got {args.last}")
    try:
        sys.stdout.write(history.render(History(args.run).streaks(args.last), args.last))
    except sqlite3.DatabaseError as e:
        raise SystemExit(f"{args.run}: not a history store: {e}") from None
    return 0


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.format == "history":
        return show_history(parser, args)
    if args.as_stored and (args.known_failures or args.gate):
        parser.error("--as-stored shows the stored verdicts: it takes no --known-failures or --gate")
    doc = _load(parser, args.run)
    old = _load(parser, args.compare) if args.compare else None
    if not args.as_stored:
        path, said = judged_by(doc, args.known_failures)
        try:
            if path is not None:
                doc = rejudged(doc, known_for(path, doc), args.gate)
        except OSError as e:
            parser.error(f"--known-failures: {path}: {e.strerror}")
        except MatrixError as e:
            raise SystemExit(f"--known-failures: {e}") from None
        print(said, file=sys.stderr)
    # its sections summed up again from its cells as judged now (as the live run built them: report.document)
    doc = document.complete(doc, compared=(args.compare, old) if old is not None else None)
    show(doc, old, args)
    failed = [rec["id"] for run in doc["runs"] for rec in run["cells"] if rec["status"] == Status.FAILED]
    if args.gate and failed:
        print(
            f"gate: {plural(len(failed), 'cell')} fail{'s' if len(failed) == 1 else ''}: "
            f"{', '.join(failed[:8])}{' ...' if len(failed) > 8 else ''}",
            file=sys.stderr,
        )
        return 1
    return 0


def show(doc, old, args):
    """The run in the format asked for, on stdout (with --html, its page too)."""
    if args.format == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    elif args.format == "memory":
        sys.stdout.write(memory.render(doc, old))
    elif args.format == "noise":
        try:
            sys.stdout.write(noise.render(doc))
        except ValueError as e:
            raise SystemExit(f"--format noise: {e}") from None
    else:  # byte for byte what --simplefsdp-status-md wrote for the same run, known failures and folder
        sys.stdout.write(render_md(doc) if args.format == "md" else render_text(doc, args.verbose) + "\n")
    if old is not None and args.format == "text":  # (memory compares the bytes itself)
        sys.stdout.write(f"changes since {args.compare}:\n")
        sys.stdout.writelines(f"  {line}\n" for line, _ in change_lines(doc["comparison"]))
    if args.html:
        print(f"html: {page.write(doc, args.html)}", file=sys.stderr)


def _load(parser, path):
    try:
        return load_run(path)
    except OSError as e:
        parser.error(f"{path}: {e.strerror}")
    except RunError as e:
        raise SystemExit(str(e)) from None
