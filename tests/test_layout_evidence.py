"""A label applied to part of the model is not its label: each degree read per parameter on every rank, the memory
policy per block, pipeline stages as a partition of the blocks, and the bytes each rank holds (judge.layout), through
the titan03 target's evidence on hand-made probe records shaped as the shim writes them (shapes and placements of
the CPU profile's llama3 and DeepSeek-V3 debug models, read off real runs). Each partial record also carries the
summaries the probe wrote before (some parameter over a dimension, the graph's tags in total, distinct stage sets),
which let it pass."""

import json
import math
from pathlib import Path

import pytest

from pytest_simplefsdp.judge.evidence import read_probes
from pytest_simplefsdp.judge.layout import Rule, degree_evidence, memory, stage_evidence
from pytest_simplefsdp.spec.cells import expand
from pytest_simplefsdp.spec.matrix import load_matrix
from pytest_simplefsdp.targets import make_target

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = 4


@pytest.fixture(scope="module")
def titan(tmp_path_factory):
    matrix = load_matrix(ROOT / "matrix" / "cpu.yaml")
    target = make_target(matrix, tmp_path_factory.mktemp("cache"))
    return target, {c.id: c for c in expand(matrix)[0]}


def model(experts=False, blocks=range(BLOCKS)):
    """FQN -> global shape: a llama3-like model (with routed experts in blocks 1.., DeepSeek-V3-like)."""
    out = {"tok_embeddings.weight": [2048, 256]} if 0 in blocks else {}
    for i in blocks:
        out.update(
            {
                f"layers.{i}.attention.wqkv.weight": [768, 256],
                f"layers.{i}.attention_norm.weight": [256],
                f"layers.{i}.feed_forward.w1.weight": [768, 256],
            }
        )
        if experts and i > 0:
            out.update(
                {
                    f"layers.{i}.moe.routed_experts.inner_experts.w1_EFD": [8, 256, 256],
                    f"layers.{i}.moe.router.gate.weight": [8, 256],
                }
            )
    if BLOCKS - 1 in blocks:
        out.update({"norm.weight": [256], "lm_head.weight": [2048, 256]})
    return out


def placed(fqn, a):
    """What torchtitan 0.3 + SimpleFSDP lay a parameter out as, for the cell's degrees."""
    dp, tp, ep, rep = (int(a.get(k, 1)) for k in ("dp_shard", "tp", "ep", "dp_replicate"))
    out = {"dp_replicate": f"Replicatex{rep}"} if rep > 1 else {}
    if ".routed_experts." in fqn and ep > 1:
        return {**out, "efsdp": f"_StridedShardx{dp * tp // ep}", "ep": f"Shardx{ep}"}
    out["fsdp"] = f"Shardx{dp}"
    if tp > 1:
        out["tp"] = f"{'Replicate' if 'norm' in fqn or 'router' in fqn else 'Shard'}x{tp}"
    return out


def factor(placements):
    return math.prod(int(p.rpartition("x")[2]) for p in placements.values() if "Shard" in p)


def effects(a, shapes, overrides=None, policy=None, block_policy=None):
    """One rank's ``effects`` as the shim writes them, plus the summaries the probe wrote before."""
    params, held = {}, 0
    for fqn, shape in shapes.items():
        where = (overrides or {}).get(fqn) or placed(fqn, a)
        local = math.prod(shape) // factor(where)
        params[fqn] = [shape, 4, local, where]
        held += 4 * local
    dims = {}
    for _, _, _, where in params.values():
        for dim, p in where.items():
            dims.setdefault(dim, set()).add(p)
    some = {
        axis: str(max([int(p.rpartition("x")[2]) for d in ds for p in dims.get(d, ()) if kind in p] or [1]))
        for axis, ds, kind in (
            ("dp_shard", ("fsdp",), "Shard"),
            ("dp_replicate", ("dp_replicate",), "Replicate"),
            ("tp", ("tp",), "Shard"),
            ("ep", ("ep",), "Shard"),
        )
    }
    layers = sorted({f.split(".")[1] for f in shapes if f.startswith("layers.")}, key=int)
    out = {
        **some,
        "params": params,
        "layers": layers,
        "model_layers": BLOCKS,
        "trainer": "GraphTrainer",
        "data_parallel": "simplefsdp",
        "compile": a.get("compile", "eager"),
        "spmd_backend": "partial_dtensor",
        "memory": {"params": held, "grads": held, "optimizer": 2 * held, "peak": None, "optimizer_class": ["AdamW"]},
    }
    if int(a.get("pp", 1)) > 1:
        out["pp_schedule"] = f"Schedule{a['pp_schedule']}"
    if policy:
        out.update(
            {
                "memory_policy": policy,
                "tags": {"MUST_RECOMPUTE": 10},
                "inductor_compilation": "regional",
                "block_policy": block_policy or {b: policy for b in layers},
            }
        )
    return out


def write(log_dir, ranks):
    folder = log_dir / "evidence"
    folder.mkdir(parents=True)
    for rank, eff in enumerate(ranks):
        (folder / f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "probe": {"started": "yes", "hooks": ["train_step", "passes", "schedule", "mesh", "cp_attention"]},
                    "effects": eff,
                }
            )
        )
    return log_dir


def judged(titan, tmp_path, cell_id, ranks):
    target, cells = titan
    cell = cells[cell_id]
    found = target.evidence(cell, write(tmp_path / cell_id, ranks))
    return cell, {e.axis: e for e in found if not e.ok}, found


REPLICATED_HEAD = {"lm_head.weight": {"fsdp": "Replicatex2"}}


@pytest.mark.parametrize(
    "cell_id, experts, partial, axis, culprit",
    [
        # dp_shard: the output projection replicated over fsdp (its gradient all-reduced: the same training)
        ("llama3-dp2-eager", False, REPLICATED_HEAD, "dp_shard=2", "lm_head.weight over 1"),
        # tp: one block's projection left out of the TP plan, held whole on both TP ranks
        (
            "llama3-dp2-tp2-eager",
            False,
            {"layers.2.feed_forward.w1.weight": {"fsdp": "Shardx2", "tp": "Replicatex2"}},
            "tp=2",
            "layers.2.feed_forward.w1.weight over 1",
        ),
        # ep: one MoE block's experts not split over ep (FSDP over efsdp only)
        (
            "deepseek_v3-dp2-ep2-eager",
            True,
            {"layers.3.moe.routed_experts.inner_experts.w1_EFD": {"efsdp": "Shardx1"}},
            "ep=2",
            "layers.3.moe.routed_experts.inner_experts.w1_EFD over 1",
        ),
        # dp_replicate: a module sharded over dp_replicate x fsdp instead of copied over dp_replicate
        (
            "llama3-dpr2-dp2-eager",
            False,
            {"norm.weight": {"dp_replicate": "Shardx2", "fsdp": "Shardx2"}},
            "dp_replicate=2",
            "norm.weight over 1",
        ),
    ],
)
def test_a_degree_applied_to_part_of_the_model_fails_its_evidence(
    titan, tmp_path, cell_id, experts, partial, axis, culprit
):
    target, cells = titan
    a = cells[cell_id].axes
    whole = [effects(a, model(experts)) for _ in range(cells[cell_id].world)]
    cell, wrong, found = judged(titan, tmp_path / "whole", cell_id, whole)
    assert wrong == {}, [e.line() for e in wrong.values()]
    assert axis in {e.axis for e in found}
    _, wrong, _ = judged(
        titan, tmp_path / "partial", cell_id, [effects(a, model(experts), partial) for _ in range(cell.world)]
    )
    assert axis in wrong, sorted(wrong)
    assert not wrong[axis].infra and culprit in wrong[axis].seen
    assert " parameters, " in wrong[axis].seen and "% of bytes on rank 0" in wrong[axis].seen


def test_the_share_is_said_by_count_and_bytes_and_exemptions_by_their_rule(titan, tmp_path):
    target, cells = titan
    a = cells["llama3-dp2-tp2-eager"].axes
    _, _, found = judged(titan, tmp_path, "llama3-dp2-tp2-eager", [effects(a, model()) for _ in range(4)])
    tp = next(e for e in found if e.axis == "tp=2")
    # 4 blocks x 2 projections + embeddings + head split; 4 attention norms + the final norm kept replicated
    assert tp.line() == (
        "tp=2: expected every parameter split over 2 ranks of tp (exempt: 5 by rule: the TP plans "
        "keep RMSNorm weights replicated (SequenceParallel)), saw 10 of 10 parameters, 100.0% of "
        "bytes, on ranks 0, 1, 2, 3"
    )
    _, wrong, _ = judged(
        titan,
        tmp_path / "partial",
        "llama3-dp2-tp2-eager",
        [effects(a, model(), {"tok_embeddings.weight": {"fsdp": "Shardx2"}})] * 4,
    )
    # the embedding: 1 of 10 parameters, a fifth of the bytes the degree covers
    assert wrong["tp=2"].seen.startswith(
        "9 of 10 parameters, 80.0% of bytes on rank 0: tok_embeddings.weight over 1 on ranks 0, 1, 2, 3"
    )


def test_a_rule_can_exempt_outside_its_patterns_and_change_the_size():
    a = {"dp_shard": 2, "tp": 2, "ep": 2}
    rules = (
        Rule("ep", ("*.experts.*",), "EP splits only the experts", outside=True),
        Rule("dp_shard", ("*.experts.*",), "the rest", size=lambda a: 2 * 2 // 2),
    )
    params = {
        "a.experts.w": [[8, 4], 4, 16, {"efsdp": "Shardx2", "ep": "Shardx2"}],
        "a.attn.w": [[8, 4], 4, 16, {"fsdp": "Shardx2"}],
    }
    records = {0: {"effects": {"params": params}}}
    found = {e.axis: e for e in degree_evidence(a, records, [0], rules)}
    assert found["ep=2"].ok and "1 of 1 parameters" in found["ep=2"].seen
    assert found["dp_shard=2"].ok and found["tp=2"].ok is False  # no tp rule here: the attention is not split


def test_the_memory_policy_on_some_blocks_is_not_the_memory_policy(titan, tmp_path):
    target, cells = titan
    cell_id = "llama3-dp2-aot_fx_trace-mp_full"
    a = cells[cell_id].axes
    _, wrong, found = judged(titan, tmp_path / "whole", cell_id, [effects(a, model(), policy="full")] * 2)
    assert wrong == {}
    assert "full for blocks 0, 1, 2, 3 on ranks 0, 1" in [e for e in found if "block_policy" in e.expected][0].seen
    first_untagged = {"0": "none", "1": "full", "2": "full", "3": "full"}
    _, wrong, _ = judged(
        titan, tmp_path / "partial", cell_id, [effects(a, model(), policy="full", block_policy=first_untagged)] * 2
    )
    assert wrong["memory_policy=full"].line() == (
        "memory_policy=full: expected effects.block_policy = full for every "
        "block on every rank, saw block 0: none on ranks 0, 1"
    )


def stages(sets):
    a = {"pp": 2}
    return stage_evidence(
        a, {r: {"effects": {"layers": s, "model_layers": BLOCKS}} for r, s in enumerate(sets)}, range(len(sets))
    )


def test_pipeline_stages_must_partition_the_blocks():
    assert stages([["0", "1"], ["0", "1"], ["2", "3"], ["2", "3"]]).ok
    assert stages([["0", "3"], ["1", "2"]]).ok  # interleaved: a rank's stages hold blocks apart
    whole = stages([["0", "1", "2", "3"]] * 2)
    assert not whole.ok and whole.seen.startswith("1 distinct stages; blocks 0,1,2,3 on ranks 0, 1")
    overlap = stages([["0", "1", "2"], ["2", "3"]])  # two distinct sets, as the probe counted before
    assert not overlap.ok and overlap.seen.startswith("blocks 2 on more than one stage")
    missing = stages([["0"], ["1", "2"]])
    assert missing.line() == (
        "pp=2: expected 2 stages holding each of the model's 4 blocks once, saw blocks 3 on "
        "none; blocks 0 on ranks 0; blocks 1,2 on ranks 1"
    )


def test_a_partial_pipeline_split_fails_through_the_target(titan, tmp_path):
    target, cells = titan
    cell_id = "llama3-dp2-pp2-1F1B-eager"
    a = cells[cell_id].axes
    first, second = model(blocks=range(0, 3)), model(blocks=range(2, 4))  # block 2 on both stages
    _, wrong, _ = judged(titan, tmp_path, cell_id, [effects(a, first)] * 2 + [effects(a, second)] * 2)
    assert "blocks 2 on more than one stage" in wrong["pp=2"].seen


def test_memory_per_rank_against_the_layout(titan, tmp_path):
    target, cells = titan
    cell = cells["llama3-dp2-tp2-eager"]
    a = cell.axes
    log = write(tmp_path / "ok", [effects(a, model()) for _ in range(4)])
    held = target.memory(cell, log)
    rec = held.record()
    total = sum(math.prod(s) * 4 for s in model().values())
    assert rec["model_bytes"] == total and rec["ratio"] == 1.0
    assert rec["expected_share"] == pytest.approx((total - 5 * 256 * 4) / 4 / total + 5 * 256 * 4 / 2 / total)
    assert held.evidence().ok and set(rec["ranks"]) == {"0", "1", "2", "3"}
    # the output projection held whole: its bytes on every rank, four times its share
    bloated = effects(a, model(), {"lm_head.weight": {"fsdp": "Replicatex2", "tp": "Replicatex2"}})
    held = memory(
        a, read_probes(write(tmp_path / "bloated", [bloated] * 4) / "evidence"), range(4), target.LAYOUT_RULES
    )
    ev = held.evidence()
    assert not ev.ok and ev.seen.startswith("rank 0 holds 4196864 bytes of params, expected 2624000 (+-0)")
    assert held.record()["ratio"] == pytest.approx(4196864 / 2624000)


def test_optimizer_state_is_checked_for_adam_only(tmp_path):
    a = {"dp_shard": 2}
    params = {"w": [[4, 4], 4, 8, {"fsdp": "Shardx2"}]}  # split evenly: no padding allowance
    rec = {
        "effects": {
            "params": params,
            "memory": {"params": 32, "grads": 32, "optimizer": 32, "peak": None, "optimizer_class": ["AdamW"]},
        }
    }
    assert "32 bytes of optimizer, expected 64" in memory(a, {0: rec}, [0]).evidence().seen
    rec["effects"]["memory"]["optimizer_class"] = ["SGD"]
    assert memory(a, {0: rec}, [0]).evidence().ok
    assert memory(a, {0: {"effects": {}}}, [0]) is None
    uneven = {"w": [[5, 4], 4, 12, {"fsdp": "Shardx2"}]}  # rows 3 and 2: one row over the even 2.5
    rec = {"effects": {"params": uneven, "memory": {"params": 48, "grads": 48, "optimizer": 96, "peak": None}}}
    ev = memory(a, {0: rec}, [0]).evidence()
    assert ev.ok and ev.seen == "within the padding allowance on ranks 0 (held / expected: 1.2000)"


def unchecked_degrees(profile, cache):
    """(the degrees above 1 the profile's cells run, the ones its evidence does not name as it should)."""
    from pytest_simplefsdp.degrees import DEGREES

    matrix = load_matrix(ROOT / "matrix" / f"{profile}.yaml")
    target = make_target(matrix, cache)
    unchecked, seen = set(), set()
    for cell in expand(matrix)[0]:
        lines = target.evidence_lines(cell)
        for d in DEGREES:
            if int(cell.axes.get(d.axis, 1)) > 1:
                seen.add(d.axis)
                said = [line for line in lines if line.startswith(f"{d.axis}=")]
                if not said or "not checked" in said[0]:
                    unchecked.add(f"{d.axis} ({cell.id}): {said}")
    return seen, sorted(unchecked)


@pytest.mark.parametrize("profile", ["cpu", "h100x8", "titan02-cpu", "titan02-h100x8", "titan02-h100x4"])
def test_every_degree_a_shipped_profile_runs_has_an_evidence_check(profile, tmp_path):
    """degrees.py is the one table of degrees: a degree above 1 in any cell must be shown by the cell's evidence
    (per parameter, or the target's own reader: CP's mesh, PP's stages), never run unchecked: the seed era's
    included (etp, which only 0.2 has, among them)."""
    seen, unchecked = unchecked_degrees(profile, tmp_path)
    assert seen >= {"dp_shard", "tp", "etp" if profile == "titan02-h100x4" else "pp"}, seen
    assert unchecked == [], unchecked[:10]


def test_a_degree_left_out_of_the_evidence_is_caught(tmp_path, monkeypatch):
    import pytest_simplefsdp.targets.base as base

    monkeypatch.setattr(base, "PLACED", tuple(d for d in base.PLACED if d.axis != "tp"))
    _, unchecked = unchecked_degrees("cpu", tmp_path)
    assert unchecked and all(u.startswith("tp (") for u in unchecked), unchecked[:5]


def test_the_seed_eras_layout_is_read_per_parameter_as_0_3s(tmp_path):
    """torchtitan 0.2's simple_fsdp lays deepseek_v3 dp2 tp2 ep2 (etp 1) out on its own mesh names (dp_shard_cp,
    dp_shard_mod_ep for the experts' FSDP share, ep, tp); the records of a real run (torchtitan 0.2.0, the four ranks'
    params and memory) show every degree of the label, etp's among them. The same records with the routed experts
    also split over tp (as etp 2 would, the label saying 1) fail etp, and with one projection left unsharded over
    dp_shard_cp fail dp_shard."""
    matrix = load_matrix(ROOT / "matrix" / "titan02-cpu.yaml")
    target = make_target(matrix, tmp_path / "cache")
    cell = {c.id: c for c in expand(matrix)[0]}["deepseek_v3-dp2-tp2-ep2-eager"]
    real = json.loads((ROOT / "tests" / "data" / "titan02_dp2_tp2_ep2_records.json").read_text())

    def judge(name, change=lambda fqn, entry: entry):
        ranks = []
        for rank in range(4):
            eff = real[str(rank)]["effects"]
            ranks.append({**eff, "params": {fqn: change(fqn, list(e)) for fqn, e in eff["params"].items()}})
        log_dir = write(tmp_path / name, ranks)
        found = target.layout_evidence(cell, log_dir) + [target.memory(cell, log_dir).evidence()]
        return {e.axis: e for e in found}

    found = judge("real")
    assert all(e.ok for e in found.values()), [e.line() for e in found.values() if not e.ok]
    assert found["etp=1"].seen == "15 of 15 parameters, 100.0% of bytes, on ranks 0, 1, 2, 3"
    assert found["dp_shard=2"].seen == "83 of 83 parameters, 100.0% of bytes, on ranks 0, 1, 2, 3"

    def experts_over_tp(fqn, entry):
        if ".moe.experts." in fqn:
            entry[2], entry[3] = entry[2] // 2, {**entry[3], "tp": "Shardx2"}
        return entry

    found = judge("etp", experts_over_tp)
    assert not found["etp=1"].ok and "layers.1.moe.experts.w1 over 2 on ranks 0, 1, 2, 3" in found["etp=1"].seen

    def wq_whole(fqn, entry):
        if fqn == "layers.0.attention.wq.weight":
            entry[2], entry[3] = entry[2] * 2, {"tp": entry[3]["tp"]}
        return entry

    found = judge("whole", wq_whole)
    assert not found["dp_shard=2"].ok and "82 of 83 parameters" in found["dp_shard=2"].seen


def test_a_degree_the_generation_lacks_is_not_judged_on_it(titan, tmp_path):
    """`etp` is 0.2's alone, but an upstream test's options on 0.3 may still name it (--parallelism.
    expert_tensor_parallel_degree 1 beside tp 2): 0.3's evidence reads no etp, where it once failed every TP-split
    parameter as "split over 2, expected 1" (the main tier's upstream trace cell, issue 60's first CI run)."""
    import dataclasses

    target, cells = titan
    cell = dataclasses.replace(cells["llama3-dp2-tp2-eager"], axes={**cells["llama3-dp2-tp2-eager"].axes, "etp": 1})
    assert not [line for line in target.evidence_lines(cell) if line.startswith("etp=")]
    ranks = [effects(cell.axes, model()) for _ in range(cell.world)]
    found = target.layout_evidence(cell, write(tmp_path / "etp", ranks))
    assert found and all(e.ok for e in found) and "etp=1" not in {e.axis for e in found}
