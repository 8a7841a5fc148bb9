"""Run in the ranks' Python (``python -m pytest_simplefsdp.shim.options [--module M --config C]``): the option table
of the installed torchtitan's job config as JSON: ``cli``, dotted name -> its choices (None: any value), and
``python``, the options the config module sets in Python where this torchtitan has no CLI option for them (the
module's ``python_options(config)``; torchtitan main's grain dataloader takes its dataset only as a config object).
targets/flags.py reads it to spell every cell's flags the way that torchtitan takes them.

``SET_ENV`` is how those values reach the ranks: a JSON object {option: value} the config module applies."""

from __future__ import annotations

import dataclasses
import importlib
import json
import types
import typing

ANY = None  # an option whose values are not a fixed set
SET_ENV = "SIMPLEFSDP_CONFIG_SET"  # JSON {option: value}: what the config module sets in Python (python_options)


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
    return registry, fn()


def table(module=None, config=None) -> dict:
    """The option table of one job config: {"cli": {name: choices}, "python": [names]}."""
    registry, job = load_config(module, config)
    python = getattr(registry, "python_options", None)
    return {"cli": walk(job), "python": sorted(python(job)) if callable(python) else []}


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module")
    parser.add_argument("--config")
    parser.add_argument("--many", help="a JSON list of [module, config] pairs: one table each, in one process "
                                       "(torch and torchtitan imported once)")
    args = parser.parse_args(argv)
    if args.many:
        print(json.dumps([table(m, c) for m, c in json.loads(args.many)]))
    else:
        print(json.dumps(table(args.module, args.config)))


if __name__ == "__main__":
    main()
