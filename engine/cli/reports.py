"""The reports of the analysis commands as text an operator reads (and as markdown): each takes
the JSON form its analysis returns (a contract, see docs/cli.md), so the analyses compute and this
module words what they found."""
from __future__ import annotations

from engine.analysis.outcomes import pattern_lines
from engine.analysis.policytest import FileResult, coverage, what_covers
from engine.cli.options import wrap_words
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
        scope = " (out of scope)" if s.get("out_of_scope") else ""
        if s["status"] == "ok":
            return "accepted " + " ".join(f"{k}={v}" for k, v in s["backends"].items()) + scope
        if s["status"] == "error":
            return f"invalid config ({s['check']}: {one_line(s['message'])})"
        return f"rejected: {one_line(s['message'])}{scope}"

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
    reasons: list = []  # why rows are out of scope, numbered in the "scope" column
    for r in result["rows"]:
        if not r.get("in_scope", True) and r["out_of_scope"] not in reasons:
            reasons.append(r["out_of_scope"])
    head += ["scope"] if reasons else []
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
        if reasons:
            cells.append("in" if r.get("in_scope", True) else f"out ({reasons.index(r['out_of_scope']) + 1})")
        body.append(cells)
    fixed = ", ".join(f"{k}={show(v)}" for k, v in result["fixed"].items())
    title = f"Routing table of {policy.ref}" + (f" ({fixed})" if fixed else "")
    if policy.upstream is not None:
        title += f", which models {one_line(policy.upstream.label())}"
    if markdown:
        lines = [f"{title}:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
        if reasons:
            lines.append("")
        lines += [f"{i}. out of scope: {why}" for i, why in enumerate(reasons, 1)]
        return "\n".join(lines)
    return _table_blocks(policy, result, axes, phases, title, reasons)


TEXT_WIDTH = 100  # the plain table fits a terminal this wide
_PHASE_COLUMN = 35  # widest phase value before it wraps (a backend name fits whole)


def _table_blocks(policy, result: dict, axes: list, phases: list, title: str, reasons: list) -> str:
    """The plain table as one block per row, fitting TEXT_WIDTH: the inputs the row holds for
    (those equal in every row are said once, under the title), then each phase's default and
    allowed backends in aligned columns, or the message it is rejected with."""
    rows = result["rows"]
    constant = [a for a in axes if len({_cell(r["when"].get(a)) for r in rows}) == 1] if len(rows) > 1 else []
    lines = _fill(title.split(" "))
    if constant:
        lines += _fill(["in every row:"] + [part for a in constant
                                            for part in _condition(rows[0]["when"].get(a), a, keep_any=True)])
    cells = []
    for r in rows:
        if r["rejected"] is None:
            cells.append({ph: (show(r["defaults"][ph]), _allowed_cell(
                r["allowed"][ph], list(policy.inputs[policy.phases[ph].input].values))) for ph in phases})
    width = min(_PHASE_COLUMN, max([len("flashinfer_sparse_mla")] + [len(v) for c in cells for pair in c.values()
                                                                   for v in pair]))
    label = max(len(ph) for ph in phases) + 2
    cells = iter(cells)
    for r in rows:
        lines.append("")
        conditions = [part for a in axes if a not in constant for part in _condition(r["when"].get(a), a)]
        lines += _fill(conditions or ["every config"])
        if not r.get("in_scope", True):
            lines.append(f"  out of scope ({reasons.index(r['out_of_scope']) + 1})")
        if r["rejected"] is not None:
            lines += _fill(["  rejected:"] + r["rejected"].split(), indent=" " * 12)
            continue
        c = next(cells)
        per_line = max(1, (TEXT_WIDTH - 11) // (label + width + 2))  # the phases side by side
        groups = [phases[k:k + per_line] for k in range(0, len(phases), per_line)]
        for what, i in (("default", 0), ("allowed", 1)):
            for g, group in enumerate(groups):
                columns = [(f"{ph}:".ljust(label), wrap_words(c[ph][i], width)) for ph in group]
                for n in range(max(len(col) for _, col in columns)):
                    text = f"  {what if n == 0 and g == 0 else '':<9}"
                    for name, col in columns:
                        text += (name if n == 0 else " " * label) + (col[n] if n < len(col) else "").ljust(width + 2)
                    lines.append(text.rstrip())
    if reasons:
        lines.append("")
    for i, why in enumerate(reasons, 1):
        lines += _fill([f"out ({i}): not modelled here, upstream's verdict may differ:"] + one_line(why).split(),
                       indent="  ")
    return "\n".join(lines)


def _condition(values, name: str, keep_any: bool = False) -> list[str]:
    """The words of `name` holding `values` (a list; empty: any value), a value list breakable
    between its values: `name=v`, or `name in [a,` `b]`."""
    if not values:
        return [f"{name} any"] if keep_any else []
    if len(values) == 1:
        return [f"{name}={show(values[0])}"]
    shown_values = [show(v) for v in values]
    return [f"{name} in [{shown_values[0]},"] + [f"{v}," for v in shown_values[1:-1]] + [f"{shown_values[-1]}]"]


def _fill(words, indent: str = "    ") -> list[str]:
    """`words` joined by spaces in lines of at most TEXT_WIDTH, continued after `indent`."""
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > TEXT_WIDTH:
            lines.append(line)
            line = indent + word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line] if line else lines


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
    if result.get("out_of_scope"):
        lines.append(f"out of scope: {result['out_of_scope']} of the {result['total']} decisions, re-evaluated, lie "
                     f"outside what {head[len('replay against '):]} models (upstream's verdict may differ)")
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
        b = s.get("backends")
        text = f"accepted kv_cache_dtype={s['kv_cache_dtype']}"
        if b:
            text += f" prefill={b['prefill']} decode={b['decode']}"
        text += "".join(f" {k}={v}" for k, v in (s.get("values") or {}).items())
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
