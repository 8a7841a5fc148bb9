"""What a cell runs: a target turns a cell's axes into one rank's program (argv + env).

A matrix file names its target. Built in:

* ``titan03`` — torchtitan 0.3.x ``graph_trainer`` through ``python -m torchtitan.train``;
* ``{command: [...], env: {...}}`` — any program, started once per rank, with placeholders
  ``{axis}``, ``{setting}``, ``{python}``, ``{nproc}``, ``{port}``, ``{dump_folder}``,
  ``{matrix_dir}``. The plugin's own tests use this with small fake targets.

Whatever differs between torchtitan generations lives in a target class and its matrix files.
"""

from __future__ import annotations

import os
import string
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from .matrix import Matrix, MatrixError

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SHIM_DIR = FIXTURES / "cpu_shim"


@dataclass
class RankCommand:
    """The program every rank runs; the launcher adds RANK, WORLD_SIZE, MASTER_PORT, ..."""

    argv: list
    env: dict = field(default_factory=dict)
    cwd: str | None = None
    preload: list = field(default_factory=list)  # modules a fork server imports once (beyond argv's)


def _check_values(matrix: Matrix, allowed: dict):
    for axis, values in matrix.axes.items():
        if axis not in allowed:
            raise MatrixError(f"{matrix.where('axes')}: target {matrix.target!r} has no axis {axis!r}; "
                              f"its axes: {', '.join(allowed)}")
        choices = allowed[axis]
        for v in values:
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1 if choices is int else v in choices
            if not ok:
                expected = "a positive integer" if choices is int else ", ".join(map(str, choices))
                raise MatrixError(f"{matrix.where('axes')}: axis {axis!r}: unknown value {v!r}; expected {expected}")


def _shim_env(device, generation):
    env = {"PYTHONPATH": os.pathsep.join([str(SHIM_DIR), str(FIXTURES)])}
    if device == "cpu":
        env.update(SIMPLEFSDP_CPU_SHIM=generation, OMP_NUM_THREADS="1")
    return env


class Titan03:
    """torchtitan 0.3.x, ``torchtitan.experiments.graph_trainer`` (SimpleFSDP inside)."""

    name = "titan03"
    version_prefix = "0.3."
    AXES = {
        "model": ("llama3", "deepseek_v3", "qwen3"),
        "dp_replicate": int, "dp_shard": int, "tp": int, "ep": int, "cp": int, "pp": int,
        "pp_schedule": ("none", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV", "GPipe",
                        "InterleavedZeroBubble", "LoopedBFS"),
        "compile": ("eager", "aot_fx_trace", "jit"),
        "backend": ("aot_eager", "inductor"),
        "memory_policy": ("none", "default", "full", "eager", "sac_and_offload"),
    }
    MODEL_KEYS = ("module", "config")  # required per model; optional: moe, eager_pp_config, cp_config
    MODEL_OPTIONAL = ("moe", "eager_pp_config", "cp_config")
    DEGREE_FLAGS = {
        "dp_replicate": "data_parallel_replicate_degree",
        "dp_shard": "data_parallel_shard_degree",
        "tp": "tensor_parallel_degree",
        "ep": "expert_parallel_degree",
        "cp": "context_parallel_degree",
        "pp": "pipeline_parallel_degree",
    }

    def __init__(self, matrix: Matrix, cache_dir: Path):
        self.matrix = matrix
        self.assets = Path(cache_dir) / "assets"
        self.dataset, self.tokenizer = str(self.assets / "c4_test"), str(self.assets / "tokenizer")

    def check(self):
        _check_values(self.matrix, self.AXES)
        for model, facts in self.matrix.models.items():
            unknown = set(facts or {}) - set(self.MODEL_KEYS) - set(self.MODEL_OPTIONAL)
            if unknown:
                raise MatrixError(f"{self.matrix.where('models')}: models.{model}: unknown keys {sorted(unknown)}; "
                                  f"allowed: {', '.join(self.MODEL_KEYS + self.MODEL_OPTIONAL)}")
        for model in self.matrix.axes.get("model", []):
            facts = self.matrix.models.get(model)
            missing = [k for k in self.MODEL_KEYS if not (facts or {}).get(k)]
            if missing:
                raise MatrixError(f"{self.matrix.where('models')}: models.{model} needs {', '.join(missing)} "
                                  f"(target {self.name})")

    def installed_version(self):
        try:
            return metadata.version("torchtitan")
        except metadata.PackageNotFoundError:
            return None

    def check_installed(self):
        """An error message when the system under test is missing or of another generation."""
        version = self.installed_version()
        if version is None:
            return "torchtitan is not installed: pip install torchtitan==0.3.0 (see README)"
        if not version.startswith(self.version_prefix):
            return (f"{self.matrix.path} targets torchtitan {self.version_prefix}x ({self.name}) "
                    f"but torchtitan {version} is installed")
        return None

    def prepare(self):
        """Generate the deterministic dataset and tokenizer once per cache folder."""
        sys.path.insert(0, str(FIXTURES))
        try:
            import assets  # fixtures/assets.py
        finally:
            sys.path.remove(str(FIXTURES))
        assets.ensure_assets(self.assets)

    def degree_args(self, axes):
        """The parallelism flags of a cell (their names are the same in 0.2 and 0.3)."""
        args = []
        for axis, flag in self.DEGREE_FLAGS.items():
            if axis in axes:
                args += [f"--parallelism.{flag}", str(axes[axis])]
        if axes.get("pp", 1) > 1:
            args += ["--parallelism.pipeline_parallel_schedule", axes["pp_schedule"]]
        return args

    def baseline_axes(self, axes):
        """A cell's numerics baseline: same model and data-parallel degree (so the same data
        shards), SimpleFSDP alone (every other degree 1), plus the matrix's baseline values."""
        base = {axis: (1 if axis in self.DEGREE_FLAGS else value) for axis, value in axes.items()}
        base["dp_shard"] = axes.get("dp_replicate", 1) * axes.get("dp_shard", 1)
        if "pp_schedule" in base:
            base["pp_schedule"] = "none"
        base.update(self.matrix.numerics.baseline)
        return base

    def seed_command(self, model, dump_folder: Path):
        """One rank that writes the seed checkpoint every cell of ``model`` starts from."""
        facts = self.matrix.models[model]
        return RankCommand([sys.executable, "-m", "torchtitan.train", "--module", facts["module"],
                            "--config", facts["config"], "--compile.mode", "None", "--training.disable_cuda_graphs",
                            "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
                            "--debug.seed", str(self.matrix.settings.get("seed", 42)), "--debug.deterministic",
                            "--parallelism.data_parallel_shard_degree", "1",
                            "--hf_assets_path", self.tokenizer, "--dataloader.dataset_path", self.dataset,
                            "--dump_folder", str(dump_folder)], _shim_env(self.matrix.device, self.name))

    def losses(self, dump_folder: Path):
        """Full-precision losses (TensorBoard) where the cell wrote them; else the log's."""
        from .numerics import tensorboard_losses

        return tensorboard_losses(dump_folder)

    def command(self, cell, dump_folder: Path, seed_folder: Path | None = None, **_):
        a, s = cell.axes, self.matrix.settings
        facts = self.matrix.models[a["model"]]
        compile_mode = a.get("compile", "aot_fx_trace")
        config = facts["config"]
        if a.get("pp", 1) > 1 and compile_mode != "aot_fx_trace" and facts.get("eager_pp_config"):
            config = facts["eager_pp_config"]  # GraphPP needs aot_fx_trace; otherwise the eager splitter
        elif a.get("cp", 1) > 1 and facts.get("cp_config"):
            config = facts["cp_config"]
        args = ["--module", facts["module"], "--config", config, *self.degree_args(a)]
        if compile_mode == "eager":
            args += ["--compile.mode", "None"]
        else:
            args += ["--compile.mode", compile_mode,
                     "--compile.backend", a.get("backend", s.get("compile_backend", "aot_eager"))]
            if a.get("memory_policy", "none") != "none":
                args += ["--compile.memory_policy", a["memory_policy"]]
        if self.matrix.device == "cpu" or a.get("pp", 1) > 1 or a.get("ep", 1) > 1:
            args += ["--training.disable_cuda_graphs"]
        local_batch = s.get("local_batch_size", 2)
        if self.matrix.numerics:  # comparable runs: one global batch, one seed checkpoint
            gbs = self.matrix.numerics.global_batch_size
            dp = a.get("dp_replicate", 1) * a.get("dp_shard", 1)
            local_batch = max(1, gbs // dp)
            args += ["--training.global_batch_size", str(gbs), "--metrics.enable_tensorboard"]
            if seed_folder is not None:
                args += ["--checkpoint.enable", "--checkpoint.initial_load_path",
                         str(seed_folder / "checkpoint" / "step-0"), "--checkpoint.load_only"]
        args += [
            "--training.steps", str(s.get("steps", 3)),
            "--training.seq_len", str(s.get("seq_len", 256)),
            "--training.local_batch_size", str(local_batch),
            "--debug.seed", str(s.get("seed", 42)), "--debug.deterministic",
            "--metrics.log_freq", "1", "--metrics.disable_color_printing",
            "--hf_assets_path", self.tokenizer, "--dataloader.dataset_path", self.dataset,
            "--dump_folder", str(dump_folder),
        ]
        args += [str(x) for x in s.get("extra_args", [])]
        env = _shim_env(self.matrix.device, self.name)
        if self.matrix.tier == "trace":  # one process, a fake process group of the cell's world size
            args += ["--comm.mode", "fake_backend"]
            env["NGPU"] = str(cell.world)
        if compile_mode != "eager":  # structured compile trace, rendered by tlparse for failing cells
            env["TORCH_TRACE"] = str(Path(dump_folder).parent / "torch_trace")
        module = facts["module"]
        preload = [f"torchtitan.experiments.{module}.config_registry" if module.startswith("graph_trainer.")
                   else module]
        return RankCommand([sys.executable, "-m", "torchtitan.train", *args], env, preload=preload)


class Titan02(Titan03):
    """torchtitan 0.2.x, ``torchtitan.experiments.simple_fsdp`` (the seed era of autumn 2025).

    TOML job config (ours: fixtures/titan02_debugmodel.toml), ``--model.name simple_fsdp.<model>``,
    ``--compile.enable``, ``--activation_checkpoint.mode``, a separate expert-TP degree."""

    name = "titan02"
    version_prefix = "0.2."
    AXES = {
        "model": ("llama3", "deepseek_v3"),
        "dp_replicate": int, "dp_shard": int, "tp": int, "ep": int, "etp": int, "cp": int, "pp": int,
        "pp_schedule": ("none", "1F1B", "Interleaved1F1B", "GPipe", "ZBVZeroBubble"),
        "compile": ("eager", "compiled"),
        "backend": ("aot_eager", "inductor"),
        "ac": ("none", "selective", "full"),
    }
    MODEL_KEYS = ("name", "flavor")
    MODEL_OPTIONAL = ("moe",)
    DEGREE_FLAGS = {**Titan03.DEGREE_FLAGS, "etp": "expert_tensor_parallel_degree"}
    JOB_TOML = FIXTURES / "titan02_debugmodel.toml"

    seed_command = None  # numerics are not wired for 0.2: its matrix files have no `numerics`

    def command(self, cell, dump_folder: Path, **_):
        a, s = cell.axes, self.matrix.settings
        facts = self.matrix.models[a["model"]]
        args = ["--job.config_file", str(self.JOB_TOML), "--model.name", facts["name"],
                "--model.flavor", facts["flavor"], *self.degree_args(a)]
        if a.get("compile", "eager") == "compiled":
            args += ["--compile.enable", "--compile.backend", a.get("backend", s.get("compile_backend", "aot_eager"))]
        args += ["--activation_checkpoint.mode", a.get("ac", "none")]
        args += [
            "--training.steps", str(s.get("steps", 3)),
            "--training.seq_len", str(s.get("seq_len", 256)),
            "--training.local_batch_size", str(s.get("local_batch_size", 2)),
            "--training.seed", str(s.get("seed", 42)), "--training.deterministic",
            "--metrics.log_freq", "1", "--metrics.disable_color_printing",
            "--model.hf_assets_path", self.tokenizer, "--training.dataset_path", self.dataset,
            "--job.dump_folder", str(dump_folder),
        ]
        args += [str(x) for x in s.get("extra_args", [])]
        env = _shim_env(self.matrix.device, self.name)
        if a.get("compile") == "compiled":
            env["TORCH_TRACE"] = str(Path(dump_folder).parent / "torch_trace")
        return RankCommand([sys.executable, "-m", "torchtitan.train", *args], env,
                           preload=[f"torchtitan.experiments.{facts['name']}"])


class CommandTarget:
    """Any program, started once per rank: ``target: {command: [argv...], env: {...}}``."""

    name = "command"

    def __init__(self, matrix: Matrix, cache_dir=None):
        self.matrix = matrix
        spec = matrix.target
        self.argv = spec.get("command")
        self.env = spec.get("env") or {}
        where = matrix.where("target")
        if not isinstance(self.argv, list) or not self.argv:
            raise MatrixError(f"{where}: target.command must be a non-empty list of arguments")
        unknown = set(spec) - {"command", "env"}
        if unknown:
            raise MatrixError(f"{where}: unknown target keys {sorted(unknown)}; allowed: command, env")
        known = set(matrix.axes) | set(matrix.settings) | {"python", "nproc", "port", "dump_folder", "matrix_dir"}
        for part in [*self.argv, *self.env.values()]:
            for _, name, _, _ in string.Formatter().parse(str(part)):
                if name and name not in known:
                    raise MatrixError(f"{where}: target.command uses unknown placeholder {{{name}}}; "
                                      f"known: {', '.join(sorted(known))}")

    def check(self):
        pass

    def check_installed(self):
        return None

    def prepare(self):
        pass

    def baseline_axes(self, axes):
        return {**axes, **self.matrix.numerics.baseline}

    seed_command = None  # fake targets need no seed checkpoint

    def losses(self, dump_folder):
        return {}

    def command(self, cell, dump_folder: Path, nproc: int, port: int, **_):
        values = {**self.matrix.settings, **cell.axes, "python": sys.executable, "nproc": nproc,
                  "port": port, "dump_folder": dump_folder, "matrix_dir": self.matrix.path.parent.resolve()}
        argv = [str(p).format(**values) for p in self.argv]
        env = {k: str(v).format(**values) for k, v in self.env.items()}
        return RankCommand(argv, env, cwd=str(self.matrix.path.parent.resolve()))


TARGETS = {Titan03.name: Titan03, Titan02.name: Titan02}


def make_target(matrix: Matrix, cache_dir: Path):
    """The matrix's target; ``cache_dir`` holds what it generates once (dataset, tokenizer)."""
    spec = matrix.target
    if isinstance(spec, dict):
        return CommandTarget(matrix)
    if spec not in TARGETS:
        raise MatrixError(f"{matrix.where('target')}: unknown target {spec!r}; built in: "
                          f"{', '.join(TARGETS)}, or {{command: [...]}}")
    target = TARGETS[spec](matrix, cache_dir)
    target.check()
    return target
