"""Model folders for a driver: a directory holding only a `config.json`, written by transformers'
own config class for the architecture, so SGLang's ModelConfig and its model-override registry
read a real config without any weights.

Folders are created once per (architecture, extra fields) under a cache directory and reused; a
forked worker that needs a new one writes it under a temporary name and renames it into place,
so two workers never see a half-written folder."""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile

# architecture -> (transformers config class, fields written unless the case gives its own)
ARCHITECTURES: dict[str, tuple[str, dict]] = {
    # DeepSeek-V3.2: index_topk 2048, DSA (the indexer fields are DeepseekV32Config's defaults, written
    # out for the transformers that lack the class)
    "DeepseekV32ForCausalLM": ("DeepseekV32Config", {"index_topk": 2048, "index_head_dim": 128,
                                                     "index_n_heads": 64}),
    "GlmMoeDsaForCausalLM": ("GlmMoeDsaConfig", {}),  # GLM-5, index_topk 2048: DSA
    # GLM-5.3-Flash. transformers' default index_kpool 16 makes SGLang pick page size 64*16 = 1024,
    # which fails the bare mamba-track-interval assert (interval 256) whenever the radix cache is
    # on; the published checkpoints use 4. The indexer fields are written out (transformers 5.19's
    # defaults, the checkpoints' values): SGLang 0.5.20's own Glm5NextConfig, used where
    # transformers has none, defaults index_topk to None, which is not a DSA model.
    "Glm5NextForConditionalGeneration": ("Glm5NextConfig", {"text_config": {
        "index_kpool": 4, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32}}),
    # LongCat-Flash with DSA's indexer (transformers' config has no index_topk of its own): DSA from
    # SGLang 0.5.16
    "LongcatFlashForCausalLM": ("LongcatFlashConfig", {"index_topk": 2048, "index_head_dim": 128,
                                                       "index_n_heads": 64}),
    "DeepseekV3ForCausalLM": ("DeepseekV3Config", {}),  # no index_topk: not DSA
    "LlamaForCausalLM": ("LlamaConfig", {}),
    # written as plain JSON (RAW): the fields SGLang's own config classes need to load the model
    "DeepseekV4ForCausalLM": (None, {}),
    "DeepseekV4ForCausalLMNextN": (None, {}),
    "DeepseekV4ForCausalLMDSpark": (None, {}),
    "DeepseekV41ForCausalLM": (None, {}),
    "MiniMaxM3SparseForCausalLM": (None, {}),
}

# what SGLang reads of a V4 config to load it (ModelConfig's V4 shapes); transformers 5.12.1's own
# DeepseekV4Config, which parses the file first, wants compress_ratios in {0, 4, 128} and one per layer
_V4 = {"sliding_window": 128, "index_head_dim": 128, "num_hidden_layers": 4}
# architecture -> the whole config.json (SGLang reads DeepSeek-V4's with its own alias of
# DeepseekV3Config, V4.1's with its own DeepseekV41Config from 0.5.21; MiniMax-M3's text model
# under a model_type transformers knows)
RAW = {
    "DeepseekV4ForCausalLM": {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
                              "compress_ratios": [0, 4, 128, 4], **_V4},
    **{arch: {"architectures": [arch], "model_type": "deepseek_v4", "compress_ratios": [0, 4, 128, 4], **_V4}
       for arch in ("DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark")},
    "DeepseekV41ForCausalLM": {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
                               "compress_ratios": [1, 2, 4, 128], **_V4},
    "MiniMaxM3SparseForCausalLM": {
        "architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m2", "vocab_size": 200064,
        "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 48,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 196608, "rms_norm_eps": 1e-06,
        "num_experts_per_tok": 8, "num_local_experts": 256, "hidden_act": "silu",
        "sparse_attention_config": {"sparse_attention_freq": [0, 1, 1, 1]}},
}


# the model_type of an architecture whose config class neither transformers nor SGLang may have:
# DeepSeek-V3.2 under transformers 5.6.0 (SGLang 0.5.11-0.5.14) is written by the class it extends
# (BASE_CLASSES) with its own model_type, as DeepSeek-V3.2's config.json is; SGLang re-reads it as
# deepseek_v3 (`_load_deepseek_v32_model`). GLM-5.3-Flash under transformers 5.12.1 with SGLang
# 0.5.13-0.5.19 is written as plain JSON, so that SGLang meets the model as an operator's checkpoint
# and gives its own start-up error
MODEL_TYPES = {"Glm5NextForConditionalGeneration": "glm5_next", "DeepseekV32ForCausalLM": "deepseek_v32"}
BASE_CLASSES = {"DeepseekV32Config": "DeepseekV3Config"}


def config_class(name: str):
    """transformers' config class of that name, else SGLang's own (`sglang.srt.configs`: 0.5.20
    ships Glm5NextConfig, which transformers 5.12.1 lacks), else None."""
    import importlib

    import transformers

    try:
        return getattr(transformers, name)
    except (AttributeError, ImportError):
        pass
    try:
        return getattr(importlib.import_module("sglang.srt.configs"), name, None)
    except ImportError:
        return None


def known_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def config_fields(architecture: str, extra=()) -> dict:
    """The keyword arguments the config class gets: defaults, then the case's extra fields (a
    dict value merges into a dict default one level deep, e.g. text_config)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"no model config for architecture {architecture!r}; known: "
                         + ", ".join(known_architectures()))
    fields = json.loads(json.dumps(ARCHITECTURES[architecture][1]))
    for key, value in dict(extra).items():
        if isinstance(value, dict) and isinstance(fields.get(key), dict):
            fields[key] = {**fields[key], **value}
        else:
            fields[key] = value
    return fields


class ModelFolders:
    """architecture + extra config fields -> a folder with that config.json."""

    def __init__(self, root: str | None = None):
        self._owned = root is None
        self.root = root or tempfile.mkdtemp(prefix="hisparse-conform-models-")
        self._owner_pid = os.getpid()
        self._paths: dict = {}
        if self._owned:
            atexit.register(self.cleanup)

    def path(self, architecture: str, extra=()) -> str:
        """The folder for the architecture with the extra config.json fields ((key, value) pairs;
        a value may be a dict, e.g. text_config)."""
        key = json.dumps([architecture, [list(kv) for kv in extra]], sort_keys=True, default=repr)
        found = self._paths.get(key)
        if found is None:
            found = self._paths[key] = self._write(architecture, extra)
        return found

    def _write(self, architecture: str, extra) -> str:
        fields = config_fields(architecture, extra)
        digest = hashlib.sha256(json.dumps([architecture, fields], sort_keys=True, default=repr)
                                .encode()).hexdigest()[:12]
        final = os.path.join(self.root, f"{architecture}-{digest}")
        if os.path.isfile(os.path.join(final, "config.json")):
            return final
        name = ARCHITECTURES[architecture][0]
        cls = None if name is None else (
            config_class(name) or (config_class(BASE_CLASSES[name]) if name in BASE_CLASSES else None))
        partial = tempfile.mkdtemp(prefix=".partial-", dir=self.root)
        if architecture in RAW:
            with open(os.path.join(partial, "config.json"), "w", encoding="utf-8") as fh:
                json.dump({**RAW[architecture], **fields}, fh, indent=2, sort_keys=True)
        elif cls is not None:
            cls(architectures=[architecture], **fields).save_pretrained(partial)
            if cls.__name__ != name:  # the base class: the architecture's own model_type
                path = os.path.join(partial, "config.json")
                with open(path, encoding="utf-8") as fh:
                    config = json.load(fh)
                config["model_type"] = MODEL_TYPES[architecture]
                config.pop("layer_types", None)  # transformers 5.6.0 refuses it on reading back
                with open(path, "w", encoding="utf-8") as fh:
                    json.dump(config, fh, indent=2, sort_keys=True)
        elif architecture in MODEL_TYPES:
            with open(os.path.join(partial, "config.json"), "w", encoding="utf-8") as fh:
                json.dump({"architectures": [architecture], "model_type": MODEL_TYPES[architecture],
                           **fields}, fh, indent=2, sort_keys=True)
        else:
            shutil.rmtree(partial, ignore_errors=True)
            raise ValueError(f"no config class {ARCHITECTURES[architecture][0]} for {architecture} "
                             "in transformers or SGLang")
        try:
            os.rename(partial, final)
        except OSError:  # another worker got there first
            shutil.rmtree(partial, ignore_errors=True)
        return final

    def cleanup(self) -> None:
        """Remove the folders of a root it created (at exit too; only in the process that
        created it, never in a forked worker)."""
        if self._owned and os.getpid() == self._owner_pid:
            shutil.rmtree(self.root, ignore_errors=True)
