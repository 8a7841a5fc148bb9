"""Where a cell's version set runs: its environment (versions.envs.Environments, built with uv), or the one pytest
runs in for ``installed``. A set's commands take that environment's Python; a set whose environment cannot be had
names the installer's line; a record names the versions it ran on (proved by what its ranks imported:
judge.provenance), and what of them the target does not support."""

from __future__ import annotations

from ..judge.provenance import Expected
from ..machine import installed_folder, versions
from ..versions.envs import DONE, EnvError
from ..versions.sets import INSTALLED, parse


class VersionSets:
    def __init__(self, envs=None):
        self.envs = envs  # versions.envs.Environments, or None: only the installed versions

    def apply(self, run, command, vset):
        """A command of the run's target as it runs in the version set's environment."""
        return self.envs.apply(command, vset, run.target.REQUIRES) if self.envs is not None else command

    def problem(self, run, vset) -> str | None:
        """Why the version set's environment cannot be had (the installer's line), or None (built, or kept)."""
        if vset.installed or self.envs is None:
            return None
        try:
            self.envs.get(vset, run.target.REQUIRES)
        except EnvError as e:
            return f"no environment for {vset.label()}: {e}"
        return None

    def python(self, run, label: str):
        """The Python of a version set's environment where it is built (its option names can be read), else None."""
        vset = parse(label)
        if vset.installed or self.envs is None:
            return None
        folder = self.envs.folder(vset, run.target.REQUIRES)
        return str(folder / "bin" / "python") if (folder / DONE).is_file() else None

    def expected(self, run, vset) -> Expected:
        """What the set's ranks must import: its environment and pins; the installed side, the installed
        distributions of what the target proves (compared, not enforced)."""
        if vset.installed or self.envs is None:
            proves = getattr(run.target, "PROVES", ())
            return Expected(INSTALLED, installed={p: installed_folder(p) for p in proves if installed_folder(p)})
        return Expected(vset.label(), str(self.envs.get(vset, run.target.REQUIRES).folder), dict(vset.pins))

    def ran_on(self, run, vset) -> dict:
        """The versions a cell of the set ran on (its record names them)."""
        if vset.installed or self.envs is None:
            return dict(versions())
        return dict(self.envs.get(vset, run.target.REQUIRES).versions)
