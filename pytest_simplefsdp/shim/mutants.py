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

    return 0  # (counted when the eager step runs)


def _acted(name):
    """Count one place changed by a mutant that acts later than its moment (a patch that runs at training time)."""
    record.write("mutant", {"name": name, "applied": record.read("mutant", "applied", 0) + 1})


# --- a label applied to part of the model: training unchanged, the layout not what the label says ---------------


@mutant("fsdp_partial", "install")
def fsdp_partial():
    """SimpleFSDP shards every module but the output projection, which it replicates over the same mesh (its
    gradient all-reduced instead of reduce-scattered: the same training, the module held whole on every rank)."""

    @after_import("torchtitan.experiments.graph_trainer.common_utils", "mutant:fsdp_partial")
    def partial(module):
        original = module.data_parallel

        def data_parallel(model, device_mesh, mode="replicate", *args, **kwargs):
            head = getattr(model, "lm_head", None) or getattr(model, "output", None)
            if mode == "fully_shard" and head is not None and hasattr(model, "layers"):
                original(head, device_mesh, "replicate", mp_policy=kwargs.get("mp_policy"))
                _acted("fsdp_partial")  # data_parallel skips a module it already wrapped
            return original(model, device_mesh, mode, *args, **kwargs)

        module.data_parallel = data_parallel

    return 0


@mutant("memory_policy_partial", "install")
def memory_policy_partial():
    """The memory policy tags every transformer block of the traced graph but its first, whose activations are all
    kept (the same numbers, less memory saved than the policy says)."""

    @after_import("torchtitan.experiments.graph_trainer.passes", "mutant:memory_policy_partial")
    def partial(module):
        original = module.tag_with_memory_policy_pass

        def tag_with_memory_policy_pass(gm, *args, **kwargs):
            out = original(gm, *args, **kwargs)
            graph = out if hasattr(out, "graph") else gm
            blocks = sorted({b for b in map(block_of, graph.graph.nodes) if b is not None}, key=int)
            untagged = [n for n in graph.graph.nodes if blocks and block_of(n) == blocks[0] and "recompute" in n.meta]
            for node in untagged:
                del node.meta["recompute"]
            if untagged:
                _acted("memory_policy_partial")
            return out

        module.tag_with_memory_policy_pass = tag_with_memory_policy_pass

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
