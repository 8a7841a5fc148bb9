"""The ``titan02`` target: torchtitan 0.2.x ``experiments/simple_fsdp``, the seed era of autumn 2025."""

from __future__ import annotations

from pathlib import Path

from ..degrees import flags
from ..judge.evidence import Expect, check
from ..judge.layout import Rule
from ..judge.mutants import TITAN02 as TITAN02_MUTANTS
from ..paths import FIXTURES
from ..spec.matrix import MatrixError
from ..spec.upstream import options
from ..versions.sets import INSTALLED
from .base import FILE_DEFINED, TP_REPLICATED, TorchtitanTarget, merged, shim_env
from .flags import Flag


class Titan02(TorchtitanTarget):
    """torchtitan 0.2.x, ``torchtitan.experiments.simple_fsdp`` (the seed era of autumn 2025).

    TOML job config (ours: fixtures/titan02_debugmodel.toml), ``--model.name simple_fsdp.<model>``,
    ``--compile.enable``, ``--activation_checkpoint.mode``, a separate expert-TP degree; flags are
    checked against the installed ``JobConfig``. Its ranks run the shim's probe as 0.3's do (shim/probes.py finds
    0.2's Trainer through its CheckpointManager): evidence per parameter, memory, invariants, and numerics from a seed
    checkpoint."""

    name = "titan02"
    PATHS = "titan02"
    WRITTEN_AS = "0.2.0"
    TRAINER = "simple_fsdp"
    TESTED = "torchtitan 0.2.0 (torch 2.10.0) and 0.2.2 (torch 2.11.0)"
    RUN_OPTIONS = {  # 0.2.0's names: 0.2.1 moved seed and deterministic under debug (flags.RENAMES respells them)
        "seed": "training.seed",
        "deterministic": "training.deterministic",
        "tokenizer": "model.hf_assets_path",
        "dataset": "training.dataset_path",
    }
    # torchtitan 0.2.0 (2025-10-18) was tested on the torch nightly of its day, which 2.9.x predates (its
    # code needs dynamo's DeviceMesh.mesh_dim_names, pytorch PR 164200): 2.10 is the nearest release; 0.2.2
    # (2026-02-20) is torch 2.11's, the torch of the lent GPU's image
    SUPPORTS = {"torch": ">=2.10,<2.12"}  # (torchtitan: judged by what it ships, TRAINER)
    AXES = {
        "model": ("llama3", "deepseek_v3"),
        **dict.fromkeys(flags("titan02"), int),  # the degrees
        "pp_schedule": ("none", "1F1B", "Interleaved1F1B", "GPipe", "ZBVZeroBubble"),
        "compile": ("eager", "compiled"),
        # fsdp2: 0.2's core train spec of the model (FSDP2's fully_shard, --model.name <fsdp2_name>) on the same seed
        # checkpoint and batches: the reference upstream's simple_fsdp/tests/test_numerics.py holds SimpleFSDP to
        "trainer": ("simplefsdp", "fsdp2"),
        "backend": ("aot_eager", "inductor"),
        "ac": (
            "none",
            "selective",
            "op",
            "full",
        ),  # op: selective AC per op (--activation_checkpoint.selective_ac_option op)
        "feature": FILE_DEFINED,
        "versions": FILE_DEFINED,  # the version sets the cells run on (matrix key `versions`, --simplefsdp-versions)
        "upstream": FILE_DEFINED,
    }
    MUTANTS = TITAN02_MUTANTS
    MODEL_KEYS = ("name", "flavor")
    MODEL_OPTIONAL = ("moe", "fsdp2_name")
    DEGREE_FLAGS = flags(name)  # axis -> torchtitan option (degrees.py, the one table)
    JOB_TOML = FIXTURES / "titan02_debugmodel.toml"

    def data_parallel(self, axes) -> str:
        """What 0.2's simple_fsdp parallelize applies: data_parallel where FSDP, EP or DDP is on (a TP- or PP-only
        layout keeps plain parameters); the core train spec's fully_shard for trainer=fsdp2."""
        dp = int(axes.get("dp_replicate", 1)) * int(axes.get("dp_shard", 1)) * int(axes.get("cp", 1))
        kind = "fsdp2" if axes.get("trainer") == "fsdp2" else "simplefsdp"
        return kind if dp > 1 or int(axes.get("ep", 1)) > 1 else "none"

    def model_name(self, axes) -> str:
        """--model.name of a cell: the model's simple_fsdp train spec, or its core one (trainer=fsdp2)."""
        facts = self.matrix.models[axes["model"]]
        if axes.get("trainer") != "fsdp2":
            return facts["name"]
        if not facts.get("fsdp2_name"):
            raise MatrixError(
                f"{self.matrix.where('models')}: model {axes['model']!r} has no fsdp2_name, which trainer=fsdp2 cells run"
            )
        return facts["fsdp2_name"]

    def evidence_plan(self, cell):
        """What the run did, from the shim's effects probe (shim/effects.py): the compile mode from what ran step 1
        (0.2 compiles the whole model with torch.compile: dynamo's graphs), its backend from whether inductor compiled,
        SimpleFSDP from the modules' parametrization, activation checkpointing from the wrappers around each block,
        the PP schedule from the schedule whose step ran, CP from the mesh built and its ring attention (cp_plan)."""
        a, plan = cell.axes, []
        step, schedule = ("train_step",), ("schedule",)
        plan.extend(self.cp_plan(a))
        mode = a.get("compile", "eager")
        plan.append(Expect(f"compile={mode}", "effects.compile", "jit" if mode == "compiled" else "eager", hooks=step))
        if mode == "compiled":
            backend = a.get("backend", self.matrix.settings.get("compile_backend", "aot_eager"))
            label = f"backend={backend}" if "backend" in a else f"compile_backend={backend}"
            plan.append(Expect(label, "effects.jit_backend", backend, hooks=step))
        trainer = a.get("trainer", "simplefsdp")
        plan.append(Expect(f"trainer={trainer}", "effects.data_parallel", self.data_parallel(a), hooks=step))
        ac = label = a.get("ac", "none")
        # layer SAC wraps every N-th block fully (N: 0.2's default, or what a feature sets); op SAC every block
        option = str(self.feature_options(a).get("activation_checkpoint.selective_ac_option", self.SELECTIVE_LAYERS))
        if ac == "selective" and option == "op":
            ac = "op"
        block = {"none": "none", "full": "full", "op": "op", "selective": "full"}[ac]
        every = int(option) if ac == "selective" and option.isdigit() else 0
        plan.append(
            Expect(f"ac={label}", "effects.block_ac", block, default="none", hooks=step, each=True, every=every)
        )
        if int(a.get("pp", 1)) > 1:
            plan.append(
                Expect(
                    f"pp_schedule={a['pp_schedule']}",
                    "effects.pp_schedule",
                    f"Schedule{a['pp_schedule']}",
                    default="none",
                    hooks=schedule,
                )
            )
        return plan

    SELECTIVE_LAYERS = 2  # 0.2's default --activation_checkpoint.selective_ac_option: every 2nd block

    def evidence(self, cell, log_dir: Path):
        return check(self.evidence_plan(cell), log_dir, self.probed_ranks(cell)) + self.layout_evidence(cell, log_dir)

    EXPERTS = ("*.moe.experts.*",)
    # the parameters 0.2's simple_fsdp plans lay out otherwise than a degree's label says, and why
    LAYOUT_RULES = (
        Rule(
            "dp_shard",
            EXPERTS,
            "routed experts are split over dp_shard_mod_ep x ep, and EP borrows cp (and tp where etp is 1) and "
            "some of dp_shard: their FSDP share is the rest",
            size=lambda a: (
                int(a.get("dp_shard", 1))
                * int(a.get("cp", 1))
                * (int(a.get("tp", 1)) if int(a.get("etp", 1)) == 1 else 1)
                // int(a.get("ep", 1))
            ),
            when=lambda a: int(a.get("ep", 1)) > 1,
        ),
        *TP_REPLICATED,
        Rule(
            "tp", EXPERTS, "with EP, expert TP is etp's (tp's own degree or 1)", when=lambda a: int(a.get("ep", 1)) > 1
        ),
        Rule("ep", EXPERTS, "EP splits only the routed experts", outside=True),
        Rule("etp", EXPERTS, "ETP splits only the routed experts", outside=True),
        Rule(
            "etp",
            EXPERTS,
            "ETP acts with EP only (without EP the experts follow tp)",
            when=lambda a: int(a.get("ep", 1)) == 1,
        ),
    )

    def seed_command(self, model, dump_folder: Path, versions=INSTALLED):
        """One rank that writes the seed checkpoint every cell of ``model`` starts from (0.2's
        ``--checkpoint.create_seed_checkpoint``, one rank, no parallelism)."""
        facts = self.matrix.models[model]
        flags = [
            Flag("job.config_file", self.JOB_TOML, "target"),
            Flag("job.custom_config_module", self.CUSTOM_CONFIG, "target"),
            Flag("model.name", facts["name"], f"model {model}"),
            Flag("model.flavor", facts["flavor"], f"model {model}"),
            Flag("checkpoint.enable", True, "target"),
            Flag("checkpoint.create_seed_checkpoint", True, "target"),
            Flag(self.RUN_OPTIONS["seed"], self.matrix.settings.get("seed", 42), "setting seed"),
            Flag(self.RUN_OPTIONS["deterministic"], True, "target"),
            Flag("parallelism.data_parallel_shard_degree", 1, "target"),
            Flag(self.RUN_OPTIONS["tokenizer"], self.tokenizer, "target"),
            Flag(self.RUN_OPTIONS["dataset"], self.dataset, "target"),
            Flag("job.dump_folder", dump_folder, "target"),
        ]
        spelled = self.spell({"model": model, "versions": versions}, flags)
        env = {**shim_env(self.matrix.device, self.name), **spelled.env()}
        return self.rank_command(
            "torchtitan.train", spelled.argv, env, unforkable=self.UNFORKABLE, lacking=spelled.lacking
        )

    CUSTOM_CONFIG = "torchtitan.experiments.simple_fsdp.job_config"  # what every upstream simple_fsdp test passes

    def job_config(self, axes):
        return None, self.CUSTOM_CONFIG  # one JobConfig for every cell, with simple_fsdp's options merged in

    OURS = {
        "job.config_file",
        "model.hf_assets_path",
        "training.dataset_path",
        "job.dump_folder",
        "training.local_batch_size",
        "training.seq_len",
        "metrics.log_freq",
    }

    def flags(self, cell, dump_folder: Path, seed_folder=None, run=0):
        a, s = cell.axes, self.matrix.settings
        test = self.upstream_test(a)
        custom = Flag("job.custom_config_module", self.CUSTOM_CONFIG, "target")
        numerics, local_batch = self.numerics_flags(cell, None if test else seed_folder)
        ours = [
            *numerics,
            *self.run_flags(s.get("steps", 3), local_batch, a),
            Flag("job.dump_folder", dump_folder, "target"),
        ]
        if test:  # our job config and run settings, upstream's flags of that run on top
            flags = [Flag("job.config_file", self.JOB_TOML, "target"), custom, *ours]
            return merged(
                flags
                + [
                    Flag(k, v, f"upstream {test.name} run {run + 1}")
                    for k, v in options(test.runs[run]).items()
                    if k not in self.OURS
                ]
            )
        facts = self.matrix.models[a["model"]]
        flags = [
            Flag("job.config_file", self.JOB_TOML, "target"),
            custom,
            Flag("model.name", self.model_name(a), f"model {a['model']}"),
            Flag("model.flavor", facts["flavor"], f"model {a['model']}"),
            *self.degree_flags(a),
        ]
        if a.get("compile", "eager") == "compiled":
            backend = a.get("backend", s.get("compile_backend", "aot_eager"))
            flags += [
                Flag("compile.enable", True, "axis compile=compiled"),
                Flag("compile.backend", backend, f"backend {backend}"),
            ]
        ac = a.get("ac", "none")
        flags.append(Flag("activation_checkpoint.mode", "selective" if ac == "op" else ac, f"axis ac={ac}"))
        if ac == "op":
            flags.append(Flag("activation_checkpoint.selective_ac_option", "op", "axis ac=op"))
        return merged(flags + self.trace_flags() + ours + self.feature_flags(a, run))

    def command(self, cell, dump_folder: Path, seed_folder: Path | None = None, run=0, **_):
        spelled = self.spell(cell.axes, self.flags(cell, dump_folder, seed_folder, run=run))
        args = [*spelled.argv, *map(str, self.matrix.settings.get("extra_args", []))]
        env = {**shim_env(self.matrix.device, self.name), **self.trace_env(cell), **self.probe_env()}
        if cell.axes.get("compile") == "compiled":
            env["TORCH_TRACE"] = str(Path(dump_folder).parent / "torch_trace")
        test = self.upstream_test(cell.axes)
        name = options(test.flags).get("model.name") if test else self.model_name(cell.axes)
        return self.rank_command(
            "torchtitan.train",
            args,
            env,
            preload=[f"torchtitan.{'experiments' if str(name).startswith('simple_fsdp.') else 'models'}.{name}"],
            unforkable=self.UNFORKABLE,
            lacking=spelled.lacking,
        )

    # the fork server imports the config manager once; 0.2 binds its arguments then (0.3 reads them per call)
    UNFORKABLE = "torchtitan 0.2's ConfigManager.parse_args binds sys.argv[1:] when it is imported"
