"""Upstream's own suite as a matrix source: the SimpleFSDP integration tests of the installed torchtitan.

torchtitan 0.3 keeps them in ``experiments/graph_trainer/tests/integration_tests.py`` (``OverrideDefinitions``
per test, built by the functions of its ``_TEST_SUITES_FUNCTION``) and ``run_precompile_tests.py``; 0.2 in
``experiments/simple_fsdp/tests/integration_tests.py``. They import ``tests.integration_tests`` from the
torchtitan repository, which the wheel does not ship, so the loader runs upstream's file as its runner does,
with a stand-in for that one import (the same fields as upstream's ``OverrideDefinitions``), and reads
the comment above each definition for why it is disabled. Nothing of upstream's is copied here.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import sys
import types
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..degrees import BY_OPTION
from .matrix import SourceUnavailable

# a URL; "PyTorch #N" / "pytorch/pytorch#N"; a bare "#N" (torchtitan's)
ISSUE = re.compile(r"(https?://[^\s)]+)|(?:\b(pytorch/pytorch|PyTorch)\s*)?(?<![\w/])#(\d{3,6})\b")
REPOS = {"": "https://github.com/pytorch/torchtitan", "pytorch": "https://github.com/pytorch/pytorch"}

# the files per generation, relative to the installed torchtitan package
SOURCES = {
    "0.3": [
        ("experiments/graph_trainer/tests/integration_tests.py", "integration"),
        ("experiments/graph_trainer/tests/run_precompile_tests.py", "precompile"),
    ],
    "0.2": [("experiments/simple_fsdp/tests/integration_tests.py", "integration")],
}


@dataclass(frozen=True)
class UpstreamTest:
    name: str
    descr: str
    runs: tuple  # one tuple of flags per run (a checkpoint test trains, then resumes)
    ngpu: int
    disabled: bool
    kind: str  # integration or precompile
    where: str  # file:line of its definition
    note: str = ""  # the comment above it (why it is disabled, TODO)
    links: tuple = ()  # issues and PRs its note names
    precompile: str = ""  # precompile tests: the precompile step's command
    recipe: tuple = ()  # the `configs` form: (model, flavor) of its first run's full configuration

    @property
    def flags(self):
        """The flags of its first run: the configuration it tests."""
        return self.runs[0] if self.runs else ()


class _Definitions:
    """Stand-in for upstream's ``tests.integration_tests.OverrideDefinitions`` (same fields and defaults): a run is a
    command line (``override_args``, the older form) or a full configuration (``configs``, callables returning the
    trainer's config, upstream #4177), with that run's ``override_args`` (none) on top."""

    def __init__(
        self,
        override_args=((" ",),),
        test_descr="default",
        test_name="default",
        ngpu=4,
        disabled=False,
        configs=(),
        **extra,
    ):
        if configs and override_args == ((" ",),):
            override_args = tuple(() for _ in configs)
        if configs and len(override_args) != len(configs):
            raise ValueError(f"{test_name}: {len(configs)} configs but {len(override_args)} override_args")
        self.override_args, self.test_descr, self.test_name = override_args, test_descr, test_name
        self.ngpu, self.disabled, self.configs, self.extra = ngpu, disabled, tuple(configs), extra


def tokens(args) -> tuple:
    """Upstream writes a run's flags as shell fragments ("--a b", "--c=d"): one word per token."""
    return tuple(w for a in args for w in shlex.split(str(a)))


def generation(root: Path | None = None) -> str | None:
    """The generation whose suite the torchtitan at ``root`` (default: the installed one) ships, by its files, never by
    its version: main says 0.2.2 and ships graph_trainer's suite."""
    root = root or torchtitan_root()
    for gen, files in SOURCES.items():
        if root is not None and (root / files[0][0]).exists():
            return gen
    return None


def torchtitan_root() -> Path | None:
    spec = importlib.util.find_spec("torchtitan")
    return Path(spec.origin).parent if spec and spec.origin else None


def load(root: Path | None = None, gen: str | None = None) -> list[UpstreamTest]:
    """Every SimpleFSDP integration (and precompile) test the installed torchtitan defines, once each."""
    root = root or torchtitan_root()
    gen = gen or generation(root)
    if root is None or gen is None:
        raise LookupError(f"no torchtitan generation with an upstream suite is installed (known: {', '.join(SOURCES)})")
    tests, seen = [], set()
    for rel, kind in SOURCES[gen]:
        path = root / rel
        if not path.exists():
            raise LookupError(f"{path}: upstream's {kind} tests are not where torchtitan {gen} keeps them")
        for t in load_file(path, kind):
            if t.name not in seen:
                seen.add(t.name)
                tests.append(t)
    return tests


def load_file(path: Path, kind: str = "integration") -> list[UpstreamTest]:
    """One file's definitions: executed with the stand-in import, built by each of its suite functions."""
    module = _execute(path)
    build = getattr(module, "_TEST_SUITES_FUNCTION", None)
    if build:
        builders = list(build.values())
    else:  # the precompile runner has one builder
        builders = [getattr(module, n) for n in dir(module) if n.startswith("_build_") and callable(getattr(module, n))]
    notes = _notes(path)
    out, seen = [], set()
    for builder in builders:
        for d in builder():
            if d.test_name in seen:
                continue
            seen.add(d.test_name)
            line, note = notes(d.test_name)
            runs = (tokens(d.override_args),) if kind == "precompile" else tuple(tokens(r) for r in d.override_args)
            recipe = ()
            if getattr(d, "configs", ()):  # (the precompile runner's own definitions have none)
                read = [recipe_flags(fn) for fn in d.configs]  # per run: its configuration's flags, then its args
                runs = tuple((*flags, *run) for (flags, _), run in zip(read, runs))
                recipe = read[0][1]
            out.append(
                UpstreamTest(
                    d.test_name,
                    d.test_descr,
                    runs,
                    int(d.ngpu),
                    bool(d.disabled),
                    kind,
                    f"{path}:{line}",
                    note,
                    links(note),
                    getattr(d, "precompile_command", "") or "",
                    recipe,
                )
            )
    return out


def _get(job, dotted):
    for part in dotted.split("."):
        job = getattr(job, part, None)
    return job


def recipe_flags(fn) -> tuple:
    """A ``configs`` run as flags: ``--module``/``--config`` as upstream's runner selects it (the function's module and
    name), then what the configuration sets on the matrix's axes, spelled as the flags that would set them (so a
    trace-tier twin runs the same layout, and coverage compares it axis by axis); and (model, flavor)."""
    flags = ["--module", fn.__module__, "--config", fn.__name__]
    job = fn()
    for name in BY_OPTION:
        value = _get(job, f"parallelism.{name}")
        if isinstance(value, int) and not isinstance(value, bool):
            flags += [f"--parallelism.{name}", str(value)]
    schedule = _get(job, "parallelism.pipeline_parallel_schedule")
    if (_get(job, "parallelism.pipeline_parallel_degree") or 1) > 1 and schedule:
        flags += ["--parallelism.pipeline_parallel_schedule", str(schedule)]
    mode = _get(job, "compile.mode")
    if mode:
        flags += ["--compile.mode", str(mode)]
        chosen = ("compile.backend",) if mode == "jit" else ("compile.inductor_compilation", "compile.memory_policy")
        flags += [w for key in chosen if _get(job, key) for w in (f"--{key}", str(_get(job, key)))]
    spec = _get(job, "model_spec")
    model = str(getattr(spec, "name", "") or "").split("/")[-1]
    return tuple(flags), (model, str(getattr(spec, "flavor", "") or ""))


def _execute(path: Path):
    """Run upstream's module with ``tests.integration_tests`` stood in for (and nothing else changed after)."""
    stand_in = types.ModuleType("tests.integration_tests")
    stand_in.OverrideDefinitions = _Definitions
    runner = types.ModuleType("tests.integration_tests.run_tests")
    runner.run_tests = lambda *a, **k: None
    saved = {
        name: sys.modules.get(name)
        for name in ("tests", "tests.integration_tests", "tests.integration_tests.run_tests")
    }
    sys.modules.update(
        {
            "tests": types.ModuleType("tests"),
            "tests.integration_tests": stand_in,
            "tests.integration_tests.run_tests": runner,
        }
    )
    try:
        spec = importlib.util.spec_from_file_location(f"simplefsdp_upstream_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.tempfile = types.SimpleNamespace(mkdtemp=lambda prefix="", **_: f"<{prefix}dir>")  # no temp dirs
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    return module


def _notes(path: Path):
    """test name -> (line of its definition, its comments: above it, inside it, and above the constant that
    disables it). Names built by f-strings (a list comprehension of variants) match as patterns."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    constants = {}  # module-level NAME = ... -> the comment block above it
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = _comment_above(lines, node.lineno)
    found = []  # (name or regex, line, note)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith(("Definitions", "Definition"))):
            continue
        name = _name_arg(node)
        if name is None:
            continue
        inside = [
            lines[i].strip().lstrip("#").strip()
            for i in range(node.lineno, node.end_lineno)
            if lines[i].strip().startswith("#")
        ]
        note = " ".join(filter(None, [_comment_above(lines, node.lineno), *inside]))
        disabled = next((k.value for k in node.keywords if k.arg == "disabled"), None)
        if isinstance(disabled, ast.Name) and constants.get(disabled.id):
            note = " ".join(filter(None, [note, constants[disabled.id]]))
        found.append((name, node.lineno, note))

    def lookup(test_name):
        for name, line, note in found:
            if name == test_name or (isinstance(name, re.Pattern) and name.fullmatch(test_name)):
                return line, note
        return 0, ""

    return lookup


def _name_arg(call):
    """The test_name argument: a string, a pattern for an f-string, or None."""
    node = next((k.value for k in call.keywords if k.arg == "test_name"), None)
    if node is None and len(call.args) > 2:
        node = call.args[2]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return re.compile("".join(re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in node.values))
    return None


def _comment_above(lines, lineno):
    """The consecutive comment lines right above a 1-based line, joined."""
    out, i = [], lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        out.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(x for x in out if x and not x.startswith("==="))


def links(note: str) -> tuple:
    """The issues and PRs a note names, as URLs (``#2149`` is torchtitan's)."""
    found = []
    for url, repo, number in ISSUE.findall(note):
        found.append(url.rstrip(".,") if url else f"{REPOS['pytorch' if repo else '']}/issues/{number}")
    return tuple(dict.fromkeys(found))


# --- what a test configures, in the matrix's words ------------------------------------------------------------

# flags that set up a run but do not change what it tests
INCIDENTAL = {
    "training.disable_cuda_graphs",
    "job.custom_config_module",
    "training.steps",
    "dump_folder",
    "checkpoint.folder",
    "compile.precompile_artifact_dir",
    "metrics.log_freq",
    "training.local_batch_size",
    "training.seq_len",
    "hf_assets_path",
    # the same settings under main's names (upstream PR 4121: batches counted in tokens)
    "training.max_context_length",
    "training.num_tokens_per_microbatch_per_dp_rank",
    "training.num_tokens_per_train_step",
}


def variant(config: str, model: str) -> str:
    """What a job config changes from the model's debug config: "" (none), "hybridep", "8b", ... The attention
    kernel is not compared: our CPU and trace-tier configs are the SDPA twins of upstream's FlexAttention ones
    (FlexAttention has no CPU backward)."""
    v = str(config).removeprefix("graph_trainer_").removeprefix(model).strip("_").replace("debugmodel", "")
    words = [w for w in v.split("_") if w and w not in ("sdpa", "cpu")]
    return "_".join(words)


def options(flags) -> dict:
    """``--a.b c`` / ``--a.b=c`` / ``--flag`` -> {"a.b": "c", "flag": True}, in order."""
    out, i = {}, 0
    flags = list(flags)
    while i < len(flags):
        word = flags[i]
        if not word.startswith("--"):
            i += 1
            continue
        key, eq, value = word[2:].partition("=")
        if not eq and i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            value, i = flags[i + 1], i + 1
        out[key.replace("-", "_") if key.startswith("parallelism") else key] = value if (eq or value) else True
        i += 1
    return out


@dataclass
class Configuration:
    """An upstream test in the matrix's axes, plus the features it sets that no axis names."""

    axes: dict
    world: int
    features: dict = field(default_factory=dict)


def configuration(test: UpstreamTest) -> Configuration:
    o = options(test.flags)
    axes, features = {}, {}
    module = o.get("module") or o.get("model.name") or ""
    axes["model"] = (test.recipe and test.recipe[0]) or str(module).split(".")[-1] or "llama3"
    for key, value in o.items():
        name = key.split(".", 1)[-1]
        if key.startswith("parallelism.") and name in BY_OPTION:
            axes[BY_OPTION[name]] = int(value)
        elif key == "parallelism.pipeline_parallel_schedule":
            axes["pp_schedule"] = str(value)
        elif key == "compile.mode":
            axes["compile"] = str(value)
        elif key == "compile.enable":  # 0.2: one switch, the model compiled whole
            axes["compile"] = "compiled"
        elif key == "activation_checkpoint.mode":  # 0.2's AC; selective per op is its own value
            op = o.get("activation_checkpoint.selective_ac_option") == "op"
            axes["ac"] = "op" if value == "selective" and op else str(value)
        elif key == "activation_checkpoint.selective_ac_option":
            continue
        elif key == "compile.backend":
            axes["backend"] = str(value)
        elif key == "compile.inductor_compilation":
            axes["backend"] = "inductor" if value == "full" else "aot_eager"
        elif key == "compile.memory_policy":
            axes["memory_policy"] = str(value)
        elif key == "config":
            # a full configuration (`configs`) differs from the debug model by its flavor; a config name by its words
            changed = variant(test.recipe[1], axes["model"]) if test.recipe else variant(value, axes["model"])
            if changed:
                features["config"] = changed
        elif key in ("module", "model.name") or key in INCIDENTAL:
            continue
        else:
            features[key] = value
    axes.setdefault("compile", "eager")
    if axes.get("pp", 1) > 1:
        axes.setdefault("pp_schedule", "1F1B")
    others = 1
    for d in ("dp_replicate", "tp", "cp", "pp"):
        others *= axes.get(d, 1)
    if axes.get("dp_shard", -1) == -1:  # torchtitan's -1: every rank the other degrees leave
        axes["dp_shard"] = max(1, test.ngpu // others)
    if test.kind == "precompile":
        features["precompile step"] = True  # rank-agnostic artifact first, then training that loads it
    if len(test.runs) > 1:  # e.g. save a checkpoint, then resume it on another layout
        features.update(later_runs(test.runs[1:], o))
    return Configuration(axes, test.ngpu, features)


def later_runs(runs, first: dict) -> dict:
    """``runs`` and, per later run, what it sets that the first does not (``run2.parallelism...``)."""
    out = {"runs": 1 + len(runs)}
    for n, flags in enumerate(runs, 2):
        for key, value in options(flags).items():
            if key not in INCIDENTAL and first.get(key) != value:
                out[f"run{n}.{key}"] = value
    return out


# what upstream's configs do where a test sets nothing (graph_trainer's CompileConfig and torchtitan's defaults)
DEFAULTS = {
    **dict.fromkeys(BY_OPTION.values(), 1),
    "pp_schedule": "none",
    "backend": "aot_eager",
    "trainer": "simplefsdp",
}


def normal(axes: dict) -> dict:
    """Axes with every default written out, so an upstream test and a cell compare axis by axis (the
    `feature` axis is compared by the flags it sets, not by its name)."""
    out = {**DEFAULTS, **{k: v for k, v in axes.items() if k != "feature"}}
    # torchtitan's default policy is a pass of aot_fx_trace's graph: eager and jit run none
    out.setdefault("memory_policy", "default" if out.get("compile") == "aot_fx_trace" else "none")
    return out


# what a `source: upstream` cell has besides the matrix's axes (known-failure conditions may name them anywhere)
UPSTREAM_AXES = {"upstream", "config", "runs", "disabled", "kind"}


def upstream_axes(test: UpstreamTest) -> dict:
    """A ``source: upstream`` cell's axes: its name, what it configures in the matrix's axes (defaults written
    out), and how it runs (runs, disabled, kind), for rules and known-failure conditions to name."""
    conf = configuration(test)
    return {
        "upstream": test.name,
        **normal(conf.axes),
        "config": conf.features.get("config", ""),
        "runs": len(test.runs),
        "disabled": test.disabled,
        "kind": test.kind,
    }


GENERATIONS = {"titan03": "0.3", "titan02": "0.2"}  # target -> the torchtitan generation whose suite it runs


def with_source(matrix):
    """A ``source: upstream`` matrix with its cells' tests: one value of its ``upstream`` axis per test the
    installed torchtitan defines (SourceUnavailable where that torchtitan, or its test files, is not here)."""
    if matrix.source != "upstream":
        return matrix
    gen = GENERATIONS[matrix.target]
    try:
        tests = {t.name: t for t in load(gen=gen)}
    except (LookupError, ImportError) as e:
        raise SourceUnavailable(f"{matrix.where('source')}: source upstream (torchtitan {gen}): {e}") from None
    return replace(matrix, upstream=tests, axes={"upstream": list(tests)})
