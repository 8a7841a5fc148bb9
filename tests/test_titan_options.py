"""Flags spelled by the installed torchtitan's own job config: 0.3.0 names and the renamed ones (PR 4121).

The job configs here are small fake config modules (so the tests do not depend on torchtitan's file staying
the same); they go through the real probe subprocess, the real target and the real matrix loader.
"""

import dataclasses
import json
import os
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from pytest_simplefsdp.shim.options import walk
from pytest_simplefsdp.spec.cells import expand
from pytest_simplefsdp.spec.matrix import MatrixError, load_matrix
from pytest_simplefsdp.targets import base as targets
from pytest_simplefsdp.targets import make_target
from pytest_simplefsdp.targets.flags import ANY, Flag, Options, Spelled

from helpers import cells_of

FAKE_CONFIGS = """
from dataclasses import dataclass, field
from typing import Literal


@dataclass
class Parallelism:
    data_parallel_replicate_degree: int = 1
    data_parallel_shard_degree: int = -1
    tensor_parallel_degree: int = 1
    expert_parallel_degree: int = 1
    context_parallel_degree: int = 1
    pipeline_parallel_degree: int = 1
    pipeline_parallel_schedule: str = "1F1B"


@dataclass
class Compile:
    mode: Literal["jit", "aot_fx_trace"] | None = "aot_fx_trace"
    backend: str = "aot_eager"
    memory_policy: Literal["default", "full"] = "default"
    {inductor}


@dataclass
class Training:
    steps: int = 10
    disable_cuda_graphs: bool = False
    {batch}


@dataclass
class Debug:
    seed: int = 0
    deterministic: bool = False


@dataclass
class Metrics:
    log_freq: int = 10
    disable_color_printing: bool = False
    enable_tensorboard: bool = False


@dataclass
class Checkpoint:
    enable: bool = False
    initial_load_path: str = ""
    load_only: bool = False
    create_seed_checkpoint: bool = False


@dataclass
class Dataloader:
    dataset_path: str = ""


@dataclass
class Config:
    parallelism: Parallelism = field(default_factory=Parallelism)
    compile: Compile = field(default_factory=Compile)
    training: Training = field(default_factory=Training)
    debug: Debug = field(default_factory=Debug)
    metrics: Metrics = field(default_factory=Metrics)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    dataloader: Dataloader = field(default_factory=Dataloader)
    hf_assets_path: str = ""
    dump_folder: str = ""


def debugmodel():
    return Config()
"""
OLD_BATCH = "seq_len: int = 2048\n    local_batch_size: int = 8\n    global_batch_size: int = -1"
NEW_BATCH = (
    "max_context_length: int = 2048\n    num_tokens_per_microbatch_per_dp_rank: int = 8192\n"
    "    num_tokens_per_train_step: int = -1"
)
INDUCTOR = 'inductor_compilation: Literal["regional", "full"] = "regional"'

MATRIX = """\
profile: fake-titan
target: titan03
device: cuda   # no CPU shim: the fake config needs no torch
world_sizes: [2]
degrees: [dp_shard]
settings: {{steps: 3, seq_len: 256, local_batch_size: 2, seed: 42}}
models:
  llama3: {{module: {module}, config: debugmodel}}
axes:
  model: [llama3]
  dp_shard: [2]
  compile: [{compile}]
  backend: [{backend}]
  memory_policy: [default]
numerics:
  global_batch_size: 8
  baseline: {{compile: aot_fx_trace}}
  lanes: [{{name: exact, match: [{{dp_shard: 2}}]}}]
"""


@pytest.fixture
def fake_torchtitan(tmp_path, monkeypatch):
    """Writes a fake config module and a matrix on it; returns (target, cells) after bind()."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the ranks' path: the probe reads the same module
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def make(name, batch=OLD_BATCH, inductor=INDUCTOR, compile="aot_fx_trace", backend="aot_eager"):
        (tmp_path / f"{name}.py").write_text(FAKE_CONFIGS.format(batch=batch, inductor=inductor))
        path = tmp_path / f"{name}.yaml"
        path.write_text(MATRIX.format(module=name, compile=compile, backend=backend))
        target = make_target(load_matrix(path), tmp_path)
        cells, _ = expand(target.matrix)
        target.bind(cells)
        return target, cells

    return make


def argv_of(target, cell, tmp_path):
    return target.command(cell, dump_folder=tmp_path / "dump", seed_folder=tmp_path / "seed").argv


def test_the_installed_config_spells_the_0_3_0_names(fake_torchtitan, tmp_path):
    target, (cell,) = fake_torchtitan("titan_0_3_0")
    argv = " ".join(argv_of(target, cell, tmp_path))
    assert "--training.seq_len 256 --training.local_batch_size 4" in argv
    assert "--training.global_batch_size 8" in argv
    assert "--compile.mode aot_fx_trace --compile.inductor_compilation regional" in argv
    assert target.spelling.startswith("torchtitan ")


def test_renamed_options_are_spelled_and_converted_to_tokens(fake_torchtitan, tmp_path):
    """torchtitan PR 4121: seq_len -> max_context_length; batches in tokens (batch x seq_len)."""
    target, (cell,) = fake_torchtitan("titan_main", batch=NEW_BATCH)
    argv = argv_of(target, cell, tmp_path)
    joined = " ".join(argv)
    assert "--training.max_context_length 256" in joined
    assert "--training.num_tokens_per_microbatch_per_dp_rank 1024" in joined  # 8 // dp 2 = 4 sequences x 256
    assert "--training.num_tokens_per_train_step 2048" in joined  # 8 sequences x 256
    assert not any(
        a in argv for a in ("--training.seq_len", "--training.local_batch_size", "--training.global_batch_size")
    )
    seed = " ".join(target.seed_command("llama3", tmp_path / "seed").argv)
    assert "--checkpoint.create_seed_checkpoint" in seed and "--dump_folder" in seed


def test_a_pp_cell_on_main_gets_as_many_microbatches_as_on_0_3_0(tmp_path, monkeypatch):
    """PR 4121 counts pipeline microbatches (default: one) where 0.3.0 sized them (default: one sequence): a PP cell
    writes 0.3.0's size out, and main gets local batch / size microbatches of that many sequences' tokens each."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    configs = FAKE_CONFIGS.format(batch=NEW_BATCH, inductor=INDUCTOR).replace(
        '    pipeline_parallel_schedule: str = "1F1B"\n',
        '    pipeline_parallel_schedule: str = "1F1B"\n    num_pp_microbatches: int = 1\n',
    )
    (tmp_path / "titan_pp.py").write_text(configs)
    path = tmp_path / "titan_pp.yaml"
    path.write_text(
        MATRIX.format(module="titan_pp", compile="aot_fx_trace", backend="aot_eager")
        .replace("degrees: [dp_shard]", "degrees: [dp_shard, pp]")
        .replace("  dp_shard: [2]\n", "  dp_shard: [1]\n  pp: [2]\n  pp_schedule: [Interleaved1F1B]\n")
        .replace("match: [{dp_shard: 2}]", "match: [{pp: 2}]")
    )
    target = make_target(load_matrix(path), tmp_path)
    cells, _ = expand(target.matrix)
    target.bind(cells)
    argv = " ".join(argv_of(target, cells[0], tmp_path))
    assert "--parallelism.num_pp_microbatches 8" in argv  # global batch 8 on one dp rank, microbatches of 1
    assert "--training.num_tokens_per_microbatch_per_dp_rank 256" in argv  # one microbatch: one sequence of 256
    assert "--training.num_tokens_per_train_step 2048" in argv and "pipeline_parallel_microbatch_size" not in argv


def test_cuda_graphs_are_left_out_as_main_of_spring_2026_spells_it(tmp_path, monkeypatch):
    """Main of May 2026 had no --training.disable_cuda_graphs: its cudagraph_pass ran unless --compile.disable_passes
    named it (and a CPU rank died in torch.cuda); a torchtitan with neither gets no flag at all."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argvs = {}
    for name, passes in (
        ("titan_may", "    disable_passes: list[str] = field(default_factory=list)\n"),
        ("titan_mar", ""),
    ):
        configs = FAKE_CONFIGS.format(batch=OLD_BATCH, inductor=INDUCTOR).replace(
            "    disable_cuda_graphs: bool = False\n", ""
        )
        (tmp_path / f"{name}.py").write_text(
            configs.replace('    backend: str = "aot_eager"\n', f'    backend: str = "aot_eager"\n{passes}')
        )
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            MATRIX.format(module=name, compile="aot_fx_trace", backend="aot_eager").replace(
                "device: cuda", "device: cpu"
            )
        )
        target = make_target(load_matrix(path), tmp_path)
        cells, _ = expand(target.matrix)
        target.bind(cells)
        argvs[name] = " ".join(argv_of(target, cells[0], tmp_path))
    assert "--compile.disable_passes cudagraph_pass" in argvs["titan_may"]
    assert "--compile.disable_passes" not in argvs["titan_mar"]
    assert "--training.disable_cuda_graphs" not in argvs["titan_mar"]


def test_a_version_sets_cells_are_spelled_by_its_own_torchtitan(fake_torchtitan, tmp_path):
    """A version set whose environment is built (here: a Python that sees the renamed config of PR 4121) spells
    its cells with that torchtitan's names; the installed versions' cells keep the installed names."""
    target, (cell,) = fake_torchtitan("titan_set")
    other = tmp_path / "other"
    other.mkdir()
    (other / "titan_set.py").write_text(FAKE_CONFIGS.format(batch=NEW_BATCH, inductor=INDUCTOR))
    python = tmp_path / "set-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={other}:$PYTHONPATH exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    asked = []
    target.python_for = lambda label: asked.append(label) or str(python)
    in_set = dataclasses.replace(cell, axes={**cell.axes, "versions": "torchtitan@abc123"})
    assert "--training.max_context_length 256" in " ".join(argv_of(target, in_set, tmp_path))
    installed = " ".join(argv_of(target, cell, tmp_path))
    assert "--training.seq_len 256" in installed and "max_context_length" not in installed
    assert asked == ["torchtitan@abc123"]  # the installed versions never ask; the set's table is read once
    argv_of(target, in_set, tmp_path)
    assert asked == ["torchtitan@abc123", "torchtitan@abc123"] and len(target.set_options) == 1
    # a flag the set's torchtitan has no spelling of goes as written and is named: the cell fails as invalid_config
    # on that version, unlaunched (a bisection can find the commit), not an error of the plugin
    gone_folder = tmp_path / "gone"
    gone_folder.mkdir()
    (gone_folder / "titan_set.py").write_text(
        FAKE_CONFIGS.format(batch=NEW_BATCH, inductor=INDUCTOR).replace("    dataset_path: str", "    grain_path: str")
    )
    python.write_text(f'#!/bin/sh\nPYTHONPATH={gone_folder}:$PYTHONPATH exec {sys.executable} "$@"\n')
    moved = tmp_path / "gone-python"  # (another interpreter: another table, not the one kept for the first)
    python.rename(moved)
    target.python_for = lambda label: str(moved)
    command = target.command(in_set, dump_folder=tmp_path / "dump", seed_folder=tmp_path / "seed")
    gone = " ".join(command.argv)
    assert "--training.max_context_length 256" in gone and "--dataloader.dataset_path " in gone
    assert [e.line() for e in command.lacking] == ["this torchtitan has no --dataloader.dataset_path (target)"]
    # a commit after the grain change (upstream 1460458) whose config module sets the dataset in Python: the set's
    # table says so, and its cells pass it to that module, as a bisection across the change needs
    grain = tmp_path / "grain"
    grain.mkdir()
    (grain / "titan_set.py").write_text(grain_module())
    python.write_text(f'#!/bin/sh\nPYTHONPATH={grain}:$PYTHONPATH exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    after = tmp_path / "grain-python"
    python.rename(after)
    target.python_for = lambda label: str(after)
    command = target.command(in_set, dump_folder=tmp_path / "dump", seed_folder=tmp_path / "seed")
    assert "--dataloader.dataset_path" not in command.argv and "--training.max_context_length" in command.argv
    assert json.loads(command.env["SIMPLEFSDP_CONFIG_SET"]) == {"dataloader.dataset_path": target.dataset}


def test_a_value_the_installed_torchtitan_cannot_express_fails_collection(fake_torchtitan):
    with pytest.raises(MatrixError) as e:
        fake_torchtitan("titan_no_full", inductor="", backend="inductor")
    msg = str(e.value)
    assert "titan_no_full.yaml:" in msg  # the matrix file and line
    assert "axis backend=inductor: needs --compile.inductor_compilation, which torchtitan" in msg
    assert "(titan_no_full.debugmodel)" in msg and "(1 of 2: llama3-2-aot_fx_trace-inductor-default)" in msg


# torchtitan main since the grain dataloader (upstream 1460458): no dataset_path; the dataset is a config object
GRAIN = """
@dataclass
class Source:
    path: str = "json"
    split: str = "train"
    load_dataset_kwargs: dict = field(default_factory=lambda: {"data_files": "tests/assets/c4_test/data.json"})


@dataclass
class Hub:
    path: str = "allenai/c4"
    split: str = "validation"
    name: str = "en"
    load_dataset_kwargs: dict = field(default_factory=dict)


@dataclass
class Dataloader:
    source: Source = field(default_factory=Source)
    validation: Hub = field(default_factory=Hub)
"""


def grain_module(sources: bool = True) -> str:
    """main's grain config (the dataset a file source object), or, ``sources=False``, a dataloader that takes its
    dataset neither way (what a torchtitan that moved it elsewhere would look like)."""
    old = FAKE_CONFIGS.format(batch=NEW_BATCH, inductor=INDUCTOR)
    text = old.replace(
        '@dataclass\nclass Dataloader:\n    dataset_path: str = ""\n',
        GRAIN if sources else "@dataclass\nclass Dataloader:\n    workers: int = 1\n",
    )
    assert text != old
    return text


def test_an_option_this_torchtitan_takes_only_in_python_goes_to_the_config_module(fake_torchtitan, tmp_path):
    """A job config that holds its dataset as a file source (main's grain): the option leaves the command line and
    reaches the ranks as $SIMPLEFSDP_CONFIG_SET, for the cells and the seed checkpoint alike, whatever config module
    it is (nothing in the module says so); the other flags stay flags."""
    (tmp_path / "titan_grain.py").write_text(grain_module())
    path = tmp_path / "titan_grain.yaml"
    path.write_text(MATRIX.format(module="titan_grain", compile="aot_fx_trace", backend="aot_eager"))
    target = make_target(load_matrix(path), tmp_path)
    cells, _ = expand(target.matrix)
    target.bind(cells)
    for command in (
        target.command(cells[0], dump_folder=tmp_path / "dump", seed_folder=tmp_path / "seed"),
        target.seed_command("llama3", tmp_path / "seed"),
    ):
        assert "--dataloader.dataset_path" not in command.argv and "--hf_assets_path" in command.argv
        assert json.loads(command.env["SIMPLEFSDP_CONFIG_SET"]) == {"dataloader.dataset_path": target.dataset}


def test_what_the_installed_torchtitan_lacks_is_said_once_before_any_cell(fake_torchtitan, tmp_path):
    """A torchtitan whose config takes the dataset neither on its command line nor as a file source: one error before
    the first cell, naming the option, how many cells (and seed checkpoints) need it, and what was tested."""
    (tmp_path / "titan_moved.py").write_text(grain_module(sources=False))
    path = tmp_path / "titan_moved.yaml"
    path.write_text(
        MATRIX.format(module="titan_moved", compile="aot_fx_trace", backend="aot_eager")
        .replace("dp_shard: [2]", "dp_shard: [2, 4]")
        .replace("world_sizes: [2]", "world_sizes: [2, 4]")
    )
    target = make_target(load_matrix(path), tmp_path)
    cells, _ = expand(target.matrix)
    with pytest.raises(MatrixError) as e:
        target.bind(cells)
    msg = str(e.value)
    assert msg.count("--dataloader.dataset_path") == 1, msg
    assert "target: needs --dataloader.dataset_path, which torchtitan" in msg
    assert f"({len(cells) + 1} of {len(cells) + 1}: " in msg and "seed checkpoint of llama3" in msg
    assert "target titan03 was tested with torchtitan 0.3.0 and main up to b5bcd76c6 (2026-08-21)" in msg


def test_a_cell_asking_for_an_option_this_torchtitan_lacks_fails_as_invalid_config_unlaunched(
    pytester, tmp_path, monkeypatch
):
    """A torchtitan before ``--compile.inductor_compilation`` (main of March 2026): its eager cell runs as listed, the
    aot_fx_trace cell, which asks for that option, fails as invalid_config naming the option and the axis that asked
    for it, without a launch; the run goes on (before: one error stopped the whole run before any cell)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(pytester.path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (pytester.path / "titan_march.py").write_text(FAKE_CONFIGS.format(batch=OLD_BATCH, inductor=""))
    path = pytester.path / "titan_march.yaml"
    path.write_text(
        MATRIX.format(module="titan_march", compile="eager, aot_fx_trace", backend="aot_eager")
        .split("numerics:")[0]
        .replace("device: cuda", "device: cpu")  # (a cell that is not launched needs no device)
    )
    target = make_target(load_matrix(path), pytester.path)
    cells, _ = expand(target.matrix)
    assert target.bind(cells) == {}  # no stop: the eager cell can run
    commands = {c.axes["compile"]: target.command(c, dump_folder=tmp_path / "dump") for c in cells}
    assert commands["eager"].lacking == ()
    (error,) = commands["aot_fx_trace"].lacking
    assert (error.flag.name, error.flag.source) == ("compile.inductor_compilation", "axis backend=aot_eager")
    dry = pytester.runpytest_subprocess(
        "--simplefsdp-matrix", f"--simplefsdp-matrix-file={path}", "--simplefsdp-dry-run", "-p", "no:cacheprovider"
    )
    assert dry.ret == 0, dry.stdout.str()[-3000:]
    dry.stdout.fnmatch_lines(
        ["*-aot_fx_trace-*", "  invalid_config, not launched: needs --compile.inductor_compilation, which torchtitan*"]
    )
    out = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix",
        f"--simplefsdp-matrix-file={path}",
        "-k",
        "aot_fx_trace",
        f"--simplefsdp-json={out}",
        f"--simplefsdp-artifacts={pytester.path / 'runs'}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(failed=1, deselected=1)
    (cell,) = cells_of(out).values()
    assert cell["failure_class"] == "invalid_config", cell
    assert cell["error_line"] == (
        "this torchtitan has no --compile.inductor_compilation (axis backend=aot_eager): not launched"
    )
    assert not list((pytester.path / "runs").rglob("rank*.log"))  # nothing was launched


def test_the_rank_shim_sets_the_dataset_on_whichever_config_torchtitan_loads(monkeypatch, tmp_path):
    """shim.options on a stand-in of main's grain config: python_options names the dataset, and config_set (what every
    rank installs where $SIMPLEFSDP_CONFIG_SET is set) points every file source of the config (training and validation)
    at our data on the config ConfigManager loads, a copy, for any config function; the CLI option's config (0.3.0)
    needs nothing in Python and refuses a value there."""
    import types

    from pytest_simplefsdp.shim import options

    namespace = {}
    exec(compile(grain_module(), "grain", "exec"), namespace)
    job = namespace["Config"]()
    assert options.python_options(job) == ["dataloader.dataset_path"]
    loaded = []

    class ConfigManager:  # torchtitan.config.manager's, as far as the shim reaches it
        def _load_config(self, args):
            loaded.append(args)
            return job, [a for a in args if not a.startswith("--module")]

    manager = types.ModuleType("torchtitan.config.manager")
    manager.ConfigManager = ConfigManager
    monkeypatch.setitem(sys.modules, "torchtitan.config.manager", manager)
    options.config_set()
    monkeypatch.setenv("SIMPLEFSDP_CONFIG_SET", json.dumps({"dataloader.dataset_path": str(tmp_path / "c4")}))
    got, rest = ConfigManager()._load_config(["--module=anything", "--training.steps", "2"])
    assert rest == ["--training.steps", "2"] and loaded
    assert got.dataloader.source.load_dataset_kwargs == {"data_files": str(tmp_path / "c4" / "data.json")}
    hub = got.dataloader.validation  # the hub's c4 (an 8B config's): our file instead, as 0.3.0's option did
    assert (hub.path, hub.split, hub.name, hub.load_dataset_kwargs) == (
        "json",
        "train",
        None,
        {"data_files": str(tmp_path / "c4" / "data.json")},
    )
    assert job.dataloader.source.load_dataset_kwargs["data_files"] == "tests/assets/c4_test/data.json"  # a copy
    monkeypatch.delenv("SIMPLEFSDP_CONFIG_SET")
    assert ConfigManager()._load_config([])[0] is job  # nothing asked: the config as loaded
    old = FAKE_CONFIGS.format(batch=NEW_BATCH, inductor=INDUCTOR)
    exec(compile(old, "old", "exec"), namespace)  # 0.3.0: the CLI option, nothing in Python
    assert options.python_options(namespace["Config"]()) == []
    with pytest.raises(ValueError, match="takes dataloader.dataset_path on its command line"):
        options.set_in_python(namespace["Config"](), {"dataloader.dataset_path": "x"})


def test_a_literal_value_outside_the_choices_is_named_as_lacking():
    """A value the option does not take goes as written and is named: the cell fails as invalid_config, unlaunched."""
    options = Options({"compile.mode": ["aot_fx_trace", "None"]}, "torchtitan 9.9 (fake)")
    spelled = options.spell([Flag("compile.mode", "jit", "axis compile=jit")])
    (error,) = spelled.lacking
    assert str(error) == "--compile.mode jit: torchtitan 9.9 (fake) accepts aot_fx_trace, None"
    assert error.line() == "this torchtitan's --compile.mode does not take jit (axis compile=jit)"
    assert spelled.argv == ["--compile.mode", "jit"]
    assert options.spell([Flag("compile.mode", "None")]) == Spelled(["--compile.mode", "None"], {})


def test_a_compiler_bisection_probe_spells_its_passes_as_tyro_takes_them():
    """All optional passes off: tyro's negated switch (``--compile.enable_passes False`` is refused as an extra
    argument); some off: one comma list, with what the cell's own flags turned off kept."""
    from pytest_simplefsdp.spec.cells import Passes
    from pytest_simplefsdp.targets.titan03 import with_passes

    options = Options({"compile.enable_passes": ANY, "compile.disable_passes": ANY}, "torchtitan 9.9 (fake)")
    every = with_passes([Flag("compile.mode", "aot_fx_trace")], Passes(every=True))
    assert options.spell(every).argv == ["--compile.mode", "aot_fx_trace", "--compile.no_enable_passes"]
    own = [Flag("compile.disable_passes", "cudagraph_pass", "upstream test")]
    some = with_passes(own, Passes(off=("regional_inductor_pass", "cudagraph_pass")))
    assert options.spell(some).argv == ["--compile.disable_passes", "cudagraph_pass,regional_inductor_pass"]
    assert with_passes(own, None) == own


def test_walk_reads_nested_options_and_their_choices():
    @dataclass
    class Inner:
        mode: Optional[Literal["a", "b"]] = "a"
        count: int = 1

    @dataclass
    class Outer:
        inner: Inner = field(default_factory=Inner)
        path: str = ""

    assert walk(Outer()) == {"inner.mode": ["a", "b", "None"], "inner.count": None, "path": None}


@pytest.mark.parametrize(
    "installed, trainers, expected",
    [
        ({"torchtitan": "0.3.0", "torch": "2.14.1"}, {"graph_trainer"}, None),
        ({"torchtitan": "0.3.0", "torch": "2.15.0.dev20261101"}, {"graph_trainer"}, None),  # main tracks the nightly
        # torchtitan main says 0.2.2 and ships graph_trainer: judged by what it ships, not by its version string
        ({"torchtitan": "0.2.2", "torch": "2.14.1"}, {"graph_trainer"}, None),
        (
            {"torchtitan": "0.3.0", "torch": "2.13.0"},
            {"graph_trainer"},
            "target titan03 supports torch >=2.14,<2.16, but torch 2.13.0 is installed (torch 2.13.0, torchtitan 0.3.0)",
        ),
        (
            {"torchtitan": "0.2.0", "torch": "2.14.1"},
            {"simple_fsdp"},
            "target titan03 needs a torchtitan that ships experiments/graph_trainer, which the installed torchtitan 0.2.0 "
            "(torch 2.14.1) lacks; tested with torchtitan 0.3.0 and main up to b5bcd76c6",
        ),
        (
            {"torch": "2.14.1"},
            set(),
            "torchtitan is not installed; target titan03 needs one that ships experiments/graph_trainer",
        ),
    ],
)
def test_what_the_installed_torchtitan_ships_and_the_torch_range_decide(
    monkeypatch, tmp_path, installed, trainers, expected
):
    monkeypatch.setattr(targets, "installed", installed.get)
    monkeypatch.setattr(targets, "torchtitan_trainers", lambda: trainers)
    matrix = tmp_path / "m.yaml"
    matrix.write_text(MATRIX.format(module="m", compile="eager", backend="aot_eager"))
    problem = make_target(load_matrix(matrix), tmp_path).check_installed()
    assert (problem is None) if expected is None else (expected in problem), problem


def test_an_unsupported_torch_stops_the_run_before_any_cell(pytester):
    """A clear usage error at collection, never a half-run matrix."""
    pytester.makeconftest(
        textwrap.dedent("""\
        from pytest_simplefsdp.targets import base as targets
        targets.installed = {"torch": "2.13.0", "torchtitan": "0.3.0"}.get
        """)
    )
    result = pytester.runpytest_subprocess("--simplefsdp-matrix", "--simplefsdp-profile=cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*target titan03 supports torch >=2.14,<2.16, but torch 2.13.0 is installed*"])
    assert not (pytester.path / ".simplefsdp" / "runs").exists()


def test_a_checkout_whose_c4_sample_is_absent_trains_on_our_assets(tmp_path, monkeypatch):
    """A clone without its large files (GitHub's copy of main lacks tests/assets/c4_test/data.json) leaves the folder
    empty: its cells would fail reading no data, so the checkout's assets are used only with the sample in them."""
    monkeypatch.setattr(targets, "source_checkout", lambda name: None)
    (tmp_path / "torchtitan").mkdir()
    (tmp_path / "tests/assets/tokenizer").mkdir(parents=True)
    (tmp_path / "tests/assets/tokenizer/tokenizer.json").write_text("{}")
    (tmp_path / "tests/assets/c4_test").mkdir()
    assert targets.checkout_assets(tmp_path) is None
    (tmp_path / "tests/assets/c4_test/data.json").write_text('{"text": "a"}\n')
    assert targets.checkout_assets(tmp_path) == tmp_path / "tests" / "assets"


def test_a_dry_run_without_the_targets_torchtitan_says_its_flags_are_unchecked(monkeypatch):
    from pytest_simplefsdp.paths import MATRIX_DIR

    monkeypatch.setattr(targets, "installed", {"torch": "2.14.1", "torchtitan": "0.3.0"}.get)
    monkeypatch.setattr(targets, "torchtitan_trainers", lambda: {"graph_trainer"})
    target = make_target(load_matrix(MATRIX_DIR / "titan02-cpu.yaml"), MATRIX_DIR)
    assert target.check_installed().startswith("target titan02 needs a torchtitan that ships experiments/simple_fsdp")
    assert target.spelling == "torchtitan 0.2.0 option names, unchecked (this target's torchtitan is not installed)"


SPMD = '    pipeline_parallel_schedule: str = "1F1B"\n'


def spmd_module(tmp_path, name, field):
    """The fake config with ``field`` added to its parallelism section (main's spmd_backend, or none)."""
    (tmp_path / f"{name}.py").write_text(
        FAKE_CONFIGS.format(batch=OLD_BATCH, inductor=INDUCTOR).replace(SPMD, SPMD + field)
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        MATRIX.format(module=name, compile="aot_fx_trace", backend="aot_eager")
        .replace(
            "  memory_policy: [default]\n",
            "  memory_policy: [default]\n  spmd_backend: [partial_dtensor, full_dtensor, spmd_types]\n",
        )
        .replace("match: [{dp_shard: 2}]", "match: [{dp_shard: 2, spmd_backend: partial_dtensor}]")
        .replace(
            "baseline: {compile: aot_fx_trace}", "baseline: {compile: aot_fx_trace, spmd_backend: partial_dtensor}"
        )
    )
    return path


def test_the_spmd_backend_axis_offers_what_the_installed_torchtitan_offers(tmp_path, monkeypatch):
    """An axis whose values are one option's choices (OFFERED_BY): where the installed config offers a value, the cell
    sets it and its evidence reads what the run used; a value it does not offer (main dropped full_dtensor), or an
    option it does not have (torchtitan before #4085), makes the cell n/a with that reason, not the run an error."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    main = spmd_module(
        tmp_path, "titan_spmd", '    spmd_backend: Literal["partial_dtensor", "spmd_types"] = "spmd_types"\n'
    )
    target = make_target(load_matrix(main), tmp_path)
    cells, _ = expand(target.matrix)
    assert target.bind(cells) == {
        "llama3-2-aot_fx_trace-aot_eager-default-full_dtensor": (
            "torchtitan 0.3.0 (titan_spmd.debugmodel) offers spmd_backend partial_dtensor, spmd_types; not full_dtensor"
        )
    }
    spmd = next(c for c in cells if c.axes["spmd_backend"] == "spmd_types")
    assert "--parallelism.spmd_backend spmd_types" in " ".join(argv_of(target, spmd, tmp_path))
    plan = {e.axis: (e.key, e.value) for e in target.evidence_plan(spmd)}
    assert plan["spmd_backend=spmd_types"] == ("effects.spmd_backend", "spmd_types")
    # no such option (main before PR 3466): no choice to make; the one path it runs (partial_dtensor) runs, without
    # the flag, the other values are n/a
    before = spmd_module(tmp_path, "titan_no_spmd", "")
    target = make_target(load_matrix(before), tmp_path)
    cells, _ = expand(target.matrix)
    why = target.bind(cells)
    assert len(why) == 2 and set(why.values()) == {
        "torchtitan 0.3.0 (titan_no_spmd.debugmodel) has no --parallelism.spmd_backend: it offers no choice of "
        "spmd_backend"
    }
    (implicit,) = [c for c in cells if c.id not in why]
    assert implicit.axes["spmd_backend"] == "partial_dtensor"
    assert "--parallelism.spmd_backend" not in " ".join(argv_of(target, implicit, tmp_path))
    # PR 3466 named that path "default": a torchtitan offering default, full_dtensor and spmd_types spells it so
    june = spmd_module(
        tmp_path, "titan_june", '    spmd_backend: Literal["default", "full_dtensor", "spmd_types"] = "default"\n'
    )
    target = make_target(load_matrix(june), tmp_path)
    cells, _ = expand(target.matrix)
    assert target.bind(cells) == {}
    partial = next(c for c in cells if c.axes["spmd_backend"] == "partial_dtensor")
    assert "--parallelism.spmd_backend default" in " ".join(argv_of(target, partial, tmp_path))


def test_cells_not_offered_are_listed_as_n_a_with_their_reason(pytester, tmp_path, monkeypatch):
    """Through the session: the cell the installed torchtitan does not offer joins the n/a cells (the dry run counts
    it; the run's JSON names its rule and reason), and the rest run as listed."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(pytester.path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = spmd_module(
        pytester.path, "titan_spmd_run", '    spmd_backend: Literal["partial_dtensor", "spmd_types"] = "spmd_types"\n'
    )
    result = pytester.runpytest_subprocess(
        "--simplefsdp-matrix", f"--simplefsdp-matrix-file={path}", "--simplefsdp-dry-run", "-p", "no:cacheprovider"
    )
    result.stdout.fnmatch_lines(["*titan_spmd_run.yaml: 2 valid cells, 1 n/a*"])
    assert "full_dtensor SKIPPED" not in result.stdout.str()


# the options of torchtitan 0.2's JobConfig (with simple_fsdp's) that a titan02-cpu cell sets, per release
SEED_ERA = [
    *("job.config_file", "job.custom_config_module", "job.dump_folder", "model.name", "model.flavor"),
    *(f"parallelism.{d}" for d in ("data_parallel_replicate_degree", "data_parallel_shard_degree")),
    *(f"parallelism.{d}" for d in ("tensor_parallel_degree", "expert_parallel_degree", "pipeline_parallel_degree")),
    *("parallelism.expert_tensor_parallel_degree", "parallelism.context_parallel_degree", "compile.enable"),
    *("compile.backend", "activation_checkpoint.mode"),
    *("training.steps", "training.seq_len", "training.local_batch_size", "metrics.log_freq"),
    *("metrics.disable_color_printing", "model.hf_assets_path", "training.dataset_path"),
]
RELEASES = {
    "0.2.0": {"training.seed", "training.deterministic", "compile.model_backend_override"},
    "0.2.2": {"debug.seed", "debug.deterministic", "compile.graph_passes", "comm.mode"},
}


def seed_era_target(monkeypatch, release, name="titan02-cpu.yaml", gpus=0, tier="real"):
    """The titan02 target on a shipped profile, bound to the option table of a fake torchtitan ``release``."""
    from pytest_simplefsdp.paths import MATRIX_DIR
    from pytest_simplefsdp.spec.matrix import with_tier

    torch = {"0.2.0": "2.10.0", "0.2.2": "2.11.0"}[release]  # the torch each was released against
    monkeypatch.setattr(targets, "installed", {"torch": torch, "torchtitan": release}.get)
    monkeypatch.setattr(targets, "torchtitan_trainers", lambda: {"simple_fsdp"})
    matrix = load_matrix(MATRIX_DIR / name)
    target = make_target(with_tier(matrix, tier, gpus) if gpus else with_tier(matrix, tier), MATRIX_DIR)
    choices = {"compile.graph_passes": ("auto_bucketing", "transformer_block_bucketing"), "comm.mode": None}
    names = {n: choices.get(n) for n in [*SEED_ERA, *RELEASES[release]]}
    target.options[target.job_config({})] = Options(names, f"torchtitan {release} (JobConfig)")
    return target, {c.id: c for c in expand(target.matrix)[0]}


@pytest.mark.parametrize("release", ["0.2.0", "0.2.2"])
def test_the_seed_era_is_spelled_by_the_installed_release_without_a_forced_deterministic_mode(
    monkeypatch, tmp_path, release
):
    """titan02 writes 0.2.0's names; 0.2.1 moved the seed under [debug] (PR 1807) and chose SimpleFSDP's bucketing
    pass by --compile.graph_passes (PR 1881): each release gets its own spelling, no profile without numerics gets
    deterministic mode, and torch 2.11 (0.2.2's) is in the target's range."""
    target, cells = seed_era_target(monkeypatch, release)
    assert target.check_installed() is None
    argv = " ".join(map(str, target.command(cells["llama3-dp2-compiled-autobucketing"], tmp_path / "dump").argv))
    if release == "0.2.0":
        assert "--training.seed 42" in argv and "--compile.model_backend_override aot_eager_autobucketing" in argv
    else:
        assert "--debug.seed 42" in argv and "--compile.graph_passes auto_bucketing" in argv
        assert "--training.seed" not in argv and "model_backend_override" not in argv
    assert "deterministic" not in argv


def test_the_seed_eras_torch_range_ends_before_2_12(monkeypatch):
    target, _ = seed_era_target(monkeypatch, "0.2.2")
    monkeypatch.setattr(targets, "installed", {"torch": "2.12.0", "torchtitan": "0.2.2"}.get)
    assert "target titan02 supports torch >=2.10,<2.12, but torch 2.12.0 is installed" in target.check_installed()


def test_deterministic_mode_only_where_numerics_compare_the_cell(fake_torchtitan, tmp_path, monkeypatch):
    """A profile with numerics runs its cells deterministic (their losses are compared bitwise or within a noise
    tolerance); the same profile without numerics does not force it."""
    target, (cell,) = fake_torchtitan("titan_numerics")
    assert "--debug.deterministic" in argv_of(target, cell, tmp_path)
    target.matrix = dataclasses.replace(target.matrix, numerics=None)
    assert "--debug.deterministic" not in argv_of(target, cell, tmp_path)


def test_the_seed_eras_trace_tier_runs_on_one_gpu_where_one_is_visible(monkeypatch, tmp_path):
    """titan02-h100x8's trace tier: on a CPU machine one simulated rank with the CPU settings (aot_eager, CPU
    patches); with a GPU visible the profile's own settings (inductor, seq_len 2048) on CUDA, no CPU patches; both
    over 0.2.2's fake process group (--comm.mode fake_backend, NGPU the simulated world)."""
    for gpus, device, backend in ((0, "cpu", "aot_eager"), (1, "cuda", "inductor")):
        target, cells = seed_era_target(monkeypatch, "0.2.2", "titan02-h100x8.yaml", gpus, "trace")
        assert str(target.matrix.device) == device
        command = target.command(cells["llama3-dpr2-dp2-tp2-compiled"], tmp_path / "dump")
        argv = " ".join(map(str, command.argv))
        assert "--comm.mode fake_backend" in argv and f"--compile.backend {backend}" in argv
        assert command.env["NGPU"] == "8" and ("SIMPLEFSDP_CPU_SHIM" in command.env) is (device == "cpu")
        assert ("--training.seq_len 2048" in argv) is (device == "cuda")
