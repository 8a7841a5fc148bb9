"""The one table of parallelism degrees: each degree's matrix axis, torchtitan's option for it, the status page's
row, and the mesh dimensions and placement that show it on the parameters. The targets spell their flags from it,
the upstream reader reads upstream's configs with it, judge.layout checks each parameter's placements against it
and the status page lists it. A new degree is a row here (plus the effect reader that shows it, where it is not on
the parameters: CP's mesh, PP's stages, in the target's evidence)."""

from __future__ import annotations

from dataclasses import dataclass

SPLIT = ("Shard", "_StridedShard")  # a piece per rank (SimpleFSDP + TP shards strided)
COPIED = ("Replicate",)
ERAS = ("titan02", "titan03")  # the built-in targets


@dataclass(frozen=True)
class Degree:
    axis: str  # the matrix axis, e.g. "dp_shard"
    option: str  # torchtitan's ``parallelism.<option>`` (0.2, 0.3 and main alike)
    label: str  # its row on the status page
    dims: tuple = ()  # the mesh dimensions that show it per parameter (SimpleFSDP names its dimension fsdp, FSDP2
    # dp_shard); none: it does not show on the parameters (its target's evidence reads it elsewhere)
    placements: tuple = ()  # the placements on those dimensions that count: SPLIT or COPIED
    shards: bool = False  # whether it divides the bytes a rank holds
    eras: tuple = ERAS  # the built-in targets whose torchtitan has the option

    def size(self, axes: dict) -> int:
        """The size the cell's label asks for (a CP degree folds into dp_shard's dimension)."""
        value = int(axes.get(self.axis, 1))
        return value * int(axes.get("cp", 1)) if self.axis == "dp_shard" else value

    def of(self, placed: dict) -> int:
        """The product of the sizes of this degree's dimensions a parameter is placed on this way (1: none)."""
        out = 1
        for dim in self.dims:
            kind, _, size = placed.get(dim, "x1").rpartition("x")
            if kind in self.placements:
                out *= int(size)
        return out

    def words(self, size: int) -> str:
        return f"{'split' if self.shards else 'copied'} over {size} rank{'s' if size != 1 else ''} of {'/'.join(self.dims)}"


# in the order their flags are written; routed experts are split over efsdp x ep: their data-parallel share is
# efsdp (a target says so, judge.layout)
DEGREES = (
    Degree(
        "dp_replicate", "data_parallel_replicate_degree", "DDP / HSDP (dp_replicate > 1)", ("dp_replicate",), COPIED
    ),
    Degree(
        "dp_shard",
        "data_parallel_shard_degree",
        "FSDP (dp_shard > 1)",
        ("fsdp", "dp_shard", "dp_shard_cp", "efsdp", "dp_shard_mod_ep"),  # 0.3: fsdp, efsdp; 0.2: dp_shard_cp, *_mod_ep
        SPLIT,
        True,
    ),
    Degree("tp", "tensor_parallel_degree", "TP (tp > 1)", ("tp",), SPLIT, True),
    Degree("ep", "expert_parallel_degree", "EP (ep > 1)", ("ep",), SPLIT, True),
    Degree("cp", "context_parallel_degree", "CP (cp > 1)"),  # folds into dp_shard's dimension
    Degree("pp", "pipeline_parallel_degree", "PP (pp > 1)"),  # a stage per rank: the target's stage evidence
    # the seed era's: routed experts split over tp's mesh dimension (with EP; the target's rules scope it)
    Degree("etp", "expert_tensor_parallel_degree", "ETP (etp > 1)", ("tp",), SPLIT, True, eras=("titan02",)),
)
BY_AXIS = {d.axis: d for d in DEGREES}
PLACED = tuple(d for d in DEGREES if d.dims)  # the degrees judge.layout reads per parameter
BY_OPTION = {d.option: d.axis for d in DEGREES}  # upstream's configs, in the matrix's words


def flags(era: str) -> dict:
    """axis -> torchtitan option of the degrees a built-in target's torchtitan has, in the table's order."""
    return {d.axis: d.option for d in DEGREES if era in d.eras}
