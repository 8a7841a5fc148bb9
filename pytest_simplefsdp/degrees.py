"""The parallelism degrees whose layout shows on the parameters: which mesh dimensions show each and with what
placement. judge.layout reads a degree per parameter from the probe's record of each parameter's placements."""

from __future__ import annotations

from dataclasses import dataclass

SPLIT = ("Shard", "_StridedShard")  # a piece per rank (SimpleFSDP + TP shards strided)
COPIED = ("Replicate",)


@dataclass(frozen=True)
class Degree:
    axis: str  # the matrix axis, e.g. "dp_shard"
    dims: tuple  # the mesh dimensions that show it (SimpleFSDP names its dimension fsdp, FSDP2 dp_shard)
    placements: tuple  # the placements on those dimensions that count: SPLIT or COPIED
    shards: bool  # whether it divides the bytes a rank holds

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


# routed experts are split over efsdp x ep: their data-parallel share is efsdp (a target says so, judge.layout)
DEGREES = (Degree("dp_shard", ("fsdp", "dp_shard", "dp_shard_cp", "efsdp"), SPLIT, True),
           Degree("dp_replicate", ("dp_replicate",), COPIED, False),
           Degree("tp", ("tp",), SPLIT, True),
           Degree("ep", ("ep",), SPLIT, True))
BY_AXIS = {d.axis: d for d in DEGREES}
