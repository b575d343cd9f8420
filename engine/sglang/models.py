"""Which model a `--model-path` names: its class (a DSA model, DeepSeek-V4 / V4.1, MiniMax-M3, or
another model HiSparse does not serve), which policy inputs that decides (a DSA policy's
`dsa_model`, every family's `model_family`), and the class a policy routes. `read_model` reads a
path once for a policy: everything the rest of a decision takes from the model.

A local checkpoint folder is read as SGLang reads it: `config.json`'s `architectures[0]`,
`model_type` and `index_topk` (`is_deepseek_dsa`: a DSA architecture with index_topk set;
`is_deepseek_v4`; `is_minimax_sparse`; V4.1 by its model_type). A hub name (no such folder) is
matched against the name patterns of engine/sglang/registry.py, the table docs/cli.md lists; a
name none of them matches is "cannot tell", and the policy's default applies.
"""
from __future__ import annotations

import os
import re

from engine.errors import ConfigError, Problem
from engine.language.record import Record
from engine.sglang import registry
from engine.sglang.registry import DSA_SINCE as DSA_SINCE_BY_ARCHITECTURE
from engine.values import kind

# architectures[0] -> the DSA family name a policy's model_family input may use (None: DSA, no
# family of its own); the registry's DSA rows
DSA_ARCHITECTURES = {a.name: a.family for a in registry.ARCHITECTURES.values() if a.model_class == "dsa"}
# families SGLang counts as DSA only from a release on: under a policy whose every modelled
# release (upstream.releases) is older, such a model is not DSA
DSA_SINCE = {DSA_ARCHITECTURES[arch]: since for arch, since in DSA_SINCE_BY_ARCHITECTURE.items()
             if DSA_ARCHITECTURES[arch]}
_NAMES = tuple((re.compile(pattern, re.I), cls, family) for pattern, cls, family in registry.NAMES)
# what each class is called in notes
SHORT_NAMES = {"dsa": "DSA", "dsv4": "DeepSeek-V4", "minimax_m3": "MiniMax-M3"}
CLASS_NAMES = {**{cls: f"a {name} model" for cls, name in SHORT_NAMES.items()},
               "other": "a model HiSparse does not serve"}


def _model_name(model_path: str) -> str:
    return os.path.basename(model_path.rstrip("/\\")) or model_path


class Model(Record):
    """What a model path says: its class (registry.MODEL_CLASSES; None: cannot tell), its family
    (a model_family value, or None), how it was decided (for notes), the release from which
    SGLang serves it as that class (None: every release), and what its config.json names
    (`architectures[0]`, `model_type`; None for a hub name)."""

    FIELDS = ("model_class", "family", "how", "since", "architecture", "model_type")
    DEFAULTS = {"since": None, "architecture": None, "model_type": None}
    __slots__ = FIELDS

    @property
    def dsa(self):
        """True / False: a DSA model or not; None: cannot tell."""
        return None if self.model_class is None else self.model_class == "dsa"


class ModelRead(Record):
    """A model path read once for a policy (read_model): the model as the releases the policy
    models see it (None where the policy reads no model), the inputs it decides, and notes."""

    FIELDS = ("model", "inputs", "notes")
    __slots__ = FIELDS

    @property
    def source(self) -> str:
        """Where the inputs it decides came from, in words (a decision's origins)."""
        return f"read from {self.model.how}"


def identify(model_path: str) -> Model:
    """The model a path names: from its config.json when it is a local folder holding one, else
    from the name. Raises ConfigError naming the file when a config.json cannot be read."""
    config = os.path.join(model_path, "config.json")
    if os.path.isdir(model_path) and os.path.lexists(config):
        return _from_config(config)
    name = _model_name(model_path)
    for pattern, cls, family in _NAMES:
        if pattern.search(name):
            return Model(cls, family, f"the name {name}")
    return Model(None, None, f"the name {name}")


def _from_config(path: str) -> Model:
    from engine.files.load import load_document
    from engine.files.reading import ReadError

    def bad(message: str) -> ConfigError:
        return ConfigError([Problem("C504", f"model config: {message}", path,
                                    hint="a model folder's config.json names its architectures and model_type")])

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
    how = f"{arch} in {path}"
    model_type = data.get("model_type")
    if model_type is not None and not isinstance(model_type, str):  # transformers looks it up by name
        raise bad(f"'model_type' must be a name, got {kind(model_type)}")
    named = {"architecture": arch, "model_type": model_type}
    known = registry.MODEL_TYPES.get(model_type) or registry.ARCHITECTURES.get(arch)
    if known is None:
        return Model("other", None, how, **named)
    if known.model_class != "dsa":
        return Model(known.model_class, known.family, how, known.since, **named)
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    topk = data["index_topk"] if "index_topk" in data else text.get("index_topk")
    if "index_topk" not in data and "index_topk" not in text and known.topk_default:
        topk = "default"
    if topk is None:
        return Model("other", None, how + " without index_topk", **named)
    return Model("dsa", known.family, how, known.since, **named)


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


def read_model(policy, model_path: str, named: Model | None = None) -> ModelRead:
    """The model a path names, read once for the policy, with the inputs it decides: a DSA
    policy's dsa_model, and model_family where the policy declares it and routes the model's
    class. A policy that declares neither reads no model. Raises ConfigError for an unreadable
    config.json."""
    out: dict = {}
    notes: list[str] = []
    if "dsa_model" not in policy.inputs and "model_family" not in policy.inputs:
        return ModelRead(None, out, notes)
    missing = missing_folder_note(model_path)
    if missing:
        notes.append(missing)
    named = named or identify(model_path)
    model = served_as(policy, named, model_path, notes)
    if "dsa_model" in policy.inputs:
        if model.dsa is None:
            default = str(policy.inputs["dsa_model"].default).lower()
            notes.append(f"cannot tell whether {model_path} uses DeepSeek Sparse Attention: the policy "
                         f"default ({default}) applies; pass --dsa-model or --no-dsa-model to hisparse to say")
            return ModelRead(model, out, notes)
        out["dsa_model"] = model.dsa
    spec = policy.inputs.get("model_family")
    if spec is None:
        return ModelRead(model, out, notes)
    if model.model_class is None:
        if "dsa_model" not in policy.inputs:
            notes.append(f"cannot tell which model {model_path} is: the policy default ({spec.default}) applies; "
                         "pass --model-family to hisparse to say")
    elif model.model_class in policy.models and model.model_class != "other":
        if model.family is not None and spec.accepts(model.family):
            out["model_family"] = model.family
        else:
            what = f"'{model.family}'" if model.family else "its family"
            notes.append(f"{model_path} ({model.how}) is {CLASS_NAMES[model.model_class]}, but the policy's "
                         f"model_family has no value for {what}: the policy default ({spec.default}) applies")
    return ModelRead(model, out, notes)


def served_as(policy, model: Model, model_path: str, notes: list) -> Model:
    """The model as the releases the policy models see it: an architecture SGLang serves only
    from a later release is another model to them (a note says so)."""
    if model.since and _before(policy, model.since):
        name = SHORT_NAMES.get(model.model_class, model.model_class)
        notes.append(f"{model_path} ({model.how}) counts as {name} only from SGLang {model.since} on; "
                     f"{policy.upstream.label()} does not: not a {name} model")
        return Model("other", None, model.how, architecture=model.architecture, model_type=model.model_type)
    return model


def _before(policy, release: str) -> bool:
    """Every release the policy models is older than `release` (False when it names none)."""
    from engine.sglang.registry import release_key

    releases = getattr(policy.upstream, "releases", None) or ()
    return bool(releases) and all(release_key(r) < release_key(release) for r in releases)


def models_table() -> str:
    """The table of docs/cli.md of how a model path is read (kept current by a test)."""
    rows = ["| `--model-path` | class | model_family |", "|---|---|---|"]
    for arch in [*registry.ARCHITECTURES.values(), *registry.MODEL_TYPES.values()]:
        where = (f"`model_type` {next(t for t, a in registry.MODEL_TYPES.items() if a is arch)}"
                 if arch in registry.MODEL_TYPES.values() else f"`architectures[0]` {arch.name}")
        topk = " with `index_topk`" if arch.model_class == "dsa" and not arch.topk_default else ""
        since = f" (from SGLang {arch.since})" if arch.since else ""
        rows.append(f"| a folder whose `config.json` has {where}{topk} | {arch.model_class}{since} | "
                    f"{arch.family or 'the policy default'} |")
    rows.append("| a folder with any other `config.json` | other | - |")
    for pattern, cls, family in registry.NAMES:
        rows.append(f"| a hub name matching `{_cell(pattern)}` | {cls} | {family or '-'} |")
    rows.append("| anything else | cannot tell: the policy default, with a note | the policy default |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
