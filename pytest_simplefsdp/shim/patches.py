"""The CPU patches: each lets the unmodified torchtitan trainer over one concrete gap of running on CPU ranks with
gloo (see the README, "Running on CPU"), one set per torchtitan generation (``SIMPLEFSDP_CPU_SHIM=<generation>``);
``SIMPLEFSDP_CPU_SHIM_SKIP=name,name`` switches single patches off, so the failure a patch hides can still be
seen. No patch bridges a torch version: each target runs on the torch its torchtitan was released against."""

import os
import time

from .hooks import CP_ATTENTION, after_import


def device_type_cpu():
    """torchtitan picks its device at import: ``_get_available_device_type() or "cuda"``."""
    import torch._utils

    original = torch._utils._get_available_device_type
    torch._utils._get_available_device_type = lambda: original() or "cpu"


def cpu_memory_monitor():
    """torchtitan's memory monitor calls CUDA-only functions on ``torch.cpu``."""
    import collections

    import torch

    props = collections.namedtuple("CpuProperties", "name total_memory")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fill = {
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: props("cpu", total),
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_stats": lambda device=None: {},
    }
    for name, fn in fill.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)


def barrier_device_ids():
    """torchtitan passes ``device_ids=[torch.cpu.current_device()]`` (the string "cpu")."""
    import torch.distributed as dist

    original = dist.barrier

    def barrier(*args, device_ids=None, **kwargs):
        if device_ids is not None and not all(isinstance(d, int) for d in device_ids):
            device_ids = None
        return original(*args, device_ids=device_ids, **kwargs)

    dist.barrier = barrier


def dram_bandwidth_constant():
    """inductor's overlap scheduler asks ``triton.testing.get_dram_gbps()``, which needs a GPU."""

    @after_import("triton.testing")
    def patch(module):
        module.get_dram_gbps = lambda *a, **k: 100.0


def cpu_sdpa_saved():
    """Graph SAC must save the CPU flash-attention op, or remat hits its RNG op."""

    @after_import("torchtitan.distributed.activation_checkpoint")
    def patch(module):
        import torch

        # its name: _get_default_save_ops, _get_save_ops on main before summer 2026 (none: nothing to patch)
        name = next((n for n in ("_get_default_save_ops", "_get_save_ops") if hasattr(module, n)), None)
        if name is None:
            return
        original = getattr(module, name)

        def save_ops():
            ops = original()
            ops.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
            return ops

        setattr(module, name, save_ops)


def cp_ring_attention_cpu():
    """torch's context parallelism serves SDPA by ring attention for the CUDA kernels only (flash, efficient,
    cuDNN); a CP rank's CPU SDPA stops at "_scaled_dot_product_flash_attention_for_cpu ... does not have a sharding
    strategy registered". Serve the CPU flash kernel the same way, with torch's own ring (`_templated_ring_attention`
    and its backward: the kv chunks rotate over the cp group, the partial outputs merge by their logsumexp, the
    head-tail load balancer's chunk pairs as on GPU), and its sharding rule (every tensor split on the sequence dim).
    Sound as on GPU: the CPU kernel returns the logsumexp the merge needs and its backward takes the merged output
    and logsumexp, as flash's does. Installed with CP's own rules (only while CP's dispatcher is on), so no layout
    without CP sees it. The CPU kernel wants one head size for q, k and v; deepseek_v3's values are narrower (128
    vs 192), which sends SDPA to its math path, which CP cannot split ("got mixed torch.Tensor and DTensor"): under
    CP the values are zero-padded to the queries' head size and the output cut back (exact: the padded columns of
    the output are zeros, the softmax and its scale are the queries' and keys')."""
    import torch.nn.functional as F

    sdpa = F.scaled_dot_product_attention

    def scaled_dot_product_attention(query, key, value, *args, **kwargs):
        width, narrow = query.size(-1), value.size(-1)
        if narrow >= width or not _on_cp_mesh(query):
            return sdpa(query, key, value, *args, **kwargs)
        out = sdpa(query, key, F.pad(value, (0, width - narrow)), *args, **kwargs)
        return out[..., :narrow]

    F.scaled_dot_product_attention = scaled_dot_product_attention

    @after_import(CP_ATTENTION)
    def patch(module):
        import importlib

        rules = importlib.import_module(CP_ATTENTION.rpartition(".")[0] + "._sharding_rules")
        forward, backward = _cpu_flash_ops()
        module.custom_ops[forward] = module.custom_ops[backward] = _cpu_ring_handler(module)
        original = rules.register_cp_sharding_rules

        def register():
            fresh = not rules._cp_strategy_contexts
            original()
            if fresh:  # as torch registers its own (unregister_cp_sharding_rules takes them all back)
                for op, strategy in ((forward, _cp_forward_strategy), (backward, _cp_backward_strategy)):
                    context = rules._single_dim_strategy_context(op, strategy, None)
                    rules._original_strategies[op] = context.__enter__()
                    rules._cp_strategy_contexts[op] = context

        rules.register_cp_sharding_rules = register


def _on_cp_mesh(t) -> bool:
    """A DTensor of context parallelism's mesh (torchtitan's CP wraps attention's inputs on the cp mesh)."""
    mesh = getattr(t, "device_mesh", None)
    return "cp" in (getattr(mesh, "mesh_dim_names", None) or ())


def _cpu_flash_ops():
    import torch

    aten = torch.ops.aten
    return aten._scaled_dot_product_flash_attention_for_cpu.default, (
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    )


def _seq_split():
    from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder

    return _ShardingPlaceholder(2)  # [batch, heads, sequence, head_dim]; the logsumexp [batch, heads, sequence]


def _cp_forward_strategy(op, args_schema, kwargs_schema):
    return [[_seq_split() for _ in ("output", "logsumexp", "query", "key", "value")]]


def _cp_backward_strategy(op, args_schema, kwargs_schema):
    names = ("grad_query", "grad_key", "grad_value", "grad_out", "query", "key", "value", "out", "logsumexp")
    return [[_seq_split() for _ in names]]


def _cpu_ring_handler(module):
    """The DTensor handler of the two CPU ops under CP: ring attention on the local chunks (as torch's
    ``_sdpa_handler`` does for the CUDA ops)."""
    from torch.distributed.tensor import DTensor

    forward, backward = _cpu_flash_ops()

    def handler(op_call, args, kwargs):
        dispatcher = DTensor._op_dispatcher
        info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
        dispatcher.sharding_propagator.propagate(info)
        sharding = info.output_sharding
        if sharding is None or sharding.needs_redistribute:
            raise AssertionError(f"{op_call}: CP's inputs must all be split on the sequence dim")
        names = [a.name for a in op_call._schema.arguments]
        given = {**dict(zip(names, info.local_args)), **info.local_kwargs}
        if given.get("attn_mask") is not None or given.get("dropout_p", 0.0):
            raise NotImplementedError("CP ring attention on CPU: no attn_mask, no dropout")
        common = dict(is_causal=given.get("is_causal", False), dropout_p=0.0, scale=given.get("scale"))
        group = info.compute_mesh.get_group()
        if op_call is forward:
            local = module._templated_ring_attention(
                group, 2, forward, query=given["query"], key=given["key"], value=given["value"], **common
            )
        else:
            local = module._templated_ring_attention_backward(
                group,
                2,
                backward,
                grad_out=given["grad_out"],
                grad_out_name="grad_out",
                query=given["query"],
                key=given["key"],
                value=given["value"],
                out=given["out"],
                logsumexp=given["logsumexp"],
                **common,
            )
        return dispatcher.wrap(local, sharding.output_spec)

    return handler


def fsdp2_sum_reduction():
    """Gloo has neither PREMUL_SUM nor AVG: FSDP2 (the core trainer, the reference cells) reduces gradients
    with SUM and divides after, as torch already does for MTIA."""

    @after_import("torch.distributed.fsdp._fully_shard._fsdp_collectives")
    def patch(module):
        original = module._get_gradient_divide_factors

        def divide_factors(rs_group, ar_group, reduce_dtype, device_type="", factor=None, force_sum=False):
            return original(rs_group, ar_group, reduce_dtype, device_type, factor, force_sum or device_type == "cpu")

        module._get_gradient_divide_factors = divide_factors


# --- torchtitan 0.2 (the seed era) only ---------------------------------------------------


def sdpa_math_backend():
    """0.2's SDPA wrapper allows only CUDA kernels; the CPU flash kernel needs equal head sizes
    (deepseek_v3 uses 192 for q/k, 128 for v): let it fall back to MATH ("No available kernel")."""

    @after_import("torchtitan.models.attention")
    def patch(module):
        from torch.nn.attention import SDPBackend

        module.ScaledDotProductAttentionWrapper.sdpa_backends = [
            SDPBackend.FLASH_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.MATH,
        ]


def histc_integer_input():
    """The MoE router counts tokens with ``torch.histc`` on Long input: no CPU kernel
    ("histogram_cpu" not implemented for 'Long'). Count in float, return the input's dtype."""
    import torch

    original = torch.histc

    def histc(input, *args, **kwargs):
        if not input.is_floating_point():
            return original(input.float(), *args, **kwargs).to(input.dtype)
        return original(input, *args, **kwargs)

    torch.histc = histc


def fill_indices_tensor_ops():
    """EP token permutation calls a Triton kernel; 0.2's own CPU fallback loops over ``.item()``,
    which full-graph compile cannot trace. Same result with fixed-shape tensor ops. (0.2's module, and main's
    until the padding went, fe80b63cf, 2026-04-02; its kernel wants a Triton driver: "0 active drivers" on CPU.)"""
    for name in ("torchtitan.models.moe.kernels", "torchtitan.models.common.moe.kernels"):

        @after_import(name)
        def patch(module):
            module.fill_indices_wrapper = fill_indices


def fill_indices(
    tokens_per_expert_group,
    start_index_values,
    write_offsets,
    experts_per_rank,
    num_ranks,
    max_len,
    block_size=128,
    max_blocks=1024,
):
    """For each local expert, the token indices it receives from every rank, in rank order, written
    from the expert's offset; -1 elsewhere (the contract of 0.2's ``fill_indices_wrapper``)."""
    import torch

    tokens = tokens_per_expert_group.view(num_ranks, experts_per_rank).t().to(torch.int64)  # [expert, rank]
    starts = start_index_values.view(num_ranks, experts_per_rank).t().to(torch.int64)
    before = torch.cumsum(tokens, dim=1) - tokens  # tokens of earlier ranks, same expert
    write = (write_offsets.to(torch.int64).view(-1, 1) + before).reshape(-1)
    length, source = tokens.reshape(-1), starts.reshape(-1)
    pos = torch.arange(max_len, device=tokens.device).view(-1, 1)
    inside = (pos >= write) & (pos < write + length)  # [position, segment]
    value = torch.where(inside, source + pos - write, torch.zeros_like(inside, dtype=torch.int64))
    out = torch.where(inside.any(dim=1), value.sum(dim=1), torch.full_like(pos.view(-1), -1))
    return out.to(torch.int32)


def grouped_mm_on_cpu():
    """0.2 takes the grouped-mm expert path only on SM90+ GPUs; on CPU it would take a for-loop
    path that H100s never run (and that fails under compile). torch 2.10.0's CPU ``_grouped_mm``
    matches the per-expert matmuls forward and backward (tests/test_shim.py checks it on the installed
    torch), so keep CPU on the GPU's code path."""
    for name in ("torchtitan.models.deepseek_v3.model.args", "torchtitan.models.llama4.model.args"):

        @after_import(name)
        def patch(module):
            module.has_cuda_capability = lambda major, minor: True


def autobucketing_analytic_estimates():
    """SimpleFSDP's ``auto_bucketing`` pass (inductor's overlap scheduler) times every compute node with Triton's GPU
    benchmark, which has no CPU driver ("0 active drivers"), and its roofline fallback reads CUDA's capabilities. On
    CPU ranks a matmul costs its FLOPs at a nominal 1 TFLOP/s and every other compute node nothing (the collectives
    keep the scheduler's own analytical estimates): the pass still buckets and reorders, by other times than a GPU's."""

    @after_import("torch._inductor.fx_passes.overlap_scheduling")
    def patch(module):
        original = module.benchmark_node_with_cache_key

        def estimated(n, custom_runtime_estimation=None):
            return original(n, custom_runtime_estimation or nominal_mm_time)

        module.benchmark_node_with_cache_key = estimated
        module.estimate_runtime_analytical = nominal_mm_time  # (also logged beside every benchmark)


def nominal_mm_time(node, override_size=None):
    """Milliseconds of an ``aten.mm`` node at 1 TFLOP/s (1e9 FLOPs a millisecond); 0 for any other node."""
    import torch

    if node.target != torch.ops.aten.mm.default:
        return 0.0
    a, b = (arg.meta["val"].shape for arg in node.args[:2])
    return 2.0 * a[0] * a[1] * b[1] / 1e9


def end_of_run_sleep():
    """Rank 0 ends every run with ``time.sleep(2)`` "for other ranks to complete" (0.3's trainer.py). No rank
    needs it here: the launcher waits for every rank, and the last collective is behind all of them. It is
    2 s of every cell's wall time (a third of a forked eager cell), so that one module's ``time.sleep``
    returns at once; switch the patch off to get the sleep back. (0.2 sleeps in train.py, which runs as
    ``__main__``: no import hook reaches it, so the seed era keeps its sleep.)"""

    class TimeWithoutSleep:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds):
            pass

    @after_import("torchtitan.trainer")
    def patch(module):
        if getattr(module, "time", None) is time:
            module.time = TimeWithoutSleep()


SHARED = {
    "device_type_cpu": device_type_cpu,
    "cpu_memory_monitor": cpu_memory_monitor,
    "barrier_device_ids": barrier_device_ids,
    "dram_bandwidth_constant": dram_bandwidth_constant,
}
PATCH_SETS = {  # SIMPLEFSDP_CPU_SHIM names the set: one per torchtitan generation
    "titan03": {
        **SHARED,
        "cpu_sdpa_saved": cpu_sdpa_saved,
        "cp_ring_attention_cpu": cp_ring_attention_cpu,
        "fsdp2_sum_reduction": fsdp2_sum_reduction,
        "end_of_run_sleep": end_of_run_sleep,
        # main before fe80b63cf (#2774, 2026-04-02) still counted tokens with histc on Long and permuted them with
        # a Triton kernel (inert after it: no histc on Long, no such module)
        "histc_integer_input": histc_integer_input,
        "fill_indices_tensor_ops": fill_indices_tensor_ops,
    },
    "titan02": {
        **SHARED,
        "sdpa_math_backend": sdpa_math_backend,
        "histc_integer_input": histc_integer_input,
        "fill_indices_tensor_ops": fill_indices_tensor_ops,
        "grouped_mm_on_cpu": grouped_mm_on_cpu,
        "autobucketing_analytic_estimates": autobucketing_analytic_estimates,
    },
}
