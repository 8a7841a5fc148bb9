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

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .evidence import Expect, check, inductor_codegen
from .matrix import Matrix, MatrixError
from .mutants import TITAN03 as TITAN03_MUTANTS
from .upstream import options, tokens
from .mutants import Mutant
from .titan_options import Flag, OptionError, read_options, unchecked

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
    virtual_local_rank: bool = False  # torchrun --virtual-local-rank: every worker LOCAL_RANK 0, its own GPU only
    unforkable: str | None = None  # why the fork launcher must not fork it (it runs under local instead)


FILE_DEFINED = object()  # an axis whose values the matrix file defines (`features`; `source: upstream`'s tests)


def merged(flags):
    """One flag per option: a later flag (a feature's, a later run's) replaces an earlier one of the same name
    where the earlier stood."""
    last = {f.name: f for f in flags}
    seen, out = set(), []
    for f in flags:
        if f.name not in seen:
            seen.add(f.name)
            out.append(last[f.name])
    return out


def _check_values(matrix: Matrix, allowed: dict):
    for axis, values in matrix.axes.items():
        if axis not in allowed:
            raise MatrixError(f"{matrix.where('axes')}: target {matrix.target!r} has no axis {axis!r}; "
                              f"its axes: {', '.join(allowed)}")
        choices = allowed[axis]
        if choices is FILE_DEFINED:
            continue  # matrix.load_matrix made or checked them
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


def _installed(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _unsupported(package, supported, target):
    """An error line when ``package`` is missing or outside the range ``target`` supports; else None."""
    version = _installed(package)
    if version is None:
        return f"{package} is not installed; target {target} supports {package} {supported} (see README)"
    try:
        ok = SpecifierSet(supported, prereleases=True).contains(Version(version))
    except InvalidVersion:
        ok = False
    if not ok:
        return (f"target {target} supports {package} {supported}, but {package} {version} is installed "
                f"(torch {_installed('torch')}, torchtitan {_installed('torchtitan')}); see README, "
                f"'Two commands for a fresh machine'")
    return None


class TorchtitanTarget:
    """What both torchtitan generations share: versions, assets, degree flags, spelling by the installed config."""

    name = ""
    SUPPORTS: dict = {}  # package -> version range this target runs against
    AXES: dict = {}
    MODEL_KEYS: tuple = ()
    MODEL_OPTIONAL: tuple = ()
    DEGREE_FLAGS: dict = {}
    WRITTEN_AS = ""  # the torchtitan release whose option names the target writes
    MUTANTS: tuple = ()  # mutants.Mutant: the bugs its start-up shim can re-inject (--simplefsdp-mutants)

    def __init__(self, matrix: Matrix, cache_dir: Path):
        self.matrix = matrix
        self.cache_dir = Path(cache_dir)
        self.assets = self.cache_dir / "assets"
        self.dataset, self.tokenizer = str(self.assets / "c4_test"), str(self.assets / "tokenizer")
        self.options = {}  # job config -> Options of the installed torchtitan (see bind)

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

    def check_installed(self):
        """An error line when torchtitan or torch is missing or outside the supported range."""
        return next((p for p in (_unsupported(pkg, spec, self.name) for pkg, spec in self.SUPPORTS.items()) if p),
                    None)

    def prepare(self):
        """Generate the deterministic dataset and tokenizer once per cache folder."""
        sys.path.insert(0, str(FIXTURES))
        try:
            import assets  # fixtures/assets.py
        finally:
            sys.path.remove(str(FIXTURES))
        assets.ensure_assets(self.assets)

    def job_configs(self, cells):
        """The job configs (keys of ``options``) the cells start from."""
        return {self.job_config(c.axes) for c in cells}

    def bind(self, cells):
        """Read the installed torchtitan's options for every job config the cells use, and spell every
        cell's flags once, so a value it cannot express fails here, naming the axis and the option."""
        version = _installed("torchtitan")
        env = _shim_env(self.matrix.device, self.name)
        for key in sorted(self.job_configs(cells), key=str):
            module, config = key
            label = f"{module}.{config}" if module else "JobConfig"
            self.options[key] = read_options(module, config, env, f"torchtitan {version} ({label})")
        for cell in cells:
            try:
                self.spell(cell.axes, self.flags(cell, Path("dump"), Path("seed")))
            except OptionError as e:
                raise MatrixError(f"{cell.where}: cell {cell.id}: {e.flag.source}: {e}") from None

    def spell(self, axes, flags):
        options = self.options.get(self.job_config(axes))
        return options.spell(flags) if options else unchecked(flags)

    @property
    def spelling(self):
        """How flags are spelled: read from the installed torchtitan, or as the target writes them."""
        if self.options:
            return next(iter(self.options.values())).origin.split(" (")[0]
        return f"torchtitan {self.WRITTEN_AS} option names, unchecked (this target's torchtitan is not installed)"

    def degree_flags(self, axes):
        flags = [Flag(f"parallelism.{flag}", axes[axis], f"axis {axis}={axes[axis]}")
                 for axis, flag in self.DEGREE_FLAGS.items() if axis in axes]
        if axes.get("pp", 1) > 1:
            flags.append(Flag("parallelism.pipeline_parallel_schedule", axes["pp_schedule"],
                              f"axis pp_schedule={axes['pp_schedule']}"))
        return flags

    def runs(self, cell) -> int:
        """How many trainings the cell is: 1, or more for a feature with `then` runs (save, then resume) and
        for an upstream test with several runs."""
        test = self.upstream_test(cell.axes)
        if test:
            return len(test.runs)
        return 1 + len(self.matrix.feature_runs.get(cell.axes.get("feature", "none"), []))

    STEPS = ()  # the steps a feature can run before its cell (`features.<name>.before`)

    def before_steps(self, cell) -> list:
        """The steps the cell's feature runs first, in order (each one process; see ``step_command``); an upstream
        precompile test's cell runs its precompile step."""
        test = self.upstream_test(cell.axes)
        if test:
            return ["precompile"] if test.kind == "precompile" and "precompile" in self.STEPS else []
        return list(self.matrix.feature_before.get(cell.axes.get("feature", "none"), []))

    def check_steps(self):
        for name, steps in self.matrix.feature_before.items():
            unknown = [s for s in steps if s not in self.STEPS]
            if unknown:
                raise MatrixError(f"{self.matrix.where('features')}: features.{name}.before: target {self.name} has "
                                  f"no step {', '.join(unknown)} (its steps: {', '.join(self.STEPS) or 'none'})")

    def upstream_test(self, axes):
        """The upstream test a cell of a ``source: upstream`` matrix runs, else None."""
        return self.matrix.upstream.get(axes.get("upstream")) if self.matrix.upstream else None

    def feature_options(self, axes, run=0):
        """The options the cell's `feature` (matrix key `features`) sets in its run ``run`` (0: the first),
        as written there; a later run's override the first's."""
        name = axes.get("feature", "none")
        words = [*self.matrix.features.get(name, []), *(self.matrix.feature_runs[name][run - 1] if run else [])]
        return options(tokens(words))

    def feature_flags(self, axes, run=0):
        name = axes.get("feature", "none")
        return [Flag(key, value, f"feature {name}" + (f" run {run + 1}" if run else ""))
                for key, value in self.feature_options(axes, run).items()
                if key != "config"]  # (the config is the job config the command starts from: job_config)

    LOADED = "Finished loading the checkpoint"  # what torchtitan 0.2 and 0.3 log once a checkpoint is in

    def loaded_checkpoint(self, log_text: str) -> bool:
        return self.LOADED in log_text

    def evidence_plan(self, cell):
        """What the run must show for the cell's label: [evidence.Expect] (none for this target)."""
        return []

    def evidence(self, cell, log_dir: Path):
        """What the run left behind that shows the cell's label took effect (see ``evidence``)."""
        return check(self.evidence_plan(cell), log_dir)

    def losses(self, dump_folder: Path):
        return {}


class Titan03(TorchtitanTarget):
    """torchtitan 0.3.x, ``torchtitan.experiments.graph_trainer`` (SimpleFSDP inside).

    Flags are written under their torchtitan 0.3.0 names and spelled by the installed torchtitan's
    own job config (``titan_options``), so a torchtitan checkout with renamed options runs unchanged.
    The ``backend`` axis says what compiles the whole graph: ``aot_eager`` (nothing: on aot_fx_trace,
    torchtitan's ``regional`` inductor compiles only tagged regions such as FlexAttention) or
    ``inductor`` (aot_fx_trace: ``--compile.inductor_compilation full``; jit: ``--compile.backend``).
    """

    name = "titan03"
    WRITTEN_AS = "0.3.0"
    MUTANTS = TITAN03_MUTANTS
    # the torch torchtitan 0.3.0 was released against (2.14) and what its development line moves to
    SUPPORTS = {"torchtitan": ">=0.3.0,<0.5", "torch": ">=2.14,<2.16"}
    AXES = {
        "model": ("llama3", "deepseek_v3", "qwen3", "muse_glimmer"),
        "dp_replicate": int, "dp_shard": int, "tp": int, "ep": int, "cp": int, "pp": int,
        "pp_schedule": ("none", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV", "GPipe",
                        "InterleavedZeroBubble", "LoopedBFS"),
        "compile": ("eager", "aot_fx_trace", "jit"),
        "backend": ("aot_eager", "inductor"),
        "memory_policy": ("none", "default", "full", "eager", "sac_and_offload"),
        # fsdp2: torchtitan's core Trainer (FSDP2, eager) on the model's fsdp2_config, the reference that
        # upstream's graph_trainer/tests/test_numerics.py holds SimpleFSDP to
        "trainer": ("simplefsdp", "fsdp2"),
        "feature": FILE_DEFINED,  # names of the matrix's `features`: flags upstream tests set beyond the axes
        "upstream": FILE_DEFINED,  # source: upstream: the name of the upstream test a cell runs
    }
    MODEL_KEYS = ("module", "config")  # required per model; optional: moe, eager_pp_config, cp_config, fsdp2_config
    MODEL_OPTIONAL = ("moe", "eager_pp_config", "cp_config", "fsdp2_config")
    TRAINER_CLASS = {"simplefsdp": "GraphTrainer", "fsdp2": "Trainer"}
    DEGREE_FLAGS = {
        "dp_replicate": "data_parallel_replicate_degree",
        "dp_shard": "data_parallel_shard_degree",
        "tp": "tensor_parallel_degree",
        "ep": "expert_parallel_degree",
        "cp": "context_parallel_degree",
        "pp": "pipeline_parallel_degree",
    }

    # --- flags ----------------------------------------------------------------------------

    def job_config(self, axes):
        """(module, config) the trainer starts from for a cell (or for a model's seed: axes {model})."""
        test = self.upstream_test(axes)
        if test:  # upstream's own module and config; on the trace tier the CPU twin of a debug config
            o = options(test.flags)
            facts = self.matrix.models.get(axes["model"], {})
            if self.matrix.tier == "trace" and not axes.get("config") and facts.get("config"):
                return facts["module"], facts["config"]
            return str(o.get("module")), str(o.get("config"))
        facts = self.matrix.models[axes["model"]]
        config = facts["config"]
        named = self.feature_options(axes).get("config")
        if named:  # a feature that runs another config of the model (upstream's HybridEP, MinimalAsyncEP, 8B, ...)
            return facts["module"], named
        if axes.get("trainer") == "fsdp2":
            if not facts.get("fsdp2_config"):
                raise MatrixError(f"{self.matrix.where('models')}: model {axes['model']!r} has no fsdp2_config, "
                                  f"which trainer=fsdp2 cells run")
            return facts["module"], facts["fsdp2_config"]
        if axes.get("pp", 1) > 1 and axes.get("compile", "aot_fx_trace") != "aot_fx_trace" and facts.get("eager_pp_config"):
            config = facts["eager_pp_config"]  # GraphPP needs aot_fx_trace; otherwise the eager splitter
        elif axes.get("cp", 1) > 1 and facts.get("cp_config"):
            config = facts["cp_config"]
        return facts["module"], config

    def job_configs(self, cells):
        configs = super().job_configs(cells)
        if self.matrix.numerics:  # the seed checkpoints start from the model's own config
            configs |= {self.job_config({"model": m}) for m in {c.axes["model"] for c in cells}}
        return configs

    def compile_flags(self, axes):
        mode = axes.get("compile", "aot_fx_trace")
        if axes.get("trainer") == "fsdp2":  # the core Trainer's config has no compile.mode: eager by default
            return []
        if mode == "eager":
            return [Flag("compile.mode", "None", "axis compile=eager")]
        backend = axes.get("backend", self.matrix.settings.get("compile_backend", "aot_eager"))
        source = f"axis backend={backend}" if "backend" in axes else f"setting compile_backend={backend}"
        flags = [Flag("compile.mode", mode, f"axis compile={mode}")]
        if mode == "jit":
            flags.append(Flag("compile.backend", backend, source))
        else:  # aot_fx_trace reads no backend: inductor is the compilation strategy of the traced graph
            flags.append(Flag("compile.inductor_compilation", "full" if backend == "inductor" else "regional", source))
        if axes.get("memory_policy", "none") != "none":
            flags.append(Flag("compile.memory_policy", axes["memory_policy"], f"axis memory_policy={axes['memory_policy']}"))
        return flags

    def run_flags(self, steps, local_batch):
        """Our run settings and where the assets are (steps and batch given: upstream runs and numerics set them)."""
        s = self.matrix.settings
        return [
            Flag("training.steps", steps, "setting steps"),
            Flag("training.seq_len", s.get("seq_len", 256), "setting seq_len"),
            Flag("training.local_batch_size", local_batch, "setting local_batch_size"),
            Flag("debug.seed", s.get("seed", 42), "setting seed"), Flag("debug.deterministic", True, "target"),
            Flag("metrics.log_freq", 1, "target"), Flag("metrics.disable_color_printing", True, "target"),
            Flag("hf_assets_path", self.tokenizer, "target"), Flag("dataloader.dataset_path", self.dataset, "target"),
        ]

    # what an upstream test's flags may not change here: where the assets and dump are, the CPU-sized shapes
    OURS = {"module", "config", "hf_assets_path", "dataloader.dataset_path", "dump_folder",
            "training.local_batch_size", "training.seq_len", "metrics.log_freq"}

    def upstream_flags(self, cell, dump_folder: Path, run=0):
        """An upstream test's run: our run settings, then upstream's flags of that run on top (its later runs'
        training.steps, degrees and checkpoint options included)."""
        test, s = self.upstream_test(cell.axes), self.matrix.settings
        flags = self.run_flags(s.get("steps", 3), s.get("local_batch_size", 2))
        flags.append(Flag("dump_folder", dump_folder, "target"))
        if self.matrix.device == "cpu":
            flags.append(Flag("training.disable_cuda_graphs", True, "target"))
        if self.matrix.tier == "trace":
            flags.append(Flag("comm.mode", "fake_backend", "tier trace"))
        flags += [Flag(key, value, f"upstream {test.name} run {run + 1}") for key, value in options(test.runs[run]).items()
                  if key not in self.OURS]
        return merged(flags + self.artifact_flags(cell, dump_folder))

    def artifact_flags(self, cell, dump_folder: Path):
        """Where the precompile step writes its artifact and the cell's ranks load it: the cell's own folder
        (upstream's tests name a temporary folder)."""
        if "precompile" not in self.before_steps(cell):
            return []
        return [Flag("compile.precompile_artifact_dir", Path(dump_folder).parent / "precompile_artifact",
                     "step precompile")]

    def flags(self, cell, dump_folder: Path, seed_folder: Path | None = None, run=0):
        a, s = cell.axes, self.matrix.settings
        if self.upstream_test(a):
            return self.upstream_flags(cell, dump_folder, run)
        flags = [*self.degree_flags(a), *self.compile_flags(a)]
        if self.matrix.device == "cpu" or a.get("pp", 1) > 1 or a.get("ep", 1) > 1:
            flags.append(Flag("training.disable_cuda_graphs", True, "target"))
        local_batch = s.get("local_batch_size", 2)
        if self.matrix.numerics:  # comparable runs: one global batch, one seed checkpoint
            gbs = self.matrix.numerics.global_batch_size
            local_batch = max(1, gbs // (a.get("dp_replicate", 1) * a.get("dp_shard", 1)))
            flags += [Flag("training.global_batch_size", gbs, "numerics.global_batch_size"),
                      Flag("metrics.enable_tensorboard", True, "numerics")]
            if seed_folder is not None and self.runs(cell) == 1:  # (a resumed cell loads its own checkpoint)
                flags += [Flag("checkpoint.enable", True, "numerics"),
                          Flag("checkpoint.initial_load_path", seed_folder / "checkpoint" / "step-0", "numerics"),
                          Flag("checkpoint.load_only", True, "numerics")]
        flags += self.run_flags(s.get("steps", 3), local_batch)
        flags.append(Flag("dump_folder", dump_folder, "target"))
        if self.matrix.tier == "trace":  # one process, a fake process group of the cell's world size
            flags.append(Flag("comm.mode", "fake_backend", "tier trace"))
        flags += self.artifact_flags(cell, dump_folder)
        return merged(flags + self.feature_flags(a, run))  # last: a feature (and its later runs) has the last word

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
        module, config = self.job_config({"model": model})
        flags = [Flag("compile.mode", "None", "target"), Flag("training.disable_cuda_graphs", True, "target"),
                 Flag("checkpoint.enable", True, "target"), Flag("checkpoint.create_seed_checkpoint", True, "target"),
                 Flag("debug.seed", self.matrix.settings.get("seed", 42), "setting seed"),
                 Flag("debug.deterministic", True, "target"),
                 Flag("parallelism.data_parallel_shard_degree", 1, "target"),
                 Flag("hf_assets_path", self.tokenizer, "target"), Flag("dataloader.dataset_path", self.dataset, "target"),
                 Flag("dump_folder", dump_folder, "target")]
        argv = ["--module", module, "--config", config, *self.spell({"model": model}, flags)]
        return RankCommand([sys.executable, "-m", "torchtitan.train", *argv], _shim_env(self.matrix.device, self.name))

    def losses(self, dump_folder: Path):
        """Full-precision losses (TensorBoard) where the cell wrote them; else the log's."""
        from .numerics import tensorboard_losses

        return tensorboard_losses(dump_folder)

    MESH_AXES = ("dp_replicate", "cp", "tp", "pp", "ep")  # built as 1-D meshes of these names when > 1

    def evidence_plan(self, cell):
        """From the shim's probe (the job config torchtitan parsed, the ParallelDims and meshes it built):
        every degree as asked, a mesh axis of that size for each parallelism, the compile mode, memory
        policy, inductor strategy or backend, and the PP schedule."""
        a, plan = cell.axes, []
        for axis in self.DEGREE_FLAGS:
            if axis in a:
                plan.append(Expect(f"{axis}={a[axis]}", f"degrees.{axis}", str(a[axis])))
                if axis in self.MESH_AXES:
                    plan.append(Expect(f"{axis}={a[axis]}", f"mesh.{axis}", str(a[axis]), default="1"))
        mode = a.get("compile", "aot_fx_trace")
        plan.append(Expect(f"compile={mode}", "config.compile.mode", "None" if mode == "eager" else mode))
        trainer = a.get("trainer", "simplefsdp")
        plan.append(Expect(f"trainer={trainer}", "config.trainer", self.TRAINER_CLASS[trainer]))
        if mode == "aot_fx_trace":  # configured is not done: the step ran a traced forward+backward graph
            plan.append(Expect(f"compile={mode}", "graph.traced", "yes", default="no"))
        for flag in self.compile_flags(a)[1:]:  # inductor strategy or backend, memory policy
            plan.append(Expect(flag.source.removeprefix("axis ").removeprefix("setting "), f"config.{flag.name}",
                               str(flag.value)))
        if a.get("pp", 1) > 1:
            plan.append(Expect(f"pp_schedule={a['pp_schedule']}", "config.parallelism.pipeline_parallel_schedule",
                               a["pp_schedule"]))
        return plan

    def evidence(self, cell, log_dir: Path):
        """The probe's evidence and, for an inductor cell, inductor's output code in the compile trace."""
        found = super().evidence(cell, log_dir)
        a = cell.axes
        if a.get("backend") == "inductor" and a.get("compile", "aot_fx_trace") != "eager" and self.matrix.tier == "real":
            found.append(inductor_codegen(Path(log_dir) / "torch_trace"))
        return found

    def command(self, cell, dump_folder: Path, seed_folder: Path | None = None, run=0, **_):
        module, config = self.job_config(cell.axes)
        flags = self.flags(cell, dump_folder, seed_folder, run)
        args = ["--module", module, "--config", config, *self.spell(cell.axes, flags)]
        args += [str(x) for x in self.matrix.settings.get("extra_args", [])]
        env = _shim_env(self.matrix.device, self.name)
        env["SIMPLEFSDP_PROBE"] = "titan03"  # the shim records what torchtitan really used (evidence_plan)
        if self.matrix.numerics and self.matrix.tier == "real":  # per-parameter norms for numerics.compare_params
            env["SIMPLEFSDP_GRAD_PROBE"] = "1"
        if self.matrix.tier == "trace":
            env["NGPU"] = str(cell.world)
        if cell.axes.get("compile", "aot_fx_trace") != "eager":  # structured compile trace: tlparse, evidence
            env["TORCH_TRACE"] = str(Path(dump_folder).parent / "torch_trace")
        preload = [f"torchtitan.experiments.{module}.config_registry" if module.startswith("graph_trainer.")
                   else module]
        # a precompiled artifact is rank-agnostic: every rank loads it as local rank 0 of its own GPU (upstream's
        # run_train_precompile.sh passes torchrun --virtual-local-rank)
        return RankCommand([sys.executable, "-m", "torchtitan.train", *args], env, preload=preload,
                           virtual_local_rank="precompile" in self.before_steps(cell))

    STEPS = ("precompile",)

    def step_command(self, cell, step, dump_folder: Path, seed_folder: Path | None = None):
        """``precompile``: graph_trainer's precompile_main, one process over a fake process group of the cell's
        world, writes the compiled artifact the cell's training then loads (upstream's run_precompile_tests.py,
        step 1). Same flags as the training; upstream's tool builds on cuda:0, so this runs on a GPU only."""
        train = self.command(cell, dump_folder, seed_folder)
        return RankCommand([sys.executable, "-m", "torchtitan.experiments.graph_trainer.precompile_main",
                            *train.argv[3:]], dict(train.env), preload=train.preload)


class Titan02(TorchtitanTarget):
    """torchtitan 0.2.x, ``torchtitan.experiments.simple_fsdp`` (the seed era of autumn 2025).

    TOML job config (ours: fixtures/titan02_debugmodel.toml), ``--model.name simple_fsdp.<model>``,
    ``--compile.enable``, ``--activation_checkpoint.mode``, a separate expert-TP degree; flags are
    checked against the installed ``JobConfig``. Numerics are not wired for 0.2 (no seed checkpoint)."""

    name = "titan02"
    WRITTEN_AS = "0.2.0"
    # torchtitan 0.2.0 (2025-10-18) was tested on the torch nightly of its day, which 2.9.x predates (its
    # code needs dynamo's DeviceMesh.mesh_dim_names, pytorch PR 164200): 2.10 is the nearest release
    SUPPORTS = {"torchtitan": ">=0.2.0,<0.3", "torch": ">=2.10,<2.11"}
    AXES = {
        "model": ("llama3", "deepseek_v3"),
        "dp_replicate": int, "dp_shard": int, "tp": int, "ep": int, "etp": int, "cp": int, "pp": int,
        "pp_schedule": ("none", "1F1B", "Interleaved1F1B", "GPipe", "ZBVZeroBubble"),
        "compile": ("eager", "compiled"),
        "backend": ("aot_eager", "inductor"),
        "ac": ("none", "selective", "op", "full"),  # op: selective AC per op (--activation_checkpoint.selective_ac_option op)
        "feature": FILE_DEFINED,
        "upstream": FILE_DEFINED,
    }
    MODEL_KEYS = ("name", "flavor")
    MODEL_OPTIONAL = ("moe",)
    DEGREE_FLAGS = {**Titan03.DEGREE_FLAGS, "etp": "expert_tensor_parallel_degree"}
    JOB_TOML = FIXTURES / "titan02_debugmodel.toml"

    def seed_command(self, model, dump_folder: Path):
        return None  # numerics are not wired for 0.2: its matrix files have no `numerics`

    CUSTOM_CONFIG = "torchtitan.experiments.simple_fsdp.job_config"  # what every upstream simple_fsdp test passes

    def job_config(self, axes):
        return None, self.CUSTOM_CONFIG  # one JobConfig for every cell, with simple_fsdp's options merged in

    OURS = {"job.config_file", "model.hf_assets_path", "training.dataset_path", "job.dump_folder",
            "training.local_batch_size", "training.seq_len", "metrics.log_freq"}

    def flags(self, cell, dump_folder: Path, seed_folder=None, run=0):
        a, s = cell.axes, self.matrix.settings
        test = self.upstream_test(a)
        custom = Flag("job.custom_config_module", self.CUSTOM_CONFIG, "target")
        ours = [*self.run_flags(s.get("steps", 3), s.get("local_batch_size", 2)),
                Flag("job.dump_folder", dump_folder, "target")]
        if test:  # our job config and run settings, upstream's flags of that run on top
            flags = [Flag("job.config_file", self.JOB_TOML, "target"), custom, *ours]
            return merged(flags + [Flag(k, v, f"upstream {test.name} run {run + 1}")
                                   for k, v in options(test.runs[run]).items() if k not in self.OURS])
        facts = self.matrix.models[a["model"]]
        flags = [Flag("job.config_file", self.JOB_TOML, "target"), custom,
                 Flag("model.name", facts["name"], f"model {a['model']}"),
                 Flag("model.flavor", facts["flavor"], f"model {a['model']}"), *self.degree_flags(a)]
        if a.get("compile", "eager") == "compiled":
            backend = a.get("backend", s.get("compile_backend", "aot_eager"))
            flags += [Flag("compile.enable", True, "axis compile=compiled"), Flag("compile.backend", backend, f"backend {backend}")]
        ac = a.get("ac", "none")
        flags.append(Flag("activation_checkpoint.mode", "selective" if ac == "op" else ac, f"axis ac={ac}"))
        if ac == "op":
            flags.append(Flag("activation_checkpoint.selective_ac_option", "op", "axis ac=op"))
        return merged(flags + ours + self.feature_flags(a, run))

    def run_flags(self, steps, local_batch):
        """Titan03.run_flags in 0.2's spelling (its seed and assets options sit in other sections)."""
        s = self.matrix.settings
        return [
            Flag("training.steps", steps, "setting steps"),
            Flag("training.seq_len", s.get("seq_len", 256), "setting seq_len"),
            Flag("training.local_batch_size", local_batch, "setting local_batch_size"),
            Flag("training.seed", s.get("seed", 42), "setting seed"), Flag("training.deterministic", True, "target"),
            Flag("metrics.log_freq", 1, "target"), Flag("metrics.disable_color_printing", True, "target"),
            Flag("model.hf_assets_path", self.tokenizer, "target"), Flag("training.dataset_path", self.dataset, "target"),
        ]

    def command(self, cell, dump_folder: Path, run=0, **_):
        args = [*self.spell(cell.axes, self.flags(cell, dump_folder, run=run)),
                *map(str, self.matrix.settings.get("extra_args", []))]
        env = _shim_env(self.matrix.device, self.name)
        if cell.axes.get("compile") == "compiled":
            env["TORCH_TRACE"] = str(Path(dump_folder).parent / "torch_trace")
        test = self.upstream_test(cell.axes)
        name = options(test.flags).get("model.name") if test else self.matrix.models[cell.axes["model"]]["name"]
        return RankCommand([sys.executable, "-m", "torchtitan.train", *args], env,
                           preload=[f"torchtitan.experiments.{name}"], unforkable=self.UNFORKABLE)

    # the fork server imports the config manager once; 0.2 binds its arguments then (0.3 reads them per call)
    UNFORKABLE = "torchtitan 0.2's ConfigManager.parse_args binds sys.argv[1:] when it is imported"


class CommandTarget:
    """Any program, started once per rank: ``target: {command: [argv...], env: {...}}``."""

    name = "command"

    def __init__(self, matrix: Matrix, cache_dir=None):
        self.matrix = matrix
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
            raise MatrixError(f"{where}: unknown target keys {sorted(unknown)}; allowed: command, env, evidence, "
                              f"mutants, steps")
        if not isinstance(self.steps, dict) or not all(isinstance(v, list) and v for v in self.steps.values()):
            raise MatrixError(f"{where}: target.steps must map step names to non-empty argument lists")
        if not isinstance(self.expects, dict) or any(a not in matrix.axes for a in self.expects) or any(
                "." not in str(k) for k in self.expects.values()):
            raise MatrixError(f"{where}: target.evidence must map axes ({', '.join(matrix.axes)}) to probe keys "
                              f"'<section>.<name>', got {self.expects!r}")
        known = set(matrix.axes) | set(matrix.settings) | {"python", "nproc", "port", "dump_folder", "matrix_dir"}
        for part in [*self.argv, *self.env.values(), *(p for argv in self.steps.values() for p in argv)]:
            for _, name, _, _ in string.Formatter().parse(str(part)):
                if name and name not in known:
                    raise MatrixError(f"{where}: target.command uses unknown placeholder {{{name}}}; "
                                      f"known: {', '.join(sorted(known))}")

    spelling = "as written in the matrix file"

    def check(self):
        pass

    def check_installed(self):
        return None

    def bind(self, cells):
        pass

    def evidence_plan(self, cell):
        return [Expect(f"{axis}={cell.axes[axis]}", str(key), str(cell.axes[axis])) for axis, key in self.expects.items()]

    def evidence(self, cell, log_dir):
        return check(self.evidence_plan(cell), log_dir)

    def prepare(self):
        pass

    def baseline_axes(self, axes):
        return {**axes, **self.matrix.numerics.baseline}

    def seed_command(self, model, dump_folder):
        return None  # fake targets need no seed checkpoint

    def losses(self, dump_folder):
        return {}

    # later runs of a feature work as for torchtitan's targets; the program says it loaded its checkpoint as
    # torchtitan does ("Finished loading the checkpoint")
    runs, upstream_test = TorchtitanTarget.runs, TorchtitanTarget.upstream_test
    before_steps, check_steps = TorchtitanTarget.before_steps, TorchtitanTarget.check_steps
    LOADED, loaded_checkpoint = TorchtitanTarget.LOADED, TorchtitanTarget.loaded_checkpoint

    def command(self, cell, dump_folder: Path, nproc: int, port: int, run=0, program=None, **_):
        values = {**self.matrix.settings, **cell.axes, "python": sys.executable, "nproc": nproc,
                  "port": port, "dump_folder": dump_folder, "matrix_dir": self.matrix.path.parent.resolve()}
        name = cell.axes.get("feature", "none")  # a feature's flags go at the end, each later run's after them
        extra = [*self.matrix.features.get(name, []), *(self.matrix.feature_runs[name][run - 1] if run else [])]
        argv = [str(p).format(**values) for p in (program or self.argv)] + list(tokens(extra))
        env = {k: str(v).format(**values) for k, v in self.env.items()}
        return RankCommand(argv, env, cwd=str(self.matrix.path.parent.resolve()))

    def step_command(self, cell, step, dump_folder: Path, seed_folder=None):
        return self.command(cell, dump_folder, nproc=1, port=0, program=self.steps[step])


TARGETS = {Titan03.name: Titan03, Titan02.name: Titan02}


def make_target(matrix: Matrix, cache_dir: Path):
    """The matrix's target; ``cache_dir`` holds what it generates once (dataset, tokenizer)."""
    spec = matrix.target
    if isinstance(spec, dict):
        target = CommandTarget(matrix)
        target.check_steps()
        return target
    if spec not in TARGETS:
        raise MatrixError(f"{matrix.where('target')}: unknown target {spec!r}; built in: "
                          f"{', '.join(TARGETS)}, or {{command: [...]}} (plugins add more: "
                          f"pytest_simplefsdp_make_target)")
    target = TARGETS[spec](matrix, cache_dir)
    target.check()
    target.check_steps()
    return target
