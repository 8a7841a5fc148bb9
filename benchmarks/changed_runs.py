"""Wall time of the PR gate's selected run (--simplefsdp-changed) for real torchtitan changes, side by side in one
run: each PR checked out in a torchtitan checkout installed editable into this Python, the matrix run from the
checkout's root (as the README runs it) with --simplefsdp-changed=<its parent>. Prints one row per PR (files, cells
selected, outcomes, wall time, ratio to the slowest); HEAD is restored after. It measures, it asserts nothing.

    python benchmarks/changed_runs.py CHECKOUT --pr COMMIT [--touch PATH] ... [--profile cpu]

--pr COMMIT: that commit as a PR over its parent; --touch PATH: a PR on top of HEAD that changes PATH alone (a
comment line appended; a branch made for it and deleted after).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def touch_pr(repo, path) -> str:
    """A commit on a new branch off HEAD that appends one comment line to ``path``; returns the commit."""
    git(repo, "checkout", "-q", "-B", "changed-runs-touch")
    with open(Path(repo) / path, "a") as f:
        f.write("# changed_runs.py: a PR that changes this file alone\n")
    git(repo, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qam", f"touch {path}")
    return git(repo, "rev-parse", "--short=12", "HEAD")


def run_pr(repo, commit, profile, folder) -> dict:
    git(repo, "checkout", "-q", commit)
    out = folder / f"{commit}.json"
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--simplefsdp-matrix",
            f"--simplefsdp-profile={profile}",
            f"--simplefsdp-changed={commit}^",
            f"--simplefsdp-json={out}",
            "-p",
            "no:cacheprovider",
            f"--simplefsdp-artifacts={folder / commit}",
            "-q",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    doc = json.loads(out.read_text())["runs"][0] if out.is_file() else {}
    outcomes: dict[str, int] = {}
    for cell in doc.get("cells", []):
        outcomes[cell["status"]] = outcomes.get(cell["status"], 0) + 1
    changed = doc.get("meta", {}).get("changed") or {}
    selected = changed.get("selected")
    return {
        "commit": commit,
        "exit": proc.returncode,
        "wall": wall,
        "outcomes": outcomes,
        "files": len(changed.get("files", {})),
        "selected": selected,
        "of": None if selected is None else selected + len(changed.get("left_out", [])),
        "subject": git(repo, "log", "-1", "--format=%s", commit)[:50],
        "tail": "" if out.is_file() else (proc.stdout + proc.stderr)[-2000:],
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", type=Path)
    p.add_argument("--pr", action="append", default=[], help="a commit of the checkout, as a PR over its parent")
    p.add_argument("--touch", action="append", default=[], help="a path: a PR on HEAD that changes it alone")
    p.add_argument("--profile", default="cpu")
    a = p.parse_args(argv)
    repo = a.checkout.resolve()
    if git(repo, "status", "--porcelain", "--untracked-files=no"):
        sys.exit(f"{repo}: has uncommitted changes; commit or stash them first")
    head = git(repo, "rev-parse", "--abbrev-ref", "HEAD")
    head = git(repo, "rev-parse", "HEAD") if head == "HEAD" else head
    rows = []
    try:
        prs = [git(repo, "rev-parse", "--short=12", c) for c in a.pr]
        for path in a.touch:
            prs.append(touch_pr(repo, path))
            git(repo, "checkout", "-q", head)
        with tempfile.TemporaryDirectory(prefix="changed-runs-") as tmp:
            for commit in prs:
                rows.append(run_pr(repo, commit, a.profile, Path(tmp)))
                r = rows[-1]
                print(
                    f"{r['commit']}  {r['selected']} of {r['of']} cells  {r['wall']:.0f} s  exit {r['exit']}  "
                    f"{r['outcomes']}  {r['subject']}{chr(10) + r['tail'] if r['tail'] else ''}",
                    flush=True,
                )
    finally:
        git(repo, "checkout", "-qf", head)
        subprocess.run(["git", "-C", str(repo), "branch", "-qD", "changed-runs-touch"], capture_output=True)
    slowest = max((r["wall"] for r in rows), default=1.0)
    print("\n| PR | files | cells selected | outcomes | exit | wall (s) | of the slowest | subject |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(r["outcomes"].items())) or "none run"
        print(
            f"| `{r['commit'][:7]}` | {r['files']} | {r['selected']} of {r['of']} | {outcomes} | {r['exit']} "
            f"| {r['wall']:.0f} | {r['wall'] / slowest:.3f} | {r['subject']} |"
        )


if __name__ == "__main__":
    main()
