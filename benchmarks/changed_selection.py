"""How many cells --simplefsdp-changed selects for real torchtitan commits: each first-parent commit of a checkout
taken as a PR over its parent, its changes mapped by the target's path map (matrix/paths/<target>.yaml) to the cells
of each profile and, with --footprints, also by the footprints kept there (the first profile's, made at one commit by
--simplefsdp-footprint: a PR gate would use those of its base; one commit's stand in for all). Prints one row per
commit and the totals; it measures, it asserts nothing.

    python benchmarks/changed_selection.py CHECKOUT [--last 45] [--profile cpu --profile h100x8] [--target titan03]
        [--footprints ROOT/.simplefsdp --made-at COMMIT]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pytest_simplefsdp.paths import MATRIX_DIR  # noqa: E402
from pytest_simplefsdp.session.setup import changes_since  # noqa: E402
from pytest_simplefsdp.spec.cells import expand  # noqa: E402
from pytest_simplefsdp.spec.matrix import load_matrix  # noqa: E402
from pytest_simplefsdp.spec.paths import load_rules, map_file, select  # noqa: E402
from pytest_simplefsdp.store import footprints  # noqa: E402


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", type=Path)
    p.add_argument("--last", type=int, default=45)
    p.add_argument("--profile", action="append", default=[])
    p.add_argument("--target", default="titan03")
    p.add_argument("--footprints", type=Path, help="a store folder (.simplefsdp) with footprints of the first profile")
    p.add_argument("--made-at", help="the commit those footprints were made at (full hash)")
    a = p.parse_args(argv)
    rules = load_rules(map_file(a.target))
    profiles = {name: expand(load_matrix(MATRIX_DIR / f"{name}.yaml"))[0] for name in a.profile or ["cpu", "h100x8"]}
    commits = git(a.checkout, "log", "--first-parent", "--format=%h %s", f"-{a.last}").splitlines()
    first = next(iter(profiles))
    prints = footprints.load(a.footprints, a.made_at, first) if a.footprints else {}
    if prints:
        profiles[f"{first} by footprint"] = profiles[first]
    totals, measured, shares = {name: 0 for name in profiles}, 0, {"none": 0, "some": 0, "all": 0}
    traced = {"none": 0, "some": 0, "all": 0}
    print("commit  files  " + "  ".join(f"{n} (of {len(c)})" for n, c in profiles.items()) + "  unmapped  subject")
    for line in commits:
        commit, subject = line.split(" ", 1)
        try:
            files = git(a.checkout, "diff", "--name-only", f"{commit}^", commit).split()
        except subprocess.CalledProcessError:  # (the oldest commit of a shallow history or a bundle: no parent)
            print(f"{commit}  its parent is not in the checkout: left out")
            continue
        measured += 1
        changes = changes_since(a.checkout, f"{commit}^", commit)
        chosen, by_print = select(rules, changes), select(rules, changes, prints, a.made_at)
        counts = {
            n: sum((by_print if n.endswith("footprint") else chosen).reaches(c.id, c.axes) for c in cells)
            for n, cells in profiles.items()
        }
        for n in counts:
            totals[n] += counts[n]
        for share, n in ((shares, first), (traced, f"{first} by footprint")):
            if n in counts:
                share["none" if not counts[n] else "all" if counts[n] == len(profiles[n]) else "some"] += 1
        unmapped = [f for f, r in chosen.rules.items() if r is None]
        print(
            f"{commit}  {len(files):5d}  "
            + "  ".join(f"{counts[n]:>{len(n) + 8}d}" for n in profiles)
            + f"  {len(unmapped):8d}  {subject[:60]}"
        )
    print(
        f"{measured} commits: "
        + ", ".join(f"{n} {totals[n] / measured:.1f} of {len(c)} cells per commit" for n, c in profiles.items())
        + f"; {first} by the map: {shares['none']} select none, {shares['some']} some, {shares['all']} all"
        + (f"; by footprint: {traced['none']} none, {traced['some']} some, {traced['all']} all" if prints else "")
    )


if __name__ == "__main__":
    main()
