"""Step 4: turn a launch outcome and its per-rank logs into a cell result.

Reads the per-step losses, and on failure the rank that failed first, its first meaningful
error line (the exception line of its last traceback), and a failure class.
"""

from __future__ import annotations

import math
import re
import signal
from dataclasses import asdict, dataclass, field, fields

from ..kinds import FailureClass, GateClass, Mutation, Status

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RANK_PREFIX = re.compile(r"(?m)^\[(?:rank|default)\d*\]: ?")  # torchrun's per-line prefix
LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+)")
GRAD_NORM = re.compile(r"step:\s*(\d+)\s+loss:\s*\S+\s+grad_norm:\s*(\S+)")
TRACEBACK = "Traceback (most recent call last):"
CHAIN_MARKERS = ("The above exception was the direct cause", "During handling of the above exception")
ERRORISH = re.compile(
    r"(Error|Exception|error:|Fatal|fatal|Segmentation fault|Aborted|Killed|"
    r"[Uu]nrecognized (options|arguments)|invalid choice)"
)
BOX = "│┃║╭╮╰╯─━═ "  # a CLI's framed message (tyro's): the frame is not the message

COMPILE_FRAMES = (
    "torch/_dynamo/",
    "torch/_inductor/",
    "torch/_functorch/",
    "torch/_higher_order_ops/",
    "torch/fx/experimental/",
    "torch/_export/",
    "graph_pp/partition",
    "graph_trainer/compile",
    "graph_trainer/passes",
    "graph_trainer/jit_backend",
)
COMPILE_TYPES = (
    "torch._dynamo.",
    "torch._inductor.",
    "InductorError",
    "BackendCompilerFailed",
    "torch.fx.experimental.symbolic_shapes",
)
# frames every eager call through a `torch._disable_dynamo` wrapper (e.g. checkpoint) shows
DISABLE_WRAPPERS = ("torch/_dynamo/eval_frame.py", "torch/_compile.py")
CONFIG_FRAMES = ("torchtitan/config/", "tyro/", "parallel_dims.py", 'configs.py", line', "validate_config")
CONFIG_TEXT = ("Unrecognized option", "usage:", "Unrecognized arguments", "is not a valid")

# what a native crash prints before the signal (the first one names the cause): C++ terminate, glibc's heap
# checks ("malloc(): unaligned tcache chunk detected", "free(): invalid pointer"), assertions
TEARDOWN_ABORT = "terminate called without an active exception"
CRASH_HINT = re.compile(
    r"(?m)^.*(terminate called|what\(\):|double free|corrupted|Assertion .* failed).*$"
    r"|^(?:malloc|free|realloc|calloc|munmap_chunk|malloc_consolidate|tcache_thread_shutdown"
    r"|_int_\w+)\(\): .*$"
)
FAULTHANDLER = re.compile(r"(?m)^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# a frame as a traceback prints it and as faulthandler does (no comma before "in")
ANY_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)', re.M)
PACKAGE_FILE = re.compile(r".*/((?:torchtitan|torch)/.+)$")
# the line a crash's text ends with: where Python was, with lines (judge.identity keeps the stack without them)
CRASH_SITE = "\nPython was in (faulthandler): "
PORT_TAKEN = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
# the typed fields of a result: a word outside its vocabulary is an error where it is set, not a wrong report
TYPED = {"status": Status, "failure_class": FailureClass, "mutation": Mutation, "gate": GateClass}


@dataclass
class CellResult:
    id: str
    axes: dict
    status: Status = Status.PASSED  # the pytest outcome
    failure_class: FailureClass | None = None
    losses: dict = field(default_factory=dict)  # step -> loss (float; NaN allowed)
    grad_norms: dict = field(default_factory=dict)  # step -> the logged total gradient norm
    error_line: str | None = None
    error_text: str | None = None  # the whole exception message (for signatures)
    failing_rank: int | None = None
    exit_codes: dict = field(default_factory=dict)
    stuck_ranks: list = field(default_factory=list)
    wall: float = 0.0
    log_dir: str = ""
    rank_logs: dict = field(default_factory=dict)
    reproducer: str = ""
    world: int = 0
    launcher: str = ""  # the launcher that ran it: torchrun, local, fork, slurm, or a plugin's
    not_run: bool = False  # it never ran: no environment for its versions, its launcher did not start it, or
    # someone else stopped it (nothing of the cell's own to confirm, bisect or record as a known failure)
    # the job whose failure failed this cell ("baseline <id>", "seed checkpoint of <model>"): infra, not its own bug
    culprit: str | None = None
    versions: dict = field(default_factory=dict)  # package -> version it ran on (its version set's environment)
    imported: dict = field(default_factory=dict)  # package -> what its ranks imported: file, version, commit, tree
    machine: dict = field(default_factory=dict)  # what decided its CPU ranks' bits: kernels' ISA, MKL branch, threads
    outside_range: list = field(default_factory=list)  # what of its version set the target does not support
    details: list = field(default_factory=list)  # extra lines for the failure report
    site: str = ""  # where it failed, from the failing rank's log: error_site, crash_stack, hang_site
    signature: str = ""  # the failure's identity (judge.identity): what broken trunk and history compare
    known_failure: str | None = None  # id of the known-failures entry that judged the cell
    known_failure_link: str | None = None
    verdict: str = ""  # why the outcome is what it is, when a known-failures entry was involved
    flaky: bool = False
    confirm: dict | None = None  # a new failure's confirming runs: {runs, passed, pass_rate, signatures}
    history: dict | None = None  # ... its cell's earlier runs on its versions (judge.history.record), newest first
    gate: GateClass | None = None  # under --simplefsdp-base, a failure's class against the base (new fails the gate)
    base: dict | None = None  # ... the cell on the base: {ref, commit, runs, passed, signatures, lines, folders}
    base_numerics: dict | None = None  # a passing smoke cell against itself on the base (judge.gate.numerics_vs_base)
    numerics: dict | None = None  # the comparison with the baseline (see numerics.compare)
    trace_html: str | None = None  # tlparse's index.html of the compile trace of a failing cell
    plot: str | None = None  # loss-curve PNG of a numerics failure
    evidence: list = field(default_factory=list)  # evidence.Evidence records: the label took effect
    memory: dict | None = None  # layout.Memory record: the bytes each rank held after step 1, against the layout
    invariants: dict | None = None  # invariants.Invariants record: the optimizer steps' exact invariants
    reused_from: str | None = None  # a baseline kept from an earlier run (reuse.py): its folder
    mutant: str | None = None  # the mutation tier: the bug this run re-injected
    mutation: Mutation | None = None  # ... killed, survived, or inconclusive (the mutant changed nothing)
    killed_by: str | None = None  # ... the check that caught it: exit (<class>), evidence, loss, grad_norm, ...
    also_killed_by: str | None = None  # ... numerics, where an earlier check caught it first: a later check sees it too

    @classmethod
    def infra(cls, cell, line, culprit=None, not_run=False) -> "CellResult":
        """A cell failed as infra around its own run, not by it: its version set cannot be built, its seed or
        baseline failed (``culprit`` names that job), or the plugin failed on it; ``line`` says which."""
        return cls(
            cell.id,
            dict(cell.axes),
            status=Status.FAILED,
            failure_class=FailureClass.INFRA,
            world=cell.world,
            error_line=line,
            error_text=line,
            mutant=getattr(cell, "mutant", None),
            culprit=culprit or None,
            not_run=not_run,
        )

    def fail(self, failure_class, line, rank=None, text=None):
        self.status, self.failure_class, self.error_line, self.failing_rank = Status.FAILED, failure_class, line, rank
        self.error_text = text or line

    def __setattr__(self, name, value):
        kind = TYPED.get(name)
        super().__setattr__(name, kind.of(value) if kind else value)

    @classmethod
    def from_record(cls, rec: dict) -> "CellResult":
        """The inverse of ``record`` (a stored or reported record back to a result; extra keys dropped)."""
        names = {f.name for f in fields(cls)}
        out = cls(**{k: v for k, v in rec.items() if k in names})
        out.losses = {int(k): (math.nan if v is None else v) for k, v in out.losses.items()}
        out.grad_norms = {int(k): (math.nan if v is None else v) for k, v in out.grad_norms.items()}
        return out

    def record(self):
        """Plain JSON data (pytest-xdist's channel carries nothing else): enums as their words."""
        d = asdict(self)
        d.update({k: None if d[k] is None else str(d[k]) for k in TYPED})
        d["losses"] = {str(k): (None if v is None or math.isnan(v) else v) for k, v in self.losses.items()}
        d["grad_norms"] = {str(k): (None if math.isnan(v) else v) for k, v in self.grad_norms.items()}
        d["nan_steps"] = [k for k, v in self.losses.items() if v is not None and math.isnan(v)]
        d["exit_codes"] = {str(k): v for k, v in self.exit_codes.items()}
        d["rank_logs"] = {str(k): [str(p) for p in v] for k, v in self.rank_logs.items()}
        # `infra` is the rare case (the probe did not run): stored only when set, so records stay as before
        d["evidence"] = [{k: v for k, v in e.items() if k != "infra" or v} for e in d["evidence"]]
        return d


def read_text(paths):
    parts = []
    for p in paths:
        try:
            with open(p, "rb") as f:
                parts.append(f.read().decode(errors="replace"))
        except OSError:
            pass
    return RANK_PREFIX.sub("", ANSI.sub("", "\n".join(parts)))


def parse_losses(text, pattern=LOSS):
    losses = {}
    for m in pattern.finditer(text):
        try:
            losses.setdefault(int(m.group(1)), float(m.group(2).rstrip(",")))
        except ValueError:
            continue
    return losses


def no_loss(value: float) -> bool:
    """What torchtitan 0.2 logs as the loss of a rank that holds none (PP stages before the last): a -1 per step it
    sums (0.2.0 logged -1.0; 0.2.2 sums its gradient-accumulation steps: -2.0 in titan02-cpu's PP cell)."""
    return value < 0 and float(value).is_integer()


def cell_losses(texts: dict) -> tuple[dict, dict]:
    """(losses, grad norms) of the first rank (by number) that logged real losses; ({}, {}) when none did."""
    for rank in sorted(texts):
        losses = parse_losses(texts[rank])
        if losses and not all(no_loss(v) for v in losses.values()):
            return losses, parse_losses(texts[rank], GRAD_NORM)
    return {}, {}


def last_exception(text):
    """(exception line, whole message, frames text) of the last traceback in a log, or None."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().endswith(TRACEBACK)]
    if not starts:
        return None
    i = starts[-1] + 1
    frames = []
    while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
        frames.append(lines[i])
        i += 1
    if i >= len(lines):
        return None
    first = lines[i].strip()
    message = [first]
    # dynamo's messages have sections, one or two blank lines apart (torch 2.10), then a closing hint; DCP's
    # CheckpointException is followed by each rank's own traceback "(RANK N)", which holds the cause
    ranks = first.startswith("torch.distributed.checkpoint.api.CheckpointException")
    sections = ranks or first.startswith("torch._dynamo.exc.")
    blanks = 0
    for line in lines[i + 1 : i + 80]:
        stripped = line.strip()
        blanks = blanks + 1 if not stripped else 0
        if (
            (blanks and not sections)
            or blanks > 2
            or stripped.startswith("Set TORCHDYNAMO_VERBOSE")
            or (not sections and not line.startswith((" ", "\t")))  # another process's output
            or stripped.startswith(("[titan]", "[rank"))
            or (stripped.startswith(TRACEBACK) and not (ranks and "(RANK " in stripped))
            or stripped.startswith(CHAIN_MARKERS)
            or re.match(r"^\[?[A-Z]\d{4} ", stripped)
        ):
            break
        message.append(line.rstrip())
    while message and not message[-1].strip():
        message.pop()
    # all frames of the log's tracebacks help classification (chained exceptions)
    all_frames = "\n".join(line for line in lines if line.startswith("  File "))
    return first, "\n".join(message), all_frames


def fallback_error(text):
    """The last error-looking line of a log without a traceback, else what it printed last."""
    lines = [line.strip().strip(BOX) for line in text.splitlines() if line.strip().strip(BOX)]
    for line in reversed(lines):
        if ERRORISH.search(line) and not line.startswith("[titan]"):
            return line
    return f"no error message; last line: {lines[-1]}" if lines else None


def classify(error_line, frames, exit_code):
    if exit_code is not None and exit_code < 0 and exit_code != -signal.SIGTERM:
        return "crash"
    text = error_line or ""
    if any(t in text for t in CONFIG_TEXT) or any(f in frames for f in CONFIG_FRAMES):
        return "invalid_config"
    compile_frames = [
        line
        for line in frames.splitlines()
        if any(f in line for f in COMPILE_FRAMES) and not any(w in line for w in DISABLE_WRAPPERS)
    ]
    if text.startswith(COMPILE_TYPES) or compile_frames:
        return "compile"
    return "runtime"


def _dump_block(text) -> str:
    """faulthandler's dump of the thread that matters: the current thread, else the one not idle in threading.py."""
    starts = [m.start() for m in FAULTHANDLER.finditer(text)]
    blocks = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    if not blocks:
        return ""
    return next((b for b in blocks if b.startswith("Current thread")), None) or next(
        (b for b in blocks if "threading.py" not in b.split("\n", 2)[1]), blocks[-1]
    )


def crash_site(text, frames=3):
    """Where Python was when the rank died, from faulthandler's dump: the innermost frames of the current thread
    (else of the thread that was not idle in threading.py), files cut to their package path."""
    found = [FRAME.match(line) for line in _dump_block(text).splitlines()[1:]]
    found = [m for m in found if m][:frames]
    return " <- ".join(f"{_package_path(m['file'])}:{m['line']} {m['func']}" for m in found)


def package_file(path: str) -> str | None:
    """torchtitan/... or torch/... of a frame's file (the last such folder of its path), else None."""
    m = PACKAGE_FILE.match("/" + path.lstrip("/"))
    return m.group(1) if m else None


def stack(text: str, innermost_first=False) -> list[tuple[str, str]]:
    """(file, function) of each frame in ``text``, innermost first (a traceback lists it last, faulthandler first)."""
    found = [(m["file"], m["func"]) for m in ANY_FRAME.finditer(text)]
    return found if innermost_first else found[::-1]


def where(frame: tuple[str, str]) -> str:
    path, func = frame
    return f"{package_file(path) or '/'.join(path.split('/')[-2:])}:{func}"


def innermost(found: list[tuple[str, str]], packages=("torchtitan/", "torch/")) -> str:
    """``file:function`` of the innermost frame in one of ``packages``, else of the innermost frame at all: where a
    bug is, not its line (lines move between a PR and its base)."""
    inside = [f for f in found if (package_file(f[0]) or "").startswith(packages)]
    return where((inside or found)[0]) if found else ""


def error_site(text) -> str:
    """The innermost torchtitan or torch frame of the root cause of the log's last exception (the first traceback of
    its chain: a compile error's last traceback ends in the backend's wrapper, whatever broke inside it)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().endswith(TRACEBACK)]
    if not starts:
        return ""
    k = len(starts) - 1
    while k and any(m in "\n".join(lines[max(starts[k] - 3, 0) : starts[k]]) for m in CHAIN_MARKERS):
        k -= 1
    block, i = [], starts[k] + 1
    while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
        block.append(lines[i])
        i += 1
    return innermost(stack("\n".join(block)))


def crash_stack(text, frames=3) -> str:
    """A crash's stack as faulthandler recorded it: its innermost frames as file:function (no lines)."""
    found = stack(_dump_block(text), innermost_first=True)[:frames]
    return " <- ".join(where(f) for f in found)


def hang_site(texts: dict, stuck: list) -> str:
    """Where the first stuck rank with a stack dump waits: its innermost torch.distributed call and the innermost
    torchtitan frame that called it (else its innermost frame)."""
    for rank in stuck:
        found = stack(_dump_block(texts.get(rank, "")), innermost_first=True)
        if found:
            waits = [f for f in found if (package_file(f[0]) or "").startswith("torch/distributed/")]
            caller = innermost(found, ("torchtitan/",))
            return f"{where(waits[0])} from {caller}" if waits and where(waits[0]) != caller else caller
    return ""


def failure_site(res, texts: dict, stuck: list) -> str:
    """Where a result failed, for its identity (judge.identity): a hang's waiting rank (or the exception of the rank
    that left first), a crash's stack, an error's frame; nothing for infra (not the cell's own)."""
    text = texts.get(res.failing_rank, "") if res.failing_rank is not None else ""
    if res.failure_class == FailureClass.CRASH:
        return crash_stack(text)
    if res.failure_class == FailureClass.HANG:
        return error_site(text) or hang_site(texts, stuck)
    if res.failure_class in (FailureClass.INFRA, None):
        return ""
    return error_site(text)


def _package_path(path):
    """site-packages/torchtitan/train.py -> torchtitan/train.py; other paths keep their last two parts."""
    parts = path.split("site-packages/", 1)
    return parts[1] if len(parts) == 2 else "/".join(path.split("/")[-2:])


def signal_name(code):
    try:
        return signal.Signals(-code).name
    except (ValueError, TypeError):
        return f"signal {-code}"


def build_result(cell, outcome, log_dir, expected_steps=None, trains=True) -> CellResult:
    """The result of a launch: losses and grad norms from the rank logs, and the first failure that
    explains the outcome (a launch error, a hang, a flood, a failing rank, the launcher, missing steps)."""
    res = CellResult(
        id=cell.id,
        axes=dict(cell.axes),
        world=cell.world,
        wall=round(outcome.wall, 2),
        log_dir=str(log_dir),
        rank_logs=outcome.rank_logs,
        reproducer=outcome.reproducer,
        launcher=outcome.launcher,
        exit_codes=dict(outcome.exit_codes),
        stuck_ranks=list(outcome.stuck_ranks),
        mutant=cell.mutant,
    )
    res.details.extend(outcome.notes)
    texts = {r: read_text(paths) for r, paths in outcome.rank_logs.items()}
    res.losses, res.grad_norms = cell_losses(texts)
    first = _failed_first(outcome, texts)
    failure = (
        _stopped(outcome, texts, res)
        or _rank_failure(outcome, texts, first)
        or (trains and _no_steps(res, expected_steps))
    )  # (a step before the cell, e.g. precompile, trains nothing)
    if failure:
        res.fail(*failure)
        res.site = failure_site(res, texts, outcome.stuck_ranks)
    if outcome.timed_out and first is not None:
        res.details.append(f"ranks {outcome.stuck_ranks} were still running at the timeout and were killed")
    if res.status == Status.FAILED and PORT_TAKEN.search(res.error_text or ""):
        res.failure_class = FailureClass.INFRA
        res.error_line = f"rendezvous port {outcome.port} is already in use: {res.error_line}"
    if outcome.survivors and res.status == Status.PASSED:
        res.fail(
            FailureClass.INFRA,
            f"{len(outcome.survivors)} process(es) outlived their rank and were killed: "
            f"{'; '.join(outcome.survivors[:3])}",
        )
    elif outcome.survivors:
        res.details.append(f"killed {len(outcome.survivors)} leftover process(es) of the cell")
    return res


def _stopped(outcome, texts, res):
    """The cell never ran to its end: it could not start, hung past its timeout, or flooded its logs."""
    if outcome.launch_error:
        res.not_run = True
        return FailureClass.INFRA, outcome.launch_error
    if outcome.timed_out and _failed_first(outcome, texts) is None:  # a rank that failed first is the cause
        ranks = ", ".join(map(str, outcome.stuck_ranks)) or "unknown"
        dumped = [r for r in outcome.stuck_ranks if FAULTHANDLER.search(texts.get(r, ""))]
        silent = [r for r in outcome.stuck_ranks if r not in dumped]
        res.details.append(
            f"Python stacks (SIGUSR1, faulthandler) are in the logs of ranks {dumped or 'none'}"
            + (f"; ranks {silent} left none (SIGUSR1 ignored or blocked, or no Python)" if silent else "")
        )
        line = f"timed out after {outcome.wall:.0f} s; ranks still running: {ranks}"
        gone = {r: when for r, when in outcome.left.items() if r not in outcome.stuck_ranks}
        if gone and outcome.stuck_ranks:  # a rank that left while its peers ran on: the hang is theirs, the cause its
            first = min(gone, key=lambda r: gone[r])
            seconds, code = gone[first]
            how = (
                "ended"
                if code is None
                else f"exited with code {code}"
                if code >= 0
                else f"was killed by {signal_name(code)}"
            )
            return (
                FailureClass.HANG,
                f"{line}; rank {first} left first: it {how} after {seconds:.1f} s while its peers ran on",
                first,
            )
        return FailureClass.HANG, line, outcome.stuck_ranks[0] if outcome.stuck_ranks else None
    if outcome.log_flood:
        cut = sorted(r for r, paths in outcome.rank_logs.items() if set(map(str, paths)) & set(outcome.cut_logs))
        return (
            FailureClass.RUNTIME,
            f"log output passed the limit of {outcome.log_flood / 2**20:.0f} MB; the cell "
            f"was stopped and its logs were cut (ranks that wrote past it: "
            f"{', '.join(map(str, cut)) or 'none: the launcher itself'})",
            cut[0] if cut else None,
        )
    return None


def _failed_first(outcome, texts):
    """The rank that failed first: the launcher's word; else, in a cell that then hung, the first rank to leave
    where it left with an error (torchrun's workers' codes are not known before torchrun ends, and a peer that
    ignores torchrun's SIGTERM keeps it from ending): the others' hang is its consequence, not the cause."""
    if outcome.first_failed_rank is not None or not outcome.timed_out:
        return outcome.first_failed_rank
    gone = {r: when for r, when in outcome.left.items() if r not in outcome.stuck_ranks}
    if not gone:
        return None
    first = min(gone, key=lambda r: gone[r])
    code = gone[first][1]
    return first if code not in (0, None) or (code is None and last_exception(texts.get(first, ""))) else None


def _rank_failure(outcome, texts, failed=None):
    """The first failing rank's exception, signal or exit code; else the launcher's own failure."""
    if failed is None:
        failed = outcome.first_failed_rank
    if failed is None:
        failed = next((r for r, c in outcome.exit_codes.items() if c not in (0, None)), None)
    if failed is not None and failed in texts:
        code, text = outcome.exit_codes.get(failed), texts[failed]
        exc = last_exception(text)
        hint = next((m.group(0).strip() for m in CRASH_HINT.finditer(text)), None)
        # a joinable C++ thread destroyed at exit aborts a rank already leaving on an uncaught Python exception: the
        # exception is the failure, the abort its consequence (0.2's DCP load error ended ranks so on gloo)
        leaving = bool(exc) and hint == TEARDOWN_ABORT
        if code is not None and code < 0 and code != -signal.SIGTERM and not leaving:
            line = f"rank {failed} killed by {signal_name(code)}" + (f": {hint}" if hint else "")
            site = crash_site(text)
            return FailureClass.CRASH, line, failed, line + (f"{CRASH_SITE}{site}" if site else "")
        if exc:
            return classify(exc[0], exc[2], None if leaving else code), exc[0], failed, exc[1]
        line = fallback_error(text) or f"rank {failed} exited with code {code}"
        return classify(line, "", code), line if code is None else f"exit code {code}: {line}", failed, line
    if outcome.launcher_exit not in (0, None) or failed is not None:
        text = read_text([outcome.launcher_log]) if outcome.launcher_log else ""
        code = outcome.exit_codes.get(failed, outcome.launcher_exit)
        return FailureClass.INFRA, fallback_error(text) or f"launcher exited with code {code}"
    return None


def _no_steps(res, expected_steps):
    """Every rank exited 0: still no pass without the training steps (whatever the settings say)."""
    if expected_steps and len(res.losses) < expected_steps:
        return (
            FailureClass.NO_RESULT,
            f"every rank exited 0 but {len(res.losses)} of {expected_steps} steps logged a loss",
        )
    if not res.losses:
        return (
            FailureClass.NO_RESULT,
            "every rank exited 0 but no step logged a loss (and the matrix sets no settings.steps)",
        )
    return None
