"""A policy config as the launch an operator would run: server arguments, model, machine.

The translation is by input name, so that it works for every version of a policy family:
- the model inputs pick an architecture, whose local model folder the driver writes;
- the machine inputs become the platform and the GPU's compute capability;
- the --hisparse-config fields become one JSON argument;
- an input that is an environment variable (`env:`) is set in the launch's environment;
- every other input is a server flag, spelled as the policy spells it (its primary flag), given
  only when its value differs from the policy's default (the operator typed nothing there).
The fields the policy decides (the inputs its rules write, the phases) are read back as resolved
(Case.reads), and the log lines kept are those of the routing of the policy's model class.
"""
from __future__ import annotations

import json

from engine.sglang.conform.protocol import Case

# model_family value -> the HF architecture of that model's config.json
ARCHITECTURES = {
    "deepseek_v32": "DeepseekV32ForCausalLM",
    "glm5": "GlmMoeDsaForCausalLM",
    "glm5_next": "Glm5NextForConditionalGeneration",
    "longcat_flash": "LongcatFlashForCausalLM",
}
# a non-DSA model runs as both kinds SGLang's generic gates tell apart: an MLA model (DeepSeek-V3:
# the DeepSeek family without index_topk) and an MHA one (Llama-3.1-8B's architecture)
NON_DSA_ARCHITECTURES = ("DeepseekV3ForCausalLM", "LlamaForCausalLM")
NON_DSA_ARCHITECTURE = NON_DSA_ARCHITECTURES[0]
MODEL_INPUTS = ("dsa_model", "model_family")
MACHINE_INPUTS = ("platform", "sm_major", "sm_minor")
# input -> its key in SGLang's --hisparse-config JSON
HISPARSE_CONFIG = {"hisparse_top_k": "top_k", "hisparse_device_buffer_size": "device_buffer_size",
                   "hisparse_swap_in_block_size": "swap_in_block_size",
                   "hisparse_host_to_device_ratio": "host_to_device_ratio"}


def architecture(config: dict) -> str:
    if config.get("dsa_model", True) is False:
        return NON_DSA_ARCHITECTURE
    return ARCHITECTURES[config.get("model_family") or "deepseek_v32"]


def model_of(policy, config: dict) -> tuple[str, tuple]:
    """(architecture, extra config.json fields) of a config's model: a DSA family's by its
    model_family (ARCHITECTURES), another class's from the registry (V4.1: its model_type)."""
    if "dsa" in policy.models:
        return architecture(config), ()
    from engine.sglang.registry import MODEL_TYPES, architecture_of

    arch = architecture_of(config.get("model_family") or policy.inputs["model_family"].default)
    model_type = next((t for t, a in MODEL_TYPES.items() if a is arch), None)
    return arch.name, ((("model_type", model_type),) if model_type else ())


def cases_of(policy, config: dict) -> tuple[Case, ...]:
    """The launches that stand for a complete canonical config: one for a DSA model, one per
    non-DSA model kind (NON_DSA_ARCHITECTURES) otherwise."""
    if config.get("dsa_model", True) is False:
        return tuple(case_of(policy, config, arch) for arch in NON_DSA_ARCHITECTURES)
    return (case_of(policy, config),)


def case_of(policy, config: dict, architecture_name: str | None = None) -> Case:
    """The launch for a complete canonical config of `policy` (every input present), on the
    model of that architecture (default: the config's own, the MLA one for a non-DSA model)."""
    argv: list[str] = []
    hisparse: dict = {}
    env: list = []
    for name, spec in policy.inputs.items():
        if name in MODEL_INPUTS or name in MACHINE_INPUTS:
            continue
        value = config[name]
        if spec.env is not None:
            if value is not None:
                env.append((spec.env, str(value)))
            continue
        if name in HISPARSE_CONFIG:
            if value is not None and value != spec.default:
                hisparse[HISPARSE_CONFIG[name]] = value
            continue
        if value == spec.default and type(value) is type(spec.default):
            continue
        if spec.type == "bool":
            if value:
                argv.append(spec.flag)
            else:  # a flag whose default is on: SGLang spells its negation --no-X
                argv.append("--no-" + spec.flag[2:])
            continue
        argv += [spec.flag, str(value)]
    if hisparse:
        argv += ["--hisparse-config", json.dumps(hisparse, separators=(",", ":"))]
    capability = (int(config.get("sm_major", 9)), int(config.get("sm_minor", 0) or 0))
    arch, extra = model_of(policy, config)
    reads = tuple(n for n in (*policy.written, *(spec.input for spec in policy.phases.values()))
                  if policy.inputs[n].env is None)
    return Case(tuple(argv), architecture_name or arch, config.get("platform", "cuda"), capability, extra,
                tuple(sorted(env)), reads, policy.models[0])
