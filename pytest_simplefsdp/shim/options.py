"""Run in the ranks' Python (``python -m pytest_simplefsdp.shim.options [--module M --config C]``): the option table
of the installed torchtitan's job config as JSON: ``cli``, dotted name -> its choices (None: any value), and
``python``, the options this job config takes only as config objects, where this torchtitan has no CLI option for them
(``PYTHON_OPTIONS``: torchtitan main's grain dataloader takes its dataset only as a source object).
targets/flags.py reads it to spell every cell's flags the way that torchtitan takes them.

``SET_ENV`` is how those values reach the ranks: a JSON object {option: value} that ``config_set`` sets on the job
config torchtitan loads, whichever config function a cell names (ours, upstream's, a user's recipe)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import os
import types
import typing

from .hooks import after_import

ANY = None  # an option whose values are not a fixed set
SET_ENV = "SIMPLEFSDP_CONFIG_SET"  # JSON {option: value}: set on the loaded job config (config_set)


def _data_sources(config):
    """Every Hugging Face dataset source in a job config (torchtitan main's grain configs: the training and the
    validation dataloader's ``HuggingFaceRandomAccessSource.Config`` of a local file, or ``HuggingFaceStreamingSource
    .Config`` of the hub's ``allenai/c4``): a dataclass with ``path``, ``split`` and ``load_dataset_kwargs``."""
    found, stack = [], [config]
    while stack:
        node = stack.pop()
        if not dataclasses.is_dataclass(node) or isinstance(node, type):
            continue
        if (
            isinstance(getattr(node, "load_dataset_kwargs", None), dict)
            and hasattr(node, "path")
            and hasattr(node, "split")
        ):
            found.append(node)
        stack += [getattr(node, f.name, None) for f in dataclasses.fields(node)]
    return found


def _set_dataset(config, folder):
    """The dataset folder (its ``data.json``, JSON lines with a ``text`` field) as every source's data, as 0.3.0's
    ``--dataloader.dataset_path`` pointed whichever dataset the config named at a local folder: the sample upstream's
    c4_test config names relative to the working folder, and the hub's c4 of its 8B configs (offline here)."""
    for source in _data_sources(config):
        source.path, source.split = "json", "train"
        for pinned in ("name", "revision"):
            if hasattr(source, pinned):
                setattr(source, pinned, None)
        source.load_dataset_kwargs = {**source.load_dataset_kwargs, "data_files": os.path.join(folder, "data.json")}


# option -> (whether a job config takes it only as config objects, how to set it there): decided by what the config
# holds, never by the version string
PYTHON_OPTIONS = {
    # torchtitan main since the grain dataloader (upstream 1460458): no --dataloader.dataset_path
    "dataloader.dataset_path": (
        lambda job: (
            not hasattr(getattr(job, "dataloader", None), "dataset_path")
            and bool(_data_sources(getattr(job, "dataloader", None)))
        ),
        _set_dataset,
    ),
}


def python_options(job) -> list:
    """The options this job config takes only in Python."""
    return sorted(name for name, (applies, _) in PYTHON_OPTIONS.items() if applies(job))


def set_in_python(job, values: dict):
    """A copy of the job config with ``values`` set (a copy: upstream's configs share dataset objects with its
    module-level registries); an option it takes on its command line instead is a ValueError."""
    job = copy.deepcopy(job)
    for name, value in values.items():
        applies, apply = PYTHON_OPTIONS[name]
        if not applies(job):
            raise ValueError(f"{type(job).__name__}: this torchtitan takes {name} on its command line, not in Python")
        apply(job, value)
    return job


def config_set():
    """In a rank: ``$SIMPLEFSDP_CONFIG_SET`` set on the job config where torchtitan 0.3 and main load it from
    ``--module``/``--config`` (``ConfigManager._load_config``; the CLI's overrides then apply on top, as they do on a
    config function's defaults). Read at each load, so a fork server's ranks set their own cell's values."""

    @after_import("torchtitan.config.manager", "config_set")
    def patch(module):
        load = module.ConfigManager._load_config

        def _load_config(self, args):
            job, rest = load(self, args)
            values = json.loads(os.environ.get(SET_ENV) or "{}")
            return (set_in_python(job, values) if values else job), rest

        module.ConfigManager._load_config = _load_config


def _choices(annotation):
    """The values a Literal (or Optional Literal) annotation allows, as the CLI writes them; else ANY."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return ["None" if a is None else str(a) for a in typing.get_args(annotation)]
    if origin in (typing.Union, getattr(types, "UnionType", None)):
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
    """The job config the trainer would start from: 0.3's config-registry function, or 0.2's JobConfig; with the
    module it came from (None for 0.2)."""
    if module is None:  # 0.2: the JobConfig, merged with a custom config module (``config``) as torchtitan does
        if config:
            from torchtitan.config.manager import ConfigManager

            return None, ConfigManager().parse_args([f"--job.custom_config_module={config}"])
        from torchtitan.config.job_config import JobConfig

        return None, JobConfig()
    candidates = [
        f"torchtitan.experiments.{module}.config_registry",
        f"torchtitan.models.{module}.config_registry",
        f"{module}.config_registry",
        module,
    ]
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
    return registry, fn()


def table(module=None, config=None) -> dict:
    """The option table of one job config: {"cli": {name: choices}, "python": [names], "binds_argv": bool}."""
    _, job = load_config(module, config)
    return {"cli": walk(job), "python": python_options(job), "binds_argv": binds_argv()}


def binds_argv() -> bool:
    """Whether this torchtitan's ConfigManager.parse_args takes ``sys.argv[1:]`` as its default, bound when the module
    is imported (0.2, and main before the spring of 2026): a fork server that imported it once would hand every rank
    its own argv, so such a torchtitan's ranks are not forked."""
    import inspect

    try:
        from torchtitan.config.manager import ConfigManager
    except ImportError:
        return False
    default = inspect.signature(ConfigManager.parse_args).parameters.get("args")
    return default is not None and isinstance(default.default, list)


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module")
    parser.add_argument("--config")
    parser.add_argument(
        "--many",
        help="a JSON list of [module, config] pairs: one table each, in one process "
        "(torch and torchtitan imported once)",
    )
    args = parser.parse_args(argv)
    if args.many:
        print(json.dumps([table(m, c) for m, c in json.loads(args.many)]))
    else:
        print(json.dumps(table(args.module, args.config)))


if __name__ == "__main__":
    main()
