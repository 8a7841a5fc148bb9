"""The ``titan03`` target: torchtitan 0.3.x ``graph_trainer`` (SimpleFSDP inside) through
``python -m torchtitan.train``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..degrees import flags
from ..judge.evidence import Expect, check, inductor_codegen
from ..judge.layout import Rule
from ..judge.mutants import TITAN03 as TITAN03_MUTANTS
from ..spec.matrix import MatrixError
from ..spec.upstream import options
from ..versions.sets import INSTALLED
from .base import FILE_DEFINED, TP_REPLICATED, TorchtitanTarget, merged, shim_env
from .flags import MICROBATCH, Flag


def with_passes(flags: list[Flag], passes) -> list[Flag]:
    """A compiler bisection's probe (session.compiling): graph_trainer's optional passes all off, or the named ones
    off besides those the cell's own flags turn off (an upstream test's cudagraph_pass)."""
    if passes is None or not (passes.every or passes.off):
        return flags
    if passes.every:
        return merged([*flags, Flag("compile.enable_passes", False, "compiler bisection probe")])
    own = [n for f in flags if f.name == "compile.disable_passes" for n in str(f.value).split(",") if n]
    names = ",".join(dict.fromkeys([*own, *passes.off]))
    return merged([*flags, Flag("compile.disable_passes", names, "compiler bisection probe")])


class Titan03(TorchtitanTarget):
    """torchtitan 0.3.x, ``torchtitan.experiments.graph_trainer`` (SimpleFSDP inside).

    Flags are written under their torchtitan 0.3.0 names and spelled by the installed torchtitan's
    own job config (``titan_options``), so a torchtitan checkout with renamed options runs unchanged.
    The ``backend`` axis says what compiles the whole graph: ``aot_eager`` (nothing: on aot_fx_trace,
    torchtitan's ``regional`` inductor compiles only tagged regions such as FlexAttention) or
    ``inductor`` (aot_fx_trace: ``--compile.inductor_compilation full``; jit: ``--compile.backend``).
    """

    name = "titan03"
    PATHS = "titan03"
    WRITTEN_AS = "0.3.0"
    TRAINER = "graph_trainer"
    TESTED = "torchtitan 0.3.0 and main up to b5bcd76c6 (2026-08-21)"
    RUN_OPTIONS = {
        "seed": "debug.seed",
        "deterministic": "debug.deterministic",
        "tokenizer": "hf_assets_path",
        "dataset": "dataloader.dataset_path",
    }
    MUTANTS = TITAN03_MUTANTS
    # the torch torchtitan 0.3.0 was released against (2.14) and what its development line moves to; torchtitan
    # itself is judged by what it ships (TRAINER), not by a version range: main has said 0.2.2 since before 0.3.0
    SUPPORTS = {"torch": ">=2.14,<2.16"}
    AXES = {
        "model": ("llama3", "deepseek_v3", "qwen3", "muse_glimmer"),
        **dict.fromkeys(flags("titan03"), int),  # the degrees
        "pp_schedule": (
            "none",
            "1F1B",
            "Interleaved1F1B",
            "ZBVZeroBubble",
            "DualPipeV",
            "GPipe",
            "InterleavedZeroBubble",
            "LoopedBFS",
        ),
        "compile": ("eager", "aot_fx_trace", "jit"),
        "backend": ("aot_eager", "inductor"),
        "memory_policy": ("none", "default", "full", "eager", "sac_and_offload"),
        # fsdp2: torchtitan's core Trainer (FSDP2, eager) on the model's fsdp2_config, the reference that
        # upstream's graph_trainer/tests/test_numerics.py holds SimpleFSDP to
        "trainer": ("simplefsdp", "fsdp2"),
        # how parallelised modules speak SPMD (upstream #4085; main dropped full_dtensor, and since #4218 its CP
        # needs spmd_types): a value the installed torchtitan does not offer makes the cell n/a (OFFERED_BY)
        "spmd_backend": ("partial_dtensor", "full_dtensor", "spmd_types"),
        "feature": FILE_DEFINED,  # names of the matrix's `features`: flags upstream tests set beyond the axes
        "versions": FILE_DEFINED,  # the version sets the cells run on (matrix key `versions`, --simplefsdp-versions)
        "upstream": FILE_DEFINED,  # source: upstream: the name of the upstream test a cell runs
    }
    OFFERED_BY = {"spmd_backend": "parallelism.spmd_backend"}
    IMPLICIT = {"spmd_backend": "partial_dtensor"}  # main before PR 3466 (2026-06-06): the one path, no option
    MODEL_KEYS = ("module", "config")  # required per model; optional: MODEL_OPTIONAL (fsdp2_module: default module)
    MODEL_OPTIONAL = ("moe", "eager_pp_config", "cp_config", "fsdp2_config", "fsdp2_module")
    TRAINER_CLASS = {"simplefsdp": "GraphTrainer", "fsdp2": "Trainer"}
    DEGREE_FLAGS = flags(name)  # axis -> torchtitan option (degrees.py, the one table)

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
        if axes.get("config"):  # a baseline that runs its cells' config (baseline_axes)
            return facts["module"], axes["config"]
        named = self.feature_options(axes).get("config")
        if named:  # a feature that runs another config of the model (upstream's HybridEP, MinimalAsyncEP, 8B, ...)
            return facts["module"], named
        if axes.get("trainer") == "fsdp2":
            if not facts.get("fsdp2_config"):
                raise MatrixError(
                    f"{self.matrix.where('models')}: model {axes['model']!r} has no fsdp2_config, "
                    f"which trainer=fsdp2 cells run"
                )
            return facts.get("fsdp2_module", facts["module"]), facts["fsdp2_config"]  # (GPU: the core model's module)
        if (
            axes.get("pp", 1) > 1
            and axes.get("compile", "aot_fx_trace") != "aot_fx_trace"
            and facts.get("eager_pp_config")
        ):
            config = facts["eager_pp_config"]  # GraphPP needs aot_fx_trace; otherwise the eager splitter
        elif axes.get("cp", 1) > 1 and facts.get("cp_config"):
            config = facts["cp_config"]
        return facts["module"], config

    def baseline_axes(self, axes):
        """A CP cell of a model that runs CP on a twin config (llama3's SDPA twin on GPU, `cp_config`) is compared with
        a baseline of that config: the same weights from the same seed checkpoint, so that the comparison is CP's, not
        FlexAttention's against SDPA's."""
        base = super().baseline_axes(axes)
        facts = self.matrix.models.get(axes.get("model"), {})
        if int(axes.get("cp", 1)) > 1 and facts.get("cp_config") and facts["cp_config"] != facts.get("config"):
            base["config"] = facts["cp_config"]
        return base

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
            flags.append(
                Flag("compile.memory_policy", axes["memory_policy"], f"axis memory_policy={axes['memory_policy']}")
            )
        return flags

    # what an upstream test's flags may not change here: where the assets and dump are, the CPU-sized shapes
    OURS = {
        "module",
        "config",
        "hf_assets_path",
        "dataloader.dataset_path",
        "dump_folder",
        "training.local_batch_size",
        "training.seq_len",
        "metrics.log_freq",
    }

    def upstream_flags(self, cell, dump_folder: Path, run=0):
        """An upstream test's run: our run settings, then upstream's flags of that run on top (its later runs'
        training.steps, degrees and checkpoint options included)."""
        test, s = self.upstream_test(cell.axes), self.matrix.settings
        flags = self.run_flags(s.get("steps", 3), s.get("local_batch_size", 2))
        flags.append(Flag("dump_folder", dump_folder, "target"))
        if self.matrix.device == "cpu":
            flags.append(Flag("training.disable_cuda_graphs", True, "target", where_present=True))
        flags += self.trace_flags()
        flags += [
            Flag(key, value, f"upstream {test.name} run {run + 1}")
            for key, value in options(test.runs[run]).items()
            if key not in self.OURS
        ]
        return merged(flags + self.artifact_flags(cell, dump_folder))

    def artifact_flags(self, cell, dump_folder: Path):
        """Where the precompile step writes its artifact and the cell's ranks load it: the cell's own folder
        (upstream's tests name a temporary folder)."""
        if "precompile" not in self.before_steps(cell):
            return []
        return [
            Flag("compile.precompile_artifact_dir", Path(dump_folder).parent / "precompile_artifact", "step precompile")
        ]

    def flags(self, cell, dump_folder: Path, seed_folder: Path | None = None, run=0):
        a, s = cell.axes, self.matrix.settings
        if self.upstream_test(a):
            return with_passes(self.upstream_flags(cell, dump_folder, run), cell.passes)
        flags = [*self.degree_flags(a), *self.compile_flags(a)]
        if "spmd_backend" in a:
            value = a["spmd_backend"]
            implicit = value == self.IMPLICIT["spmd_backend"]  # (left out where torchtitan has no such choice)
            flags.append(Flag("parallelism.spmd_backend", value, f"axis spmd_backend={value}", where_present=implicit))
        if a.get("pp", 1) > 1:  # 0.3.0's default, written out: main counts microbatches instead (PR 4121: its
            # default is one microbatch, which no two-stage schedule takes), and converts this to as many as 0.3.0 ran
            flags.append(Flag(MICROBATCH, 1, "target (torchtitan 0.3.0's default microbatch size)"))
        if self.matrix.device == "cpu" or a.get("pp", 1) > 1 or a.get("ep", 1) > 1:
            flags.append(Flag("training.disable_cuda_graphs", True, "target", where_present=True))
        numerics, local_batch = self.numerics_flags(cell, seed_folder)
        flags += numerics
        flags += self.run_flags(s.get("steps", 3), local_batch, a)
        flags.append(Flag("dump_folder", dump_folder, "target"))
        flags += self.trace_flags()
        flags += self.artifact_flags(cell, dump_folder)
        # last: a feature (and its later runs) has the last word, then a compiler bisection's probe
        return with_passes(merged(flags + self.feature_flags(a, run)), cell.passes)

    def seed_command(self, model, dump_folder: Path, versions=INSTALLED):
        """One rank that writes the seed checkpoint every cell of ``model`` starts from (spelled by the torchtitan
        of ``versions``, the version set's label, where its environment is built)."""
        module, config = self.job_config({"model": model})
        flags = [
            Flag("compile.mode", "None", "target"),
            Flag("training.disable_cuda_graphs", True, "target", where_present=True),
            Flag("checkpoint.enable", True, "target"),
            Flag("checkpoint.create_seed_checkpoint", True, "target"),
            Flag("debug.seed", self.matrix.settings.get("seed", 42), "setting seed"),
            Flag("debug.deterministic", True, "target"),
            Flag("parallelism.data_parallel_shard_degree", 1, "target"),
            Flag("hf_assets_path", self.tokenizer, "target"),
            Flag("dataloader.dataset_path", self.dataset, "target"),
            Flag("dump_folder", dump_folder, "target"),
        ]
        spelled = self.spell({"model": model, "versions": versions}, flags)
        argv = ["--module", module, "--config", config, *spelled.argv]
        env = {**shim_env(self.matrix.device, self.name), **spelled.env()}
        return self.rank_command("torchtitan.train", argv, env, unforkable=spelled.unforkable, lacking=spelled.lacking)

    EXPERTS = ("*.moe.routed_experts.*", "*.moe.experts.*")
    # the parameters torchtitan 0.3's own plans lay out otherwise than a degree's label says, and why
    LAYOUT_RULES = (
        Rule(
            "dp_shard",
            EXPERTS,
            "routed experts are split over efsdp x ep, and EP takes its ranks from dp_shard x "
            "cp x tp: their FSDP share is the rest",
            size=lambda a: int(a.get("dp_shard", 1)) * int(a.get("cp", 1)) * int(a.get("tp", 1)) // int(a.get("ep", 1)),
            when=lambda a: int(a.get("ep", 1)) > 1,
        ),
        *TP_REPLICATED,
        Rule(
            "tp", EXPERTS, "ETP is 1 in 0.3: EP, not TP, splits routed experts", when=lambda a: int(a.get("ep", 1)) > 1
        ),
        Rule("ep", EXPERTS, "EP splits only the routed experts", outside=True),
    )

    SCHEDULE_CLASS = "Schedule{}"  # torch.distributed.pipelining's class of a schedule name

    def evidence_plan(self, cell):
        """What the run did, from the shim's effects probe (shim/effects.py), never what its job config says (the
        degrees, per parameter, and the pipeline stages are judge.layout's, in ``evidence``): the compile mode from
        what ran step 1, the trainer from the class whose step ran and how data parallelism reached the parameters,
        the memory policy from the traced graph's recompute tags of every block, the inductor strategy from the
        terminal pass that ran (jit: whether inductor compiled), the PP schedule from the schedule whose step ran, CP
        from the mesh built and the ring its attention ran (cp_plan)."""
        a, plan = cell.axes, []
        step, schedule = ("train_step",), ("schedule",)
        passes = ("train_step", "passes")  # what graph_trainer's passes recorded (imported with its trainer)
        plan.extend(self.cp_plan(a))
        if "spmd_backend" in a:
            plan.append(
                Expect(f"spmd_backend={a['spmd_backend']}", "effects.spmd_backend", a["spmd_backend"], hooks=step)
            )
        trainer = a.get("trainer", "simplefsdp")
        mode = "eager" if trainer == "fsdp2" else a.get("compile", "aot_fx_trace")
        plan.append(Expect(f"compile={a.get('compile', mode)}", "effects.compile", mode, hooks=step))
        plan.append(Expect(f"trainer={trainer}", "effects.trainer", self.TRAINER_CLASS[trainer], hooks=step))
        plan.append(Expect(f"trainer={trainer}", "effects.data_parallel", trainer, hooks=step))
        policy = a.get("memory_policy", "none")
        if policy != "none":  # eager and jit accept a policy and ignore it: only aot_fx_trace's passes apply one
            plan.append(
                Expect(f"memory_policy={policy}", "effects.memory_policy", policy, default="none", hooks=passes)
            )
            plan.append(Expect(f"memory_policy={policy}", "effects.block_policy", policy, hooks=passes, each=True))
        if mode != "eager" and trainer != "fsdp2":
            backend = a.get("backend", self.matrix.settings.get("compile_backend", "aot_eager"))
            label = f"backend={backend}" if "backend" in a else f"compile_backend={backend}"
            if mode == "jit":
                plan.append(Expect(label, "effects.jit_backend", backend, hooks=step))
            else:
                plan.append(
                    Expect(
                        label,
                        "effects.inductor_compilation",
                        "full" if backend == "inductor" else "regional",
                        default="none",
                        hooks=passes,
                    )
                )
        if a.get("pp", 1) > 1:
            plan.append(
                Expect(
                    f"pp_schedule={a['pp_schedule']}",
                    "effects.pp_schedule",
                    self.SCHEDULE_CLASS.format(a["pp_schedule"]),
                    default="none",
                    hooks=schedule,
                )
            )
        if cell.passes is not None:  # a compiler bisection's probe: what the passes it turned off would have done
            plan = [e for e in plan if e.key not in self.COMPILE_TIME]
        return plan

    COMPILE_TIME = ("effects.memory_policy", "effects.block_policy", "effects.inductor_compilation")  # graph passes

    def evidence(self, cell, log_dir: Path):
        """The probe's evidence from every rank that ran (the trace tier runs one: what needs every rank, PP's stages,
        is left out there) and, for an inductor cell, inductor's output code in the compile trace. A precompiled cell's
        graph passes ran in its precompile step: what they did is read there."""
        a, plan = cell.axes, self.evidence_plan(cell)
        at_step = [e for e in plan if e.key in self.COMPILE_TIME] if "precompile" in self.before_steps(cell) else []
        found = check([e for e in plan if e not in at_step], log_dir, self.probed_ranks(cell))
        found += check([replace(e, hooks=()) for e in at_step], Path(log_dir) / "precompile", [0]) if at_step else []
        found += self.layout_evidence(cell, log_dir)
        if (
            a.get("backend") == "inductor"
            and a.get("compile", "aot_fx_trace") != "eager"
            and self.matrix.tier != "trace"
        ):
            found.append(inductor_codegen(Path(log_dir) / "torch_trace"))
        return found

    def command(self, cell, dump_folder: Path, seed_folder: Path | None = None, run=0, **_):
        module, config = self.job_config(cell.axes)
        flags = self.flags(cell, dump_folder, seed_folder, run)
        spelled = self.spell(cell.axes, flags)
        args = ["--module", module, "--config", config, *spelled.argv]
        args += [str(x) for x in self.matrix.settings.get("extra_args", [])]
        env = {**shim_env(self.matrix.device, self.name), **spelled.env()}
        env.update(self.probe_env())  # the shim records what torchtitan really used (evidence_plan)
        env.update(self.trace_env(cell))
        if cell.axes.get("compile", "aot_fx_trace") != "eager":  # structured compile trace: tlparse, evidence
            env["TORCH_TRACE"] = str(Path(dump_folder).parent / "torch_trace")
        preload = [
            f"torchtitan.experiments.{module}.config_registry" if module.startswith("graph_trainer.") else module
        ]
        # a precompiled artifact is rank-agnostic: every rank loads it as local rank 0 of its own GPU (upstream's
        # run_train_precompile.sh passes torchrun --virtual-local-rank)
        return self.rank_command(
            "torchtitan.train",
            args,
            env,
            preload=preload,
            virtual_local_rank="precompile" in self.before_steps(cell),
            unforkable=spelled.unforkable,
            lacking=spelled.lacking,
        )

    STEPS = ("precompile",)

    def step_command(self, cell, step, dump_folder: Path, seed_folder: Path | None = None):
        """``precompile``: graph_trainer's precompile_main, one process over a fake process group of the cell's
        world, writes the compiled artifact the cell's training then loads (upstream's run_precompile_tests.py,
        step 1). Same flags as the training; upstream's tool builds on cuda:0, so this runs on a GPU only."""
        train = self.command(cell, dump_folder, seed_folder)
        return self.rank_command(
            "torchtitan.experiments.graph_trainer.precompile_main", train.argv[3:], train.env, preload=train.preload
        )
