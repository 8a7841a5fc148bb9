"""What the probe records in every rank of a titan03 or titan02 cell (it changes nothing):

* ``evidence``: what torchtitan was asked: the job config's compile and PP settings, the trainer class, the
  degrees and 1-D meshes of the ParallelDims it built (kept in the record beside what the run did, effects.py,
  which the checks read; only CP's is read from the mesh), and which of the probe's own hooks attached
  (``probe.hooks``), so a probe that did not run is not read as a run that lied.
* ``training``: per optimizer step, the exact invariants of every parameter shard on this rank (did it change,
  did it have a gradient, its learning rate, a hash of its bits, which piece of the full tensor it is, the
  squared norm of its update) and how many optimizer and scheduler steps ran (``steps.rank<R>.jsonl``); with
  the gradient probe (numerics runs), each parameter's full-tensor gradient norm before clipping, its norm after
  the step, and once a checksum of the loaded weights (``grads.rank<R>.jsonl``).

The mutants (mutants.py) act at the same points: a bug inside the system under test, seen by the probe as the
gate sees it."""

from . import effects, gradmath, record
from .hooks import ATTACHED, after_import, on_attach
from .mutants import actor

# where each generation's Trainer is reached: 0.3's class in torchtitan.trainer; 0.2's Trainer is defined in
# torchtitan/train.py, which the launch runs as __main__ (no module to patch before its main runs): the instance is
# taken where it hands itself to its CheckpointManager (``states={"train_state": self}``), before training starts
TRAINERS = {"titan03": "torchtitan.trainer", "titan02": "torchtitan.components.checkpoint"}

_STATE = {}  # "trainer": this rank's Trainer once training started; "traced": a traced graph was made (effects)


def named_params(trainer):
    """FQN -> parameter over the rank's model parts, wrapper names (compile, AC) removed."""
    out = {}
    for part in trainer.model_parts:
        for name, p in part.named_parameters():
            out.setdefault(".".join(effects.clean(name)), p)
    return out


def started():
    """This rank's probe is running: its hooks so far (a forked rank says so once its environment is its own)."""
    record.write("probe", {"started": "yes", "hooks": sorted(set(ATTACHED))})


def evidence():
    started()
    on_attach(lambda label: started())

    @after_import("torchtitan.config.manager", "config")
    def config(module):
        original = module.ConfigManager.parse_args

        def parse_args(self, *args, **kwargs):
            cfg = original(self, *args, **kwargs)
            keys = {
                "compile": ("mode", "backend", "inductor_compilation", "memory_policy"),
                "parallelism": ("pipeline_parallel_schedule",),
            }
            record.write(
                "config",
                {
                    f"{section}.{k}": str(getattr(getattr(cfg, section, None), k, None))
                    for section, names in keys.items()
                    for k in names
                },
            )
            record.write("config", {"trainer": type(cfg).__qualname__.split(".")[0]})  # GraphTrainer or Trainer
            return cfg

        module.ConfigManager.parse_args = parse_args

    @after_import("torchtitan.distributed.parallel_dims", "mesh")
    def mesh(module):
        original = module.ParallelDims.build_mesh

        def build_mesh(self, *args, **kwargs):
            world = original(self, *args, **kwargs)
            record.write(
                "degrees",
                {k: getattr(self, k) for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "world_size")},
            )
            if hasattr(self, "get_all_one_dimensional_meshes"):
                meshes = {name: m.size() for name, m in self.get_all_one_dimensional_meshes().items()}
            else:  # 0.2: one world mesh with named dimensions
                meshes = dict(zip(world.mesh_dim_names or (), map(int, world.mesh.shape)))
            record.write("mesh", meshes)
            return world

        module.ParallelDims.build_mesh = build_mesh

    @after_import("torchtitan.experiments.graph_trainer.make_fx_tracer", "traced")
    def traced(module):  # every trace (GraphTrainer's, GraphPP's stages, a precompiled one) makes a TracedResult
        original = module.TracedResult.__init__

        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            _STATE["traced"] = True

        module.TracedResult.__init__ = __init__


def training(grads: bool, invariants: bool, mutant: str | None, generation="titan03"):
    """The train-step probe: ``grads`` (the gradient probe), ``invariants`` (every step's), ``mutant`` (its bug), on
    the Trainer of ``generation`` (TRAINERS)."""
    act = actor(mutant)
    act("install")

    @after_import("torchtitan.distributed.utils", "clip")
    def clip(module):
        original = module.clip_grad_norm_

        def clip_grad_norm_(*args, **kwargs):
            trainer = _STATE.get("trainer")
            if trainer is not None:
                params = named_params(trainer)
                act("grads", trainer=trainer, params=params)
                if grads:
                    record.append(
                        "grads",
                        {
                            "kind": "grad_norm",
                            "step": trainer.step,
                            "values": gradmath.norms({fqn: p.grad for fqn, p in params.items()}),
                        },
                    )
            return original(*args, **kwargs)

        module.clip_grad_norm_ = clip_grad_norm_  # trainer.py calls it as dist_utils.clip_grad_norm_

    def wrap(original):
        def train_step(self, *args, **kwargs):
            if "trainer" not in _STATE:  # the checkpoint is loaded: these are the weights step 1 starts from
                _STATE["trainer"] = self
                params = named_params(self)
                act("load", trainer=self, params=params)
                if grads:
                    record.append("grads", {"kind": "init_checksum", "step": 0, "values": gradmath.checksums(params)})
                _watch(self, act, invariants)
            out = original(self, *args, **kwargs)
            if grads:
                record.append(
                    "grads", {"kind": "param_norm", "step": self.step, "values": gradmath.norms(named_params(self))}
                )
            if invariants and "update" in _STATE:
                record.append("steps", {"step": self.step, **_STATE.pop("update"), **_STATE["counts"]})
            if "effects" not in _STATE:  # the parallelised model and what ran step 1
                _STATE["effects"] = True
                effects.at_first_step(self, named_params(self), bool(_STATE.get("traced")))
            return out

        return train_step

    if generation == "titan03":

        @after_import(TRAINERS[generation], "train_step")
        def step(module):
            module.Trainer.train_step = wrap(module.Trainer.train_step)

    else:

        @after_import(TRAINERS[generation], "train_step")
        def instance(module):
            import inspect
            import types

            original = module.CheckpointManager.__init__

            def __init__(self, *args, **kwargs):
                original(self, *args, **kwargs)
                states = inspect.signature(original).bind(self, *args, **kwargs).arguments.get("states") or {}
                trainer = states.get("train_state")
                if trainer is not None and "train_step" not in vars(trainer):
                    trainer.train_step = types.MethodType(wrap(type(trainer).train_step), trainer)

            module.CheckpointManager.__init__ = __init__


def _watch(trainer, act, invariants):
    """The optimizer's and the LR scheduler's steps of this trainer, counted and observed (on the instances:
    whatever class torchtitan built them as)."""
    counts = _STATE["counts"] = {"optimizer_steps": 0, "scheduler_steps": 0}
    optimizers, schedulers = trainer.optimizers, trainer.lr_schedulers
    optimizer_step, scheduler_step = optimizers.step, schedulers.step

    def step(*args, **kwargs):
        params = named_params(trainer)
        act("before_update", trainer=trainer, params=params)
        before = {fqn: gradmath.local(p).clone() for fqn, p in params.items()}
        lrs = _learning_rates(optimizers)
        with_grad = _has_grad(params)
        out = optimizer_step(*args, **kwargs)
        counts["optimizer_steps"] += 1
        act("update", trainer=trainer, params=params, before=before)
        if invariants:
            _STATE["update"] = _update(params, before, lrs, with_grad)
        return out

    def scheduler(*args, **kwargs):
        out = scheduler_step(*args, **kwargs)
        counts["scheduler_steps"] += 1
        act("schedule", trainer=trainer)
        return out

    optimizers.step, schedulers.step = step, scheduler


def _learning_rates(optimizers):
    """id(parameter) -> the learning rate its optimizer step uses."""
    return {
        id(p): float(group["lr"])
        for o in getattr(optimizers, "optimizers", [optimizers])
        for group in o.param_groups
        for p in group["params"]
    }


def _has_grad(params):
    import torch

    have = {fqn: p.grad is not None for fqn, p in params.items()}
    nonzero = [gradmath.local(p.grad).ne(0).any() for fqn, p in params.items() if have[fqn]]
    flags = iter(torch.stack(nonzero).tolist() if nonzero else [])
    return {fqn: bool(next(flags)) if have[fqn] else False for fqn in params}


def _update(params, before, lrs, with_grad):
    """Per parameter of this rank: [changed, had a nonzero gradient, learning rate, hash of its bits after the
    step, which piece of the full tensor it is, squared norm of the update], and the rank's learning rates."""
    import torch

    changed, squares, hashes = [], [], []
    for fqn, p in params.items():
        now = gradmath.local(p)
        changed.append(now.ne(before[fqn]).any())
        squares.append((now.double() - before[fqn].double()).pow(2).sum())
        hashes.append(gradmath.bits_hash(now, torch.arange(now.numel(), device=now.device)))
    changed, squares, hashes = (torch.stack(x).tolist() if x else [] for x in (changed, squares, hashes))
    out = {
        fqn: [bool(c), with_grad[fqn], lrs.get(id(p)), int(h), gradmath.shard_key(p), s]
        for (fqn, p), c, s, h in zip(params.items(), changed, squares, hashes)
    }
    return {"lr": sorted(set(lrs.values())), "params": out}
