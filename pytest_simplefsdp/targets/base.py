"""What the built-in targets share: the torchtitan targets' base (versions, assets, degree flags, spelling by
the installed config, later runs and steps before a cell), the start-up shim's environment, and the checks of a
matrix's axis values against what a target accepts."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ..commands import RankCommand
from ..degrees import PLACED
from ..judge.evidence import Expect, check, read_probes
from ..judge.layout import Rule, degree_evidence, memory, stage_evidence
from ..judge.numerics import lane_for
from ..kinds import Device
from ..machine import TRAINERS, installed, source_checkout, torchtitan_trainers
from ..paths import FIXTURES, SHIM_DIR, probe_folder
from ..spec.matrix import Matrix, MatrixError
from ..spec.paths import load_rules, map_file
from ..spec.upstream import options, tokens
from ..versions.sets import INSTALLED
from ..words import release
from .flags import Flag, read_options, spelled_value, unchecked

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


def check_values(matrix: Matrix, allowed: dict):
    for axis, values in matrix.axes.items():
        if axis not in allowed:
            raise MatrixError(
                f"{matrix.where('axes')}: target {matrix.target!r} has no axis {axis!r}; its axes: {', '.join(allowed)}"
            )
        choices = allowed[axis]
        if choices is FILE_DEFINED:
            continue  # matrix.load_matrix made or checked them
        for v in values:
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1 if choices is int else v in choices
            if not ok:
                expected = "a positive integer" if choices is int else ", ".join(map(str, choices))
                raise MatrixError(f"{matrix.where('axes')}: axis {axis!r}: unknown value {v!r}; expected {expected}")


def shim_env(device, generation):
    """The start-up shim first on the ranks' path (then the config modules), and on CPU the generation's patches."""
    env = {"PYTHONPATH": os.pathsep.join([str(SHIM_DIR), str(FIXTURES)])}
    if device == "cpu":
        env.update(SIMPLEFSDP_CPU_SHIM=generation, OMP_NUM_THREADS="1")
    return env


def _unsupported(package, supported, target):
    """An error line when ``package`` is missing or outside the range ``target`` supports; else None."""
    version = installed(package)
    if not version:
        return f"{package} is not installed; target {target} supports {package} {supported} (see README)"
    try:
        ok = SpecifierSet(supported, prereleases=True).contains(Version(version))
    except InvalidVersion:
        ok = False
    if not ok:
        return (
            f"target {target} supports {package} {supported}, but {package} {version} is installed "
            f"(torch {installed('torch')}, torchtitan {installed('torchtitan')}); see README, "
            f"'Two commands for a fresh machine'"
        )
    return None


def checkout_assets(rootdir) -> Path | None:
    """torchtitan's own test assets (``tests/assets``: its tokenizer and c4 sample), where torchtitan runs from a git
    checkout: installed editable from one, or the rootdir is one. A wheel ships neither; a copy whose c4 sample is
    absent (a clone without its large files leaves the folder empty) is not used: ours instead."""
    for root in (source_checkout("torchtitan"), Path(rootdir)):
        assets = root / "tests" / "assets" if root else None
        if (
            assets
            and (root / "torchtitan").is_dir()
            and (assets / "tokenizer" / "tokenizer.json").is_file()
            and (assets / "c4_test").is_dir()
            and any(p.is_file() for p in (assets / "c4_test").iterdir())
        ):
            return assets
    return None


class Target:
    """What every built-in target shares (hookspecs.Target is the interface a plugin's target fills): later runs
    of a cell (a feature's `then`, an upstream test's runs), steps before it (`before`), its evidence, and
    nothing to install, prepare or bind."""

    name = ""
    spelling = "as written in the matrix file"
    MUTANTS: tuple = ()  # judge.mutants.Mutant: the bugs the target can re-inject (--simplefsdp-mutants)
    REQUIRES: tuple = ()  # what a version set's environment installs for it beyond the set's pins
    SUPPORTS: dict = {}  # package -> version range this target runs against (none: any)
    PATHS = ""  # its map of torchtitan paths to the cells they reach: matrix/paths/<PATHS>.yaml (spec.paths)

    def __init__(self, matrix: Matrix):
        self.matrix = matrix

    def path_rules(self):
        """The rules of its path map (--simplefsdp-changed), or None where it has none."""
        return load_rules(map_file(self.PATHS), getattr(self, "AXES", None) or None) if self.PATHS else None

    def check(self):
        pass

    def check_installed(self):
        return None

    def bind(self, cells) -> dict:
        """Bind the cells to what is installed; returns the cells it cannot offer here: cell id -> why."""
        return {}

    def outside_range(self, versions: dict) -> list[str]:
        """What of a version set lies outside this target's supported range (a twin run or a bisection asked for
        it by name: it runs, and its reports say so)."""
        out = []
        for package, spec in self.SUPPORTS.items():
            ran = release(versions.get(package))
            try:
                if ran and not SpecifierSet(spec, prereleases=True).contains(Version(ran)):
                    out.append(f"{package} {ran} is outside target {self.name}'s range {spec}")
            except InvalidVersion:
                pass  # a commit: no range to hold it to
        return out

    def prepare(self):
        pass

    def seed_command(self, model, dump_folder, versions=INSTALLED):
        return None  # no seed checkpoint: numerics start from the program's own initialisation

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
                raise MatrixError(
                    f"{self.matrix.where('features')}: features.{name}.before: target {self.name} has "
                    f"no step {', '.join(unknown)} (its steps: {', '.join(self.STEPS) or 'none'})"
                )

    def upstream_test(self, axes):
        """The upstream test a cell of a ``source: upstream`` matrix runs, else None."""
        return self.matrix.upstream.get(axes.get("upstream")) if self.matrix.upstream else None

    LOADED = "Finished loading the checkpoint"  # what torchtitan 0.2 and 0.3 log once a checkpoint is in (fakes too)

    def loaded_checkpoint(self, log_text: str) -> bool:
        return self.LOADED in log_text

    def evidence_plan(self, cell):
        """What the run must show for the cell's label: [evidence.Expect] (none here)."""
        return []

    def evidence_lines(self, cell) -> list:
        """What the evidence checks, a line each (the dry run's ``evidence:``)."""
        return [e.line() for e in self.evidence_plan(cell)]

    def evidence(self, cell, log_dir: Path):
        """What the run left behind that shows the cell's label took effect (see judge.evidence)."""
        return check(self.evidence_plan(cell), log_dir)

    def memory(self, cell, log_dir: Path):
        """The bytes each rank held against what the layout implies (judge.layout.Memory), where the probe records
        them (none here)."""
        return None

    def losses(self, dump_folder: Path):
        return {}


class TorchtitanTarget(Target):
    """What both torchtitan generations share: versions, assets, degree flags, spelling by the installed config."""

    REQUIRES = ("torch", "torchtitan", "triton", "psutil")  # (torchtitan imports triton; SLURM's reaper needs psutil)

    AXES: dict = {}
    MODEL_KEYS: tuple = ()
    MODEL_OPTIONAL: tuple = ()
    DEGREE_FLAGS: dict = {}
    WRITTEN_AS = ""  # the torchtitan release whose option names the target writes
    TRAINER = ""  # the SimpleFSDP trainer the target runs (machine.TRAINERS): what the installed torchtitan must ship
    TESTED = ""  # the torchtitan versions and commits the target was tested with, for the lines that refuse one
    # where a generation keeps the run settings' options: seed, deterministic, the tokenizer, the dataset
    RUN_OPTIONS = {"seed": "", "deterministic": "", "tokenizer": "", "dataset": ""}

    def __init__(self, matrix: Matrix, cache_dir: Path):
        super().__init__(matrix)
        self.cache_dir = Path(cache_dir)
        self.checkout_assets = checkout_assets(self.cache_dir.parent)  # (cache_dir: <rootdir>/.simplefsdp)
        self.assets = self.checkout_assets or self.cache_dir / "assets"
        self.dataset, self.tokenizer = str(self.assets / "c4_test"), str(self.assets / "tokenizer")
        self.options = {}  # job config -> Options of the installed torchtitan (see bind)
        self.set_options = {}  # (a version set's Python, job config) -> Options of that set's torchtitan
        # version set label -> the Python of its built environment, or None (set by the session: run.sets.VersionSets)
        self.python_for = None

    def run_flags(self, steps, local_batch, axes=None):
        """Our run settings and where the assets are (steps and batch given: upstream runs and numerics set them),
        in the generation's option names (RUN_OPTIONS)."""
        s, name = self.matrix.settings, self.RUN_OPTIONS
        # deterministic mode only where numerics compare the cell's losses: it is a mode its users do not train in,
        # and it changes what runs (inductor refuses the seed era's auto_bucketing pass under it)
        compared = self.matrix.numerics if axes is None else self.compared(axes)
        deterministic = [Flag(name["deterministic"], True, "numerics")] if compared else []
        if compared and self.matrix.device == Device.CUDA:  # an op with no deterministic CUDA kernel warns, runs on
            deterministic.append(Flag("debug.deterministic_warn_only", True, "numerics on a GPU", where_present=True))
        return [
            Flag("training.steps", steps, "setting steps"),
            Flag("training.seq_len", s.get("seq_len", 256), "setting seq_len"),
            Flag("training.local_batch_size", local_batch, "setting local_batch_size"),
            Flag(name["seed"], s.get("seed", 42), "setting seed"),
            *deterministic,
            Flag("metrics.log_freq", 1, "target"),
            Flag("metrics.disable_color_printing", True, "target"),
            Flag(name["tokenizer"], self.tokenizer, "target"),
            Flag(name["dataset"], self.dataset, "target"),
        ]

    def trace_flags(self) -> list:
        """The trace tier's: one process over torchtitan's fake process group (0.2.1+), of the world ``trace_env``
        names."""
        return [Flag("comm.mode", "fake_backend", "tier trace")] if self.matrix.tier == "trace" else []

    def trace_env(self, cell) -> dict:
        """The world the trace tier's fake process group simulates (torchtitan reads ``NGPU``)."""
        return {"NGPU": str(cell.world)} if self.matrix.tier == "trace" else {}

    def check(self):
        check_values(self.matrix, self.AXES)
        for model, facts in self.matrix.models.items():
            unknown = set(facts or {}) - set(self.MODEL_KEYS) - set(self.MODEL_OPTIONAL)
            if unknown:
                raise MatrixError(
                    f"{self.matrix.where('models')}: models.{model}: unknown keys {sorted(unknown)}; "
                    f"allowed: {', '.join(self.MODEL_KEYS + self.MODEL_OPTIONAL)}"
                )
        for model in self.matrix.axes.get("model", []):
            facts = self.matrix.models.get(model)
            missing = [k for k in self.MODEL_KEYS if not (facts or {}).get(k)]
            if missing:
                raise MatrixError(
                    f"{self.matrix.where('models')}: models.{model} needs {', '.join(missing)} (target {self.name})"
                )

    def check_installed(self):
        """An error line when torchtitan is missing or lacks the target's trainer, or torch is outside the supported
        range. torchtitan is judged by what it ships, not its version string (main says 0.2.2)."""
        version = installed("torchtitan")
        if not version:
            return (
                f"torchtitan is not installed; target {self.name} needs one that ships {TRAINERS[self.TRAINER]} "
                f"(tested with {self.TESTED}; see README)"
            )
        if self.TRAINER not in torchtitan_trainers():
            return (
                f"target {self.name} needs a torchtitan that ships {TRAINERS[self.TRAINER]}, which the installed "
                f"torchtitan {version} (torch {installed('torch')}) lacks; tested with {self.TESTED} (see README, "
                f"'Two commands for a fresh machine')"
            )
        return next((p for p in (_unsupported(pkg, spec, self.name) for pkg, spec in self.SUPPORTS.items()) if p), None)

    def prepare(self):
        """Generate the deterministic dataset and tokenizer once per cache folder (fixtures/assets.py), unless
        torchtitan runs from a checkout that has its own."""
        if self.checkout_assets:
            return
        spec = importlib.util.spec_from_file_location("simplefsdp_assets", FIXTURES / "assets.py")
        assets = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(assets)
        assets.ensure_assets(self.assets)

    PROVES = ("torch", "torchtitan")  # what every rank records it imported (shim/provenance.py)

    def rank_command(self, module, args, env, **kw) -> RankCommand:
        """``python -m module args`` as every rank of the target runs it: what it imports proved, from a safe import
        path (Python's -P) started in the plugin's own folder: a rank started in the torchtitan checkout pytest runs
        in would import the checkout's torchtitan ahead of the environment's (Python 3.10, which has no -P, too)."""
        env = {**env, "PYTHONSAFEPATH": "1", "SIMPLEFSDP_PROVES": ",".join(self.PROVES)}
        return RankCommand([sys.executable, "-m", module, *args], env, cwd=str(self.cache_dir), **kw)

    def job_configs(self, cells):
        """The job configs (keys of ``options``) the cells start from."""
        return {self.job_config(c.axes) for c in cells}

    # axes whose values are the choices of one torchtitan option, where the installed torchtitan offers it (found in
    # its job config, never by version): a value it does not offer makes the cell n/a, not the run an error
    OFFERED_BY = {}
    IMPLICIT: dict = {}  # axis -> the value a torchtitan without the OFFERED_BY option runs (its only one)

    def not_offered(self, cell) -> str | None:
        """Why the torchtitan a cell runs on does not offer the cell's value of an ``OFFERED_BY`` axis, else None."""
        options = self.options_for(cell.axes)
        for axis, option in self.OFFERED_BY.items():
            if axis not in cell.axes or options is None:
                continue
            value, origin = str(cell.axes[axis]), options.origin
            if option not in options.names and value == self.IMPLICIT.get(axis):
                continue  # a torchtitan before the choice runs this value, the one it has
            if option not in options.names:
                return f"{origin} has no --{option}: it offers no choice of {axis}"
            choices = options.names[option]
            if choices is not None and str(spelled_value(option, value, choices)) not in choices:
                return f"{origin} offers {axis} {', '.join(c for c in choices if c != 'None')}; not {value}"
        return None

    def bind(self, cells) -> dict:
        """Read the installed torchtitan's options for every job config the cells use, and spell every cell's (and
        seed checkpoint's) flags once. An option some cells ask for and this torchtitan does not have fails those
        cells as invalid_config, named (their commands carry it: ``RankCommand.lacking``); where it leaves nothing
        to run (every cell, or a seed checkpoint, lacks one: the options moved) the run stops here, in one message
        naming every missing option, the cells that need it and what the target was tested with. Returns the cells
        it does not offer (``OFFERED_BY``): cell id -> why."""
        version = installed("torchtitan")
        env = shim_env(self.matrix.device, self.name)
        keys = sorted(self.job_configs(cells), key=str)
        origins = {(m, c): f"torchtitan {version} ({f'{m}.{c}' if m else 'JobConfig'})" for m, c in keys}
        self.options.update(read_options(keys, env, origins))
        offered = {cell.id: why for cell in cells if (why := self.not_offered(cell))}
        missing = {}  # (option, what asked for it) -> [the error, the cells (or seeds) that need it]
        jobs = [
            (cell.id, lambda c=cell: self.spell(c.axes, self.flags(c, Path("dump"), Path("seed"))))
            for cell in cells
            if cell.id not in offered
        ]
        if self.matrix.numerics:
            jobs += [
                (f"seed checkpoint of {m}", lambda m=m: self.seed_command(m, Path("seed")))
                for m in sorted({c.axes["model"] for c in cells})
            ]
        lacking = set()  # the jobs that ask for an option (or a value) this torchtitan does not have
        for name, spell in jobs:
            for e in spell().lacking:
                missing.setdefault((e.flag.name, e.flag.source), [str(e), []])[1].append(name)
                lacking.add(name)
        # (a version set's cell lacking an option is that commit's outcome, never a reason to stop)
        seeds = {name for name, _ in jobs if name.startswith("seed checkpoint of ")}
        here = {c.id for c in cells if c.id not in offered and c.axes.get("versions", INSTALLED) == INSTALLED}
        if lacking & seeds or (here and lacking >= here):
            lines = [
                f"  {source}: {error} ({len(names)} of {len(jobs)}: {', '.join(names[:3])}"
                f"{', ...' if len(names) > 3 else ''})"
                for (_, source), (error, names) in missing.items()
            ]
            raise MatrixError(
                f"{self.matrix.where('target')}: the installed torchtitan {version} cannot run what "
                f"{self.matrix.path.name} asks for; before any cell:\n"
                + "\n".join(lines)
                + f"\ntarget {self.name} was tested with {self.TESTED}: a newer torchtitan may have "
                f"moved these options (see README, 'Following torchtitan main')"
            )
        return offered

    def spell(self, axes, flags):
        options = self.options_for(axes)
        return options.spell(flags) if options else unchecked(flags)

    def options_for(self, axes):
        """The option table a cell's flags are spelled by: its version set's torchtitan where that set's environment
        is built (a torchtitan commit may have renamed options), else the installed one's (see bind)."""
        key, label = self.job_config(axes), axes.get("versions", INSTALLED)
        python = self.python_for(label) if self.python_for is not None and label != INSTALLED else None
        if python is None:
            return self.options.get(key)
        if (python, key) not in self.set_options:
            m, c = key
            origin = f"torchtitan of {label} ({f'{m}.{c}' if m else 'JobConfig'})"
            try:
                found = read_options([key], shim_env(self.matrix.device, self.name), {key: origin}, python)[key]
            except RuntimeError:  # the set's torchtitan cannot list them: flags as written, its cell says what breaks
                found = None
            self.set_options[(python, key)] = found
        return self.set_options[(python, key)]

    @property
    def spelling(self):
        """How flags are spelled: read from the installed torchtitan, or as the target writes them."""
        if self.options:
            return next(iter(self.options.values())).origin.split(" (")[0]
        return f"torchtitan {self.WRITTEN_AS} option names, unchecked (this target's torchtitan is not installed)"

    def degree_flags(self, axes):
        flags = [
            Flag(f"parallelism.{flag}", axes[axis], f"axis {axis}={axes[axis]}")
            for axis, flag in self.DEGREE_FLAGS.items()
            if axis in axes
        ]
        if axes.get("pp", 1) > 1:
            flags.append(
                Flag(
                    "parallelism.pipeline_parallel_schedule",
                    axes["pp_schedule"],
                    f"axis pp_schedule={axes['pp_schedule']}",
                )
            )
        return flags

    def feature_options(self, axes, run=0):
        """The options the cell's `feature` (matrix key `features`) sets in its run ``run`` (0: the first),
        as written there; a later run's override the first's."""
        name = axes.get("feature", "none")
        words = [*self.matrix.features.get(name, []), *(self.matrix.feature_runs[name][run - 1] if run else [])]
        return options(tokens(words))

    def feature_flags(self, axes, run=0):
        name = axes.get("feature", "none")
        return [
            Flag(key, value, f"feature {name}" + (f" run {run + 1}" if run else ""))
            for key, value in self.feature_options(axes, run).items()
            if key != "config"
        ]  # (the config is the job config the command starts from: job_config)

    # --- the probe and numerics (both generations' ranks run the shim's probe: shim/probes.py) ---------------------

    LAYOUT_RULES: tuple = ()  # judge.layout.Rule: the parameters the generation's plans lay out otherwise, and why

    @property
    def placed(self) -> tuple:
        """The degrees read per parameter that this generation's torchtitan has (0.3 has no etp: an upstream test's
        options may still name it)."""
        return tuple(d for d in PLACED if self.name in d.eras)

    def evidence_lines(self, cell) -> list:
        a = cell.axes
        return [
            *super().evidence_lines(cell),
            *(f"{d.axis}={a[d.axis]} <- effects.params of every parameter" for d in self.placed if d.axis in a),
            *([f"pp={a['pp']} <- effects.layers partitioning the blocks"] if int(a.get("pp", 1)) > 1 else []),
            "memory <- effects.memory against the layout",
        ]

    def cp_plan(self, axes) -> list:
        """CP's evidence: the mesh built with its cp dimension, and each rank's attention seeing the key/value chunks
        of that many ranks (torch's ring for SDPA, FlexAttention's all-gather; shim/effects.py) with a chunk of its own
        of seq_len / cp: a CP whose attention stays within each rank's chunk (torchtitan issue 2808) shows none."""
        if "cp" not in axes:
            return []
        cp, label = int(axes["cp"]), f"cp={axes['cp']}"
        plan = [Expect(label, "mesh.cp", str(cp), default="1", hooks=("mesh",))]
        ring = ("cp_attention",)
        if cp == 1:
            return [*plan, Expect(label, "effects.cp_ring", "none", default="none", hooks=ring)]
        seq = int(self.matrix.settings.get("seq_len", 256)) // cp
        return [
            *plan,
            Expect(label, "effects.cp_ring", str(cp), default="none", hooks=ring),
            Expect(label, "effects.cp_chunk_seq", str(seq), default="none", hooks=ring),
        ]

    def compared(self, axes) -> bool:
        """Whether the profile's numerics compare the cell (a lane takes it): only such a cell starts from the seed
        checkpoint, on the global batch, in deterministic mode."""
        numerics = self.matrix.numerics
        return bool(numerics) and lane_for(numerics.lanes, axes) is not None

    def probe_env(self) -> dict:
        """What every rank's probe records: its evidence and effects; on the real tier every optimizer step's exact
        invariants (judge.invariants); with numerics each parameter's norms (numerics.compare_params)."""
        env = {"SIMPLEFSDP_PROBE": self.name}
        if self.matrix.tier == "real":
            env["SIMPLEFSDP_INVARIANTS"] = "1"
            if self.matrix.numerics:
                env["SIMPLEFSDP_GRAD_PROBE"] = "1"
        return env

    def probed_ranks(self, cell) -> list:
        """The ranks whose records judge the cell: the trace tier runs one."""
        return [self.matrix.trace["rank"]] if self.matrix.tier == "trace" else list(range(cell.world))

    def layout_evidence(self, cell, log_dir: Path) -> list:
        """Every degree of the label per parameter on every rank, and PP's stages as a partition of the blocks
        (not on the trace tier: one rank holds one stage)."""
        ranks, records = self.probed_ranks(cell), read_probes(probe_folder(log_dir))
        found = degree_evidence(cell.axes, records, ranks, self.LAYOUT_RULES, self.placed)
        if int(cell.axes.get("pp", 1)) > 1 and self.matrix.tier != "trace":
            found.append(stage_evidence(cell.axes, records, ranks))
        return found

    def memory(self, cell, log_dir: Path):
        """The bytes every rank held after step 1 against the layout (judge.layout.Memory; None: none recorded)."""
        records = read_probes(probe_folder(log_dir))
        return memory(cell.axes, records, self.probed_ranks(cell), self.LAYOUT_RULES, self.placed)

    def losses(self, dump_folder: Path):
        """Full-precision losses (TensorBoard) where the cell wrote them; else the log's."""
        return tensorboard_losses(dump_folder)

    def numerics_flags(self, cell, seed_folder: Path | None) -> tuple[list, int]:
        """(flags, local batch) of a comparable run: one global batch, one seed checkpoint (a resumed cell loads its
        own); without numerics none, and the setting's local batch."""
        a, local_batch = cell.axes, self.matrix.settings.get("local_batch_size", 2)
        if not self.compared(a):
            return [], local_batch
        gbs = self.matrix.numerics.global_batch_size
        local_batch = max(1, gbs // (a.get("dp_replicate", 1) * a.get("dp_shard", 1)))
        local_batch = a.get("pp_microbatch", local_batch)  # a PP cell's baseline: its microbatches (baseline_axes)
        flags = [
            Flag("training.global_batch_size", gbs, "numerics.global_batch_size"),
            Flag("metrics.enable_tensorboard", True, "numerics"),
        ]
        if seed_folder is not None and self.runs(cell) == 1:
            flags += [
                Flag("checkpoint.enable", True, "numerics"),
                Flag("checkpoint.initial_load_path", seed_folder / "checkpoint" / "step-0", "numerics"),
                Flag("checkpoint.load_only", True, "numerics"),
            ]
        return flags, local_batch

    BASELINE_PP_MICROBATCH = True  # a PP cell's baseline runs its microbatches as gradient accumulation

    def baseline_axes(self, axes):
        """A cell's numerics baseline: same model and data-parallel degree (so the same data shards), SimpleFSDP
        alone (every other degree 1), plus the matrix's baseline values."""
        base = {axis: (1 if axis in self.DEGREE_FLAGS else value) for axis, value in axes.items()}
        base["dp_shard"] = axes.get("dp_replicate", 1) * axes.get("dp_shard", 1)
        if "pp_schedule" in base:
            base["pp_schedule"] = "none"
        if axes.get("pp", 1) > 1:  # the same microbatches, as gradient accumulation: torchtitan main packs one row
            # per dataloader batch (upstream 1460458), so 8 PP microbatches of 256 tokens hold other tokens than one
            # 2048-token batch would; on 0.3.0 and 0.2 it changes only the order of the sums
            base["pp_microbatch"] = 1
        base.update(self.matrix.numerics.baseline)
        return base


# what torchtitan's TP plans keep replicated over tp, in 0.2 and 0.3 alike (judge.layout.Rule)
TP_REPLICATED = (
    Rule("tp", ("*norm.weight",), "the TP plans keep RMSNorm weights replicated (SequenceParallel)"),
    Rule(
        "tp",
        ("*.attention.wkv_a.weight", "*.attention.wq_a.weight"),
        "DeepSeek-V3's TP plan keeps MLA's low-rank down-projections replicated",
    ),
    Rule("tp", ("*.moe.router.gate.weight",), "the MoE router is replicated over tp"),
)


def tensorboard_losses(dump_folder: Path, tag="loss_metrics/global_avg_loss"):
    """Full-precision losses from torchtitan's TensorBoard events (the log prints 5 decimals)."""
    files = sorted(Path(dump_folder).rglob("events.out.tfevents.*"))
    if not files:
        return {}
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return {}
    losses = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                losses[int(event.step)] = float(event.value)
    return losses
