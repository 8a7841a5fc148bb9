"""The probe's maths over sharded parameters: full-tensor norms and bit checksums from every rank's shards, with a
few batched all-gathers instead of one collective per tensor, and the position-weighted hash of a tensor's bits
that sums exactly over shards in any order. Rank-side; torch is imported inside (the shim loads before it)."""

_PRIME = 2**31 - 1  # two residues multiply within int64, and 2**32 products of residues sum within it


def shard_dims(t):
    """The mesh dims that split a DTensor: Shard, and _StridedShard (SimpleFSDP + TP), for which is_shard() is False
    on torch 2.14; () for a replicated DTensor or a plain tensor."""
    return tuple(
        i for i, pl in enumerate(getattr(t, "placements", None) or ()) if not (pl.is_replicate() or pl.is_partial())
    )


def shard_key(t) -> str:
    """Which piece of the full tensor this rank holds: its coordinates on the mesh dims that split the tensor
    ("" for a whole tensor). Ranks with the same key hold copies of the same piece."""
    dims = shard_dims(t)
    if not dims:
        return ""
    names = t.device_mesh.mesh_dim_names or tuple(str(i) for i in range(t.device_mesh.ndim))
    coords = t.device_mesh.get_coordinate() or ()
    return ",".join(f"{names[i]}={coords[i]}" for i in dims)


def local(t):
    """The rank's own part of a parameter (a DTensor's local shard, else the tensor)."""
    t = t.detach()
    return t.to_local() if hasattr(t, "to_local") else t


def over_shards(tensors, part, whole, finish):
    """FQN -> a value of each full tensor (None stays None), with one all-gather per mesh dimension and group of
    alike DTensors instead of one collective per tensor (hundreds per step on TP/EP layouts, where each costs a
    round of every rank being scheduled). ``part(t)``: (a 0-d tensor from this rank's shard of ``t``, whether the
    shard could be used); the tensors are summed over the mesh dims that split the tensor, in rank order (so the
    result does not depend on how tensors are grouped), then ``finish``-ed. ``whole(x)``: the value of a tensor held
    whole: a plain tensor, a replicated DTensor's local copy, and the gathered full tensor where a placement is
    Partial (a pending reduction) or ``part`` could not use the shard on some rank. That last decision travels in the
    same all-gather (a flag per tensor), so every rank of the mesh takes the same path: a rank that gathered alone
    would wait forever for its peers."""
    import torch
    import torch.distributed as dist

    out, groups = {}, {}
    for fqn, t in tensors.items():
        if t is None:
            out[fqn] = None
            continue
        t = t.detach()
        placements = getattr(t, "placements", None)
        dims = shard_dims(t)
        if placements is None:
            out[fqn] = whole(t)
        elif any(pl.is_partial() for pl in placements):
            out[fqn] = whole(t.full_tensor())
        elif not dims:  # replicated: every rank holds the whole tensor
            out[fqn] = whole(t.to_local())
        else:
            value, usable = part(t)
            groups.setdefault((t.device_mesh, dims, value.dtype), []).append((fqn, t, value, usable))
    for (mesh, dims, _), items in groups.items():  # the same order on every rank: the FQNs' order
        values = [value for _, _, value, _ in items]
        total = torch.stack(values + [torch.zeros_like(v) + (not usable) for v, (*_, usable) in zip(values, items)])
        for dim in dims:
            group = mesh.get_group(dim)
            parts = [torch.empty_like(total) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, total, group=group)
            total = parts[0]
            for other in parts[1:]:
                total = total + other
        done, unusable = finish(total[: len(items)]).tolist(), (total[len(items) :] > 0).tolist()
        for (fqn, t, _, _), value, gather in zip(items, done, unusable):
            out[fqn] = whole(t.full_tensor()) if gather else value  # the same on every rank: the flags are summed
    return {fqn: out[fqn] for fqn in tensors}


def norms(tensors):
    """FQN -> the 2-norm of each full tensor: the root of the sum of its shards' squared norms."""
    import torch

    norm = torch.linalg.vector_norm
    return over_shards(
        tensors, lambda t: (norm(t.to_local()).pow(2), True), lambda x: float(norm(x)), lambda s: s.pow(0.5)
    )


def bits_hash(values, index):
    """sum((index + 1) * bits(value)) mod _PRIME over the elements, on their exact bit patterns, in integers: a
    moved, permuted or changed value changes it (unlike a norm), and sums of it over shards are exact in any order."""
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[values.element_size()]
    bits = values.contiguous().view(ints).flatten().to(torch.int64).remainder(_PRIME)
    return (bits * index.flatten().add(1).remainder(_PRIME)).remainder(_PRIME).sum().remainder(_PRIME)


def checksums(tensors):
    """FQN -> a position-weighted hash of each full tensor's bits (``bits_hash``), the same whatever the layout:
    each rank hashes its shard at the shard's positions in the full tensor, and the shards' hashes are summed,
    so no tensor is gathered. The positions are an index tensor split as the DTensor is, locally
    (``src_data_rank=None``: no communication); a tensor they do not fit on some rank is hashed from the full tensor."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    def part(t):
        local = t.to_local()
        try:
            positions = torch.arange(t.numel(), device=t.device).view(t.shape)
            index = distribute_tensor(positions, t.device_mesh, t.placements, src_data_rank=None).to_local()
        except Exception:  # a placement the split does not know (the whole tensor is hashed instead)
            index = None
        if index is None or index.shape != local.shape:
            return torch.zeros((), dtype=torch.int64), False
        return bits_hash(local, index), True

    return over_shards(
        tensors,
        part,
        lambda x: int(bits_hash(x, torch.arange(x.numel(), device=x.device))),
        lambda s: s.remainder(_PRIME),
    )
