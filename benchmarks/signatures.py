"""Which stored failures shared a signature before issue 58 and which share one now: the known-failures signature
(judge.known.signature: numbers, paths and frames dropped), which broken trunk, history and confirming runs used to
compare, against the identity they compare now (judge.identity). Not a test; it measures and prints.

    python benchmarks/signatures.py RUN.json [RUN.json ...] [--faults] [--markdown]

RUN.json: a ``--simplefsdp-json`` document (or a run's results.jsonl) of runs made with this revision (their
records carry ``site``, where each failure was). ``--faults`` adds one real run of the fault tier's fakes
(tests/fakes/fake_rank.py: errors, hangs, crashes and numerics faults on different ranks and steps). Each row is
one old signature that two or more failures shared: how many failures, and into how many identities they split
now; a split row is two bugs the old signature merged (or one bug seen from two ranks, which the row names)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pytest_simplefsdp.judge.identity import identity  # noqa: E402
from pytest_simplefsdp.judge.known import signature  # noqa: E402
from pytest_simplefsdp.judge.results import CellResult  # noqa: E402

FAKES = ROOT / "tests" / "fakes"
# (mode, extra fake_rank arguments): faults that failed with one old signature per group
FAULTS = [
    ("fail", ""),
    ("fail", ', "--at-step", "3"'),
    ("fail", ', "--error", "AssertionError: "'),
    ("fail", ', "--error", "ValueError: fake failure on purpose"'),
    ("hang", ""),
    ("usr1ignore", ""),
    ("leave", ""),
    ("segv", ""),
    ("kill", ""),
    ("exit3", ""),
    ("nan", ""),
    ("nan", ', "--steps", "4"'),
    ("zerograd", ""),
]


def records(path: Path) -> list[tuple[str, dict]]:
    """(profile, record) of each cell record of a stored run."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [(r.get("profile", path.stem), r) for r in lines if r.get("type", "cell") == "cell"]
    runs = json.loads(text)["runs"]
    return [(run["meta"]["profile"], c) for run in runs for c in run["cells"] + run.get("mutants", [])]


def fault_run(out: Path) -> Path:
    """One pytest run of the fakes, one cell per fault (a mode axis of labels), with the local launcher."""
    commands = {
        f"f{n}": f'["{{python}}", "-m", "fake_rank", "--mode", "{mode}", "--dump", "{{dump_folder}}", '
        f'"--steps", "{{steps}}"{args}]'
        for n, (mode, args) in enumerate(FAULTS)
    }
    matrices = []
    for (name, command), (mode, _) in zip(commands.items(), FAULTS):
        path = out / f"{name}-{mode}.yaml"
        path.write_text(
            textwrap.dedent(f"""\
            profile: {name}-{mode}
            target:
              env: {{PYTHONPATH: "{FAKES}"}}
              command: {command}
            device: cpu
            world_sizes: [2]
            degrees: [ranks]
            timeout: 8
            settings: {{steps: 3}}
            axes:
              ranks: [2]
            """)
        )
        matrices.append(f"--simplefsdp-matrix-file={path}")
    doc = out / "faults.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "--simplefsdp-matrix",
            *matrices,
            "--simplefsdp-confirm=1",
            "--simplefsdp-history=off",
            f"--simplefsdp-json={doc}",
            f"--simplefsdp-artifacts={out / 'runs'}",
            "-p",
            "no:cacheprovider",
        ],
        cwd=out,
        capture_output=True,
        text=True,
    )
    return doc


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", type=Path)
    p.add_argument("--faults", action="store_true", help="add a real run of the fault tier's fakes")
    p.add_argument("--markdown", action="store_true", help="a markdown table (docs/measurements.md)")
    a = p.parse_args()
    paths = list(a.runs)
    if a.faults:
        paths.append(fault_run(Path(tempfile.mkdtemp(prefix="signatures-"))))
    failures = []
    for path in paths:
        for profile, rec in records(path):
            if not rec.get("failure_class") or rec.get("not_run"):
                continue
            result = CellResult.from_record(rec)
            old = signature(rec.get("error_text") or rec.get("error_line"))
            failures.append((f"{profile}::{rec['id']}", old, identity(result)))  # (made again: this revision's)
    by_old = defaultdict(list)
    for cell, old, new in failures:
        by_old[old].append((cell, new))
    rows = []
    for old, group in sorted(by_old.items(), key=lambda kv: -len(kv[1])):
        if len(group) < 2:
            continue
        news = sorted({new for _, new in group})
        rows.append((old, len(group), len(news), news))
    olds, news = len(by_old), len({new for *_, new in failures})
    print(f"{len(failures)} failures from {len(paths)} run(s): {olds} signatures before, {news} identities now")
    if a.markdown:
        print("\n| signature before | failures | identities now | the identities |\n|---|---|---|---|")
        for old, n, k, ids in rows:
            print(f"| `{old[:90]}` | {n} | {k} | {'<br>'.join(f'`{i[:140]}`' for i in ids)} |")
        return
    for old, n, k, ids in rows:
        print(f"\n{n} failures shared: {old[:160]}\n  now {k} identit{'y' if k == 1 else 'ies'}:")
        for i in ids:
            cells = [c for c, new in by_old[old] if new == i]
            print(f"    {i[:200]}  ({len(cells)}: {', '.join(cells[:4])}{' ...' if len(cells) > 4 else ''})")


if __name__ == "__main__":
    main()
