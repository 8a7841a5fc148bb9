"""The mutation tier: named bugs re-injected into the system under test, to show the gate catches them.

``--simplefsdp-mutants=all`` (or names) turns every selected cell a mutant applies to into an item
``<cell>[mutant-<name>]``: the cell runs with ``SIMPLEFSDP_MUTANT=<name>`` (the start-up shim injects the
bug and prints ``[simplefsdp-shim] mutant: <name>`` into the rank logs) and goes through the whole
verdict: exit, evidence, losses, gradient and parameter norms against the unmutated baseline. The item
passes when the gate killed the mutant (and says which check did), and fails when the mutant survived:
a configuration with that bug would have been green.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..kinds import Mutation, Status
from ..paths import probe_folder
from .evidence import read_probes


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what goes wrong, and where it happened upstream
    applies: Callable[[dict], bool]  # cell axes -> whether the bug can show in that cell


def _compiled(a):
    return a.get("compile", "aot_fx_trace") == "aot_fx_trace" and a.get("pp", 1) == 1


# torchtitan 0.3 graph_trainer (the shim's mutants.py implements each by name; a test checks both ways)
TITAN03 = (
    Mutant(
        "expert_grad_divide",
        "expert gradients divided by an extra 2, as when reduced over the wrong mesh "
        "(torchtitan issue 1551, fixed for SimpleFSDP in PR 1793 by gradient_divide_factor)",
        lambda a: a.get("ep", 1) > 1,
    ),
    Mutant(
        "reduce_scatter_sum",
        "FSDP's gradient reduce-scatter sums over the data-parallel ranks instead of averaging",
        lambda a: a.get("dp_replicate", 1) * a.get("dp_shard", 1) > 1,
    ),
    Mutant("dropped_grad", "one parameter's gradient (norm.weight) silently lost", lambda a: True),
    Mutant(
        "pp_stage_skips_backward",
        "the first pipeline stage runs no backward (its gradients stay zero)",
        lambda a: a.get("pp", 1) > 1,
    ),
    Mutant(
        "expert_placement",
        "sharded expert weights land on the wrong slots of their EP rank after the checkpoint load",
        lambda a: a.get("ep", 1) > 1,
    ),
    Mutant(
        "compile_falls_back_to_eager", "compile.mode aot_fx_trace configured, the step silently runs eager", _compiled
    ),
    Mutant(
        "lost_update",
        "rank 1's optimizer update of its one-dimensional parameter shards (the norm weights) is "
        "undone every step: correct gradients, half of every norm layer never trains",
        lambda a: True,
    ),
    Mutant(
        "cp_attention_local",
        "context parallelism shards the sequence but never reaches attention: each rank attends within its own "
        "chunk (SimpleFSDP from torchtitan's CP refactor, PR 2144, to graph_trainer's CP support, PR 3305; issue 2808)",
        lambda a: a.get("cp", 1) > 1,
    ),
    Mutant(
        "graph_pass_corrupts_node",
        "a graph pass miscompiles: canonicalize_graph_pass turns the traced step's first aten.add into an aten.sub "
        "(no error; named by --simplefsdp-bisect=compiler)",
        _compiled,
    ),
    # a label applied to part of the model: training unchanged, so only the layout evidence can see it
    Mutant(
        "fsdp_partial",
        "SimpleFSDP shards every module but the output projection, replicated over the same mesh "
        "(the same training; the module held whole on every rank)",
        lambda a: (
            a.get("dp_shard", 1) > 1
            and a.get("dp_replicate", 1) == 1
            and a.get("tp", 1) == 1
            and a.get("trainer") != "fsdp2"
        ),
    ),
    Mutant(
        "memory_policy_partial",
        "the memory policy tags every transformer block but the first (its activations all kept)",
        lambda a: a.get("memory_policy", "none") != "none" and a.get("compile", "aot_fx_trace") == "aot_fx_trace",
    ),
    Mutant(
        "replicate_partial",
        "HSDP replicates every module over dp_replicate but the output projection, "
        "sharded instead (over the replicate mesh, or over fsdp alone under hybrid sharding)",
        lambda a: a.get("dp_replicate", 1) > 1 and a.get("tp", 1) == 1 and a.get("trainer") != "fsdp2",
    ),
    Mutant(
        "tp_partial",
        "TP shards every column-wise projection but the first, whose weight every TP rank holds "
        "whole (the same forward and gradients)",
        lambda a: a.get("tp", 1) > 1 and a.get("trainer") != "fsdp2",
    ),
    Mutant(
        "ep_partial",
        "EP shards the routed experts of every MoE layer but the first, which it leaves to the "
        "dense mesh as with EP 1 (sharded over fsdp, tokens routed locally: the same training)",
        lambda a: a.get("ep", 1) > 1 and a.get("tp", 1) == 1 and a.get("trainer") != "fsdp2",
    ),
    Mutant(
        "pp_partial",
        "the pipeline split leaves the model's last block out of every stage",
        lambda a: a.get("pp", 1) > 1,
    ),
    # from step 2 on: an update, a schedule and a state that go wrong after the first step
    Mutant(
        "update_lost_from_step2",
        "from step 2, rank 1's optimizer update of its attention weights is undone",
        lambda a: True,
    ),
    Mutant(
        "lr_skew_from_step2",
        "after step 1, rank 1's LR scheduler steps once more: from step 2 its learning "
        "rate runs ahead of the other ranks'",
        lambda a: True,
    ),
    Mutant(
        "optimizer_state_lost_at_step2",
        "right before step 2's update, rank 1's optimizer state (AdamW's "
        "moments and step counts) is reset: its step-2 update is a first step's",
        lambda a: True,
    ),
)


def _seed_compiled(a):
    return a.get("compile", "eager") == "compiled"


def _also(name, applies):
    """TITAN03's mutant ``name`` (the shim implements it for 0.2 too), on a titan02 cell where ``applies``."""
    m = next(m for m in TITAN03 if m.name == name)
    return Mutant(m.name, m.bug, applies)


# torchtitan 0.2 experiments/simple_fsdp (the seed era): the bugs acting inside the training step, as on 0.3, and the
# layout bugs the shim re-injects into 0.2's own code (its data_parallel, apply_ac, pipeline split, torch.compile);
# 0.3's tp_partial, ep_partial and replicate_partial patch 0.3's module sharding protocol, which 0.2 does not have
RUNTIME = {  # act at a moment of the training step (shim/probes.py calls them): one implementation for 0.2 and 0.3
    "expert_grad_divide",
    "reduce_scatter_sum",
    "dropped_grad",
    "pp_stage_skips_backward",
    "expert_placement",
    "lost_update",
    "update_lost_from_step2",
    "lr_skew_from_step2",
    "optimizer_state_lost_at_step2",
}
# 0.3's pp_partial and fsdp_partial apply to the same cells on 0.2 (the shim patches 0.2's pipeline split and
# data_parallel too)
SHARED = RUNTIME | {"pp_partial", "fsdp_partial"}
TITAN02 = (
    *(m for m in TITAN03 if m.name in SHARED),
    _also("compile_falls_back_to_eager", _seed_compiled),
    Mutant(
        "ac_partial",
        "activation checkpointing wraps every transformer block but the first (its activations all kept)",
        lambda a: a.get("ac", "none") != "none",
    ),
)


def parse_names(value: str, known: tuple) -> list:
    """``all`` or comma-separated names -> the Mutant records; ValueError names an unknown one."""
    by_name = {m.name: m for m in known}
    if value.strip() == "all":
        return list(known)
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise ValueError(
            f"unknown mutant {', '.join(map(repr, unknown)) or repr(value)}; "
            f"known: {', '.join(by_name) or 'none for this target'}, or all"
        )
    return [by_name[n] for n in names]


def applied(log_dir, name) -> int:
    """How many places the shim changed for the mutant, summed over ranks (0: it had nothing to act on)."""
    return sum(
        int(rec.get("mutant", {}).get("applied", 0))
        for rec in read_probes(probe_folder(log_dir)).values()
        if rec.get("mutant", {}).get("name") == name
    )


def killed_by(result) -> str | None:
    """The check that failed the mutated cell, or None when it passed (the mutant survived)."""
    if result.failure_class is None:
        return None
    if result.failure_class == "numerics" and (result.invariants or {}).get("violation"):
        return f"invariant ({result.invariants['check']})"
    if result.failure_class == "numerics" and result.numerics:
        return result.numerics.get("check", "loss")
    if result.failure_class == "invalid_config":  # every label part the run did not show, in the evidence's order
        axes = ", ".join(dict.fromkeys(e["axis"] for e in result.evidence if not e["ok"]))
        return f"evidence ({axes})" if axes else "evidence"
    return f"exit ({result.failure_class})"


def judge(result, mutant: Mutant):
    """Write the mutation verdict into a mutated cell's result: killed (the item passes) when a check failed
    the run after the mutant acted; survived (fails) when the run was green; inconclusive (fails) when the
    mutant changed nothing. A matrix item and the fixture alike."""
    result.killed_by = killed_by(result)
    acted = applied(result.log_dir, mutant.name)
    caught = f"[{result.failure_class}] {result.error_line}" if result.failure_class else ""
    if not acted:
        result.mutation = Mutation.INCONCLUSIVE
        result.verdict = (
            f"mutant {mutant.name} did not act in this run (nothing of its kind to change"
            f"{', or the run failed first: ' + caught if caught else ''})"
        )
    elif result.killed_by:
        result.mutation = Mutation.KILLED
        result.verdict = f"mutant {mutant.name} killed by the {result.killed_by} check: {caught}" + (
            f"; seen by {result.also_killed_by}" if result.also_killed_by else ""
        )
    else:
        result.mutation = Mutation.SURVIVED
        result.verdict = f"mutant {mutant.name} survived: the run with this bug was green ({mutant.bug})"
    result.status = Status.PASSED if result.mutation == Mutation.KILLED else Status.FAILED
    return result
