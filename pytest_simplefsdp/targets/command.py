"""The command target: any program, started once per rank (``target: {command: [...], env: {...}}``), with
placeholders ``{axis}``, ``{setting}``, ``{python}``, ``{nproc}``, ``{port}``, ``{dump_folder}``, ``{matrix_dir}``,
``{passes_off}`` (a compiler bisection's probe: the graph passes it turns off, comma-separated, ``*`` for all).
The plugin's own tests use it with small fake targets; a project can run its own scripts through it."""

from __future__ import annotations

import string
import sys
from pathlib import Path

from ..commands import RankCommand
from ..judge.evidence import Expect
from ..judge.mutants import Mutant
from ..spec.matrix import Matrix, MatrixError
from ..spec.upstream import tokens
from .base import Target


class CommandTarget(Target):
    """Any program, started once per rank: ``target: {command: [argv...], env: {...}}``. Later runs and steps
    before a cell work as for torchtitan's targets; the program says it loaded its checkpoint as torchtitan does
    ("Finished loading the checkpoint")."""

    name = "command"

    def __init__(self, matrix: Matrix, cache_dir=None):
        super().__init__(matrix)
        spec = matrix.target
        self.argv = spec.get("command")
        self.env = spec.get("env") or {}
        self.expects = spec.get("evidence") or {}  # axis -> key of the record the program writes
        self.steps = spec.get("steps") or {}  # step name -> its program (one process), run before a cell that asks
        self.STEPS = tuple(self.steps)
        where = matrix.where("target")
        names = spec.get("mutants") or []  # bugs the program re-injects itself when SIMPLEFSDP_MUTANT names one
        if not isinstance(names, list) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise MatrixError(f"{where}: target.mutants must be a list of names, got {names!r}")
        self.MUTANTS = tuple(Mutant(n, f"declared by {matrix.path.name}", lambda a: True) for n in names)
        if not isinstance(self.argv, list) or not self.argv:
            raise MatrixError(f"{where}: target.command must be a non-empty list of arguments")
        unknown = set(spec) - {"command", "env", "evidence", "mutants", "steps"}
        if unknown:
            raise MatrixError(
                f"{where}: unknown target keys {sorted(unknown)}; allowed: command, env, evidence, mutants, steps"
            )
        if not isinstance(self.steps, dict) or not all(isinstance(v, list) and v for v in self.steps.values()):
            raise MatrixError(f"{where}: target.steps must map step names to non-empty argument lists")
        if (
            not isinstance(self.expects, dict)
            or any(a not in matrix.axes for a in self.expects)
            or any("." not in str(k) for k in self.expects.values())
        ):
            raise MatrixError(
                f"{where}: target.evidence must map axes ({', '.join(matrix.axes)}) to probe keys "
                f"'<section>.<name>', got {self.expects!r}"
            )
        known = set(matrix.axes) | set(matrix.settings) | {"python", "nproc", "port", "dump_folder", "matrix_dir"}
        known.add("passes_off")
        for part in [*self.argv, *self.env.values(), *(p for argv in self.steps.values() for p in argv)]:
            for _, name, _, _ in string.Formatter().parse(str(part)):
                if name and name not in known:
                    raise MatrixError(
                        f"{where}: target.command uses unknown placeholder {{{name}}}; "
                        f"known: {', '.join(sorted(known))}"
                    )

    def evidence_plan(self, cell):
        return [
            Expect(f"{axis}={cell.axes[axis]}", str(key), str(cell.axes[axis])) for axis, key in self.expects.items()
        ]

    def baseline_axes(self, axes):
        return {**axes, **self.matrix.numerics.baseline}

    def command(self, cell, dump_folder: Path, nproc: int, port: int, run=0, program=None, **_):
        values = {
            **self.matrix.settings,
            **cell.axes,
            "python": sys.executable,
            "nproc": nproc,
            "port": port,
            "dump_folder": dump_folder,
            "matrix_dir": self.matrix.path.parent.resolve(),
            "passes_off": "" if cell.passes is None else "*" if cell.passes.every else ",".join(cell.passes.off),
        }
        name = cell.axes.get("feature", "none")  # a feature's flags go at the end, each later run's after them
        extra = [*self.matrix.features.get(name, []), *(self.matrix.feature_runs[name][run - 1] if run else [])]
        argv = [str(p).format(**values) for p in (program or self.argv)] + list(tokens(extra))
        env = {k: str(v).format(**values) for k, v in self.env.items()}
        return RankCommand(argv, env, cwd=str(self.matrix.path.parent.resolve()))

    def step_command(self, cell, step, dump_folder: Path, seed_folder=None):
        return self.command(cell, dump_folder, nproc=1, port=0, program=self.steps[step])
