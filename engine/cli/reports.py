"""The reports of the analysis commands as text an operator reads (and as markdown): each takes
the JSON form its analysis returns (a contract, see docs/cli.md), so the analyses compute and this
module words what they found."""
from __future__ import annotations

from engine.analysis.outcomes import pattern_lines
from engine.analysis.policytest import FileResult, coverage, what_covers
from engine.values import one_line, show, shown


# -- hisparse diff ----------------------------------------------------------------------------
def _domain_text(d: dict) -> str:
    parts = []
    for name, ch in d["values"].items():
        parts.append(f"{name} " + " ".join([f"+{v}" for v in ch["added"]] + [f"-{v}" for v in ch["removed"]]))
    if d["inputs_added"]:
        parts.append("new inputs " + ", ".join(d["inputs_added"]))
    if d["inputs_removed"]:
        parts.append("inputs removed " + ", ".join(d["inputs_removed"]))
    return "; ".join(parts)


def diff_text(result: dict, markdown: bool = False, max_patterns: int = 4) -> str:
    a, b = result["a"], result["b"]
    head = (f"{a.get('label') or a['family'] + '@' + str(a['version'])} -> "
            f"{b.get('label') or b['family'] + '@' + str(b['version'])}")
    if result.get("where"):
        head += " where " + " ".join(f"{k}={show(v)}" for k, v in result["where"].items())
    changed = sum(result["counts"].values())
    lines = []
    if markdown:
        lines.append(f"### `{head}`: {changed} of {result['total']} configs change")
        lines.append("")
        lines.append("| class | configs |")
        lines.append("|---|---:|")
        lines += [f"| {cls} | {n} |" for cls, n in result["counts"].items()]
        if _domain_text(result["domain"]):
            lines += ["", f"Domain: {_domain_text(result['domain'])}"]
        for g in result["groups"]:
            lines.append("")
            where = f", where `{g['where']}`" if g["where"] else ""
            lines.append(f"**{g['class']}** ({g['count']}): {g['change']}{where}")
            lines.append("")
            lines += [f"- `{t}`" for t in g["text"][:max_patterns]]
            if len(g["text"]) > max_patterns:
                lines.append(f"- ... {len(g['text']) - max_patterns} more patterns (`--format json` lists all)")
            lines.append(f"- e.g. {_example_text(g['class'], g['example'])}")
        return "\n".join(lines)
    if result["equivalent"]:
        return f"{head}: equivalent on all {result['total']} configs"
    lines.append(f"{head}: {changed} of {result['total']} configs change "
                 + "(" + ", ".join(f"{cls} {n}" for cls, n in result["counts"].items() if n) + ")")
    if _domain_text(result["domain"]):
        lines.append(f"domain: {_domain_text(result['domain'])}")
    for g in result["groups"]:
        lines.append(f"{g['class']} {g['count']}: {one_line(g['change'])}")
        lines += pattern_lines(g, max_patterns)
        lines.append(f"    e.g. {_example_text(g['class'], g['example'])}")
    return "\n".join(lines)


def _example_text(cls: str, ex: dict) -> str:
    if cls == "log_changed":
        a, b = ex["a"]["log"], ex["b"]["log"]
        i = next((k for k in range(max(len(a), len(b))) if (a[k:k + 1] != b[k:k + 1])), 0)
        return f"log {a[i] if i < len(a) else '(none)'!r}  =>  {b[i] if i < len(b) else '(none)'!r}"

    def side(s):
        if s["status"] == "ok":
            return "accepted " + " ".join(f"{k}={v}" for k, v in s["backends"].items())
        if s["status"] == "error":
            return f"invalid config ({s['check']}: {one_line(s['message'])})"
        return f"rejected: {one_line(s['message'])}"

    return f"{side(ex['a'])}  =>  {side(ex['b'])}"


# -- hisparse table ---------------------------------------------------------------------------
def _cell(values: list | None) -> str:
    if not values:
        return "any"
    return ", ".join(show(v) for v in values)


def _allowed_cell(allowed: list, all_backends: list) -> str:
    if not allowed:
        return "none"
    if len(allowed) == len(all_backends):
        return "any"
    if len(allowed) > len(all_backends) / 2:  # the shorter way to say it
        return "any but " + ", ".join(b for b in all_backends if b not in allowed)
    return ", ".join(allowed)


def table_text(policy, result: dict, markdown: bool = False) -> str:
    axes = [a for a in result["axes"] if any(a in r["when"] for r in result["rows"])]
    phases = list(policy.phases)
    any_rejected = any(r["rejected"] is not None for r in result["rows"])
    head = axes + [f"{ph} default" for ph in phases] + [f"{ph} allowed" for ph in phases]
    head += ["rejected with"] if any_rejected else []
    body = []
    for r in result["rows"]:
        cells = [_cell(r["when"].get(a)) for a in axes]
        if r["rejected"] is not None:
            cells += ["-"] * len(phases)
        else:
            cells += [show(r["defaults"][ph]) for ph in phases]
        cells += [_allowed_cell(r["allowed"][ph], list(policy.inputs[policy.phases[ph].input].values))
                  for ph in phases]
        if any_rejected:
            cells.append(one_line(r["rejected"] or ""))
        body.append(cells)
    fixed = ", ".join(f"{k}={show(v)}" for k, v in result["fixed"].items())
    title = f"Routing table of {policy.ref}" + (f" ({fixed})" if fixed else "")
    if policy.upstream is not None:
        title += f", which models {one_line(policy.upstream.label())}"
    if markdown:
        lines = [f"{title}:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max([len(h)] + [len(cells[i]) for cells in body]) for i, h in enumerate(head)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in body]
    return "\n".join(lines)


# -- hisparse test ----------------------------------------------------------------------------
def policy_test_text(results: list[FileResult], min_coverage: float | None) -> tuple[str, bool]:
    lines = []
    ok = True
    for fr in results:
        p = fr.policy
        for c in fr.failed:
            ok = False
            lines.append(f"FAIL {one_line(fr.file)}:{c.line}: {one_line(c.name)}")
            for what, expected, actual in c.mismatches:  # unclipped: messages may differ at the end
                lines.append(f"    {what}: expected {shown(expected, None)}")
                lines.append(f"    {' ' * len(what)}  actual   {shown(actual, None)}")
        done, total, missing = coverage(fr)
        pct = 100.0 * done / total if total else 100.0
        passed = len(fr.cases) - len(fr.failed)
        lines.append(f"{p.ref} ({one_line(fr.file)}): {passed}/{len(fr.cases)} cases passed; "
                     f"rule coverage {done}/{total} ({pct:.0f}%)")
        for r in missing:
            lines.append(f"    not covered: {r.stage} rule {r.name} ({one_line(p.location(r))}): no case makes it {what_covers(r)}")
        if min_coverage is not None and pct < min_coverage:
            ok = False
            lines.append(f"    coverage {pct:.0f}% is below the minimum {min_coverage:g}%")
    return "\n".join(lines), ok


# -- hisparse replay --------------------------------------------------------------------------
def replay_text(result: dict) -> str:
    p = result["policy"]
    head = f"replay against {p['family']}@{p['version']}"
    if result["equivalent"]:
        text = f"{head}: all {result['total']} recorded decisions stay the same"
    else:
        changed = sum(result["counts"].values())
        text = (f"{head}: {changed} of {result['total']} recorded decisions would change ("
                + ", ".join(f"{c} {n}" for c, n in result["counts"].items() if n) + ")")
    lines = [text]
    for g in result["groups"]:
        more = " ..." if g["count"] > len(g["lines"]) else ""
        lines.append(f"{g['class']} {g['count']}: {one_line(g['change'])} (lines {', '.join(map(str, g['lines'][:10]))}"
                     f"{' ...' if len(g['lines']) > 10 else more})")
        ex = g["example"]
        lines.append(f"    e.g. line {ex['line']}: {one_line(ex['recorded'])}  =>  {one_line(ex['now'])}")
    for prob in result["problems"]:
        lines.append(f"{one_line(prob['file'])}:{prob['line']}:{prob['col']}: {prob['code']}: {one_line(prob['message'])}")
    return "\n".join(lines)


# -- hisparse conform -------------------------------------------------------------------------
def _side_text(s: dict) -> str:
    if s["ok"]:
        b = s["backends"]
        text = f"accepted kv_cache_dtype={s['kv_cache_dtype']} prefill={b['prefill']} decode={b['decode']}"
    else:
        text = f"rejected: {one_line(s['message'])}"
    return text + "".join(f"\n        log: {one_line(line)}" for line in s["log"])


def conform_text(result: dict, markdown: bool = False, max_patterns: int = 4) -> str:
    """The report for a person (text) or a document (markdown)."""
    c = result["counts"]
    head = (f"{result['policy']['family']}@{result['policy']['version']} vs SGLang {result['sglang']}: "
            f"{c['agree']:,} of {result['total']:,} configs agree")
    if c["out_of_scope"]:
        head += f", {c['out_of_scope']:,} out of scope"
    if c["differ"]:
        head += f", {c['differ']:,} differ (" + ", ".join(f"{f} {n:,}" for f, n in result["fields"].items() if n) + ")"
    scope = []
    if result.get("sample"):
        scope.append(f"a stratified sample of {result['sample']['n']:,} (seed {result['sample']['seed']}) "
                     f"of the {result['domain_size']:,} configs of the declared domain")
    if result.get("where"):
        scope.append("where " + " ".join(f"{k}={show(v)}" for k, v in result["where"].items()))
    lines = []
    if markdown:
        lines.append(f"### {head}")
        if scope:
            lines += ["", "Configs: " + "; ".join(scope) + "."]
        for title, groups in (("Differences", result["groups"]), ("Out of scope", result["out_of_scope"])):
            for g in groups:
                label = g["change"] if "change" in g else f"rejected at {g['at']}: {g['why']}"
                where = f", where `{g['where']}`" if g["where"] else ""
                lines += ["", f"**{title.lower()}** ({g['count']:,}): {label}{where}", ""]
                lines += [f"- `{t}`" for t in g["text"][:max_patterns]]
                if len(g["text"]) > max_patterns:
                    lines.append(f"- ... {len(g['text']) - max_patterns} more patterns (`--format json` lists all)")
                ex = g["example"]
                lines.append(f"- e.g. `{' '.join(ex['argv']) or '(no flags)'}` on {ex['architecture']}, "
                             f"{ex['platform']} SM{ex['capability'][0]}{ex['capability'][1]}")
        return "\n".join(lines)
    lines.append(head)
    if scope:
        lines.append("configs: " + "; ".join(scope))
    if result.get("warning"):
        lines.append("warning: " + one_line(result["warning"]))
    for g in result["groups"] + result["out_of_scope"]:
        label = one_line(g["change"] if "change" in g else f"out of scope, rejected at {g['at']}: {g['why']}")
        lines.append(f"{g['count']:,}: {label}")
        lines += pattern_lines(g, max_patterns)
        ex = g["example"]
        lines.append(f"    e.g. {one_line(' '.join(ex['argv'])) or '(no flags)'}  [{ex['architecture']}, {ex['platform']} "
                     f"SM{ex['capability'][0]}.{ex['capability'][1]}]")
        lines.append(f"      policy: {_side_text(ex['policy'])}")
        lines.append(f"      SGLang: {_side_text(ex['sglang'])}")
    return "\n".join(lines)
