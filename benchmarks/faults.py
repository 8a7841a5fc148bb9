"""The fault table: each fault of issue 17 as the plugin judges it now, under each launcher. Not a test (the
tests in tests/test_faults.py, test_fork.py, test_matrix.py and test_verdict.py assert the same verdicts).

    python benchmarks/faults.py [--launchers local fork torchrun] [-k WORD]

A rank fault is one real ``pytest --simplefsdp-matrix`` run of a fake target (tests/fakes/fake_rank.py as
``python -m fake_rank``, which every launcher runs); its row is the outcome, failure class, failing rank, the
error line or first detail, and the processes of the run still alive after pytest ended. A bad input is a
dry run of a matrix or known-failures file; its row is pytest's exit code and first error line, and how long
it took.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
FAKES = ROOT / "tests" / "fakes"


def fake(mode, ranks=2, args="", timeout=30, steps=3, target=None, extra=""):
    command = target or (
        f'["{{python}}", "-m", "fake_rank", "--mode", "{mode}", "--dump", "{{dump_folder}}", '
        f'"--steps", "{{steps}}"{args}]'
    )
    return (
        textwrap.dedent(f"""\
        profile: faults
        target:
          env: {{PYTHONPATH: "{FAKES}"}}
          command: {command}
        device: cpu
        world_sizes: [{ranks}]
        degrees: [ranks]
        timeout: {timeout}
        settings: {{steps: {steps}}}
        axes:
          mode: [{mode}]
          ranks: [{ranks}]
        """)
        + extra
    )


# (fault, what issue 17 measured before, matrix text, extra pytest args, launchers it applies to)
RANK_FAULTS = [
    (
        "a rank closes stdout and stderr, then raises",
        "fork: exit code 0 on every rank, the cell passed",
        fake("closeraise"),
        [],
        None,
    ),
    (
        "a rank double-forks a setsid daemon that execs `sleep 97` with an empty environment",
        "all: the daemon outlived the run (ppid 1)",
        fake("daemon"),
        [],
        None,
    ),
    (
        "rank 0 raises while rank 2 ignores SIGTERM",
        "all: a hang of rank 2; rank 0's error missing",
        fake("failignore", ranks=3, args=', "--rank", "2"', timeout=120),
        [],
        None,
    ),
    (
        "a rank ignores SIGUSR1 and hangs",
        "all: 'every rank's Python stack was dumped' with its log empty",
        fake("usr1ignore", args=', "--rank", "1"', timeout=15),
        [],
        None,
    ),
    (
        "a rank hangs; the runner kills it at the timeout",
        "local: the killed rank recorded with exit code 0",
        fake("hang", timeout=15),
        [],
        None,
    ),
    ("a rank dies of SIGSEGV", "fork: no faulthandler dump in the rank's log", fake("segv"), [], None),
    (
        "a rank writes 200 MB to stdout, then exits",
        "torchrun: passed once (the cap was a poll); 200 MB log kept",
        fake("flood", args=', "--flood-mb", "200"'),
        ["--simplefsdp-log-limit=16"],
        None,
    ),
    (
        "`/bin/true` as the target, no `settings.steps`",
        "all: passed (no training step logged)",
        fake("noop", target='["/bin/true"]').replace("settings: {steps: 3}\n", ""),
        [],
        None,
    ),
    (
        "a module whose body runs at import (no main guard)",
        "fork: every cell infra 'fork server did not start', servers left running",
        fake("pass", target='["{python}", "-m", "unguarded_rank"]'),
        [],
        ["fork"],
    ),
]

UNGUARDED = (
    "import os\nprint(f'unguarded body ran in pid {os.getpid()} rank {os.environ.get(\"RANK\")}')\n"
    "for step in (1, 2, 3):\n    print(f'step: {step}  loss: {10.0 / step:8.5f}  grad_norm: 1.0')\n"
)

# the escape that once ran os.system from a matrix file: reach warnings.catch_warnings, then its module's builtins
ESCAPE = (
    "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]()"
    "._module.__builtins__['__import__']('os').system('touch MARKER')"
)
# (fault, before, matrix text, known-failures text or None)
BAD_INPUTS = [
    (
        "a rule reaching `os` through `__subclasses__`",
        "ran os.system, even under --simplefsdp-dry-run",
        fake("pass") + f'rules:\n  - {{name: escape, drop_if: "{ESCAPE}", reason: r}}\n',
        None,
    ),
    (
        "a known-failures `error: '(a+)+$'` against a 200-character error line",
        "100 % CPU for more than 90 s",
        fake("fail", args=', "--error", "RuntimeError: ' + "a" * 200 + '"'),
        "- id: redos\n  when: {mode: fail}\n  error: '(a+)+$'\n  kind: xfail\n  reason: r\n"
        "  link: https://github.com/pytorch/torchtitan/issues/1\n",
    ),
    (
        "a layout of 2 x 3 = 6 ranks with `world_sizes: [4]`",
        "collected; failed only at run time",
        fake("pass")
        .replace("world_sizes: [2]", "world_sizes: [4]")
        .replace("degrees: [ranks]", "degrees: [a, b]")
        .replace("  ranks: [2]\n", "  a: [2]\n  b: [3]\n"),
        None,
    ),
    (
        "an `exclude` entry with a value no axis has",
        "accepted silently",
        fake("pass") + "exclude:\n  - {mode: pas}\n",
        None,
    ),
    ("`timeout: .inf`", "accepted silently", fake("pass").replace("timeout: 30", "timeout: .inf"), None),
    (
        "a YAML syntax error",
        "pointed at the line after its cause",
        fake("pass").replace("device: cpu\n", "device: [cpu\n"),
        None,
    ),
    (
        "a list where a mapping belongs (`settings: [1, 2]`)",
        "said 'got CommentedSeq'",
        fake("pass").replace("settings: {steps: 3}", "settings: [1, 2]"),
        None,
    ),
]


def alive_under(folder):
    """Processes whose working directory or evidence folder lies under ``folder`` (a daemon keeps its cwd)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            env = p.environ()
            if any(str(x).startswith(str(folder)) for x in (p.cwd(), env.get("SIMPLEFSDP_EVIDENCE_DIR", ""))):
                found.append(f"{p.pid} ({' '.join(p.info['cmdline'] or [])[:40]})")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def pytest_run(tmp, matrix_text, args, kf_text=None):
    path = Path(tmp) / "faults.yaml"
    path.write_text(matrix_text)
    extra = []
    if kf_text is not None:
        (Path(tmp) / "kf.yaml").write_text(kf_text)
        extra.append(f"--simplefsdp-known-failures={Path(tmp) / 'kf.yaml'}")
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--simplefsdp-matrix",
            f"--simplefsdp-matrix-file={path}",
            f"--simplefsdp-artifacts={Path(tmp) / 'runs'}",
            f"--simplefsdp-json={Path(tmp) / 'run.json'}",
            *extra,
            *args,
        ],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{tmp}"},
    )
    return proc, time.monotonic() - started


def rank_row(fault, before, text, args, launcher):
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        (Path(tmp) / "unguarded_rank.py").write_text(UNGUARDED)
        proc, _ = pytest_run(
            tmp, text.replace(str(FAKES), f"{FAKES}:{tmp}"), [f"--simplefsdp-launcher={launcher}", *args]
        )
        time.sleep(0.5)  # what the run left behind has had its moment to die
        left = alive_under(tmp)
        try:
            cell = json.loads((Path(tmp) / "run.json").read_text())["runs"][0]["cells"][0]
        except (OSError, KeyError, IndexError, json.JSONDecodeError):
            return [fault, launcher, before, f"no run document (exit {proc.returncode})", ", ".join(left) or "none"]
        details = cell.get("details") or []
        said = cell.get("error_line") or next(iter(details), "")
        said += "".join(f"; {d}" for d in details if "Python stacks" in d)  # a hang: whose stacks are in the logs
        rank = f", rank {cell['failing_rank']}" if cell.get("failing_rank") is not None else ""
        codes = f", exit codes {cell['exit_codes']}" if cell.get("exit_codes") and cell["status"] != "passed" else ""
        if cell["status"] == "passed":
            said = f"losses {cell.get('losses')}"
        verdict = " ".join(filter(None, [cell["status"], cell.get("failure_class")])) + f"{rank}{codes}: {said}"
        for r, paths in sorted((cell.get("rank_logs") or {}).items()):
            texts = [Path(p).read_text(errors="replace") if os.path.exists(p) else "" for p in paths]
            if "SIGSEGV" in fault:
                verdict += (
                    f"; rank {r}: {'faulthandler dump' if any('Fatal Python error' in t for t in texts) else 'no dump'}"
                )
            elif "200 MB" in fault:
                verdict += (
                    f"; rank {r} log {sum(os.path.getsize(p) for p in paths if os.path.exists(p)) / 2**20:.1f} MB"
                )
            elif "main guard" in fault:
                verdict += f"; rank {r}: {'body ran here' if any('unguarded body ran' in t for t in texts) else '-'}"
        return [fault, launcher, before, verdict, ", ".join(left) or "none"]


def input_row(fault, before, text, kf_text):
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        marker = Path(tmp) / "pwned"
        args = [] if kf_text else ["--simplefsdp-dry-run"]  # the regex is judged: the cell must run
        proc, wall = pytest_run(
            tmp, text.replace("MARKER", str(marker)), [*args, "--simplefsdp-launcher=local"], kf_text
        )
        err = next(
            (line for line in (proc.stderr + proc.stdout).splitlines() if re.match(r"(ERROR|E  |.*UsageError)", line)),
            "",
        )
        if kf_text:  # the run judged the failure: its outcome line
            err = next((line for line in proc.stdout.splitlines() if "XFAIL" in line or "FAILED" in line), err)
        err = err or next((line for line in proc.stdout.splitlines() if "valid cells" in line or "n/a" in line), "")
        return [
            fault,
            "-",
            before,
            f"exit {proc.returncode} in {wall:.1f} s: {err.strip()[:160]}",
            "ran code" if marker.exists() else "-",
        ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launchers", nargs="+", default=["local", "fork", "torchrun"])
    ap.add_argument("-k", dest="word", default="", help="only the faults whose description contains this")
    args = ap.parse_args()
    rows = []
    for fault, before, text, extra, only in RANK_FAULTS:
        for launcher in args.launchers:
            if (only is None or launcher in only) and args.word in fault:
                rows.append(rank_row(fault, before, text, extra, launcher))
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    for fault, before, text, kf_text in (f for f in BAD_INPUTS if args.word in f[0]):
        rows.append(input_row(fault, before, text, kf_text))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print("| fault | launcher | verdict before (issue 17) | verdict now | left alive |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")


if __name__ == "__main__":
    main()
