"""Which model a `--model-path` names: whether it uses DeepSeek Sparse Attention (a policy's
`dsa_model`) and which DSA family it is (`model_family`).

A local checkpoint folder is read as SGLang reads it: `config.json`'s `architectures[0]` and
`index_topk` (`is_deepseek_dsa`: the architecture is one of DSA_ARCHITECTURES and index_topk is
set). A hub name (no such folder) is matched against the name patterns below, the table
docs/cli.md lists; a name none of them matches is "cannot tell" and the policy's default applies.
"""
from __future__ import annotations

import os
import re

from engine.errors import ConfigError, Problem
from engine.sglang.registry import DSA_SINCE as DSA_SINCE_BY_ARCHITECTURE
from engine.values import kind

# architectures[0] -> the family name a policy's model_family input may use (None: DSA, no family
# of its own). SGLang's is_deepseek_dsa list; the GLM-5 SM12x defaults need GlmMoeDsaForCausalLM
# exactly, so GLM-5.3-Flash (Glm5Next) is a family of its own, never glm5.
DSA_ARCHITECTURES = {
    "DeepseekV3ForCausalLM": "deepseek_v32",
    "DeepseekV3ForCausalLMNextN": "deepseek_v32",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "GlmMoeDsaForCausalLM": "glm5",
    "Glm5NextForConditionalGeneration": "glm5_next",
    "MistralLarge3ForCausalLM": None,
    "PixtralForConditionalGeneration": None,
    "LongcatFlashForCausalLM": "longcat_flash",
    "LongcatFlashForCausalLMNextN": "longcat_flash",
    "Dots3NoteForCausalLM": "dots3_note",
    "Dots3NoteForCausalLMNextN": "dots3_note",
}
# families SGLang counts as DSA only from a release on (is_deepseek_dsa's architecture list;
# engine/sglang/registry.py): under a policy whose every modelled release (upstream.releases) is
# older, such a model is not DSA
DSA_SINCE = {DSA_ARCHITECTURES[arch]: since for arch, since in DSA_SINCE_BY_ARCHITECTURE.items()}
# architectures whose transformers config class has an index_topk default (a config.json that
# leaves it out still has it once loaded); the others are DSA only with index_topk written
INDEX_TOPK_DEFAULT = frozenset({"DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "Glm5NextForConditionalGeneration"})

# hub names, by family: checked in order, the first match decides
DSA_NAMES = (
    ("deepseek_v32", re.compile(r"deepseek[-_ ]?v3[._]2", re.I)),
    ("glm5_next", re.compile(r"glm[-_ ]?5[._][0-9]+[-_ ]?flash", re.I)),  # GLM-5.3-Flash: Glm5Next
    ("glm5", re.compile(r"glm[-_ ]?5(?![0-9])", re.I)),
)
# model families known not to use DSA (anything else is "cannot tell": the policy default applies)
NON_DSA_NAMES = re.compile(
    r"deepseek[-_ ]?(v2|v3(?![._]2)|r1|coder|llm|math|moe|vl)|llama|qwen|mistral|mixtral|gemma|phi|kimi|"
    r"glm[-_ ]?4|chatglm|gpt|minimax|yi[-_]|baichuan|internlm|olmo|falcon|command|granite", re.I)


def _model_name(model_path: str) -> str:
    return os.path.basename(model_path.rstrip("/\\")) or model_path


class Model:
    """What a model path says: dsa (True/False/None = cannot tell), family (or None), and how it
    was decided (for notes)."""

    def __init__(self, dsa, family, how: str):
        self.dsa, self.family, self.how = dsa, family, how


def identify(model_path: str) -> Model:
    """The model a path names: from its config.json when it is a local folder holding one, else
    from the name. Raises ConfigError naming the file when a config.json cannot be read."""
    config = os.path.join(model_path, "config.json")
    if os.path.isdir(model_path) and os.path.lexists(config):
        return _from_config(config)
    name = _model_name(model_path)
    for family, pattern in DSA_NAMES:
        if pattern.search(name):
            return Model(True, family, f"the name {name}")
    if NON_DSA_NAMES.search(name):
        return Model(False, None, f"the name {name}")
    return Model(None, None, f"the name {name}")


def _from_config(path: str) -> Model:
    from engine.files.load import load_document
    from engine.files.reading import ReadError

    def bad(message: str) -> ConfigError:
        return ConfigError([Problem("C504", f"model config: {message}", path,
                                    hint="a model folder's config.json says its architectures")])

    try:
        data = load_document(path).data
    except ReadError as exc:
        raise ConfigError([Problem("C504", f"model config: {p.message}", p.file, p.line, p.col, p.hint)
                           for p in exc.problems]) from None
    if not isinstance(data, dict):
        raise bad(f"expected a JSON object, got {kind(data)}")
    archs = data.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise bad("'architectures' must be a non-empty list of names")
    arch = archs[0]
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    topk = data["index_topk"] if "index_topk" in data else text.get("index_topk")
    if "index_topk" not in data and "index_topk" not in text and arch in INDEX_TOPK_DEFAULT:
        topk = "default"
    how = f"{arch} in {path}"
    if arch in DSA_ARCHITECTURES and topk is not None:
        return Model(True, DSA_ARCHITECTURES[arch], how)
    return Model(False, None, how + ("" if arch not in DSA_ARCHITECTURES else " without index_topk"))


def looks_local(model_path: str) -> bool:
    """Whether a model path is written as a local path rather than a hub name (`name` or
    `org/name`): it starts with /, ./, ../ or ~, or has more than one separator."""
    if model_path.startswith(("/", "./", "../", "~", ".\\", "..\\")):
        return True
    return model_path.count("/") > 1 or (os.sep != "/" and os.sep in model_path)


def missing_folder_note(model_path: str) -> str | None:
    """A note when a model path looks local but names no folder (it is then read as a hub name,
    as SGLang would try to download it)."""
    if looks_local(model_path) and not os.path.exists(model_path):
        return (f"{model_path}: no such file or folder; it looks like a local path, so it is read as a hub "
                "name (by the name table), as SGLang would try to download it")
    return None


def model_is_dsa(model_path: str) -> bool | None:
    """True / False when the model path names a known family, None when it cannot tell."""
    return identify(model_path).dsa


def model_inputs(policy, model_path: str) -> tuple[dict, list[str]]:
    """(the inputs the model path decides, notes) for the policy's dsa_model and model_family
    inputs, where it declares them. Raises ConfigError for an unreadable config.json."""
    out: dict = {}
    notes: list[str] = []
    if "dsa_model" not in policy.inputs and "model_family" not in policy.inputs:
        return out, notes
    missing = missing_folder_note(model_path)
    if missing:
        notes.append(missing)
    model = identify(model_path)
    if model.dsa and model.family in DSA_SINCE and _before(policy, DSA_SINCE[model.family]):
        notes.append(f"{model_path} ({model.how}) counts as DSA only from SGLang {DSA_SINCE[model.family]} "
                     f"on; {policy.upstream.label()} does not: not a DSA model")
        model = Model(False, None, model.how)
    if "dsa_model" in policy.inputs:
        if model.dsa is None:
            default = str(policy.inputs["dsa_model"].default).lower()
            notes.append(f"cannot tell whether {model_path} uses DeepSeek Sparse Attention: the policy "
                         f"default ({default}) applies; pass --dsa-model or --no-dsa-model to hisparse to say")
            return out, notes
        out["dsa_model"] = model.dsa
    spec = policy.inputs.get("model_family")
    if spec is not None and model.dsa:
        if model.family is not None and spec.accepts(model.family):
            out["model_family"] = model.family
        else:
            what = f"'{model.family}'" if model.family else "its family"
            notes.append(f"{model_path} ({model.how}) is a DSA model, but the policy's model_family has no "
                         f"value for {what}: the policy default ({spec.default}) applies")
    return out, notes


def _before(policy, release: str) -> bool:
    """Every release the policy models is older than `release` (False when it names none)."""
    from engine.sglang.registry import release_key

    releases = getattr(policy.upstream, "releases", None) or ()
    return bool(releases) and all(release_key(r) < release_key(release) for r in releases)


def models_table() -> str:
    """The table of docs/cli.md of how a model path is read (kept current by a test)."""
    rows = ["| `--model-path` | DSA | model_family |", "|---|---|---|"]
    for arch, family in DSA_ARCHITECTURES.items():
        topk = "" if arch in INDEX_TOPK_DEFAULT else " with `index_topk`"
        since = f" (from SGLang {DSA_SINCE[family]})" if family in DSA_SINCE else ""
        rows.append(f"| a folder whose `config.json` has `architectures[0]` {arch}{topk} | yes{since} | "
                    f"{family or 'the policy default'} |")
    rows.append("| a folder with any other `config.json` | no | - |")
    for family, pattern in DSA_NAMES:
        rows.append(f"| a hub name matching `{_cell(pattern.pattern)}` | yes | {family} |")
    rows.append(f"| a hub name matching `{_cell(NON_DSA_NAMES.pattern)}` | no | - |")
    rows.append("| anything else | the policy default, with a note | the policy default |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
