# A small stand-in for an upstream suite in the `configs` form (upstream 4f167b017, #4177: each run names a full
# configuration, a function returning the trainer's config, and upstream's runner selects it with
# MODULE=<its module> CONFIG=<its name>); one test keeps the older override_args form beside them.
from dataclasses import dataclass, field

from tests.integration_tests import OverrideDefinitions


@dataclass
class Parallelism:
    data_parallel_replicate_degree: int = 1
    data_parallel_shard_degree: int = -1
    tensor_parallel_degree: int = 1
    expert_parallel_degree: int = 1
    context_parallel_degree: int = 1
    pipeline_parallel_degree: int = 1
    pipeline_parallel_schedule: str = "1F1B"


@dataclass
class Compile:
    mode: str | None = "aot_fx_trace"
    backend: str = "aot_eager"
    inductor_compilation: str = "regional"
    memory_policy: str = "default"


@dataclass
class ModelSpec:
    name: str = "graph_trainer/llama3"
    flavor: str = "debugmodel"


@dataclass
class Config:
    parallelism: Parallelism = field(default_factory=Parallelism)
    compile: Compile = field(default_factory=Compile)
    model_spec: ModelSpec = field(default_factory=ModelSpec)


def llama3_debugmodel_fsdp2_tp2():
    return Config(Parallelism(data_parallel_shard_degree=2, tensor_parallel_degree=2))


def llama3_debugmodel_fsdp4_jit():
    return Config(Parallelism(data_parallel_shard_degree=4), Compile(mode="jit", backend="inductor"))


def llama3_8b_fsdp8_eager():
    return Config(Parallelism(data_parallel_shard_degree=8), Compile(mode=None), ModelSpec(flavor="8B"))


def deepseek_v3_debugmodel_ep2_pp2():
    return Config(
        Parallelism(expert_parallel_degree=2, pipeline_parallel_degree=2, pipeline_parallel_schedule="Interleaved1F1B"),
        model_spec=ModelSpec(name="graph_trainer/deepseek_v3"),
    )


def deepseek_v3_debugmodel_ep4():
    return Config(Parallelism(expert_parallel_degree=4), model_spec=ModelSpec(name="graph_trainer/deepseek_v3"))


def build_tests():
    return [
        OverrideDefinitions(
            configs=[llama3_debugmodel_fsdp2_tp2],
            test_descr="aot_fx_trace FSDP+TP",
            test_name="aot_fx_trace_fsdp_tp",
        ),
        OverrideDefinitions(
            configs=[llama3_debugmodel_fsdp4_jit],
            test_descr="JIT FSDP, inductor",
            test_name="jit_fsdp_inductor",
            # TODO: inductor on JIT is off until the partitioner regression (#2149) is fixed.
            disabled=True,
        ),
        OverrideDefinitions(
            configs=[llama3_8b_fsdp8_eager],
            test_descr="8B eager",
            test_name="eager_8b",
            ngpu=8,
        ),
        # save on one layout, resume on another
        OverrideDefinitions(
            configs=[deepseek_v3_debugmodel_ep2_pp2, deepseek_v3_debugmodel_ep4],
            override_args=[["--checkpoint.enable"], ["--checkpoint.enable", "--training.steps 20"]],
            test_descr="checkpoint across layouts",
            test_name="moe_checkpoint_relayout",
            ngpu=8,
        ),
        OverrideDefinitions(
            [["--module graph_trainer.llama3", "--config graph_trainer_llama3_debugmodel", "--compile.mode jit"]],
            "JIT 1D",
            "jit_1d",
        ),
    ]


_TEST_SUITES_FUNCTION = {"all": build_tests}
