"""The ``titan02`` target: torchtitan 0.2.x ``experiments/simple_fsdp``, the seed era of autumn 2025."""

from __future__ import annotations

from pathlib import Path

from ..degrees import DEGREES, flags
from ..paths import FIXTURES
from ..spec.upstream import options
from ..versions.sets import INSTALLED
from .base import FILE_DEFINED, TorchtitanTarget, merged, shim_env
from .flags import Flag


class Titan02(TorchtitanTarget):
    """torchtitan 0.2.x, ``torchtitan.experiments.simple_fsdp`` (the seed era of autumn 2025).

    TOML job config (ours: fixtures/titan02_debugmodel.toml), ``--model.name simple_fsdp.<model>``,
    ``--compile.enable``, ``--activation_checkpoint.mode``, a separate expert-TP degree; flags are
    checked against the installed ``JobConfig``. Numerics are not wired for 0.2 (no seed checkpoint)."""

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
    MODEL_KEYS = ("name", "flavor")
    MODEL_OPTIONAL = ("moe",)
    DEGREE_FLAGS = flags(name)  # axis -> torchtitan option (degrees.py, the one table)
    JOB_TOML = FIXTURES / "titan02_debugmodel.toml"

    def evidence_lines(self, cell) -> list:
        """The seed era's ranks run no probe (shim/probes.py is titan03's): a green shows its exit and losses only,
        and the dry run says so for each degree of its label."""
        return [
            *super().evidence_lines(cell),
            *(
                f"{d.axis}={cell.axes[d.axis]} <- not checked: the seed era's ranks run no probe"
                for d in DEGREES
                if int(cell.axes.get(d.axis, 1)) > 1
            ),
        ]

    def seed_command(self, model, dump_folder: Path, versions=INSTALLED):
        return None  # numerics are not wired for 0.2: its matrix files have no `numerics`

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
        ours = [
            *self.run_flags(s.get("steps", 3), s.get("local_batch_size", 2)),
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
            Flag("model.name", facts["name"], f"model {a['model']}"),
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

    def command(self, cell, dump_folder: Path, run=0, **_):
        spelled = self.spell(cell.axes, self.flags(cell, dump_folder, run=run))
        args = [*spelled.argv, *map(str, self.matrix.settings.get("extra_args", []))]
        env = {**shim_env(self.matrix.device, self.name), **self.trace_env(cell)}
        if cell.axes.get("compile") == "compiled":
            env["TORCH_TRACE"] = str(Path(dump_folder).parent / "torch_trace")
        test = self.upstream_test(cell.axes)
        name = options(test.flags).get("model.name") if test else self.matrix.models[cell.axes["model"]]["name"]
        return self.rank_command(
            "torchtitan.train",
            args,
            env,
            preload=[f"torchtitan.experiments.{name}"],
            unforkable=self.UNFORKABLE,
            lacking=spelled.lacking,
        )

    # the fork server imports the config manager once; 0.2 binds its arguments then (0.3 reads them per call)
    UNFORKABLE = "torchtitan 0.2's ConfigManager.parse_args binds sys.argv[1:] when it is imported"
