"""Between cells and launch: a torchtitan cell's flags, spelled the way the installed torchtitan takes them.

A torchtitan target writes every flag under its torchtitan 0.3.0 name (``training.seq_len``) and
says where it comes from (an axis value or a setting). What the installed torchtitan accepts is read
from its own job config: the dataclass that the ``--module/--config`` function returns (0.3), or
``JobConfig`` (0.2), walked field by field in a subprocess of the ranks' Python. A flag the installed
torchtitan lacks is renamed where a known rename exists (torchtitan PR 4121 counts batches in tokens:
``training.seq_len`` became ``training.max_context_length``, ...), and is otherwise an error that names
the axis or setting, its value and the option.

Run as ``python -m pytest_simplefsdp.titan_options [--module M --config C]`` it prints the option
table of the installed torchtitan as JSON (what the probe runs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ANY = None  # an option whose values are not a fixed set


@dataclass(frozen=True)
class Flag:
    """One option of a cell's command, under its torchtitan 0.3.0 name."""

    name: str  # dotted, e.g. "training.seq_len"
    value: object = True  # True: a bare switch (--training.disable_cuda_graphs)
    source: str = ""  # what asked for it, for error lines: "axis backend=inductor", "setting seq_len"


@dataclass(frozen=True)
class Rename:
    """An option torchtitan renamed after 0.3.0; ``convert`` maps the old value, given the cell's flags."""

    old: str
    new: str
    convert: Callable[[object, dict], object]
    why: str


def _tokens(value, flags):
    return int(value) * int(flags["training.seq_len"].value)


RENAMES = {r.old: r for r in (
    Rename("training.seq_len", "training.max_context_length", lambda v, f: v, "torchtitan PR 4121"),
    Rename("training.local_batch_size", "training.num_tokens_per_microbatch_per_dp_rank", _tokens,
           "torchtitan PR 4121: batches counted in tokens (local batch x seq_len)"),
    Rename("training.global_batch_size", "training.num_tokens_per_train_step", _tokens,
           "torchtitan PR 4121: batches counted in tokens (global batch x seq_len)"),
    Rename("parallelism.pipeline_parallel_microbatch_size", "parallelism.num_pp_microbatches",
           lambda v, f: int(f["training.local_batch_size"].value) // int(v),
           "torchtitan PR 4121: microbatches counted, not sized"),
)}


class OptionError(Exception):
    """A flag the installed torchtitan cannot express; ``flag`` says where it came from."""

    def __init__(self, flag: Flag, message: str):
        super().__init__(message)
        self.flag = flag


@dataclass(frozen=True)
class Options:
    """The options one torchtitan job config accepts: dotted name -> its choices (None: any value)."""

    names: dict
    origin: str  # e.g. "torchtitan 0.3.0 (titan03_configs.llama3_debugmodel_cpu)"

    def spell(self, flags: list[Flag]) -> list[str]:
        """argv for the flags; raises OptionError for one this torchtitan has no spelling of."""
        by_name = {f.name: f for f in flags}
        argv = []
        for flag in flags:
            name, value = flag.name, flag.value
            if name not in self.names and name in RENAMES and RENAMES[name].new in self.names:
                rename = RENAMES[name]
                name, value = rename.new, rename.convert(value, by_name)
            if name not in self.names:
                raise OptionError(flag, f"needs --{flag.name}, which {self.origin} does not have")
            choices = self.names[name]
            if choices is not ANY and value is not True and str(value) not in choices:
                raise OptionError(flag, f"--{name} {value}: {self.origin} accepts {', '.join(choices)}")
            argv += _argv(name, value)
        return argv


def unchecked(flags: list[Flag]) -> list[str]:
    """argv as the target wrote it, for a dry run where the target's torchtitan is not installed."""
    return [a for f in flags for a in _argv(f.name, f.value)]


def _argv(name, value):
    return [f"--{name}"] if value is True else [f"--{name}", str(value)]


# --- reading the installed torchtitan (in a subprocess of the ranks' Python) --------------------


def _choices(annotation):
    """The values a Literal (or Optional Literal) annotation allows, as the CLI writes them; else ANY."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return ["None" if a is None else str(a) for a in typing.get_args(annotation)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        out = []
        for arg in typing.get_args(annotation):
            if arg is type(None):
                out.append("None")
            elif typing.get_origin(arg) is typing.Literal:
                out += _choices(arg)
            else:
                return ANY
        return out
    return ANY


def walk(config, prefix="") -> dict:
    """Every leaf option of a job-config dataclass instance: dotted name -> choices."""
    try:
        hints = typing.get_type_hints(type(config))
    except Exception:  # a forward reference the module cannot resolve: no choices then
        hints = {}
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(walk(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = _choices(hints.get(f.name, f.type))
    return out


def load_config(module=None, config=None):
    """The job config the trainer would start from: 0.3's config-registry function, or 0.2's JobConfig."""
    if module is None:  # 0.2: the JobConfig, merged with a custom config module (``config``) as torchtitan does
        if config:
            from torchtitan.config.manager import ConfigManager

            return ConfigManager().parse_args([f"--job.custom_config_module={config}"])
        from torchtitan.config.job_config import JobConfig

        return JobConfig()
    candidates = [f"torchtitan.experiments.{module}.config_registry", f"torchtitan.models.{module}.config_registry",
                  f"{module}.config_registry", module]
    for name in candidates:
        try:
            registry = importlib.import_module(name)
            break
        except ImportError:
            continue
    else:
        raise SystemExit(f"cannot import a config registry for --module {module} (tried {', '.join(candidates)})")
    fn = getattr(registry, config, None)
    if not callable(fn):
        raise SystemExit(f"{registry.__name__} has no config function {config!r}")
    return fn()


def _cache_key(python, module, config, env):
    """What the option table depends on: the Python, torchtitan's version and files, the config module."""
    spec = importlib.util.find_spec("torchtitan")
    parts = [python, module or "", config or "", env.get("PYTHONPATH", "")]
    if spec and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        parts.append(str(root))
        files = [*root.glob("config/*.py"), *root.glob("experiments/*/configs.py"),
                 *root.glob("experiments/*/*/config_registry.py")]
        parts += [f"{p}:{p.stat().st_mtime_ns}" for p in sorted(files)]
        try:
            from importlib import metadata

            parts.append(metadata.version("torchtitan"))
        except Exception:
            pass
    for folder in env.get("PYTHONPATH", "").split(os.pathsep):
        for p in sorted(Path(folder).glob("*.py")) if folder else []:
            parts.append(f"{p}:{p.stat().st_mtime_ns}")
    parts.append(str(Path(__file__).stat().st_mtime_ns))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def cache_root() -> Path:
    """Per user, not per rootdir: the key says what a table depends on, so every run may share it."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pytest-simplefsdp"


def read_options(module, config, env: dict, origin: str) -> Options:
    """The installed torchtitan's options for one config, cached by what they depend on."""
    # the ranks' path (the target's folders, then the user's: see launch) and this package for the probe
    path = [p for p in (env.get("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")) if p]
    full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)}
    key = _cache_key(sys.executable, module, config, full_env)
    cached = cache_root() / "options" / f"{key}.json"
    if cached.exists():
        return Options(json.loads(cached.read_text()), origin)
    argv = [sys.executable, "-m", "pytest_simplefsdp.titan_options"]
    argv += [*(["--module", module] if module else []), *(["--config", config] if config else [])]
    full_env["PYTHONPATH"] = os.pathsep.join([*path, str(Path(__file__).resolve().parent.parent)])
    proc = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=600)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"reading the options of {origin} failed: {tail[0]}")
    names = json.loads(proc.stdout.strip().splitlines()[-1])
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(names))
    return Options(names, origin)


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module")
    parser.add_argument("--config")
    args = parser.parse_args(argv)
    print(json.dumps(walk(load_config(args.module, args.config))))


if __name__ == "__main__":
    main()
