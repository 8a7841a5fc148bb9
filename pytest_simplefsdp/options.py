"""The plugin's options: declared once (CLI ``--simplefsdp-<name>``, ini ``simplefsdp_<name>``), read once
into one frozen, typed Settings. Each option has a validator (as pytest-timeout's do) that names the
option and the value it refused, so a bad value is a usage error before anything is collected or run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from .kinds import Tier
from .paths import MATRIX_DIR
from .versions.sets import VersionError, parse
from .words import did_you_mean

GROUP = ("simplefsdp", "SimpleFSDP composability matrix (pytest-simplefsdp)")


def positive(name, value):
    """A positive finite number; None where unset."""
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"--simplefsdp-{name}: not a number: {value!r}") from None
    if not (number > 0 and math.isfinite(number)):
        raise pytest.UsageError(f"--simplefsdp-{name} must be a positive finite number, got {value}")
    return number


def whole(name, value):
    """A positive whole number; None where unset."""
    number = positive(name, value)
    if number is not None and number != int(number):
        raise pytest.UsageError(f"--simplefsdp-{name}: not a whole number: {value}")
    return None if number is None else int(number)


def one_of(*choices, optional=False):
    def check(name, value):
        if optional and value in (None, ""):
            return None
        if value not in choices:
            raise pytest.UsageError(
                f"--simplefsdp-{name}: unknown value {value!r}; known: {', '.join(choices)}"
                + did_you_mean(value, choices)
            )
        return value

    return check


def jobs(name, value):
    value = str(value or "1")
    if value != "auto" and not (value.isdigit() and int(value) > 0):
        raise pytest.UsageError(f"--simplefsdp-{name}: expected a positive number or auto, got {value!r}")
    return value if value == "auto" else int(value)


def plan_devices(name, value):
    """--simplefsdp-plan: "visible" (bare), or a number of GPUs to plan for."""
    if value in (None, ""):
        return None
    if value == "visible":
        return value
    if not (str(value).isdigit() and int(value) > 0):
        raise pytest.UsageError(
            f"--simplefsdp-{name}: expected a number of GPUs (or nothing: the visible ones), got {value!r}"
        )
    return int(value)


def existing_file(name, value):
    """A file that must exist when the run starts (not after every cell ran)."""
    if not value:
        return None
    if not Path(value).is_file():
        raise pytest.UsageError(f"--simplefsdp-{name}: {value}: no such file")
    return Path(value)


def _writable(name, p: Path):
    """The nearest existing folder above ``p`` must be a folder we may write into."""
    above = next(a for a in (p.parent, *p.parent.parents) if a.exists())
    if not above.is_dir():
        raise pytest.UsageError(f"--simplefsdp-{name}: {p}: {above} is a file, not a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"--simplefsdp-{name}: {p}: {above} is not writable")


def output_file(name, value):
    """A file the run writes (at its end): checked now, not after every cell ran."""
    if not value:
        return None
    p = Path(value)
    if p.is_dir():
        raise pytest.UsageError(f"--simplefsdp-{name}: {value}: is a folder; name a file")
    _writable(name, p)
    return p


def history_file(name, value):
    """The history store: off, or a file (default: set by the session, under the rootdir)."""
    return "off" if value == "off" else output_file(name, value)


def output_dir(name, value):
    """A folder the run writes into: checked now."""
    if not value:
        return None
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise pytest.UsageError(f"--simplefsdp-{name}: {value}: is a file; name a folder")
    _writable(name, p / "x")
    return p


def output_page(name, value):
    """A page: a folder for DIR/index.html, or one self-contained FILE.html."""
    return output_file(name, value) if value and str(value).endswith(".html") else output_dir(name, value)


def version_set(name, value):
    """A version set (versions.sets.parse), checked now; its label, or None where unset."""
    if value in (None, ""):
        return None
    try:
        return parse(value).label()
    except VersionError as e:
        raise pytest.UsageError(f"--simplefsdp-{name}={value}: {e}") from None


def version_sets(name, values):
    return [version_set(name, v) for v in values or []]


def existing_dir(name, value):
    if not value:
        return None
    if not Path(value).is_dir():
        raise pytest.UsageError(f"--simplefsdp-{name}: {value}: no such folder")
    return Path(value)


def text(name, value):
    return value if value not in (None, "") else None


def flag(name, value):
    return bool(value)


@dataclass(frozen=True)
class Option:
    name: str  # CLI --simplefsdp-<name>, ini simplefsdp_<name>
    kind: str  # the ini type: bool, string or args
    default: Any
    help: str
    parse: Callable[[str, Any], Any] = text
    const: Any = None  # a string option that may also be given bare (--simplefsdp-plan): this value then
    metavar: str = "VALUE"  # how --help names its value
    matrix_only: bool = True  # it does nothing without --simplefsdp-matrix (the simplefsdp_cell fixture reads it not)

    @property
    def dest(self):
        return "simplefsdp_" + self.name.replace("-", "_")


def add_options(parser, options):
    """Register options in the plugin's one group (other modules, e.g. the SLURM launcher, add theirs)."""
    group = parser.getgroup(*GROUP)
    for o in options:
        if o.kind == "bool":
            group.addoption(f"--simplefsdp-{o.name}", action="store_true", default=None, dest=o.dest, help=o.help)
        elif o.kind == "args":
            group.addoption(
                f"--simplefsdp-{o.name}", action="append", default=None, dest=o.dest, metavar=o.metavar, help=o.help
            )
        else:
            bare = {"nargs": "?", "const": o.const} if o.const is not None else {}
            group.addoption(
                f"--simplefsdp-{o.name}",
                default=None,
                dest=o.dest,
                help=f"{o.help} [ini: {o.dest}]",
                metavar=o.metavar,
                **bare,
            )
        parser.addini(o.dest, help=o.help, type=o.kind, default=o.default)


def raw(config, o: Option):
    value = config.getoption(o.dest)
    return value if value is not None else config.getini(o.dest)


def check_unused(config, options=None):
    """Without --simplefsdp-matrix, an option only a matrix run reads would do nothing: a usage error that says so,
    rather than a run that silently collects no cell (options the simplefsdp_cell fixture reads are fine)."""
    given = [
        o
        for o in options or OPTIONS
        if o.matrix_only and o.name != "matrix" and config.getoption(o.dest) not in (None, [])
    ]
    if given:
        names = ", ".join(f"--simplefsdp-{o.name}" for o in given)
        raise pytest.UsageError(
            f"{names}: only a matrix run reads {'this option' if len(given) == 1 else 'these options'}; "
            f"add --simplefsdp-matrix (or drop {'it' if len(given) == 1 else 'them'})"
        )


def read(config, options) -> dict:
    """name (with _ for -) -> validated value, for each option."""
    return {o.name.replace("-", "_"): o.parse(o.name, raw(config, o)) for o in options}


def _profiles():
    return ", ".join(p.stem for p in sorted(MATRIX_DIR.glob("*.yaml")))


def stored_run(name, value):
    """--simplefsdp-compare: a stored run's file, or bare (NEWEST): the newest stored run of the same profile."""
    return NEWEST if value == NEWEST else existing_file(name, value)


NEWEST = "newest"
MERGE_BASE = "merge-base"  # --simplefsdp-base given bare

OPTIONS = [
    Option(
        "matrix",
        "bool",
        False,
        "run the SimpleFSDP composability matrix: one test per valid cell "
        "(ordinary test files are not collected in this mode)",
        flag,
    ),
    Option(
        "profile",
        "string",
        "auto",
        f"profile(s) to run, comma-separated: the project's matrix/NAME.yaml, else "
        f"the shipped one ({_profiles()}); 'all'; or 'auto' (default: the installed "
        f"torchtitan generation's h100x8 profile where 8 CUDA devices are visible, "
        f"else its cpu profile)",
        metavar="LIST",
    ),
    Option(
        "matrix-file",
        "args",
        [],
        "matrix YAML file(s) to run instead of --simplefsdp-profile (repeatable)",
        lambda name, value: [Path(f) for f in value or []],
        metavar="PATH",
    ),
    Option(
        "timeout",
        "string",
        None,
        "per-cell timeout in seconds (default: the matrix file's `timeout`, else 900); "
        "a cell past it is stack-dumped, killed and reported as a hang",
        positive,
        metavar="SECONDS",
        matrix_only=False,
    ),
    Option(
        "tier",
        "string",
        "real",
        "real: every rank runs (the profile's device); trace: each cell is one "
        "simulated rank (torchtitan's fake backend) on this CPU machine, or for a GPU "
        "profile on one visible GPU each (the matrix's trace.gpu): config, "
        "parallelisation, tracing and the steps are judged, numerics are not",
        lambda name, value: Tier(one_of("real", "trace")(name, value)),
        metavar="real|trace",
    ),
    Option(
        "dry-run",
        "bool",
        False,
        "collect the cells and print each one's exact command and environment; launch nothing, write nothing",
        flag,
    ),
    Option(
        "json",
        "string",
        None,
        "write the run (one record per cell: id, axes, status, losses per step, "
        "first error line, failing rank, wall time, log dir) to this JSON file",
        output_file,
        metavar="PATH",
    ),
    Option(
        "launcher",
        "string",
        "auto",
        "how ranks are started: auto (default: fork for CPU profiles, torchrun "
        "for GPU profiles; the fastest shown equivalent to torchrun), torchrun "
        "(the reference), local (the runner starts each rank with torchrun's "
        "environment), fork (a server imports torch and the target once and "
        "forks the ranks of every cell), slurm (every cell is one srun job step; "
        "see --simplefsdp-slurm-*), or one a plugin adds",
        metavar="NAME",
        matrix_only=False,
    ),
    Option(
        "artifacts",
        "string",
        None,
        "folder for per-cell logs and results (default: .simplefsdp/runs/<time> under the rootdir)",
        output_dir,
        metavar="DIR",
        matrix_only=False,
    ),
    Option(
        "jobs",
        "string",
        "1",
        "cells run at once: N or auto (as many as the ranks budget or the visible GPUs "
        "allow); GPU cells get disjoint CUDA_VISIBLE_DEVICES, CPU cells share a budget of "
        "--simplefsdp-max-ranks ranks (default: the cores)",
        jobs,
        metavar="N|auto",
    ),
    Option(
        "log-limit",
        "string",
        "512",
        "MB of logs a cell may write (all ranks together); past it the cell is stopped and its logs cut",
        positive,
        metavar="MB",
        matrix_only=False,
    ),
    Option(
        "max-ranks",
        "string",
        None,
        "most ranks one CPU cell may start on this machine (default: one per GB "
        "of available memory); a larger cell fails without launching",
        whole,
        metavar="N",
        matrix_only=False,
    ),
    Option(
        "status-md",
        "string",
        None,
        "write the status markdown (GitHub markdown: cells run of the valid ones, "
        "status by feature, one grid per profile and model, footnotes with the known "
        "failures' links) to this file",
        output_file,
        metavar="PATH",
    ),
    Option(
        "html",
        "string",
        None,
        "where to write the run's static HTML page (default: index.html in the run's "
        "folder, beside its logs and records): DIR/index.html, or FILE.html, one "
        "self-contained file (its plots inlined, the wall-time plot added). Failures first, "
        "filters "
        "by status, the status by feature, the grids, each cell's details and logs; also: "
        "python -m pytest_simplefsdp.report RUN --html DIR|FILE.html",
        output_page,
        metavar="DIR|FILE.html",
    ),
    Option(
        "compare",
        "string",
        None,
        "a stored run (a --simplefsdp-json file or a run's results.jsonl) to compare "
        "this one with; bare: the newest stored run of the same profile under "
        ".simplefsdp/runs. Newly broken, newly fixed and changed-signature cells are "
        "listed and marked",
        stored_run,
        const=NEWEST,
        metavar="PATH",
    ),
    Option(
        "baseline",
        "string",
        None,
        "numerics only: take the numerics baselines (the cells each cell's losses "
        "and norms are compared with) from this stored run instead of running them; "
        "not the run to compare with (that is --simplefsdp-compare)",
        existing_file,
        metavar="PATH",
        matrix_only=False,
    ),
    Option(
        "fresh",
        "bool",
        False,
        "make seed checkpoints and numerics baselines again instead of using the ones "
        "kept under .simplefsdp/reuse/ (kept by a content key over the torch and "
        "torchtitan versions, the job's command, the shim, configs and assets); "
        "the new ones are kept",
        flag,
        matrix_only=False,
    ),
    Option(
        "reuse-dir",
        "string",
        None,
        "where seed checkpoints and numerics baselines are kept and looked up "
        "(default: .simplefsdp/reuse/ in the rootdir); a job's key names no folder of "
        "the run or the rootdir, so checkouts and CI jobs of one machine may share one",
        output_dir,
        metavar="DIR",
        matrix_only=False,
    ),
    Option(
        "known-failures",
        "string",
        None,
        "known-failures YAML (default: known_failures.yaml in the rootdir, else the one shipped with the plugin)",
        existing_file,
        metavar="PATH",
        matrix_only=False,
    ),
    Option(
        "gate",
        "bool",
        False,
        "merge-gate mode: a known failure that passes (XPASS) fails the run and names the entry to delete",
        flag,
        matrix_only=False,
    ),
    Option(
        "mutants",
        "string",
        None,
        "the mutation tier instead of the cells: re-inject named bugs (all, or "
        "comma-separated names) into every selected cell each applies to; an item "
        "passes when the gate kills its mutant and fails when the mutant survives",
        metavar="LIST",
    ),
    Option(
        "coverage",
        "string",
        None,
        "write the upstream coverage report to this file (.md, .json or text): "
        "for each SimpleFSDP integration test of the installed torchtitan, the cell "
        "of the shipped profiles that runs it or what is missing, and its known "
        "failures (also: python -m pytest_simplefsdp.report.coverage)",
        output_file,
        metavar="PATH",
    ),
    Option(
        "plan",
        "string",
        None,
        "print the plan instead of running: how the cells will be packed (the "
        "visible GPUs, or --simplefsdp-plan=N GPUs; on CPU the ranks budget) and the "
        "expected wall time, from the newest stored run of each profile, else an "
        "estimate per cell size; launches nothing, writes nothing",
        plan_devices,
        const="visible",
        metavar="N",
    ),
    Option(
        "versions",
        "args",
        [],
        "run every selected cell on this version set (repeatable): torch==2.15.0, several "
        "pins comma-separated (torch==2.15.0,torchtitan==0.3.0), torchtitan@<commit> (of "
        "--simplefsdp-torchtitan-repo), or installed (the environment pytest runs in); each "
        "set runs in an environment of its own, built with uv and kept under "
        ".simplefsdp/envs/ (--simplefsdp-fresh builds it again)",
        version_sets,
        metavar="SET",
    ),
    Option(
        "twin",
        "string",
        None,
        "run every selected cell on the installed versions and on this version set "
        "(torch==2.15.0) side by side, and print the twin table: the cells whose verdict, "
        "failure signature or numerics differ",
        version_set,
        metavar="SET",
    ),
    Option(
        "bisect",
        "string",
        None,
        "after the run, bisect each new failure (with -k: each failing selected cell) "
        "over the versions of this package (torch or torchtitan) to the window where it "
        "starts (or stops) failing with its signature, or (compiler) inside the installed "
        "versions to the compiler step that breaks it: the compile ladder (eager, traced "
        "with no graph pass), graph_trainer's passes one off at a time, the smallest set "
        "that still fails; prints the table, writes an issue body beside the run, and the "
        "window (or the step) into the cell's known-failures entry under "
        "--simplefsdp-update-known-failures",
        one_of("torch", "torchtitan", "compiler", optional=True),
        metavar="torch|torchtitan|compiler",
    ),
    Option(
        "bisect-versions",
        "string",
        None,
        "the ordered versions to bisect over: a comma list (2.9.1,2.10.0), a "
        "range of the index's releases (>=2.9,<2.11; default: the last 8 minor "
        "releases up to the newest), a folder of wheels or an index URL "
        "(nightlies); for torchtitan: GOOD..BAD commits of "
        "--simplefsdp-torchtitan-repo",
        metavar="LIST",
    ),
    Option(
        "confirm",
        "string",
        "2",
        "runs that must agree before a bisection probe counts, and before a new failure "
        "is reported as new (a cell that passes in one of them is reported as flaky, "
        "with its pass rate); a failure a kind: flaky entry matches, or whose history shows it "
        "flaky, runs until a pass is 99 percent likely by that pass rate (at most 10 runs)",
        whole,
        metavar="N",
        matrix_only=False,
    ),
    Option(
        "base",
        "string",
        None,
        "gate a torchtitan pull request: each cell that fails here (the installed "
        "torchtitan: the PR) is run again on the torchtitan of REF, a commit of the "
        "checkout (--simplefsdp-torchtitan-repo, else the one torchtitan is installed "
        "editable from, else the rootdir), in an environment kept per commit; bare: the "
        "merge base of HEAD with main. Each failure is then new (passes on the base, or "
        "fails there differently), broken trunk (same signature on the base), flaky "
        "(runs disagree) or known (an entry); only new failures fail the run. Passing "
        "cells are not run again, but smoke cells (--simplefsdp-base-numerics)",
        const=MERGE_BASE,
        metavar="REF",
    ),
    Option(
        "base-numerics",
        "string",
        "report",
        "under --simplefsdp-base, each smoke cell that passes is also run "
        "once on the base and compared with it (losses, every parameter's "
        "gradient and update norms): report (the default) names the cells "
        "whose numerics the PR changed and by how much, fail also fails those "
        "that moved beyond the cell's own tolerance, off runs nothing more",
        one_of("report", "fail", "off"),
        metavar="report|fail|off",
    ),
    Option(
        "changed",
        "string",
        None,
        "run only the cells the torchtitan checkout's changes since REF can reach "
        "(git diff REF, the working tree's edits and new files included): by what "
        "each cell ran where footprints are kept (--simplefsdp-footprint), else by the "
        "target's map of torchtitan paths (matrix/paths/<target>.yaml; a path it does "
        "not map reaches every cell); bare: the --simplefsdp-base commit, else the "
        "merge base of HEAD with main. The run says which cells it left out and why, "
        "and which changes no cell here gates",
        const=MERGE_BASE,
        metavar="REF",
    ),
    Option(
        "footprint",
        "bool",
        False,
        "record what of the torchtitan checkout each cell's ranks executed (the files "
        "they imported, opened or listed, the functions that ran or that dynamo traced) "
        "and keep it per torchtitan commit under .simplefsdp/footprints/, where "
        "--simplefsdp-changed selects cells by it; on under --simplefsdp-sentinel. "
        "Costs each cell a trace function on every call (benchmarks/footprint.py)",
        flag,
    ),
    Option(
        "history",
        "string",
        None,
        "the SQLite file every judged cell of every run is appended to (default: "
        ".simplefsdp/history.sqlite under the rootdir; off: none): a cell's pass rate "
        "over its last 10 runs, and a new failure that failed the same way before on "
        "the same versions and passed since is flaky, not new (python -m "
        "pytest_simplefsdp.report HISTORY --format history shows each cell's streak)",
        history_file,
        metavar="PATH|off",
        matrix_only=False,
    ),
    Option(
        "sentinel",
        "string",
        None,
        "the nightly sentinel, unattended: FOLDER keeps the nightlies' outcomes; each "
        "cell that fails now as new and passed on some earlier night is confirmed, "
        "bisected over the torchtitan commits (of --simplefsdp-torchtitan-repo), then "
        "the torch releases, since it last passed, and one issue body and one "
        "known-failures draft per bug are written into FOLDER/<time>/",
        output_dir,
        metavar="FOLDER",
    ),
    Option(
        "torchtitan-repo",
        "string",
        None,
        "a git checkout of torchtitan whose commits version sets, "
        "--simplefsdp-bisect=torchtitan and --simplefsdp-base name (default: "
        "the checkout torchtitan is installed editable from, else the rootdir "
        "where it is one)",
        existing_dir,
        metavar="PATH",
    ),
    Option(
        "update-known-failures",
        "bool",
        False,
        "after the run, rewrite the known-failures file: add entries "
        "for new failures (with a placeholder link to fill in), remove "
        "entries whose cells all passed; other entries, their order and "
        "comments are kept",
        flag,
    ),
]


@dataclass(frozen=True)
class Settings:
    """Every --simplefsdp-* option of the run, validated; built once from the pytest config."""

    matrix: bool
    profile: str
    matrix_file: list
    timeout: float | None
    tier: Tier
    dry_run: bool
    json: Path | None
    launcher: str
    artifacts: Path | None
    jobs: int | str
    log_limit: float | None
    max_ranks: int | None
    status_md: Path | None
    html: Path | None
    compare: Path | str | None
    baseline: Path | None
    fresh: bool
    reuse_dir: Path | None
    known_failures: Path | None
    gate: bool
    mutants: str | None
    coverage: Path | None
    plan: int | str | None
    versions: list
    twin: str | None
    bisect: str | None
    bisect_versions: str | None
    confirm: int
    base: str | None
    base_numerics: str
    changed: str | None
    footprint: bool
    history: Path | str | None
    sentinel: Path | None
    torchtitan_repo: Path | None
    update_known_failures: bool

    @classmethod
    def from_config(cls, config) -> "Settings":
        values = read(config, OPTIONS)
        if values["plan"] is not None:  # a plan launches nothing, as a dry run
            values["dry_run"] = True
        values["confirm"] = values["confirm"] or 2
        if values["twin"] and values["versions"]:
            raise pytest.UsageError(
                "--simplefsdp-twin runs the installed versions and one more set; "
                "--simplefsdp-versions names every set itself: give one of the two"
            )
        if values["sentinel"] and values["bisect"]:
            raise pytest.UsageError(
                "--simplefsdp-sentinel bisects the cells that turned red over what changed since "
                "they passed: drop --simplefsdp-bisect"
            )
        if values["bisect"] == "compiler" and values["bisect_versions"]:
            raise pytest.UsageError(
                "--simplefsdp-bisect=compiler searches inside the installed versions: drop --simplefsdp-bisect-versions"
            )
        if values["base"] and (values["twin"] or values["versions"]):
            raise pytest.UsageError(
                "--simplefsdp-base reruns failures on the base's torchtitan; it runs the installed "
                "versions only: drop --simplefsdp-twin / --simplefsdp-versions"
            )
        values["footprint"] = bool(values["footprint"] or values["sentinel"])  # the nightly makes the footprints
        return cls(**values)

    @property
    def version_sets(self) -> list:
        """The labels of the version sets every cell runs on ([]: the installed versions only)."""
        return ["installed", self.twin] if self.twin else list(self.versions)

    @property
    def log_limit_bytes(self) -> int:
        return int((self.log_limit or 512) * 2**20)


def settings(config) -> Settings:
    """The run's Settings, read and validated once per pytest config."""
    if _SETTINGS not in config.stash:
        config.stash[_SETTINGS] = Settings.from_config(config)
    return config.stash[_SETTINGS]


_SETTINGS = pytest.StashKey[Settings]()
