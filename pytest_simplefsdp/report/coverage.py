"""The coverage report (--simplefsdp-coverage, ``python -m pytest_simplefsdp.report.coverage``): for each SimpleFSDP
integration test of the installed torchtitan, the cell of the shipped profiles that runs its configuration, or
what is missing; our cells whose layout no upstream test runs; and upstream's disabled tests with the known
failures of ours that apply to them."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from tabulate import tabulate

from ..judge.known import could_apply, load_known_failures
from ..kinds import Coverage
from ..paths import KNOWN_FAILURES
from ..spec.cells import expand
from ..spec.matrix import load_matrix, with_tier
from ..spec.profiles import shipped
from ..spec.upstream import (
    DEFAULTS,
    INCIDENTAL,
    UPSTREAM_AXES,
    UpstreamTest,
    configuration,
    generation,
    later_runs,
    load,
    normal,
    options,
    tokens,
    upstream_axes,
    variant,
)
from ..targets import make_target
from ..yamlio import MatrixError


@dataclass
class Candidate:
    """One cell of our profiles, as coverage sees it."""

    where: str  # profile[tier]::cell id
    axes: dict
    world: int
    features: dict
    ruled_out: str = ""  # a cell the profile drops: "rule <name>: <reason>"
    raw: dict = field(default_factory=dict)  # its axes as the matrix has them, and what known failures see besides
    env: dict = field(default_factory=dict)


def candidates(matrices) -> list[Candidate]:
    """Every valid cell of these matrices (already in their tier), with the features its flags add."""
    out = []
    for m in matrices:
        tier = "" if m.tier == "real" else f"[{m.tier}]"
        target = make_target(m, Path("."))
        cells, dropped = expand(m)
        for cell in [*cells, *dropped]:
            flags = [*m.features.get(cell.axes.get("feature", "none"), []), *m.settings.get("extra_args", [])]
            first = options(tokens(flags))
            features = {k: v for k, v in first.items() if k not in INCIDENTAL and k != "config"}
            then = m.feature_runs.get(cell.axes.get("feature", "none"), [])
            if then:
                features.update(later_runs([tokens(t) for t in then], first))
            if "precompile" in m.feature_before.get(cell.axes.get("feature", "none"), []):
                features["precompile step"] = True
            config = variant(target.job_config(cell.axes)[1], cell.axes.get("model", "")) if cell in cells else ""
            if config:
                features["config"] = config
            ruled = f"rule {cell.rule}: {cell.reason}" if cell not in cells else ""
            env = {"profile": m.profile, "target": target.name, "device": m.device, "tier": m.tier}
            out.append(
                Candidate(
                    f"{m.profile}{tier}::{cell.id}",
                    normal(cell.axes),
                    cell.world,
                    features,
                    ruled,
                    dict(cell.axes),
                    env,
                )
            )
    return out


@dataclass
class Row:
    test: UpstreamTest
    status: Coverage
    cells: list  # where of the cells that cover it (all of them when covered or partly)
    reason: str = ""  # what is missing


# where a test sets nothing, its config file decides, which the wheel does not ship (0.2's debug_model.toml): any
# value of ours matches
CONFIG_DECIDES = {"ac"}


def differences(want: dict, have: dict) -> list[str]:
    keys = sorted((set(want) | set(have)) - (CONFIG_DECIDES - set(want)))
    return [
        f"{k}={want.get(k, 'unset')} (ours: {have.get(k, 'no such axis')})"
        for k in keys
        if want.get(k, DEFAULTS.get(k)) != have.get(k, DEFAULTS.get(k))
    ]


def cover(test: UpstreamTest, pool: list[Candidate]) -> Row:
    conf = configuration(test)
    want = normal(conf.axes)
    same_world = [c for c in pool if c.world == conf.world and not c.ruled_out]
    layout = [c for c in same_world if not differences(want, c.axes)]

    def missing(c):
        return sorted(k for k, v in conf.features.items() if c.features.get(k) != v)

    full = [c for c in layout if not missing(c)]
    if full:
        return Row(test, Coverage.COVERED, [c.where for c in full])
    if layout:
        best = min(layout, key=lambda c: len(missing(c)))
        return Row(
            test, Coverage.PARTLY, [c.where for c in layout], f"same layout; not set by any: {', '.join(missing(best))}"
        )
    ruled = next((c for c in pool if c.ruled_out and c.world == conf.world and not differences(want, c.axes)), None)
    if ruled:
        return Row(test, Coverage.NONE, [], f"{ruled.where.split('::')[0]} rules this layout out: {ruled.ruled_out}")
    if not same_world:
        return Row(test, Coverage.NONE, [], f"no profile has a {conf.world}-rank world")
    nearest = min(same_world, key=lambda c: len(differences(want, c.axes)))
    return Row(
        test, Coverage.NONE, [], f"nearest {nearest.where} differs in " + "; ".join(differences(want, nearest.axes))
    )


def coverage(tests, pool) -> dict:
    """Upstream test by test, then the other direction: our cells whose layout no upstream test runs."""
    rows = [cover(t, pool) for t in tests]
    upstream_layouts = [(configuration(t).world, normal(configuration(t).axes)) for t in tests]
    ours = [c for c in pool if not c.ruled_out]
    ours_only = [
        c.where for c in ours if not any(w == c.world and not differences(a, c.axes) for w, a in upstream_layouts)
    ]
    totals = {str(s): sum(r.status == s for r in rows) for s in Coverage}
    return {"tests": rows, "ours_only": ours_only, "totals": totals, "cells": len(ours)}


def cross_links(cov, pool, known) -> list[dict]:
    """Each upstream-disabled test with the known-failure entries of ours that apply to a cell running it (or
    to its own cell in the ``source: upstream`` profile), and the issues upstream's note names."""
    by_where = {c.where: c for c in pool}
    out = []
    for row in cov["tests"]:
        t = row.test
        if not t.disabled:
            continue
        cells = [by_where[w] for w in row.cells if w in by_where]
        targets = [(c.raw, c.env) for c in cells] + [(upstream_axes(t), {"profile": "upstream", "tier": "real"})]
        entries = [e for e in (known.entries if known else []) if any(could_apply(e, a, env) for a, env in targets)]
        why = (
            ""
            if entries
            else (
                "no cell of ours runs it: " + row.reason
                if row.status == Coverage.NONE
                else "no entry yet: no run of ours has shown its error (its cells are GPU-only, or pass where they ran); "
                "--candidates drafts one from upstream's reason"
            )
        )
        out.append(
            {
                "name": t.name,
                "entries": [{"id": e.id, "link": e.link} for e in entries],
                "why_none": why,
                "upstream_note": t.note,
                "upstream_links": list(t.links),
            }
        )
    return out


def candidates_yaml(links) -> str:
    """Known-failure entries for the upstream-disabled tests no entry covers, for a person to confirm: the
    upstream profile's cell, upstream's reason and link carried over, the error left to fill in."""
    out = []
    for x in links:
        if x["entries"]:
            continue
        link = x["upstream_links"][0] if x["upstream_links"] else "TODO"
        reason = (x["upstream_note"] or "upstream disables it without a comment").replace("'", "''")
        out.append(
            f"- id: upstream-{x['name'].replace('+', '-')}\n  when: {{profile: upstream, upstream: "
            f"'{x['name']}'}}\n  error: 'TODO: the error line, once a run shows it'\n  kind: xfail\n"
            f"  link: {link}\n  reason: 'upstream disables it: {reason}'\n"
        )
    return "".join(out)


def render(cov, fmt="text") -> str:
    rows = cov["tests"]
    t = cov["totals"]
    head = (
        f"upstream coverage: {len(rows)} upstream tests: {t['covered']} covered, {t['partly']} partly, "
        f"{t['none']} not covered; {len(cov['ours_only'])} of our {cov['cells']} cells run a layout no upstream "
        f"test runs"
    )
    links = cov.get("disabled", [])
    if fmt == "json":
        return (
            json.dumps(
                {
                    "totals": t,
                    "cells": cov["cells"],
                    "ours_only": cov["ours_only"],
                    "disabled": links,
                    "tests": [
                        {
                            "name": r.test.name,
                            "kind": r.test.kind,
                            "ngpu": r.test.ngpu,
                            "disabled": r.test.disabled,
                            "status": str(r.status),
                            "cells": r.cells,
                            "reason": r.reason,
                            "where": r.test.where,
                            "note": r.test.note,
                            "links": list(r.test.links),
                        }
                        for r in rows
                    ],
                },
                indent=1,
            )
            + "\n"
        )
    table = [
        (
            r.test.name + (" (disabled)" if r.test.disabled else ""),
            r.test.ngpu,
            str(r.status),
            r.cells[0] + (f" +{len(r.cells) - 1}" if len(r.cells) > 1 else "") if r.cells else "-",
            r.reason,
        )
        for r in rows
    ]
    style = "github" if fmt == "md" else "simple"
    body = tabulate(
        table,
        headers=("upstream test", "GPUs", "coverage", "our cell", "missing"),
        tablefmt=style,
        maxcolwidths=[None, None, None, 60, 70] if fmt == "text" else None,
    )
    known = tabulate(
        [
            (
                x["name"],
                ", ".join(f"{e['id']} ({e['link']})" for e in x["entries"]) or x["why_none"],
                " ".join(x["upstream_links"]) or "-",
            )
            for x in links
        ],
        headers=("upstream-disabled test", "our known failure", "upstream's links"),
        tablefmt=style,
        maxcolwidths=[None, 80, 50] if fmt == "text" else None,
    )
    mark = "# " if fmt == "md" else ""
    return f"{mark}{head}\n\n{body}\n\n{mark}upstream-disabled tests and our known failures\n\n{known}\n"


def shipped_matrices(gen: str):
    """The shipped profiles of a generation, each in the real tier and (where it has one) the trace tier."""
    out = []
    for name, path in shipped().items():
        if name.startswith("titan02-") != (gen == "0.2") or name.endswith("upstream"):
            continue  # (the upstream-sourced profile runs upstream's tests: it covers nothing of ours)
        m = load_matrix(path)
        out.append(m)
        if m.trace:
            out.append(with_tier(m, "trace"))
    return out


def report(known_path=None):
    """The coverage of the installed generation's upstream suite by the shipped profiles, cross-linked with the
    known failures: the document render() and candidates_yaml() take."""
    gen = generation()
    if gen is None:
        raise LookupError(
            "the installed torchtitan ships no SimpleFSDP suite (experiments/graph_trainer or simple_fsdp)"
        )
    tests = load(gen=gen)
    matrices = shipped_matrices(gen)
    axis_names = {a for m in shipped_matrices("0.2") + shipped_matrices("0.3") for a in m.axes} | UPSTREAM_AXES
    known = load_known_failures(known_path or KNOWN_FAILURES, axis_names)
    pool = candidates(matrices)
    cov = coverage(tests, pool)
    cov["disabled"] = cross_links(cov, pool, known)
    return cov


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pytest_simplefsdp.report.coverage",
        description="Which cell of our profiles runs each of the installed torchtitan's "
        "SimpleFSDP integration tests (and which of ours upstream lacks).",
    )
    parser.add_argument("--format", choices=("text", "md", "json"), default="text")
    parser.add_argument(
        "--known-failures",
        default=None,
        help="the known-failures file to cross-link (default: the one shipped with the plugin)",
    )
    parser.add_argument(
        "--candidates",
        action="store_true",
        help="print known-failure entries for the upstream-disabled tests no entry covers, to confirm",
    )
    args = parser.parse_args(argv)
    try:
        cov = report(args.known_failures)
    except (LookupError, metadata.PackageNotFoundError, MatrixError) as e:
        parser.error(str(e))
    sys.stdout.write(candidates_yaml(cov["disabled"]) if args.candidates else render(cov, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
