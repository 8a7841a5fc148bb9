"""Between cells and launch: a torchtitan cell's flags, spelled the way the installed torchtitan takes them.

A torchtitan target writes every flag under its torchtitan 0.3.0 name (``training.seq_len``) and
says where it comes from (an axis value or a setting). What the installed torchtitan accepts is read
from its own job config: the dataclass that the ``--module/--config`` function returns (0.3), or
``JobConfig`` (0.2), walked field by field in a subprocess of the ranks' Python (shim/options.py). A flag the installed
torchtitan lacks is renamed where a known rename exists (torchtitan PR 4121 counts batches in tokens:
``training.seq_len`` became ``training.max_context_length``, ...); otherwise the cell cannot run on that torchtitan:
its command carries the option it lacks and the axis or setting that asked for it (``RankCommand.lacking``), and
the cell fails as ``invalid_config`` naming them, without a launch (a commit before the option, or a PR that
removed it); where nothing of the run can be spelled, the run stops before any cell (``Target.bind``).

The table is read by ``python -m pytest_simplefsdp.shim.options [--module M --config C]`` in the ranks' Python
(it prints the option table of the installed torchtitan as JSON), and cached by what it depends on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..machine import installed
from ..paths import PACKAGE, cache_root, write_json
from ..shim import options as probe
from ..shim.options import ANY, SET_ENV


@dataclass(frozen=True)
class Flag:
    """One option of a cell's command, under the name its target writes (titan03: torchtitan 0.3.0's; titan02:
    0.2.0's)."""

    name: str  # dotted, e.g. "training.seq_len"
    value: object = True  # True / False: a switch (--training.disable_cuda_graphs, --compile.no_enable_passes)
    source: str = ""  # what asked for it, for error lines: "axis backend=inductor", "setting seq_len"
    # a switch that turns off what later torchtitans added (CUDA graphs): left out where this one has no such option
    where_present: bool = False


@dataclass(frozen=True)
class Rename:
    """An option torchtitan renamed after the release a target writes; ``convert`` maps the old value, given the
    cell's flags. Applied only where the installed torchtitan lacks the old name and has the new one."""

    old: str
    new: str
    convert: Callable[[object, dict], object]
    why: str


# a value torchtitan spelled otherwise before the release a target writes: (option, value) -> (old value, why);
# used where the installed torchtitan's choices lack the value and have the old one
OLD_VALUES = {
    ("parallelism.spmd_backend", "partial_dtensor"): (
        "default",
        "torchtitan PR 3466 (2026-06-06) named the existing parallelism path 'default'",
    ),
}

MICROBATCH = "parallelism.pipeline_parallel_microbatch_size"


def spelled_value(name, value, choices):
    """The value as a torchtitan with these choices takes it: its old spelling where only that is offered."""
    old = OLD_VALUES.get((name, str(value)))
    if choices is not ANY and str(value) not in choices and old and old[0] in choices:
        return old[0]
    return value


def _tokens(value, flags):
    return int(value) * int(flags["training.seq_len"].value)


def _microbatch_tokens(value, flags):
    """A local batch (sequences per dp rank) as main's tokens per microbatch: under PP (a microbatch size given) one
    pipeline microbatch's sequences, since main's local batch is num_pp_microbatches of them."""
    return _tokens(flags[MICROBATCH].value if MICROBATCH in flags else value, flags)


def _bucketing_pass(value, flags):
    """0.2.0's backend override ``aot_eager_autobucketing`` as the pass PR 1881 chose by name (the backend is the
    cell's --compile.backend); any other value goes as it is, for the option's choices to refuse."""
    return "auto_bucketing" if value == "aot_eager_autobucketing" else value


RENAMES = {
    r.old: r
    for r in (
        # the seed era (titan02 writes 0.2.0's names)
        Rename("training.seed", "debug.seed", lambda v, f: v, "torchtitan PR 1807 (0.2.1): seed under [debug]"),
        Rename(
            "training.deterministic",
            "debug.deterministic",
            lambda v, f: v,
            "torchtitan PR 1807 (0.2.1): deterministic under [debug]",
        ),
        Rename(
            "compile.model_backend_override",
            "compile.graph_passes",
            _bucketing_pass,
            "torchtitan PR 1881 (0.2.1): SimpleFSDP's bucketing passes chosen by --compile.graph_passes",
        ),
        # main before training.disable_cuda_graphs (spring 2026): CUDA graphs were a graph pass, left out by name
        Rename(
            "training.disable_cuda_graphs",
            "compile.disable_passes",
            lambda v, f: "cudagraph_pass",
            "main of spring 2026: cudagraph_pass ran unless --compile.disable_passes named it",
        ),
        # after 0.3.0 (titan03 writes 0.3.0's names)
        Rename("training.seq_len", "training.max_context_length", lambda v, f: v, "torchtitan PR 4121"),
        Rename(
            "training.local_batch_size",
            "training.num_tokens_per_microbatch_per_dp_rank",
            _microbatch_tokens,
            "torchtitan PR 4121: batches counted in tokens (local batch x seq_len; under PP, one microbatch's)",
        ),
        Rename(
            "training.global_batch_size",
            "training.num_tokens_per_train_step",
            _tokens,
            "torchtitan PR 4121: batches counted in tokens (global batch x seq_len)",
        ),
        Rename(
            "parallelism.pipeline_parallel_microbatch_size",
            "parallelism.num_pp_microbatches",
            lambda v, f: int(f["training.local_batch_size"].value) // int(v),
            "torchtitan PR 4121: microbatches counted, not sized",
        ),
    )
}


class OptionError(Exception):
    """A flag a torchtitan cannot express: an option it does not have, or a value outside the option's choices
    (``offered``); ``flag`` says where it came from."""

    def __init__(self, flag: Flag, message: str, offered: list | None = None):
        super().__init__(message)
        self.flag, self.offered = flag, offered

    def line(self) -> str:
        """What the cell's failure says, naming no torchtitan version (its commits before the option say the same)."""
        if self.offered is None:
            return f"this torchtitan has no --{self.flag.name} ({self.flag.source})"
        return f"this torchtitan's --{self.flag.name} does not take {self.flag.value} ({self.flag.source})"


@dataclass(frozen=True)
class Spelled:
    """A cell's flags as the installed torchtitan takes them: on its command line, and in Python through the config
    module (the options it has no CLI option for: Options.python), passed to the ranks as ``SET_ENV``."""

    argv: list
    python: dict
    lacking: tuple = ()  # OptionError per option this torchtitan does not have (the flag goes as written)
    unforkable: str | None = None  # why its ranks must not be forked (Options.binds_argv)

    def env(self) -> dict:
        return {SET_ENV: json.dumps(self.python, sort_keys=True)} if self.python else {}


@dataclass(frozen=True)
class Options:
    """The options one torchtitan job config accepts: dotted name -> its choices (None: any value)."""

    names: dict
    origin: str  # e.g. "torchtitan 0.3.0 (titan03_configs.llama3_debugmodel_cpu)"
    # what the config module sets in Python where this torchtitan has no CLI option (shim.options.table)
    python: frozenset = frozenset()
    binds_argv: bool = False  # its ConfigManager binds sys.argv when imported (shim.options.binds_argv): not forked

    @classmethod
    def from_table(cls, table: dict, origin: str):
        return cls(
            table["cli"], origin, python=frozenset(table.get("python", ())), binds_argv=table.get("binds_argv", False)
        )

    def spell(self, flags: list[Flag]) -> Spelled:
        """argv (and Python-set values) for the flags. An option this torchtitan does not have, or a value outside its
        choices, goes as written and is named in ``lacking`` (the installed torchtitan's table or a version set's: a
        cell's outcome on that torchtitan, which a bisection can find, never a collection error)."""
        by_name = {f.name: f for f in flags}
        argv, python, lacking = [], {}, []
        for flag in flags:
            name, value = flag.name, flag.value
            if name not in self.names and name in RENAMES and RENAMES[name].new in self.names:
                rename = RENAMES[name]
                name, value = rename.new, rename.convert(value, by_name)
            if name not in self.names and name in self.python:
                python[name] = str(value) if isinstance(value, Path) else value
                continue
            if name not in self.names and flag.where_present:
                continue  # (main of spring 2026 has no CUDA graphs to disable)
            if name not in self.names:
                lacking.append(OptionError(flag, f"needs --{flag.name}, which {self.origin} does not have"))
                argv += _argv(name, value)
                continue
            choices = self.names[name]
            value = spelled_value(name, value, choices)
            if choices is not ANY and not isinstance(value, bool) and str(value) not in choices:
                error = f"--{name} {value}: {self.origin} accepts {', '.join(choices)}"
                lacking.append(OptionError(flag, error, offered=choices))
            argv += _argv(name, value)
        binds = f"{self.origin.split(' (')[0]}'s ConfigManager.parse_args binds sys.argv[1:] when it is imported"
        return Spelled(argv, python, tuple(lacking), binds if self.binds_argv else None)


def unchecked(flags: list[Flag]) -> Spelled:
    """argv as the target wrote it, for a dry run where the target's torchtitan is not installed."""
    return Spelled([a for f in flags for a in _argv(f.name, f.value)], {})


def _argv(name, value):
    """A switch as tyro writes it (True: ``--compile.enable_passes``, False: ``--compile.no_enable_passes``); else the
    option and its value."""
    if isinstance(value, bool):
        section, _, option = name.rpartition(".")
        return [f"--{name}"] if value else [f"--{section + '.' if section else ''}no_{option}"]
    return [f"--{name}", str(value)]


def _cache_key(python, module, config, env):
    """What the option table depends on: the Python, torchtitan's version and files, the config module."""
    spec = importlib.util.find_spec("torchtitan")
    parts = [python, module or "", config or "", env.get("PYTHONPATH", "")]
    if spec and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        parts.append(str(root))
        files = [
            *root.glob("config/*.py"),
            *root.glob("experiments/*/configs.py"),
            *root.glob("experiments/*/*/config_registry.py"),
        ]
        parts += [f"{p}:{p.stat().st_mtime_ns}" for p in sorted(files)]
        parts.append(installed("torchtitan"))
    for folder in env.get("PYTHONPATH", "").split(os.pathsep):
        for p in sorted(Path(folder).glob("*.py")) if folder else []:
            parts.append(f"{p}:{p.stat().st_mtime_ns}")
    parts.append(str(Path(probe.__file__).stat().st_mtime_ns))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def read_options(pairs, env: dict, origins: dict, python: str | None = None) -> dict:
    """The torchtitan's options for each (module, config) pair: {pair: Options}, each cached by what it depends on;
    the ones not cached are read in one subprocess (it imports torch and torchtitan once). ``python``: the
    interpreter whose torchtitan it is (a version set's environment), else this one."""
    python = python or sys.executable
    # the ranks' path (the target's folders, then the user's: see launch) and this package for the probe
    path = [p for p in (env.get("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")) if p]
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)}
    out, missing = {}, {}
    for module, config in pairs:
        cached = cache_root() / "options" / f"{_cache_key(python, module, config, full_env)}.json"
        if cached.exists():
            out[module, config] = Options.from_table(json.loads(cached.read_text()), origins[module, config])
        else:
            missing[module, config] = cached
    if not missing:
        return out
    argv = [python, "-m", "pytest_simplefsdp.shim.options", "--many", json.dumps(list(missing))]
    full_env["PYTHONPATH"] = os.pathsep.join([*path, str(PACKAGE.parent)])
    proc = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=600)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        which = ", ".join(origins[k] for k in missing)
        raise RuntimeError(f"reading the options of {which} failed: {tail[0]}")
    tables = json.loads(proc.stdout.strip().splitlines()[-1])
    for (key, cached), names in zip(missing.items(), tables):
        write_json(cached, names)
        out[key] = Options.from_table(names, origins[key])
    return out
