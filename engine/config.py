"""Server configs from files: SGLang-style YAML or JSON config files, keys with dashes or
underscores. Values keep their YAML/JSON types; strings are never read as booleans or numbers
("true" in quotes is an error that says so), so a config means what it says."""
from __future__ import annotations

from .errors import ConfigError, Problem


def read_config_file(path: str):
    """The parsed file (a yaml_reader.Document); raises ConfigError (file:line:col) when
    unreadable or not a mapping. A pipe is read too (`--config <(...)`, /dev/stdin): the operator
    named it."""
    from .yaml_reader import ReadError, load_document

    try:
        doc = load_document(path, regular_only=False)
    except ReadError as exc:
        raise ConfigError([Problem("C504", p.message, p.file, p.line, p.col, p.hint) if p.code == "E101"
                           else p for p in exc.problems]) from None
    if doc.data is None:
        doc.data = {}
    if not isinstance(doc.data, dict):
        raise ConfigError([Problem("C504", f"a config file holds a mapping of option -> value, this one "
                                   f"holds a {type(doc.data).__name__}", path, 1, 1)])
    return doc


def load_config_file(policy, path: str) -> tuple[dict, list[str]]:
    """(config, keys ignored as unrelated to the policy) from an SGLang config file. The config
    keeps the file's spellings (validated); SGLang's JSON-valued options (--hisparse-config)
    are expanded into the inputs they carry."""
    from .sglang import expand_json_options

    doc = read_config_file(path)
    data, problems = expand_json_options(policy, doc.data, path)
    if problems:
        raise ConfigError(problems)
    _, ignored = policy.normalize_lenient(data, file=path, doc=doc)
    kept = {k: v for k, v in data.items() if policy.canonical_key(k) is not None}
    return kept, ignored


def merge_config(policy, base: dict, extra: dict) -> dict:
    """`base` updated with `extra`, where a key of `extra` replaces every spelling of the same
    input in `base` (kv-cache-dtype replaces kv_cache_dtype)."""
    out = dict(base)
    for key, value in extra.items():
        name = policy.canonical_key(key)
        if name is not None:  # an unknown key is left for evaluation to report
            for old in [k for k in out if policy.canonical_key(k) == name]:
                del out[old]
        out[key] = value
    return out
