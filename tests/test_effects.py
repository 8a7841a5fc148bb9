"""Evidence from effects: for every axis of the CPU profile, torchtitan is made to accept the option and then ignore
it (a copy of the installed torchtitan, patched where the option takes effect, first on the path), and the cell's
evidence must fail for that axis. The run exits 0 and trains in each: only what the run did tells.

Each patch prints ``[injected] <axis> accepted and ignored`` into the rank logs where it acts; a run where it
did not print is not a proof of anything, and the test says so."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_simplefsdp.paths import MATRIX_DIR

from helpers import cells_of

titan = pytest.importorskip("torchtitan", reason="torchtitan is the system under test: pip install torchtitan==0.3.0")
if not __import__("importlib.metadata").metadata.version("torchtitan").startswith("0.3."):
    pytest.skip("these cells are torchtitan 0.3's (tox -e titan03)", allow_module_level=True)

pytestmark = pytest.mark.real

IGNORED = 'getattr(__import__("torchtitan._ignored"), "_ignored").ignored'
HELPER = '''import json, os, sys


def ignored(axis):
    """True (and says so in the rank's log) when this rank's cell is to accept ``axis`` and ignore it:
    $SIMPLEFSDP_TEST_IGNORE maps cell ids to the axis each ignores; the cell is the one whose evidence folder
    (runs/<profile>/<cell>/evidence) the rank writes into."""
    cell = os.path.basename(os.path.dirname(os.environ.get("SIMPLEFSDP_EVIDENCE_DIR", "")))
    hit = json.loads(os.environ.get("SIMPLEFSDP_TEST_IGNORE", "{}")).get(cell) == axis
    if hit:
        print(f"[injected] {axis} accepted and ignored", file=sys.stderr, flush=True)
    return hit
'''

# axis -> (the cell, [(file under torchtitan/, text, replacement)], the label part whose evidence must fail)
INJECTIONS = {
    "dp_shard": (
        "llama3-dp2-eager",
        [
            (  # SimpleFSDP replicates instead of sharding: trains as DDP
                "experiments/graph_trainer/common_utils.py",
                '        dp_mesh_dim_names = ["fsdp"]\n        dp_mode = "fully_shard"',
                f'        dp_mesh_dim_names = ["fsdp"]\n        dp_mode = "replicate" if {IGNORED}("dp_shard") else "fully_shard"',
            )
        ],
        "dp_shard=2",
    ),
    "dp_replicate": (
        "llama3-dpr2-dp2-eager",
        [
            (  # HSDP's replicate dimension dropped: FSDP over fsdp alone
                "experiments/graph_trainer/common_utils.py",
                "    if parallel_dims.dp_replicate_enabled:\n        if parallel_dims.dp_shard_enabled",
                f'    if parallel_dims.dp_replicate_enabled and not {IGNORED}("dp_replicate"):\n'
                "        if parallel_dims.dp_shard_enabled",
            )
        ],
        "dp_replicate=2",
    ),
    "tp": (
        "llama3-tp2-eager",
        [
            (  # the tp mesh is built, the model is not tensor-parallelised
                "experiments/graph_trainer/llama3/parallelize.py",
                "    if parallel_dims.tp_enabled:\n        model.parallelize(parallel_dims)",
                f'    if parallel_dims.tp_enabled and not {IGNORED}("tp"):\n        model.parallelize(parallel_dims)',
            )
        ],
        "tp=2",
    ),
    "ep": (
        "deepseek_v3-dp2-ep2-eager",
        [
            (  # the ep mesh is built; the experts stay whole, sharded as dense weights
                "experiments/graph_trainer/deepseek_v3/parallelize.py",
                "    if parallel_dims.tp_enabled or parallel_dims.ep_enabled:\n        model.parallelize(parallel_dims)",
                f'    if (parallel_dims.tp_enabled or parallel_dims.ep_enabled) and not {IGNORED}("ep"):\n'
                "        model.parallelize(parallel_dims)",
            ),
            (
                "experiments/graph_trainer/common_utils.py",
                "    if parallel_dims.ep_enabled and isinstance(model, Decoder):\n",
                f'    if parallel_dims.ep_enabled and isinstance(model, Decoder) and not {IGNORED}("ep"):\n',
            ),
        ],
        "ep=2",
    ),
    "pp": (
        "llama3-pp2-1F1B-eager",
        [
            (  # two stages run, each holds every block: the split is ignored
                "distributed/pipeline_parallel.py",
                "    for i, stage_ms in enumerate(module_names_per_stage):\n",
                f'    if {IGNORED}("pp"):\n'
                '        blocks = [m for s in module_names_per_stage for m in s if m.startswith("layers.")]\n'
                '        module_names_per_stage = [[m for m in s if m == "tok_embeddings"] + blocks\n'
                '                                  + [m for m in s if m != "tok_embeddings" and not m.startswith("layers.")]\n'
                "                                  for s in module_names_per_stage]\n"
                "    for i, stage_ms in enumerate(module_names_per_stage):\n",
            )
        ],
        "pp=2",
    ),
    "pp_schedule": (
        "llama3-pp2-1F1B-eager",
        [
            (  # another schedule runs than the one asked for
                "distributed/pipeline_parallel.py",
                "    else:\n        schedule_class = get_schedule_class(parallelism.pipeline_parallel_schedule)",
                f'    else:\n        schedule_class = get_schedule_class("GPipe" if {IGNORED}("pp_schedule") '
                "else parallelism.pipeline_parallel_schedule)",
            )
        ],
        "pp_schedule=1F1B",
    ),
    "compile": (
        "llama3-dp2-jit",
        [
            (  # compile.mode=jit parsed, the model left uncompiled
                "experiments/graph_trainer/compile.py",
                '    if mode == "jit":\n        if "model" not in compile_config.components:',
                f'    if mode == "jit" and {IGNORED}("compile"):\n        return model\n'
                '    if mode == "jit":\n        if "model" not in compile_config.components:',
            )
        ],
        "compile=jit",
    ),
    "memory_policy": (
        "llama3-dp2-aot_fx_trace-mp_full",
        [
            (  # full asked, the default policy tags the graph
                "experiments/graph_trainer/memory_policy.py",
                "    memory_policy = config.compile.memory_policy\n",
                f'    memory_policy = "default" if {IGNORED}("memory_policy") else config.compile.memory_policy\n',
            )
        ],
        "memory_policy=full",
    ),
    "backend": (
        "llama3-dp2-aot_fx_trace-mp_default",
        [
            (  # no terminal inductor pass: regional never ran
                "experiments/graph_trainer/passes.py",
                "    inductor_compilation = compile_config.inductor_compilation\n",
                f'    inductor_compilation = compile_config.inductor_compilation\n    if {IGNORED}("backend"):\n'
                "        return passes\n",
            )
        ],
        "compile_backend=aot_eager",
    ),
    "trainer": (
        "llama3-dp2-eager-fsdp2",
        [
            (  # the core Trainer runs, FSDP2 never wraps the model
                "models/llama3/parallelize.py",
                "    apply_fsdp_to_decoder(\n        model,\n        dp_mesh,",
                f'    if {IGNORED}("trainer"):\n        return model\n    apply_fsdp_to_decoder(\n        model,\n        dp_mesh,',
            )
        ],
        "trainer=fsdp2",
    ),
}


@pytest.fixture(scope="module")
def overlay(tmp_path_factory):
    """A copy of the installed torchtitan with every injection in place (each acts only under its
    SIMPLEFSDP_TEST_IGNORE), and the CPU profile without numerics (the evidence is what is tested)."""
    root = tmp_path_factory.mktemp("overlay")
    source = Path(titan.__file__).parent
    shutil.copytree(source, root / "torchtitan", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "torchtitan" / "_ignored.py").write_text(HELPER)
    for axis, (_, patches, _) in INJECTIONS.items():
        for relative, old, new in patches:
            path = root / "torchtitan" / relative
            text = path.read_text()
            assert text.count(old) == 1, f"{relative}: the text the {axis} injection replaces is not there once"
            path.write_text(text.replace(old, new))
    from ruamel.yaml import YAML

    yaml = YAML()
    doc = yaml.load((MATRIX_DIR / "cpu.yaml").read_text())
    doc.pop("numerics")
    with open(root / "cpu.yaml", "w") as f:
        yaml.dump(doc, f)
    return root


# the injections in one session per group (one fork server preloads the overlay once), each in its own cell: pp and
# pp_schedule act on the same cell, so pp_schedule runs in a session of its own
GROUPS = [[axis for axis in INJECTIONS if axis != "pp_schedule"], ["pp_schedule"]]


@pytest.fixture(scope="module")
def runs(overlay, tmp_path_factory):
    """axis -> the record of its cell, from the group's session in which that cell ignored that axis."""
    found = {}
    for n, group in enumerate(GROUPS):
        folder = tmp_path_factory.mktemp(f"effects{n}")
        out = folder / "run.json"
        env = dict(os.environ, SIMPLEFSDP_TEST_IGNORE=json.dumps({INJECTIONS[axis][0]: axis for axis in group}))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(overlay), os.environ.get("PYTHONPATH")]))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "--simplefsdp-matrix",
                *(f"{overlay / 'cpu.yaml'}::{INJECTIONS[axis][0]}" for axis in group),
                "--simplefsdp-confirm=1",
                f"--simplefsdp-json={out}",
                f"--simplefsdp-artifacts={folder / 'runs'}",
            ],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
        cells = cells_of(out)
        found.update({axis: cells[INJECTIONS[axis][0]] for axis in group})
    return found


# one worker runs them all: each would otherwise run the module's sessions again
@pytest.mark.xdist_group("effects")
@pytest.mark.parametrize("axis", list(INJECTIONS))
def test_an_option_accepted_then_ignored_fails_its_axis_evidence(runs, axis):
    _, _, label = INJECTIONS[axis]
    cell = runs[axis]
    logs = "".join(Path(p).read_text() for paths in cell["rank_logs"].values() for p in paths)
    assert f"[injected] {axis} accepted and ignored" in logs, f"inconclusive: the {axis} injection did not act"
    others = [a for a in INJECTIONS if a != axis and f"[injected] {a} accepted" in logs]
    assert not others, f"{cell['id']}: other injections acted too: {others}"
    assert sorted(cell["losses"]) == ["1", "2", "3"], cell["error_line"]  # it trained: only the evidence tells
    assert cell["status"] == "failed" and cell["failure_class"] == "invalid_config", cell["error_line"]
    wrong = [e for e in cell["evidence"] if e["axis"] == label and not e["ok"]]
    assert wrong, f"no failing evidence for {label}: {cell['evidence']}"
    assert not any(e.get("infra") for e in wrong)
