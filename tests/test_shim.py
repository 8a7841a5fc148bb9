"""The CPU start-up shim: patch sets per generation, switches, and one patch checked against its reference."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from pytest_simplefsdp.paths import SHIM_DIR


def run_python(code, **env):
    full = dict(os.environ, PYTHONPATH=str(SHIM_DIR), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


def test_shim_says_what_it_applied_and_honours_skips():
    out = run_python("pass", SIMPLEFSDP_CPU_SHIM="titan03", SIMPLEFSDP_CPU_SHIM_SKIP="cpu_sdpa_saved")
    assert out.returncode == 0, out.stderr
    assert (
        "[simplefsdp-shim] applied: device_type_cpu,cpu_memory_monitor,barrier_device_ids,"
        "dram_bandwidth_constant,cp_ring_attention_cpu,fsdp2_sum_reduction,end_of_run_sleep,histc_integer_input,"
        "fill_indices_tensor_ops; skipped: cpu_sdpa_saved"
    ) in out.stderr


SLEEP_CHECK = (
    "import time, torchtitan.trainer as t; start = time.monotonic(); t.time.sleep(2); "
    "print(t.time is time, time.monotonic() - start >= 2, t.time.perf_counter() > 0)"
)


@pytest.mark.skipif(importlib.util.find_spec("torchtitan.trainer") is None, reason="needs torchtitan 0.3")
def test_the_end_of_run_sleep_patch_skips_only_the_trainers_sleep_and_can_be_switched_off():
    """0.3's trainer ends every run with time.sleep(2) on rank 0; the patch makes that module's sleep return
    at once (other time functions still work); SIMPLEFSDP_CPU_SHIM_SKIP=end_of_run_sleep brings it back."""
    out = run_python(SLEEP_CHECK, SIMPLEFSDP_CPU_SHIM="titan03")
    assert out.stdout.split() == ["False", "False", "True"], out.stderr
    out = run_python(SLEEP_CHECK, SIMPLEFSDP_CPU_SHIM="titan03", SIMPLEFSDP_CPU_SHIM_SKIP="end_of_run_sleep")
    assert out.stdout.split() == ["True", "True", "True"], out.stderr


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SIMPLEFSDP_CPU_SHIM": "titan99"}, "SIMPLEFSDP_CPU_SHIM='titan99': known patch sets: titan03, titan02"),
        ({"SIMPLEFSDP_CPU_SHIM": "titan02", "SIMPLEFSDP_CPU_SHIM_SKIP": "nope"}, "names unknown patches ['nope']"),
    ],
)
def test_bad_shim_settings_stop_the_rank(env, message):
    out = run_python("pass", **env)
    assert out.returncode != 0 and message in out.stderr


def test_without_the_shim_setting_nothing_is_patched():
    out = run_python("import torch._utils; print(torch._utils._get_available_device_type())")
    assert "[simplefsdp-shim]" not in out.stderr and out.stdout.strip() == "None"


def test_device_type_patch_makes_torch_answer_cpu():
    out = run_python(
        "import torch._utils; print(torch._utils._get_available_device_type())", SIMPLEFSDP_CPU_SHIM="titan03"
    )
    assert out.stdout.strip() == "cpu", out.stderr


FILL_INDICES = """
import torch
from pytest_simplefsdp.shim import patches as shim

def reference(tokens, starts, write_offsets, per_rank, ranks, max_len):
    out = torch.full((max_len,), -1, dtype=torch.int32)
    for e in range(per_rank):
        write = int(write_offsets[e])
        for r in range(ranks):
            i = r * per_rank + e
            length, start = int(tokens[i]), int(starts[i])
            end = min(write + length, max_len)
            if length > 0:
                out[write:end] = torch.arange(start, start + end - write, dtype=torch.int32)
            write += length
    return out

g = torch.Generator().manual_seed(0)
for _ in range(200):
    per_rank, ranks = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
    tokens = torch.randint(0, 6, (per_rank * ranks,), generator=g)
    starts = torch.cumsum(tokens, 0) - tokens
    sizes = (tokens.view(ranks, per_rank).sum(0).clamp_min(8) + 7) // 8 * 8
    offsets = torch.cumsum(sizes, 0) - sizes
    max_len = int(sizes.sum()) + int(torch.randint(0, 5, (1,), generator=g))
    args = (tokens, starts, offsets, per_rank, ranks, max_len)
    assert torch.equal(shim.fill_indices(*args), reference(*args)), args
print("200 equal")
"""


def fresh_python(code):
    """torch in a fresh interpreter, never in the xdist worker: a worker that had run hundreds of tests (forks,
    signal handlers, a child subreaper) died once of a segfault in the garbage collector while reporting the
    failure of an in-process torch test here (2026-12-07; the same test passes alone)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_fill_indices_replacement_matches_the_loop_reference():
    """titan02's EP permutation: fixed-shape tensor ops give what 0.2's `.item()` loop gives."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    out = fresh_python(FILL_INDICES)
    assert out.returncode == 0 and out.stdout.strip() == "200 equal", out.stderr[-3000:]


GROUPED_MM = """
import sys, torch
if not hasattr(torch, "_grouped_mm"):
    sys.exit(print(f"torch {torch.__version__} has no _grouped_mm"))
g = torch.Generator().manual_seed(0)
x = torch.randn(10, 16, generator=g, requires_grad=True)
w = torch.randn(3, 16, 32, generator=g, requires_grad=True)
offs = torch.tensor([3, 3, 10], dtype=torch.int32)  # one expert gets no token
out = torch._grouped_mm(x, w, offs=offs)
out.pow(2).sum().backward()
x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
ref = torch.cat([x2[0:3] @ w2[0], x2[3:3] @ w2[1], x2[3:10] @ w2[2]])
ref.pow(2).sum().backward()
assert torch.allclose(out, ref, atol=1e-4)
assert torch.allclose(x.grad, x2.grad, atol=1e-3) and torch.allclose(w.grad, w2.grad, atol=1e-3)
print("equal")
"""


def test_cpu_grouped_mm_matches_per_expert_matmuls():
    """What grouped_mm_on_cpu (titan02) rests on: the installed torch's CPU ``_grouped_mm`` gives the
    per-expert matmuls' values and gradients."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    out = fresh_python(GROUPED_MM)
    if "has no _grouped_mm" in out.stdout:
        pytest.skip(out.stdout.strip())
    assert out.returncode == 0 and out.stdout.strip() == "equal", out.stderr[-3000:]


@pytest.mark.parametrize("skip, op", [("", "SUM"), ("fsdp2_sum_reduction", "AVG")], ids=["patched", "skipped"])
def test_fsdp2_reduces_with_sum_on_cpu(skip, op):
    """Gloo has no AVG or PREMUL_SUM (the FSDP2 reference cells failed with "Cannot use ReduceOp.PREMUL_SUM
    with Gloo"): on CPU the patch makes FSDP2 sum and divide after; GPUs keep their reduction."""
    code = (
        "import torch; from torch.distributed.fsdp._fully_shard import _fsdp_collectives as c\n"
        "group = type('Group', (), {'size': lambda self: 2})()\n"
        "print(c._get_gradient_divide_factors(group, None, torch.float32, 'cpu')[2], "
        "c._get_gradient_divide_factors(group, None, torch.float32, 'cuda')[2])"
    )
    out = run_python(code, SIMPLEFSDP_CPU_SHIM="titan03", SIMPLEFSDP_CPU_SHIM_SKIP=skip)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"RedOpType.{op}", "RedOpType.AVG"], out.stdout


PROBE_CODE = r"""
import json, os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Shard, Replicate, Partial
from torch.distributed.tensor.placement_types import _StridedShard
from pytest_simplefsdp.shim import gradmath as shim

def rank(r, out):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=r, world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    full = {n: torch.randn(8, 5) * (i + 1) for i, n in enumerate("abcdefgh")}
    full["a"] = full["a"][:7]  # uneven shards
    t = {"a": distribute_tensor(full["a"], mesh, [Shard(0), Replicate()]),   # FSDP-like
         "b": distribute_tensor(full["b"], mesh, [Shard(0), Shard(1)]),      # FSDP + TP
         "c": distribute_tensor(full["c"], mesh, [Replicate(), Replicate()]),
         "d": distribute_tensor(full["d"], mesh["dp"], [Shard(1)]),          # another mesh
         "e": DTensor.from_local(full["e"] / 2, mesh, [Partial(), Replicate()]),  # a pending sum: gathered
         "f": full["f"], "none": None,
         "g": distribute_tensor(full["g"], mesh, [Shard(0), Replicate()]),   # joins a's collective
         "h": distribute_tensor(full["h"], mesh, [_StridedShard(0, split_factor=2), Shard(0)])}  # SimpleFSDP + TP
    full["e"] = full["e"] / 2 * 2
    calls = []
    gather = dist.all_gather
    dist.all_gather = lambda *a, **k: (calls.append(1), gather(*a, **k))[1]
    norms, gathers = shim.norms(t), len(calls)
    sums = shim.checksums(t)
    dist.all_gather = gather
    per_tensor = {k: None if v is None else float(torch.linalg.vector_norm(v).full_tensor() if k != "f" else
                                                  torch.linalg.vector_norm(v)) for k, v in t.items()}
    exact = {k: None if k == "none" else float(torch.linalg.vector_norm(full[k])) for k in t}
    whole = {k: None if k == "none" else int(shim.bits_hash(full[k], torch.arange(full[k].numel()))) for k in t}
    rolled = int(shim.bits_hash(full["b"].roll(1, 0), torch.arange(full["b"].numel())))
    # a shard the probe cannot use on one rank only (rank 1's "b"): every rank must gather "b" whole, together
    norm = torch.linalg.vector_norm
    is_b = lambda x: x.to_local().data_ptr() == t["b"].to_local().data_ptr()  # the probe holds a detached view
    mixed = shim.over_shards({k: t[k] for k in "abg"}, lambda x: (norm(x.to_local()).pow(2), not (r == 1 and is_b(x))),
                              lambda x: float(norm(x)), lambda s: s.pow(0.5))
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump({"norms": norms, "per_tensor": per_tensor, "exact": exact, "order": list(norms),
                   "gathers": [gathers, len(calls) - gathers], "sums": sums, "whole": whole, "rolled": rolled,
                   "mixed": mixed}, f)
    dist.destroy_process_group()

mp.start_processes(rank, args=(sys.argv[1],), nprocs=4, start_method="fork")
"""


def test_the_grad_probe_reads_full_tensors_with_a_few_batched_collectives(tmp_path):
    """The numerics probe's norms (``_norms``) and weight checksums (``_checksums``) on 4 gloo ranks (2 x 2 mesh):
    Shard (uneven), Shard x Shard, _StridedShard x Shard (SimpleFSDP + TP), Replicate, another mesh, Partial, a
    plain tensor and None. Norms equal the full tensor's and the per-tensor DTensor path's; checksums equal the
    hash of the full tensor exactly, whatever the layout; one all-gather per mesh dimension and group, not one
    collective per tensor; every rank gets the same values, in the caller's order; a shard one rank cannot use makes
    every rank gather that tensor whole (not that rank alone, which would wait for its peers forever)."""
    from pytest_simplefsdp.launch.procs import free_port

    script = tmp_path / "probe.py"
    script.write_text(PROBE_CODE)
    full = dict(os.environ, PYTHONPATH=str(SHIM_DIR), PORT=str(free_port()), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=full, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    first = ranks[0]
    assert first["order"] == list(first["sums"]) == ["a", "b", "c", "d", "e", "f", "none", "g", "h"]
    for r in ranks:
        assert r["norms"] == first["norms"] and r["sums"] == first["sums"]  # every rank the same, bit for bit
        assert r["sums"] == r["whole"]  # the full tensor's hash, exactly
        for k, v in r["norms"].items():
            if v is None:
                assert r["exact"][k] is None and r["per_tensor"][k] is None
            else:
                assert v == pytest.approx(r["exact"][k], rel=1e-6), k
                assert v == pytest.approx(r["per_tensor"][k], rel=1e-6), k
        # a+g (dp, one dim) -> 1, b and h (dp, tp) -> 2, d (the dp sub-mesh) -> 1; c is replicated, e gathered
        assert r["gathers"] == [4, 4], r
        assert r["mixed"] == first["mixed"] and r["mixed"] == pytest.approx({k: r["exact"][k] for k in "abg"}, rel=1e-6)
    assert first["rolled"] != first["whole"]["b"]  # moved values change the checksum (a norm would not see it)


ESTIMATE = (
    "import torch, torch._inductor.fx_passes.overlap_scheduling as o\n"
    "g = torch.fx.Graph()\n"
    "a, b = g.placeholder('a'), g.placeholder('b')\n"
    "a.meta['val'], b.meta['val'] = torch.empty(4, 8), torch.empty(8, 16)\n"
    "mm = g.call_function(torch.ops.aten.mm.default, (a, b))\n"
    "mm.meta['val'] = torch.empty(4, 16)\n"
    "try:\n    print(o.estimate_runtime_analytical(mm))\nexcept Exception as e:\n    print(type(e).__name__)\n"
)


@pytest.mark.skipif(
    importlib.util.find_spec("torchtitan.experiments.simple_fsdp") is None, reason="the seed era's patch (titan02)"
)
def test_the_autobucketing_pass_estimates_matmuls_on_cpu_where_it_would_ask_the_gpu():
    """The overlap scheduler of 0.2's auto_bucketing pass costs a matmul by CUDA's roofline (AssertionError on
    CPU ranks); the seed era's patch costs it 2*M*N*K FLOPs at a nominal 1 TFLOP/s instead."""
    out = run_python(ESTIMATE, SIMPLEFSDP_CPU_SHIM="titan02")
    assert out.stdout.split() == [str(2.0 * 4 * 8 * 16 / 1e9)], out.stderr
    out = run_python(
        ESTIMATE, SIMPLEFSDP_CPU_SHIM="titan02", SIMPLEFSDP_CPU_SHIM_SKIP="autobucketing_analytic_estimates"
    )
    assert out.stdout.split() == ["AssertionError"], out.stderr


def test_a_patch_that_does_not_fit_its_module_is_said_and_not_attached(tmp_path):
    """A probe written for a newer torchtitan (main of March 2026 had no remat pass): its patch raises, which is said
    on the rank's stderr and leaves the label unattached (evidence then says the key was not recorded), never the
    import of torchtitan's module failing with the plugin's own error."""
    (tmp_path / "old_passes.py").write_text("def apply_sac_pass(gm):\n    return gm\n")
    code = (
        "from pytest_simplefsdp.shim import hooks\n"
        "@hooks.after_import('old_passes', 'passes')\n"
        "def passes(module):\n"
        "    module.selective_activation_remat_pass\n"
        "@hooks.after_import('old_passes', 'other')\n"
        "def other(module):\n"
        "    module.seen = True\n"
        "import old_passes\n"
        "print(hooks.ATTACHED, old_passes.seen)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(SHIM_DIR.parent.parent)]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "['other'] True"
    assert "[simplefsdp-shim] passes did not attach to old_passes: AttributeError:" in out.stderr


CP_CODE = r"""
import json, os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental._attention import (
    _HeadTailLoadBalancer, _context_parallel_shard, _enable_context_parallel_dispatcher)

def rank(r, out, narrow):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=r, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 16, 12, requires_grad=True), torch.randn(2, 4, 16, 12, requires_grad=True)
    v = torch.randn(2, 4, 16, 8 if narrow else 12, requires_grad=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # the whole sequence on one rank
    grad = torch.randn_like(ref)
    ref.backward(grad)
    chunks = lambda *ts: _context_parallel_shard(mesh, [t.detach() for t in ts], (2,) * len(ts),
                                                  _HeadTailLoadBalancer(16, 2, torch.device("cpu")))
    lq, lk, lv, lgrad = chunks(q, k, v, grad)
    want = chunks(ref, q.grad, k.grad, v.grad)
    for t in (lq, lk, lv):
        t.requires_grad_()
    _enable_context_parallel_dispatcher()
    try:
        o = F.scaled_dot_product_attention(*(DTensor.from_local(t, mesh, [Shard(2)], run_check=False)
                                             for t in (lq, lk, lv)), is_causal=True)
        o.to_local().backward(lgrad)
        got = [o.to_local(), lq.grad, lk.grad, lv.grad]
        result = [float((g - w).abs().max()) for g, w in zip(got, want)]
    except Exception as e:
        result = f"{type(e).__name__}: {e}"
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()

mp.start_processes(rank, args=(sys.argv[1], sys.argv[2] == "narrow"), nprocs=2, start_method="fork")
"""


@pytest.mark.skipif(importlib.util.find_spec("torchtitan.trainer") is None, reason="needs torchtitan 0.3 (its torch)")
@pytest.mark.parametrize("values", ["same", "narrow"])
@pytest.mark.parametrize("skip", ["", "cp_ring_attention_cpu"], ids=["patched", "skipped"])
def test_context_parallel_attention_on_cpu_ranks_is_the_whole_sequences(tmp_path, skip, values):
    """CP on 2 gloo ranks with torch's head-tail load balancer, as torchtitan shards: each rank's output and q/k/v
    gradients equal the chunks of one rank's causal SDPA over the whole sequence (the ring saw the other rank's
    chunks), also with values narrower than queries (deepseek_v3's). Without the patch, torch has no CPU path."""
    from pytest_simplefsdp.launch.procs import free_port

    env = dict(
        os.environ,
        PYTHONPATH=str(SHIM_DIR),
        PORT=str(free_port()),
        SIMPLEFSDP_CPU_SHIM="titan03",
        SIMPLEFSDP_CPU_SHIM_SKIP=skip,
    )
    out = subprocess.run(
        [sys.executable, "-c", CP_CODE, str(tmp_path), values], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for r in (0, 1):
        result = json.loads((tmp_path / f"rank{r}.json").read_text())
        if skip:  # torch's own errors: no CPU strategy; narrow values: SDPA's math path, which CP cannot split
            assert "does not have a sharding strategy" in result if values == "same" else "mixed torch.Tensor" in result
        else:
            assert isinstance(result, list), result
            assert max(result) < 1e-5, result  # output, dq, dk, dv: float rounding only


FLEX_CP_CODE = r"""
import json, os, sys, types
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
api = types.ModuleType("torchtitan.distributed.context_parallel.api")  # stands for 0.3's module (its global)
api.flex_cp_allgather = lambda k, v, seq_dim, pg_name: (k, v)
sys.modules[api.__name__] = api
from pytest_simplefsdp.shim import effects
effects.effects()
k = torch.zeros(2, 64, 4, 8)  # [batch, sequence chunk, heads, head_dim], torchtitan's seq_dim 1
api.flex_cp_allgather(k, k, 1, dist.group.WORLD.group_name)
print(json.dumps(json.load(open(os.path.join(os.environ["SIMPLEFSDP_EVIDENCE_DIR"], "rank0.json")))["effects"]))
"""


@pytest.mark.skipif(importlib.util.find_spec("torchtitan.trainer") is None, reason="needs torchtitan 0.3 (its torch)")
def test_flexattentions_cp_all_gather_is_recorded_as_the_ranks_its_attention_saw(tmp_path):
    """FlexAttention's CP (the GPU profiles' deepseek_v3) all-gathers the key/value chunks instead of torch's ring:
    the effects probe records it the same way (the ranks whose chunks the attention saw, this rank's chunk)."""
    from pytest_simplefsdp.launch.procs import free_port

    env = dict(os.environ, PORT=str(free_port()))
    env["SIMPLEFSDP_EVIDENCE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", FLEX_CP_CODE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"cp_ring": 1, "cp_chunk_seq": 64}
