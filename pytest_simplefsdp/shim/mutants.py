"""The mutation tier's bugs, re-injected inside the system under test (``SIMPLEFSDP_MUTANT=<name>``). Each is
registered with the moment of the training step it acts at; pytest_simplefsdp.judge.mutants names the same set
(a test checks both ways). An implementation returns how many places it changed (0: nothing of its kind here: the
mutant is inconclusive, never killed). The training probe (probes.py) calls ``act`` at each moment:

* ``install``: once, when the shim starts (a patch of torchtitan's code);
* ``load``: after the checkpoint load, before step 1 (``params``: FQN -> parameter);
* ``grads``: each step, after backward and before gradient clipping;
* ``before_update`` / ``update``: each step, right before / after the optimizer step (``before``: each
  parameter's local shard before it);
* ``schedule``: each step, after the LR scheduler step.
"""

import sys

from . import record
from .effects import block_of
from .gradmath import local
from .hooks import after_import

IMPLEMENTED = {}  # name -> (moment, fn)


def mutant(name, moment):
    def register(fn):
        IMPLEMENTED[name] = (moment, fn)
        return fn

    return register


def actor(name):
    """``act(moment, **context)`` for the named mutant (a no-op for none), counting what it changed per rank."""
    if not name:
        return lambda moment, **context: None
    if name not in IMPLEMENTED:
        raise SystemExit(f"SIMPLEFSDP_MUTANT={name!r}: the shim implements {', '.join(sorted(IMPLEMENTED))}")
    when, fn = IMPLEMENTED[name]

    def act(moment, **context):
        if moment == when:
            count = fn(**context)
            if count:
                record.write("mutant", {"name": name, "applied": record.read("mutant", "applied", 0) + count})

    return act


def _rank():
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _on_ep_mesh(p):
    """An expert parameter sharded by EP: a DTensor whose mesh has an ``ep`` dim."""
    return "ep" in (getattr(getattr(p, "device_mesh", None), "mesh_dim_names", None) or ())


# --- from step 1 (and load time) ----------------------------------------------------------------------------


@mutant("expert_grad_divide", "grads")
def expert_grad_divide(trainer, params):
    """Reduced over the wrong mesh: expert gradients divided once more (torchtitan issue 1551)."""
    return len([p.grad.mul_(0.5) for p in params.values() if p.grad is not None and _on_ep_mesh(p)])


@mutant("reduce_scatter_sum", "grads")
def reduce_scatter_sum(trainer, params):
    """FSDP's reduce-scatter summed instead of averaged over the data-parallel ranks."""
    dp = trainer.parallel_dims.dp_replicate * trainer.parallel_dims.dp_shard
    return len([p.grad.mul_(dp) for p in params.values() if p.grad is not None]) if dp > 1 else 0


@mutant("dropped_grad", "grads")
def dropped_grad(trainer, params):
    """One parameter's gradient (norm.weight) silently lost."""
    p = params.get("norm.weight")
    if p is None or p.grad is None:
        return 0
    p.grad.zero_()
    return 1


@mutant("pp_stage_skips_backward", "grads")
def pp_stage_skips_backward(trainer, params):
    """The first pipeline stage runs no backward: its gradients stay zero."""
    if not trainer.parallel_dims.pp_enabled or "tok_embeddings.weight" not in params:
        return 0
    return len([p.grad.zero_() for p in params.values() if p.grad is not None])


@mutant("expert_placement", "load")
def expert_placement(trainer, params):
    """Sharded expert weights land on the wrong slots of their EP rank after the checkpoint load."""
    import torch

    hit = 0
    with torch.no_grad():
        for p in params.values():
            shard = local(p)
            if _on_ep_mesh(p) and shard.dim() and shard.shape[0] > 1:  # dim 0: the experts (w1_EFD, ...)
                shard.copy_(shard.roll(1, 0))
                hit += 1
    return hit


@mutant("compile_falls_back_to_eager", "install")
def compile_falls_back_to_eager():
    """compile.mode aot_fx_trace asked and configured; the step silently runs eager."""

    @after_import("torchtitan.experiments.graph_trainer.trainer", "mutant:compile_falls_back_to_eager")
    def fallback(module):
        def forward_backward_step(self, **kwargs):
            record.write("mutant", {"name": "compile_falls_back_to_eager", "applied": 1})
            return module.Trainer.forward_backward_step(self, **kwargs)

        module.GraphTrainer.forward_backward_step = forward_backward_step

    # 0.2: simple_fsdp's parallelize wraps the model in torch.compile where compile.enable is set; it runs without
    for name, fn in (("llama3", "parallelize_llama"), ("deepseek_v3", "parallelize_deepseekv3")):

        @after_import(f"torchtitan.experiments.simple_fsdp.{name}.parallelize", "mutant:compile_falls_back_to_eager")
        def uncompiled(module, fn=fn):
            original = getattr(module, fn)

            def parallelize(model, parallel_dims, job_config, *args, **kwargs):
                asked = job_config.compile.enable
                job_config.compile.enable = False
                try:
                    return original(model, parallel_dims, job_config, *args, **kwargs)
                finally:
                    job_config.compile.enable = asked
                    if asked:
                        _acted("compile_falls_back_to_eager")

            setattr(module, fn, parallelize)

    return 0  # (counted when the eager step runs; 0.2: when parallelize skipped the compile)


@mutant("cp_attention_local", "install")
def cp_attention_local():
    """Context parallelism shards the sequence (inputs, labels, positions) but never reaches attention: each rank
    attends only within its own chunk, with no error. SimpleFSDP's parallelize did so from torchtitan's CP refactor
    (PR 2144, January 2026) to graph_trainer's CP support (PR 3305, May 2026; issue 2808: it "silently
    malfunctions"), torchtitan 0.2.2 included."""

    def never_applied(module):
        def apply_cp_to_forward(attention_modules, cp_mesh):
            _acted("cp_attention_local")

        module.apply_cp_to_forward = apply_cp_to_forward

    # the function, and the name graph_trainer's common_utils imported of it (looked up when it applies CP)
    for name in ("torchtitan.distributed.context_parallel.api", "torchtitan.experiments.graph_trainer.common_utils"):
        after_import(name, "mutant:cp_attention_local")(never_applied)
    return 0  # (counted where CP would have been applied)


@mutant("graph_pass_corrupts_node", "install")
def graph_pass_corrupts_node():
    """A graph pass miscompiles: graph_trainer's canonicalize_graph_pass turns the traced step's first aten.add into
    an aten.sub (the shapes agree, nothing fails; the step computes something else). The compiler bisection must
    name that pass (--simplefsdp-bisect=compiler)."""

    def corrupt(graph):
        import torch

        add = next((n for n in graph.graph.nodes if n.target is torch.ops.aten.add.Tensor), None)
        if add is None:
            return False
        add.target = torch.ops.aten.sub.Tensor
        graph.recompile()
        return True

    _after_pass("canonicalize_graph_pass", "graph_pass_corrupts_node", corrupt)
    return 0  # (counted when the pass changed a node)


def _after_pass(name, mutant_name, change):
    """Patch graph_trainer's pass ``name`` (looked up by name when its pass list is made, and filtered by it): after it
    ran, ``change(graph)`` alters the graph it returned, and says whether it changed anything (counted)."""

    @after_import("torchtitan.experiments.graph_trainer.passes", f"mutant:{mutant_name}")
    def patch(module):
        original = getattr(module, name)

        def after(gm, *args, **kwargs):
            out = original(gm, *args, **kwargs)
            if change(out if hasattr(out, "graph") else gm):
                _acted(mutant_name)
            return out

        after.__name__ = name
        setattr(module, name, after)


def _acted(name):
    """Count one place changed by a mutant that acts later than its moment (a patch that runs at training time)."""
    record.write("mutant", {"name": name, "applied": record.read("mutant", "applied", 0) + 1})


# --- a label applied to part of the model: training unchanged, the layout not what the label says ---------------


def _own_class(module):
    """``module`` as an instance of a subclass of its own: SimpleFSDP caches its wrapper class per (module class,
    parameter names) with the first wrap's parametrization inside, so a head wrapped on its own mesh would lend
    that mesh to every other module of its class."""
    cls = module.__class__
    module.__class__ = type(f"Partial{cls.__name__}", (cls,), {"__module__": cls.__module__})
    return module


@mutant("fsdp_partial", "install")
def fsdp_partial():
    """SimpleFSDP shards every module but the output projection, which it replicates over the same mesh (its
    gradient all-reduced instead of reduce-scattered: the same training, the module held whole on every rank)."""

    def partial(module):
        original = module.data_parallel

        def data_parallel(model, device_mesh, mode="replicate", *args, **kwargs):
            head = getattr(model, "lm_head", None) or getattr(model, "output", None)
            if mode == "fully_shard" and head is not None and hasattr(model, "layers"):
                original(_own_class(head), device_mesh, "replicate", mp_policy=kwargs.get("mp_policy"))
                _acted("fsdp_partial")  # data_parallel skips a module it already wrapped
            return original(model, device_mesh, mode, *args, **kwargs)

        module.data_parallel = data_parallel

    # 0.3's data_parallel, and 0.2's (its parallelize modules import the name after this patch replaced it)
    for name in ("torchtitan.experiments.graph_trainer.common_utils", "torchtitan.experiments.simple_fsdp.simple_fsdp"):
        after_import(name, "mutant:fsdp_partial")(partial)
    return 0


@mutant("ac_partial", "install")
def ac_partial():
    """Activation checkpointing wraps every transformer block but the first (0.2's apply_ac): its activations are all
    kept, the numbers the same, less memory saved than the label says."""

    @after_import("torchtitan.distributed.activation_checkpoint", "mutant:ac_partial")
    def partial(module):
        original, done = module._apply_ac_to_transformer_block, []

        def _apply_ac_to_transformer_block(block, *args, **kwargs):
            if not done:  # apply_ac's first block, once per process
                done.append(True)
                _acted("ac_partial")
                return block
            return original(block, *args, **kwargs)

        module._apply_ac_to_transformer_block = _apply_ac_to_transformer_block

    return 0


@mutant("memory_policy_partial", "install")
def memory_policy_partial():
    """The memory policy tags every transformer block of the traced graph but its first, whose activations are all
    kept (the same numbers, less memory saved than the policy says)."""

    def untag_first_block(graph):
        blocks = sorted({b for b in map(block_of, graph.graph.nodes) if b is not None}, key=int)
        untagged = [n for n in graph.graph.nodes if blocks and block_of(n) == blocks[0] and "recompute" in n.meta]
        for node in untagged:
            del node.meta["recompute"]
        return bool(untagged)

    _after_pass("tag_with_memory_policy_pass", "memory_policy_partial", untag_first_block)
    return 0


@mutant("replicate_partial", "install")
def replicate_partial():
    """HSDP replicates every module over dp_replicate but the output projection, which it shards over the
    replicate mesh dimension too (on dim 1; fsdp keeps dim 0): the same all-gathered weight, its gradient reduced
    over both dimensions, so the same training; the label's replicas of that module do not exist."""

    @after_import("torchtitan.experiments.graph_trainer.common_utils", "mutant:replicate_partial")
    def partial(module):
        import torch.nn as nn
        from torch.distributed.tensor import Shard, distribute_tensor

        simple, original = sys.modules["torchtitan.experiments.graph_trainer.simple_fsdp"], module.data_parallel

        def data_parallel(model, device_mesh, mode="replicate", *args, **kwargs):
            head = getattr(model, "lm_head", None) or getattr(model, "output", None)
            if mode in ("replicate", "hybrid_shard") and head is not None and hasattr(model, "layers"):
                placements = (Shard(1), Shard(0))[-device_mesh.ndim :]  # (replicate dim, fsdp dim) or (replicate)
                names = [n for n, p in head.named_parameters(recurse=False) if p is not None]
                for name in names:
                    head.register_parameter(
                        name, nn.Parameter(distribute_tensor(getattr(head, name), device_mesh, placements))
                    )
                simple._register_parametrization(
                    _own_class(head),
                    names,
                    simple.ReplicateComputation(device_mesh, placements, mode, mp_policy=kwargs.get("mp_policy")),
                )
                _acted("replicate_partial")
            return original(model, device_mesh, mode, *args, **kwargs)

        module.data_parallel = data_parallel

    return 0


def _replicated_over_tp(layout):
    import spmd_types as spmd
    from torchtitan.distributed.parallel_dims import MeshAxisName, SpmdLayout

    return SpmdLayout({**layout.axis_types, MeshAxisName.TP: spmd.R}, partition_spec=layout.partition_spec)


@mutant("tp_partial", "install")
def tp_partial():
    """TP shards every column-wise projection but the first, whose weight each TP rank holds whole (its output
    cut to the TP shard the next module expects, so the forward and the gradients are unchanged)."""

    @after_import("torchtitan.protocols.module", "mutant:tp_partial")
    def partial(module):
        import dataclasses

        import spmd_types as spmd
        from torchtitan.distributed.parallel_dims import MeshAxisName

        original, done = module.Module.parallelize, []

        def colwise(cfg):
            weight = cfg and cfg.state_shardings.get("weight")
            out = cfg and cfg.out_src_shardings
            return (
                weight is not None
                and cfg.local_map is None
                and cfg.out_dst_shardings is None
                and weight.axis_types.get(MeshAxisName.TP) == spmd.S(0)
                and getattr(out, "axis_types", {}).get(MeshAxisName.TP) == spmd.S(-1)
            )

        def parallelize(self, parallel_dims):
            if parallel_dims.tp > 1 and not done:
                done.append(True)  # the root's call: the first module in order, once per process
                first = next((m for m in self.modules() if colwise(getattr(m, "_sharding_config", None))), None)
                if first is not None:
                    cfg = first._sharding_config
                    first._sharding_config = dataclasses.replace(
                        cfg,
                        state_shardings={k: _replicated_over_tp(v) for k, v in cfg.state_shardings.items()},
                        out_src_shardings=_replicated_over_tp(cfg.out_src_shardings),
                        out_dst_shardings=cfg.out_src_shardings,
                    )
                    _acted("tp_partial")
            return original(self, parallel_dims)

        module.Module.parallelize = parallelize

    return 0


@mutant("ep_partial", "install")
def ep_partial():
    """EP shards the routed experts of every MoE layer but the first, whose experts SimpleFSDP then shards over the
    dense mesh as with EP 1 (its tokens routed locally: the dispatcher's EP 1 path). The same training."""

    @after_import("torchtitan.models.common.moe", "mutant:ep_partial")
    def partial(module):
        original, done = module.RoutedExperts.parallelize, []

        def parallelize(self, parallel_dims):
            if parallel_dims.ep > 1 and not done:
                done.append(True)
                for sub in self.modules():  # this subtree counts as parallelized: nothing distributed, no EP mesh
                    if hasattr(sub, "_parallelized"):
                        sub._parallelized = True
                self.inner_experts.simplefsdp_without_ep = True
                _acted("ep_partial")
                return None
            return original(self, parallel_dims)

        module.RoutedExperts.parallelize = parallelize

    @after_import("torchtitan.experiments.graph_trainer.common_utils", "mutant:ep_partial")
    def dense(module):
        original = module.data_parallel

        def data_parallel(model, device_mesh, *args, **kwargs):
            if getattr(model, "simplefsdp_without_ep", False) and "efsdp" in (device_mesh.mesh_dim_names or ()):
                return model  # left to the dense mesh's wrap, as with EP 1: sharded over fsdp, gradients reduced
            return original(model, device_mesh, *args, **kwargs)

        module.data_parallel = data_parallel

    return 0


@mutant("pp_partial", "install")
def pp_partial():
    """The pipeline split leaves the model's last transformer block out of every stage (the stages cover the
    rest: a model one block shorter trains)."""

    def drop_last(original):
        def split(*args, **kwargs):
            stages = [list(s) for s in original(*args, **kwargs)]
            blocks = [(i, name) for i, s in enumerate(stages) for name in s if name.startswith("layers.")]
            if blocks:
                index, name = max(blocks, key=lambda b: int(b[1].split(".")[1]))
                stages[index].remove(name)
                _acted("pp_partial")
            return stages

        return split

    for name in ("torchtitan.distributed.pipeline_parallel", "torchtitan.experiments.graph_trainer.graph_pp.pipeline"):

        @after_import(name, "mutant:pp_partial")
        def partial(module):
            for split in ("_generate_llm_fqn_per_model_part", "generate_llm_fqn_per_model_part"):  # 0.3, 0.2
                if hasattr(module, split):
                    setattr(module, split, drop_last(getattr(module, split)))

    return 0


def _restore(params, before, which):
    """Undo the optimizer step for the parameters ``which(fqn, p)`` picks: their local shards back as they were."""
    import torch

    hit = 0
    with torch.no_grad():
        for fqn, p in params.items():
            if which(fqn, p) and fqn in before:
                local(p).copy_(before[fqn])
                hit += 1
    return hit


@mutant("lost_update", "update")
def lost_update(trainer, params, before):
    """Rank 1's optimizer update of its one-dimensional parameter shards (the norm weights) is undone every step:
    the gradients are right, half of every norm layer never trains."""
    return _restore(params, before, lambda fqn, p: local(p).dim() == 1) if _rank() == 1 else 0


# --- from step 2 on: an update, a schedule and a state that go wrong after the first step -------------------


@mutant("update_lost_from_step2", "update")
def update_lost_from_step2(trainer, params, before):
    """From step 2, rank 1's optimizer update of its attention weights is undone (an update that stops reaching
    one rank's shards after the first step, as a stale buffer swap would)."""
    if trainer.step < 2 or _rank() != 1:
        return 0
    return _restore(params, before, lambda fqn, p: ".attention." in f".{fqn}")


@mutant("lr_skew_from_step2", "schedule")
def lr_skew_from_step2(trainer):
    """After step 1, rank 1's LR scheduler steps once more: from step 2 its learning rate runs one step ahead of
    the other ranks' (a scheduler stepped per microbatch, or twice on a resumed rank)."""
    if trainer.step != 1 or _rank() != 1:
        return 0
    for scheduler in trainer.lr_schedulers.schedulers:
        scheduler.step()
    return len(trainer.lr_schedulers.schedulers)


@mutant("optimizer_state_lost_at_step2", "before_update")
def optimizer_state_lost_at_step2(trainer, params):
    """Right before step 2's update, rank 1's optimizer state (AdamW's moments and step counts) is reset, as a
    state that was not restored after step 1 would be: its update at step 2 is a first step's."""
    import torch

    if trainer.step != 2 or _rank() != 1:
        return 0
    hit = 0
    with torch.no_grad():
        for optimizer in trainer.optimizers.optimizers:
            for state in optimizer.state.values():
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()
                        hit += 1
    return hit
