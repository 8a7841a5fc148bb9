"""How long pytest takes to start with this plugin installed: a plain test file (the plugin must stay out of the
way) and `pytest --simplefsdp-matrix --co -q` of the CPU profile, cold (empty cache) and warm (nothing changed
since the last run). Measured side by side with an older revision of the plugin (``--before REV``, checked out
into a temporary git worktree and put first on PYTHONPATH), in the same run, because this machine kind's speed
varies 4-7x from day to day: compare the ratios, not the seconds of another day.

    python benchmarks/startup.py [--before 2b99f3f] [--repeat 3]

Prints one table: per case and revision, the median time to pytest's first line of output and to its end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]


def timed(argv, cwd, env):
    """(seconds to the first line of output, seconds to the end, exit code)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    for line in proc.stdout:
        if first is None and line.strip():
            first = time.monotonic() - start
    code = proc.wait()
    return first or float("nan"), time.monotonic() - start, code


def cases(folder):
    plain = folder / "test_plain.py"
    plain.write_text("def test_one():\n    assert 1 + 1 == 2\n")
    # (the SLURM plugin's entry point moved between the revisions: left out on both sides alike)
    base = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:simplefsdp_slurm",
        f"--rootdir={folder}",
    ]
    return {
        "plain test file, plugin installed": base + [str(plain), "-q"],
        "plain test file, plugin disabled (-p no:simplefsdp)": base + [str(plain), "-q", "-p", "no:simplefsdp"],
        "--simplefsdp-matrix --co -q, cold (empty cache)": base + ["--simplefsdp-matrix", "--co", "-q"],
        "--simplefsdp-matrix --co -q, warm (nothing changed)": base + ["--simplefsdp-matrix", "--co", "-q"],
    }


def measure(rev_path, repeat, folder):
    """{case: (median first line, median end)} with the plugin's code from ``rev_path`` (None: as installed)."""
    env = dict(os.environ)
    if rev_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(rev_path), env.get("PYTHONPATH")]))
    out = {}
    for name, argv in cases(folder).items():
        firsts, ends = [], []
        for _ in range(repeat):
            cache = tempfile.mkdtemp(prefix="simplefsdp-cache-") if "cold" in name else str(folder / "cache")
            env["XDG_CACHE_HOME"] = cache
            first, end, code = timed(argv, folder, env)
            if code not in (0, 5):  # 5: nothing collected (the plain file with -p no:... still collects one)
                raise SystemExit(f"{name}: pytest exited {code}")
            firsts.append(first)
            ends.append(end)
        out[name] = (statistics.median(firsts), statistics.median(ends))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="2b99f3f", help="the older revision to measure beside this checkout")
    p.add_argument("--repeat", type=int, default=3, help="runs per case and revision (the median is shown)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="simplefsdp-startup-") as tmp:
        tmp = Path(tmp)
        old = tmp / "before"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(old), a.before],
            check=True,
            capture_output=True,
        )
        init = old / "pytest_simplefsdp" / "__init__.py"
        if not init.exists():  # older revisions were a namespace package, which this checkout's regular one (on
            init.write_text("")  # the path through the editable install) would shadow even behind PYTHONPATH
        try:
            folder = tmp / "project"  # a folder that is not this checkout, as a user's would be
            folder.mkdir()
            results = {}
            for label, path in ((f"before ({a.before})", old), ("now", None)):
                check = subprocess.run(
                    [sys.executable, "-c", "import pytest_simplefsdp; print(pytest_simplefsdp.__path__[0])"],
                    capture_output=True,
                    text=True,
                    cwd=folder,
                    env=dict(os.environ, **({"PYTHONPATH": str(path)} if path else {})),
                )
                print(f"{label}: the plugin's code from {check.stdout.strip()}", flush=True)
                (folder / "cache").mkdir(exist_ok=True)
                timed(
                    [
                        sys.executable,
                        "-m",
                        "pytest",
                        "-p",
                        "no:cacheprovider",
                        "-p",
                        "no:simplefsdp_slurm",
                        "--simplefsdp-matrix",
                        "--co",
                        "-q",
                        f"--rootdir={folder}",
                    ],
                    folder,
                    dict(
                        os.environ, XDG_CACHE_HOME=str(folder / "cache"), **({"PYTHONPATH": str(path)} if path else {})
                    ),
                )  # fills the warm case's cache
                results[label] = measure(path, a.repeat, folder)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True)
    labels = list(results)
    rows = []
    for case in results[labels[0]]:
        before, now = results[labels[0]][case], results[labels[1]][case]
        rows.append(
            [
                case,
                f"{before[0]:.2f}",
                f"{now[0]:.2f}",
                f"{now[0] / before[0]:.2f}",
                f"{before[1]:.2f}",
                f"{now[1]:.2f}",
            ]
        )
    print(
        tabulate(
            rows,
            headers=[
                "case (median of runs)",
                f"first line {labels[0]} s",
                "first line now s",
                "ratio",
                f"end {labels[0]} s",
                "end now s",
            ],
        )
    )


if __name__ == "__main__":
    main()
