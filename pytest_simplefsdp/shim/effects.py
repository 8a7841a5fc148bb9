"""What a titan03 rank did with its label, read from the run itself (it changes nothing): the ``effects`` section
of the rank's probe record. The job config says what was asked; these say what happened, so an option torchtitan
accepted and then ignored no longer passes as its label (judge.evidence compares them with the cell's axes):

* ``<dp_shard|dp_replicate|tp|ep>``: the size of the mesh dimension the model's parameters are laid out over once
  parallelised (dp_shard: sharded over ``fsdp``, dp_replicate: replicated over ``dp_replicate``, tp, ep: sharded
  over ``tp``, ``ep``); 1 where no parameter is (``dims``: every dimension and placement seen);
* ``layers``: the transformer blocks this rank holds (pipeline stages: ranks of different stages hold different
  ones; judge.evidence counts the distinct sets);
* ``data_parallel``: how data parallelism reached the parameters: SimpleFSDP's parametrization, FSDP2's
  ``fully_shard``, or none; ``trainer``: the class whose ``train_step`` ran;
* ``compile``: what ran step 1: a traced graph (aot_fx_trace), a model torch.compile wrapped whose graphs dynamo
  compiled (jit), or neither (eager); ``jit_backend``: inductor where inductor compiled any graph, else aot_eager;
* ``memory_policy``: the recompute tags the traced graph carries into rematerialisation, read as the policy that
  writes them (``tags``: the counts);
* ``inductor_compilation``: the terminal inductor pass that ran on the traced graph (full or regional);
* ``pp_schedule``: the class of the pipeline schedule whose ``step`` ran (and ``pp_actions``: its actions here);
* ``spmd_backend``: the SPMD backend the trainer set for the run (torchtitan's ``get_spmd_backend()`` at step 1).
"""

from . import record
from .hooks import after_import

# the mesh dimension each degree lays parameters out over, and the placement that shows it
# (SimpleFSDP names its dimension fsdp, torchtitan's FSDP2 dp_shard; a CP degree folds into it)
DEGREE_DIMS = {"dp_shard": (("fsdp", "dp_shard", "dp_shard_cp"), "Shard"),
               "dp_replicate": (("dp_replicate",), "Replicate"), "tp": (("tp",), "Shard"), "ep": (("ep",), "Shard")}
_INDUCTOR = {"graphs": 0}  # graphs inductor compiled in this rank


def layout(params) -> dict:
    """Degree axis -> the size of its mesh dimension the parameters are placed over with its placement ("1": none)."""
    found = {}
    for p in params.values():
        mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
        if mesh is None or placements is None:
            continue
        for name, size, placement in zip(mesh.mesh_dim_names or (), mesh.mesh.shape, placements):
            found.setdefault(name, set()).add((int(size), type(placement).__name__))
    out = {}
    for axis, (dims, kind) in DEGREE_DIMS.items():
        sizes = sorted(size for dim in dims for size, k in found.get(dim, ()) if k == kind and size > 1)
        out[axis] = str(max(sizes)) if sizes else "1"
    out["dims"] = {name: sorted(f"{kind}x{size}" for size, kind in v) for name, v in found.items()}
    return out


def layers(params) -> list:
    """The indices of the transformer blocks whose parameters this rank holds."""
    held = set()
    for fqn in params:
        parts = fqn.split(".")
        if "layers" in parts and parts.index("layers") + 1 < len(parts):
            held.add(parts[parts.index("layers") + 1])
    return sorted(held, key=lambda x: (len(x), x))


def data_parallel(trainer) -> str:
    from torch.distributed.fsdp import FSDPModule

    modules = [m for part in trainer.model_parts for m in part.modules()]
    if any(type(m).__name__.startswith("SimpleFSDP") for m in modules):
        return "simplefsdp"
    if any(isinstance(m, FSDPModule) for m in modules):
        return "fsdp2"
    return "none"


def spmd_backend() -> str:
    """The SPMD backend the run set up ("none" where this torchtitan has none to choose)."""
    try:
        from torchtitan.distributed.utils import get_spmd_backend
    except ImportError:
        return "none"
    return str(get_spmd_backend())


def at_first_step(trainer, params, traced: bool):
    """What the parallelised model and step 1 show (the probe calls it once, after step 1)."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    wrapped = sum(getattr(m, "_compiled_call_impl", None) is not None  # nn.Module.compile, as jit applies it
                  for part in trainer.model_parts for m in part.modules())
    ran = "aot_fx_trace" if traced else "jit" if wrapped and graphs else "eager"
    record.write("effects", {**layout(params), "layers": layers(params), "data_parallel": data_parallel(trainer),
                             "trainer": type(trainer).__name__, "dynamo_graphs": graphs, "compiled_modules": wrapped,
                             "compile": ran, "inductor_graphs": _INDUCTOR["graphs"],
                             "jit_backend": "inductor" if _INDUCTOR["graphs"] else "aot_eager",
                             "spmd_backend": spmd_backend()})


# the recompute tags each memory policy writes (memory_policy.py): full tags forward nodes MUST_RECOMPUTE, default
# saves every matmul and lets the rest be recomputed, eager alternates matmuls, sac_and_offload offloads some
def policy_of(tags: dict) -> str:
    if not any(tags.get(k) for k in ("MUST_SAVE", "PREFER_RECOMPUTE", "MUST_RECOMPUTE", "MUST_CPU_OFFLOAD")):
        return "none"
    if tags.get("MUST_CPU_OFFLOAD"):
        return "sac_and_offload"
    if tags.get("MUST_RECOMPUTE") and not tags.get("PREFER_RECOMPUTE"):
        return "full"
    if tags.get("mm_recomputed"):
        return "eager"
    return "default"


def _tags(gm) -> dict:
    import torch

    counts = {}
    for node in gm.graph.nodes:
        tag = node.meta.get("recompute")
        if tag is None:
            continue
        name = getattr(tag, "name", str(tag))
        counts[name] = counts.get(name, 0) + 1
        if node.target is torch.ops.aten.mm.default:
            key = "mm_saved" if name == "MUST_SAVE" else "mm_recomputed"
            counts[key] = counts.get(key, 0) + 1
    return counts


def effects():
    @after_import("torchtitan.experiments.graph_trainer.passes", "passes")
    def passes(module):
        """The passes GraphTrainer and GraphPP build their lists from (looked up when the list is made)."""
        remat = module.selective_activation_remat_pass

        def selective_activation_remat_pass(gm, *args, **kwargs):
            seen = record.read("effects", "tags", {})
            for k, n in _tags(gm).items():
                seen[k] = seen.get(k, 0) + n
            record.write("effects", {"tags": seen, "memory_policy": policy_of(seen)})
            return remat(gm, *args, **kwargs)

        module.selective_activation_remat_pass = selective_activation_remat_pass
        for kind, name in (("full", "full_inductor_compilation_pass"), ("regional", "regional_inductor_pass")):
            original = getattr(module, name)

            def terminal(gm, *args, _original=original, _kind=kind, **kwargs):
                record.write("effects", {"inductor_compilation": _kind})
                return _original(gm, *args, **kwargs)

            terminal.__name__ = name  # pass lists are filtered by name (--compile.disable_passes)
            setattr(module, name, terminal)

    @after_import("torch._inductor.compile_fx", "inductor")
    def inductor(module):  # dynamo's inductor backend looks compile_fx up when it compiles
        original = module.compile_fx

        def compile_fx(*args, **kwargs):
            _INDUCTOR["graphs"] += 1
            return original(*args, **kwargs)

        module.compile_fx = compile_fx

    @after_import("torch.distributed.pipelining.schedules", "schedule")
    def schedule(module):
        for base in (module.PipelineScheduleSingle, module.PipelineScheduleMulti):
            original = base.step

            def step(self, *args, _original=original, **kwargs):
                order = getattr(self, "pipeline_order", None) or {}
                record.write("effects", {"pp_schedule": type(self).__name__,
                                         "pp_actions": len(order.get(getattr(self, "rank", 0), []) or [])})
                return _original(self, *args, **kwargs)

            base.step = step
