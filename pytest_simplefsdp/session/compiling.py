"""--simplefsdp-bisect=compiler: which compiler step breaks a failing compiled cell, inside one version. Each probe is
a real run of the cell with less of the compiler, judged as any cell (the same failure signature, or a numerics
failure for a numerics failure, is "fails"):

1. the compile ladder, lightest first: the cell in eager mode, then (aot_fx_trace) traced with no graph pass, or
   (0.3's jit, 0.2's compiled: torch.compile of the model) on the aot_eager backend for an inductor cell: the first
   rung that fails names the step (eager failing: not the compiler's). Rungs the evidence cannot tell apart (dynamo's
   own eager backend from aot_eager) are not on it;
2. graph_trainer's passes of the failing run (its ranks' record: shim.effects.graph_passes), one off at a time: a
   pass whose probe passes is needed for the failure;
3. the smallest set that still fails: the needed passes alone on, else delta debugging over the list (ddmin).

A pass that runs though turned off (GraphPP's mandatory normalisation) makes its probe untestable, from what the
probe's ranks recorded, not from a list kept here. The finding is said as "fails with pass X on, passes with it off;
traced with no graph pass it passes; eager passes"."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..judge.evidence import read_probes
from ..judge.identity import identity
from ..judge.results import CellResult
from ..kinds import FailureClass
from ..paths import probe_folder
from ..spec.cells import Passes, rerun_command
from ..versions.bisect import FAILS, OTHER, PASSES, UNTESTABLE, Bisection, judge_runs, table
from .bisecting import Found, kind_of, log_section, outcome

PACKAGE = "compiler"  # Found.package of a compiler bisection


@dataclasses.dataclass(frozen=True)
class Step:
    """One probe: the cell with ``axes`` changed and ``passes`` turned off."""

    words: str
    axes: tuple = ()  # (axis, value) changes
    passes: Passes | None = None


def ladder(axes: dict) -> list[Step]:
    """The rungs below the cell's own compile, lightest first."""
    mode = axes.get("compile", "aot_fx_trace")
    eager = {"compile": "eager", **({"memory_policy": "none"} if "memory_policy" in axes else {})}
    rungs = [Step("eager", tuple(eager.items()))]
    if mode == "aot_fx_trace":
        rungs.append(Step("aot_fx_trace with no graph pass", passes=Passes(every=True)))
    elif axes.get("backend") == "inductor":  # a whole-model torch.compile (0.3's jit, 0.2's compiled) on inductor
        rungs.append(Step(f"{mode} on the aot_eager backend", (("backend", "aot_eager"),)))
    return rungs


def only(names, passes) -> Step:
    on = [n for n in passes if n in names]
    return Step(f"only {', '.join(on)} on", passes=Passes(off=tuple(n for n in passes if n not in on)))


def search(axes: dict, passes: list[str], probe, mandatory=()) -> tuple[list, str, list[str]]:
    """(probes in the order they ran, the step named in words, the passes named) for a cell whose ``passes`` ran in
    its failing run; ``probe(step) -> versions.bisect.Probe`` (its version: the step's words). The ``mandatory``
    passes run whatever a probe turns off: they are not searched, and the words say they ran in every probe."""
    probes = []
    passes = [p for p in passes if p not in mandatory]
    always = f" (with {', '.join(mandatory)}, which run in every probe)" if mandatory else ""

    def look(step):
        probes.append(probe(step))
        return probes[-1].outcome

    rungs, said, mode = ladder(axes), [], axes.get("compile", "aot_fx_trace")  # (said: each rung below, in order)
    for n, rung in enumerate(rungs):
        got = look(rung)
        below = "".join(f"; {w}" for w in reversed(said))
        if got == FAILS:
            if n == 0:
                return probes, "fails in eager mode too: not a compiler step", []
            return probes, f"fails at the rung '{rung.words}' already{below}", []
        # a rung that fails otherwise (its own bug: eager PP's numerics) is skipped, as git bisect skips
        said.append(f"{rung.words} passes" if got == PASSES else f"{rung.words} {got} ({probes[-1].signature[:80]})")
    ladder_words = "; ".join(reversed(said))
    if not passes:  # (0.2's torch.compile of the model, a jit cell: no graph_trainer pass to search)
        on = f" on the {axes['backend']} backend" if axes.get("backend") else ""
        return probes, f"fails only compiled ({mode}{on}); {ladder_words}; no graph pass ran", []
    needed = [p for p in passes if look(Step(f"without {p}", passes=Passes(off=(p,)))) == PASSES]
    if needed and len(needed) < len(passes) and look(only(needed, passes)) == FAILS:
        culprits = needed
    elif needed and len(needed) == len(passes):
        culprits = needed
    else:
        culprits = ddmin(passes, lambda on: look(only(on, passes)) == FAILS)
    if not culprits:
        return probes, f"no set of graph passes fails on its own ({ladder_words})", []
    one = len(culprits) == 1
    names = f"pass {culprits[0]} on" if one else f"passes {' + '.join(culprits)} on together"
    alone = "" if len(culprits) == len(passes) else f"; with only {'it' if one else 'them'} on it fails"
    words = f"fails with {names}{always}, passes with {'it' if one else 'either'} off{alone}; {ladder_words}"
    return probes, words, culprits


def ddmin(items: list[str], fails) -> list[str]:
    """Zeller's delta debugging: a 1-minimal subset of ``items`` (known to fail as a whole) for which ``fails(subset)``
    holds: each chunk alone, then each chunk's complement, then finer chunks."""
    current, n = list(items), 2
    while len(current) >= 2:
        size = -(-len(current) // n)
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        tries = chunks + ([[x for x in current if x not in c] for c in chunks] if len(chunks) > 2 else [])
        smaller = next((c for c in tries if fails(c)), None)
        if smaller is not None:
            n = 2 if smaller in chunks else max(n - 1, 2)
            current = smaller
        elif n >= len(current):
            break
        else:
            n = min(2 * n, len(current))
    return current


class CompilerBisector:
    """Runs ``search`` on each cell to bisect (the same cells --simplefsdp-bisect=torch would take)."""

    def __init__(self, state, bisector):
        self.state, self.bisector = state, bisector

    def run(self, records, selected) -> list[Found]:
        found = []
        for run, cell, rec in self.bisector.to_bisect(records, selected):
            item = Found(run, cell, rec, PACKAGE)
            found.append(item)
            if rec.get("not_run"):
                item.error = f"not bisected: {cell.id} did not run ({rec.get('error_line')})"
                continue
            if not compiled(cell.axes):
                item.error = f"not bisected: {cell.id} runs no compiler its axes can take away (compile: eager or none)"
                continue
            wanted = rec.get("signature") or identity(CellResult.from_record(rec))
            ran = effects_of(rec.get("log_dir") or "", rec.get("failing_rank"))
            passes, mandatory = ran.get("graph_passes") or [], ran.get("graph_passes_mandatory") or []
            started = time.monotonic()
            # the backend the cell compiles with, where the profile's setting, not an axis, names it
            backend = cell.axes.get("backend", run.matrix.settings.get("compile_backend"))
            axes = {**cell.axes, **({"backend": backend} if backend else {})}
            probes, named, culprits = search(axes, passes, self.probe_for(run, cell, wanted), mandatory)
            item.bisection = Bisection([p.version for p in probes], probes, None, named)
            item.named, item.culprits, item.passes = named, culprits, list(passes)
            item.running = ran.get("graph_pass_running") or ""
            item.wall = time.monotonic() - started
            item.issue = self.issue(item, wanted)
            rec["compiler_step"] = named  # (the cell's record in the run's document: its JSON, page and table)
        return found

    def issue(self, item: Found, wanted) -> Path:
        """The markdown issue body beside the run: the step named, every probe, how to reproduce both sides."""
        folder = self.state.run_dir / "bisect"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{item.cell.id}-{PACKAGE}.md"
        rec, name = item.record, item.run.name
        rerun = rerun_command(name, item.cell.id, item.cell.axes, item.run.matrix.tier)
        lines = [
            f"# {rec.get('error_line') or wanted} (compiler step: {', '.join(item.culprits) or 'none named'})",
            "",
            f"**Cell:** `{item.run.matrix.profile}::{item.cell.id}` ({item.run.target.name}, {item.cell.world} ranks)",
            f"**Signature:** `{wanted}`",
            f"**Found:** {item.named}",
            *([f"**Its ranks failed inside:** `{item.running}`"] if item.running else []),
            f"**Graph passes of the failing run:** {', '.join(item.passes) or 'none recorded'}",
            "",
            "| step | outcome | runs | signature or line | wall |",
            "|---|---|---|---|---|",
            *(f"| {' | '.join(str(x).replace('|', '/') for x in row)} |" for row in table(item.bisection)),
            "",
            "## Reproducer",
            "",
            "```sh",
            rerun,
            "```",
            *(
                [
                    "",
                    f"It passes with `--compile.disable_passes {item.culprits[0]}` added to the ranks' command (the "
                    f"probe without it, above).",
                ]
                if item.culprits
                else []
            ),
            "",
            *log_section(rec),
        ]
        path.write_text("\n".join(lines))
        return path

    def probe_for(self, run, cell, wanted):
        def probe(step: Step):
            slug = "compiler-" + "".join(c if c.isalnum() else "-" for c in step.words)[:60].strip("-")
            probe_cell = cell.attempt(slug, axes={**cell.axes, **dict(step.axes)}, passes=step.passes)
            results = [
                self.state.run_and_check(run, probe_cell.attempt(f"{n}"))
                for n in range(1, self.state.settings.confirm + 1)
            ]
            return judge_runs(step.words, [(*judged(r, wanted, step.passes), r.wall) for r in results])

        return probe


COMPILER_FAILURES = (FailureClass.COMPILE, FailureClass.RUNTIME, FailureClass.CRASH, FailureClass.NUMERICS)


def compiled(axes: dict, rec: dict | None = None) -> bool:
    """Whether the cell compiles by its own axes (a compile axis, not eager; SimpleFSDP's trainer) and, given its
    record, failed as a compiler step can make it fail (not a hang or an infrastructure failure)."""
    ok = axes.get("compile") not in (None, "eager") and axes.get("trainer") != "fsdp2"
    return ok and (rec is None or rec.get("failure_class") in COMPILER_FAILURES)


def judged(result, wanted, passes) -> tuple:
    """(outcome, signature, line) of one probe run: a numerics failure fails a numerics bisection whatever parameter
    it names first; a pass turned off that ran all the same (mandatory) makes the probe untestable."""
    ran = effects_of(result.log_dir)
    forced = [p for p in (passes.off if passes else ()) if p in (ran.get("graph_passes_mandatory") or [])]
    if forced:
        return UNTESTABLE, "", f"{', '.join(forced)} ran though turned off (mandatory here)"
    got, sig, line = outcome(result, wanted)
    if got == OTHER and kind_of(sig) == kind_of(wanted) == "numerics":
        return FAILS, sig, line
    return got, sig, line


def effects_of(log_dir, rank=None) -> dict:
    """The effects ``rank`` recorded (the failing one: the pass it failed inside), else rank 0's (the pass list is
    every rank's same)."""
    probes = read_probes(probe_folder(log_dir)) if log_dir else {}
    return (probes.get(rank) or probes.get(0) or next(iter(probes.values()), {})).get("effects", {})
