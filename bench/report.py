"""The figures of the documentation, generated from bench/results/*.json (kept current by a test): the
README's headline, and the performance table and notes of docs/performance.md. No figure in them is
typed in."""
from __future__ import annotations

import json
import os

from bench.common import RESULTS

LABELS = {
    "warm_decision_us": ("a warm single decision, `policy.evaluate` (v2, each of its 12,288 configs in turn)", "us"),
    "cold_start_ratio": ("cold `hisparse evaluate` process vs `python -c pass` in the same environment", "x time"),
    "first_load_ms": ("first policy load in a fresh process: import + load (v8, its document cached)", "ms"),
    "torch_never_imported": ("`hisparse evaluate` never imports torch", ""),
    "check_seconds": ("`hisparse check policies/`: every shipped version, as a process", "s"),
    "diff_seconds": ("`hisparse diff dsa-backends@9 dsa-backends@10` (479,232 configs), as a process", "s"),
    "decode_vs_matmul_b1": ("reference FP8 sparse decode GFLOP/s / float32 matmul GFLOP/s, b=1", "ratio"),
    "decode_vs_matmul_b8": ("reference FP8 sparse decode GFLOP/s / float32 matmul GFLOP/s, b=8", "ratio"),
    "prefill_vs_matmul_b1": ("reference BF16 prefill GFLOP/s / float32 matmul GFLOP/s, s_q=1", "ratio"),
    "prefill_vs_matmul_b8": ("reference BF16 prefill GFLOP/s / float32 matmul GFLOP/s, s_q=8", "ratio"),
    "dequant_vs_convert": ("`dequantize_kv_fp8` throughput / a uint8 -> bf16 conversion writing the same bytes "
                           "(preallocated outputs; the worst of 1k-64k rows, SGLang's and FlashMLA's scales)", "ratio"),
    "translate_vs_copy_floor": ("`HotBuffer.translate` / its copy floor (64 requests, top-k 2048, 30 % misses)",
                                "x time"),
}


def _load(name: str) -> dict | None:
    path = os.path.join(RESULTS, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def performance_table() -> str:
    rows = ["| figure | measured | goal | met |", "|---|---:|---|---|"]
    machine = None
    for name in ("engine", "kernels", "hotbuffer"):
        r = _load(name)
        if r is None:
            continue
        machine = machine or r["machine"]
        for key, g in r["goals"].items():
            if key not in LABELS:
                continue
            label, unit = LABELS[key]
            value = g["value"]
            shown = ("yes" if value else "no") if isinstance(value, bool) else f"{value:g} {unit}".strip()
            rows.append(f"| {label} | {shown} | {g['goal']} | {'yes' if g['met'] else '**no**'} |")
    if machine:
        loads = [f"{(r['machine'].get('load_average') or ['?'])[0]:g} ({name})" for name in ("engine", "kernels", "hotbuffer")
                 if (r := _load(name)) and r["machine"].get("load_average")]
        rows.append("")
        rows.append(f"Machine: {_machines(('engine', 'kernels', 'hotbuffer'))}, Python {machine['python']}, torch "
                    f"{machine.get('torch')} pinned to {machine.get('torch_threads')} thread(s)"
                    + (f"; load average {', '.join(loads)} when the figures were taken." if loads else "."))
    return "\n".join(rows)


def _machines(names) -> str:
    """The machine the results were taken on, or each machine with the results it took."""
    seen: dict = {}
    for name in names:
        r = _load(name)
        if r:
            m = r["machine"]
            seen.setdefault(f"{m.get('cpu', m['machine'])}, {m['cpus']} CPUs", []).append(name)
    if len(seen) == 1:
        return next(iter(seen))
    return "; ".join(f"{m} ({', '.join(names)} figures)" for m, names in seen.items())


def _curve(dq: dict, key: str) -> str:
    """The range of one figure over the dequantisation curve's sizes."""
    values = [point[key] for point in dq["curve"]]
    lo, hi = f"{min(values):g}", f"{max(values):g}"
    return lo if lo == hi else f"{lo}-{hi}"


def _missed(results: list) -> list[str]:
    return [key for r in results for key, g in r["goals"].items() if key in LABELS and not g["met"]]


def accuracy_table() -> str:
    """The FP8 vs BF16 table, from bench/results/accuracy.json: each cell the range over the seeds."""
    r = _load("accuracy")
    if r is None:
        return "(run `make bench` to produce the figures)"
    rows = ["| q scale (std of the BF16 logits) | cosine similarity | max abs error / max abs reference | "
            "max abs lse difference |", "|---|---|---|---|"]

    def span(values, fmt):
        lo, hi = fmt(min(values)), fmt(max(values))
        return lo if lo == hi else f"{lo}-{hi}"

    for q_scale, f in r["figures"]["fp8_vs_bf16"].items():
        rows.append(f"| {q_scale} (about {span(f['logit_std'], lambda x: f'{x:.1f}')}) "
                    f"| {span(f['cosine'], lambda x: f'{x:.5f}')} "
                    f"| {span([100 * x for x in f['max_err_over_peak']], lambda x: f'{x:.2g}')} % "
                    f"| {span(f['max_lse_diff'], lambda x: f'{x:.2g}')} |")
    setup, seeds = r["figures"]["setup"], r["figures"]["setup"]["seeds"]
    flashmla = r["figures"]["fp8_vs_bf16_flashmla_scales"]
    cos = [c for f in flashmla.values() for c in f["cosine"]]
    rows.append("")
    rows.append(f"SGLang's FP8 scales (raw amax/448), softmax scale {setup['softmax_scale']:g} ({setup['softmax_scale_of']}); "
                f"with FlashMLA's power-of-two scales the cosine similarity is {min(cos):.5f}-{max(cos):.5f}.\n"
                f"Seeds {seeds[0]}-{seeds[-1]}; measured by `python -m bench --only accuracy`\n"
                "(`bench/results/accuracy.json`), bounded by `tests/test_reference.py`.")
    return "\n".join(rows)


def _mode_curves(dq: dict, key: str) -> str:
    """A figure's range over the dequantisation curve, for each scale mode."""
    names = {"sglang": "SGLang's scales", "flashmla": "FlashMLA's"}
    return ", ".join(f"{_curve(m, key)} ({names[mode]})" for mode, m in dq["modes"].items())


def performance_notes() -> str:
    """The figures behind the table, in words, with what each missed goal misses by and why."""
    e, k, h, m = (_load(n) for n in ("engine", "kernels", "hotbuffer", "memory"))
    if not all((e, k, h, m)):
        return "(run `make bench` to produce the figures)"
    missed = _missed([e, k, h])
    gpu = (_load("gpu") or {}).get("figures", {})
    h_goals = h["goals"]
    e, h, m = e["figures"], h["figures"], m["figures"]
    dc, st, an = e["decision_cost"], e["startup"], e["analyses"]
    rates, a = k["figures"]["rates"], m["attend_32k_x8"]

    def span(key: str) -> str:  # the range over the batch sizes measured
        lo, hi = (f"{f(row[key] for row in rates.values()):.0f}" for f in (min, max))
        return lo if lo == hi else f"{lo}-{hi}"

    mb = 1e6
    heading = "every goal is met" if not missed else \
        f"and the goal{'s' if len(missed) > 1 else ''} missed, by how much and why"
    lines = [f"What the figures say ({heading}):", ""]
    core = e["core_lines"]
    # the modules counted beside the core (results from before the list was recorded: these three)
    beside = ", ".join(f"`{m}`" for m in core.get("files_side_modules",
                                                    ("engine/files/catalog.py", "engine/files/releases.py",
                                                     "engine/files/cache.py")))
    lines.append(f"""- **Decisions** are made by one evaluator, a walk over the rules (`policy.evaluate`; `policy.trace`
  is the same walk recording each step): {dc['policy_us_per_decision']} us a warm decision over the v2
  domain, against {dc['flat_us_per_decision']} us for `bench/flat_v2.py`, the same decisions written as one
  flat if/else ({dc['ratio']}x). Whole domains use the bulk evaluator (`policy.probe()`, a loop generated
  from the same rules): {dc['bulk_us_per_decision']} us a config ({dc['bulk_ratio']}x the flat if/else).
  The evaluation core (`engine/language`, `engine/policy`) is {core['total']:,} lines; the modules that hold
  what is kept out of it ({beside}) take {core['files_side']:,} more.""")
    lines.append(f"""- **Start-up**: a `hisparse evaluate` process costs {st['evaluate_cpu_ms']} ms of CPU against
  {st['python_cpu_ms']} ms for `python -c pass` ({st['ratio']}x; {st['baseline_cpu_ms']} ms for Python importing
  yaml and jsonschema, which only a load without the cache needs; wall times {st['evaluate_wall_ms']} and
  {st['python_wall_ms']} ms). The first load of v8 in a fresh process (import + load, measured inside it)
  takes {st['first_load_cached_ms']} ms from the cached document and {st['first_load_uncached_ms']} ms without it
  (`HISPARSE_NO_CACHE=1`: PyYAML and jsonschema imported, parse, schema).""")
    lines.append(f"""- **Whole-domain analyses** (CPU time of the process; wall time beside): `hisparse check
  policies/` ({an['check_files'] if 'check_files' in an else 'all ten'} versions) {an['check']['cpu_s']} s ({an['check']['wall_s']} s), of v10 alone
  {an['check_v10']['cpu_s']} s, `hisparse diff` v9 -> v10 ({an['diff_v9_v10_configs']:,}
  configs) {an['diff_v9_v10']['cpu_s']} s ({an['diff_v9_v10']['wall_s']} s), v1 -> v2 {an['diff_v1_v2']['cpu_s']} s; without
  the cache (every file parsed and schema-checked first) check takes {an['check_uncached']['cpu_s']} s and the
  v9 -> v10 diff {an['diff_v9_v10_uncached']['cpu_s']} s. On a synthetic policy of
  {an['large_configs']:,} configs (v8 with two top-k values, `bench/engine_bench.py`):
  its deep lint {an['check_large']['cpu_s']} s, its diff from v8 {an['diff_v8_large']['cpu_s']} s.""")
    lines.append(_kernels_note(k, span, missed))
    lines.append(_hot_buffer_note(h_goals, h, missed))
    for key in missed:  # a goal missed in this run without a note of its own above
        if key not in ("translate_vs_copy_floor", "dequant_vs_convert") and not key.startswith("decode_vs_matmul"):
            g = next(r["goals"][key] for r in (_load("engine"), _load("kernels")) if key in r["goals"])
            lines.append(f"- **{LABELS[key][0]}: missed in this run** ({g['value']:g} against {g['goal']}).")
    lines.append(f"""- **Memory**: a KV token takes 656 bytes as an FP8 row and 1,152 as BF16 ({m['kv_bytes_per_token']['fp8_saving']:.0%} less); a hot
  buffer of 4,096 slots (+64 for the newest token's page) takes {m['hot_buffer']['per_request_bytes']['fp8'] / mb:.2f} MB per request in FP8
  and {m['hot_buffer']['per_request_bytes']['bf16'] / mb:.2f} MB in BF16. `hisparse attend` at 32k context x 8 requests peaks at
  {a['peak_rss_bytes'] / mb:.0f} MB resident: {a['baseline_rss_bytes'] / mb:.0f} MB of Python and torch, the {a['bf16_truth_bytes'] / mb:.0f} MB BF16 KV kept to
  measure accuracy, the {a['host_pool_bytes'] / mb:.0f} MB FP8 host pool, the {a['hot_buffer_bytes'] / mb:.0f} MB hot buffer and the kernels'
  bounded scratch.""")
    published = gpu.get("published_tflops")
    anchors = (f", next to FlashMLA's published\n  {published['sparse_prefill']} (sparse prefill) and "
               f"{published['sparse_decode_fp8']} (FP8 sparse decode) TFLOPS on {published['gpu']}"
               if published else "")
    lines.append(f"""- **GPU**: the GPU check (`kernels_bridge/gpu_check.py`) measures the bridge against direct `flash_mla` calls (per-call
  overhead in us) and both kernels' TFLOPS on DeepSeek-V3.2 shapes{anchors}. No GPU was available where
  these figures were taken, so `bench/results/gpu.json` records that it did not run and why; run
  it on a GPU machine as [bridge.md](bridge.md#the-gpu-check) says.""")
    return "\n".join(lines)


def _kernels_note(k: dict, span, missed: list) -> str:
    """The reference kernels' and the dequantisation's paragraph."""
    k_goals, dq = k["goals"], k["figures"]["dequant"]
    sg = dq["modes"]["sglang"]
    return (f"""- **Reference kernels** (h_q 128, top-k 2048, one thread) reach {span('decode_gflops')} GFLOP/s (FP8
  decode) and {span('prefill_gflops')} GFLOP/s (BF16 prefill) against {span('matmul_gflops')} GFLOP/s for float32
  `torch.matmul` on the same FLOPs. FP8 rows are dequantised without a table, whatever their scales
  (SGLang's raw amax/448 or FlashMLA's powers of two): each code's sign and 7 magnitude bits are
  moved into a float16's bits, widened and multiplied by the scale times 2^8 in float32, then
  rounded to bf16, bit-identical to a table of code values (torch's own float8 -> float32
  conversion takes {dq['fp8_cast_ns_per_element']} ns an element here). Against a baseline that writes the same
  bytes (a uint8 -> bf16 conversion of 576 bytes a row into the same preallocated bf16 [n, 576]
  output), `dequantize_kv_fp8` runs at {_mode_curves(dq, 'ratio')} of its speed from
  {dq['sizes'][0]:,} to {dq['sizes'][-1]:,} rows ({_curve(sg, 'dequantize_gbs')} GB/s written against {_curve(sg, 'convert_gbs')} GB/s with
  SGLang's scales; `bench/results/kernels_dequant_vs_rows.png`): five passes (widening, shifting,
  masking, to float32, the scale product) and the bf16 rounding against the conversion's one. With
  fresh outputs instead, both pay page faults on new memory, which at {dq['sizes'][-1]:,} rows
  ({sg['curve'][-1]['bytes_written'] / 1e6:.0f} MB written) cost more than the work: the ratio there is
  {sg['curve'][-1]['fresh_ratio']}, a size artefact, not a speed. Latency grows linearly with top-k
  (`bench/results/kernels_latency_vs_topk.png`) and batch (`kernels_gflops_vs_batch.png`).""" + ("" if "dequant_vs_convert" not in missed else f""" **Missed**
  (goal {k_goals['dequant_vs_convert']['goal']}, at {k_goals['dequant_vs_convert']['value']:g}): the passes above against the conversion's one."""
  + _passes_note(dq)) + _decode_miss(k, missed))


def _passes_note(dq: dict) -> str:
    """The dequantisation's bound from its passes alone, where the results hold it."""
    c = dq.get("chunk_passes")
    if not c:
        return ""
    return (f""" Timed alone on one {c['rows']}-row chunk with its data in the cache, those passes take
  {c['passes_total_us']:g} us ({', '.join(f'{k.replace("_", " ")} {v:g}' for k, v in c['passes_us'].items())}) against
  {c['convert_us']:g} us for the conversion of the same rows: {c['bound']:g} before any per-call cost or cache miss. The
  float32 product is the definition (bf16(float32(code) * scale), bit for bit), and torch's fused
  mixed-dtype forms of these passes (int8 times an int16 factor, float16 times float32, a float32
  product written as bf16) measured slower than the separate passes.""")


def _decode_miss(k: dict, missed: list) -> str:
    """Why the FP8 decode misses its goal against the matmul, where it does."""
    keys = [key for key, g in k["goals"].items() if key.startswith("decode_vs_matmul") and not g["met"]]
    if not keys or not any(key.startswith("decode_vs_matmul") for key in missed):
        return ""
    rates = k["figures"]["rates"]
    extra = [row["decode_ms"] - row["prefill_ms"] for row in rates.values()]
    values = [k["goals"][key]["value"] for key in keys]
    return (f""" **Missed** (FP8 decode against the matmul, goal {k['goals'][keys[0]]['goal']}, at
  {min(values):g}-{max(values):g} for {len(keys)} of {len(rates)} batch sizes): the decode dequantises its top-k rows before the
  product, with the torch passes above, and takes {min(extra):.1f}-{max(extra):.1f} ms more than the BF16 prefill over the
  same FLOPs.""")


def _hot_buffer_note(h_goals: dict, h: dict, missed: list) -> str:
    """The hot buffer's paragraph."""
    fp8, bf16, batch = h["fp8"], h["bf16"], h["vs_batch"]
    mb = 1e6
    hot = (f"""- **Hot buffer**: `translate` takes {fp8['translate_ms']} ms per step against {fp8['floor_ms']} ms for its copy
  floor ({fp8['ratio']}x; 64 requests, top-k 2048, buffer 4096, {fp8['rows_copied_per_step']:.0f} rows or {fp8['bytes_copied_per_step'] / mb:.1f} MB copied,
  {fp8['miss_rate']:.0%} misses, FP8 rows; {bf16['ratio']}x for BF16 rows; {batch[min(batch, key=int)]['ratio']}x at {min(batch, key=int)} requests to
  {batch[max(batch, key=int)]['ratio']}x at {max(batch, key=int)}: `hotbuffer_vs_batch.png`), as SGLang fills it (warm admission, the new
  tokens written on the device). The floor is the copy no translation can avoid: the same rows, one
  gather and one scatter of 8-byte words, timed with the rows out of the cache, right after each
  step; the ratio is the median of the steps' ratios. The bookkeeping is whole-batch tensor passes
  over int32 values, masks as arithmetic (a select a multiplication, a sign test a shift).""")
    if "translate_vs_copy_floor" in missed:
        split = (f"of its {fp8['translate_ms']} ms, {fp8['copy_in_translate_ms']} ms is its own row copy and "
                 f"{fp8['bookkeeping_ms']} ms the bookkeeping, where 1.5x leaves the bookkeeping at most half the floor, "
                 f"{fp8['floor_ms'] / 2:.1f} ms" if "bookkeeping_ms" in fp8 else
                 f"besides the copy, a step spends {fp8['translate_ms'] - fp8['floor_ms']:.1f} ms checking the top-k and "
                 f"on the bookkeeping")
        hot += (f""" **Missed** (goal {h_goals['translate_vs_copy_floor']['goal']}, by {fp8['ratio'] / 1.5 - 1:.0%}): {split}.
  SGLang's LRU order re-ranks every slot of every request each step: the kernel's hash of the top-k,
  a look-up of every slot, the new order and the misses' places are some 50 whole-batch passes over
  [requests, buffer] and [requests, top-k] tensors, each at memory speed already; halving them needs
  fewer passes, not faster ones.""")
    return hot


def headline() -> str:
    """The README's few figures, from the same results as the table in docs/performance.md."""
    e, k, h, m, acc = (_load(n) for n in ("engine", "kernels", "hotbuffer", "memory", "accuracy"))
    if not all((e, k, h, m, acc)):
        return "(run `make bench` to produce the figures)"
    goals = [(key, g) for r in (e, k, h) for key, g in r["goals"].items() if key in LABELS]
    missed = [(key, g) for key, g in goals if not g["met"]]
    dc, st, an = e["figures"]["decision_cost"], e["figures"]["startup"], e["figures"]["analyses"]
    rates, kv = k["figures"]["rates"], m["figures"]["kv_bytes_per_token"]
    cosines = [c for f in acc["figures"]["fp8_vs_bf16"].values() for c in f["cosine"]]
    logit_std = [x for f in acc["figures"]["fp8_vs_bf16"].values() for x in f["logit_std"]]

    def span(key: str) -> str:
        lo, hi = (f"{f(row[key] for row in rates.values()):.0f}" for f in (min, max))
        return lo if lo == hi else f"{lo}-{hi}"

    lines = [
        f"- A warm decision costs {dc['policy_us_per_decision']} us ({dc['ratio']}x a flat hand-written if/else "
        f"with the same outputs); a cold `hisparse evaluate` process {st['evaluate_cpu_ms']} ms of CPU "
        f"({st['ratio']}x `python -c pass`), without importing torch.",
        f"- Over a whole domain: `hisparse check policies/` lints every shipped version in {an['check']['cpu_s']} s; "
        f"`hisparse diff dsa-backends@9 dsa-backends@10` compares {an['diff_v9_v10_configs']:,} configs in "
        f"{an['diff_v9_v10']['cpu_s']} s.",
        f"- FP8 KV rows take {kv['fp8']} bytes a token against {kv['bf16']} for BF16 ({kv['fp8_saving']:.0%} less); FP8 "
        f"decode (SGLang's FP8 scales) against the BF16 kernel over the same rows, at the model's softmax scale: cosine "
        f"similarity {min(cosines):.5f} or better, with logits of std up to {max(logit_std):.1f} "
        f"([docs/bridge.md](docs/bridge.md#fp8-vs-bf16-accuracy)).",
        f"- The CPU reference kernels (h_q 128, top-k 2048, one thread) reach {span('decode_gflops')} GFLOP/s (FP8 "
        f"decode) and {span('prefill_gflops')} GFLOP/s (BF16 prefill), against {span('matmul_gflops')} GFLOP/s for a "
        f"float32 matmul of the same FLOPs.",
        f"- {len(goals) - len(missed)} of the {len(goals)} speed goals are met"
        + ("." if not missed else "; missed: " + "; ".join(
            f"{LABELS[key][0]}: {g['value']:g} {LABELS[key][1]} (goal {g['goal']})" for key, g in missed) + "."),
    ]
    gpu = _load("gpu")
    if gpu and gpu["figures"].get("skipped"):
        lines.append(f"- Not measured: FlashMLA on a GPU; `bench/results/gpu.json` records why ({gpu['figures']['reason']}).")
    machine = e["machine"]
    lines += ["", f"Measured on {_machines(('engine', 'kernels', 'hotbuffer', 'memory', 'accuracy'))}, Python "
                  f"{machine['python']}, torch {machine.get('torch')}; how, and against what baseline and goal: "
                  "[docs/performance.md](docs/performance.md)."]
    return "\n".join(lines)


def _machine(m: dict) -> str:
    """A result's machine in words: CPU, CPUs, load average where recorded, Python."""
    load = f", load average {m['load_average'][0]:g}" if m.get("load_average") else ""
    return f"{m.get('cpu', m['machine'])}, {m['cpus']} CPUs{load}, Python {m['python']}"


def plugin_own_tests() -> str:
    """SGLang's own tests of the replaced functions, timed with and without the plugin
    (bench/results/plugin.json), for docs/plugin.md."""
    r = _load("plugin")
    o = r and r["figures"].get("own_tests")
    if not o or "suite_cpu_seconds" not in o:
        return "Not measured yet (`python -m bench --only plugin`)."
    g, m = r["goals"]["own_tests_suite_ratio"], r["machine"]
    cpu, wall = o["suite_cpu_seconds"], o["suite_seconds"]
    return (f"SGLang {o['release']}'s own tests of the replaced functions ({o['tests']} tests, `{o['folder']}`; "
            f"{o['passed']} pass with and without the plugin), each run a fresh process, {o['repeats']} runs of "
            f"each in alternation: the suite's CPU time {cpu['without']:.3f} s without the plugin and "
            f"{cpu['with']:.3f} s with it on the shipped policy, {o['suite_cpu_ratio_median']:.3f}x (median of the "
            f"pairs' ratios; goal {g['goal']}: {'met' if g['met'] else '**not met**'}); its wall time "
            f"{wall['without']:.3f} s and {wall['with']:.3f} s ({o['suite_ratio_median']:.3f}x); the whole "
            f"processes' CPU time (SGLang's import, the plugin's load, the tests) {o['process_cpu_ratio']:.3f}x. "
            f"{_machine(m)}; {r['date'][:10]}.")


def plugin_startup() -> str:
    """The SGLang plugin's start-up cost beside SGLang alone (bench/results/plugin.json), for
    docs/plugin.md."""
    r = _load("plugin")
    s = r and r["figures"].get("startup")
    if not s:
        return "Not measured yet (`python -m bench --only plugin`)."
    rows = ["| model | SGLang alone | the plugin installed, inert | the plugin on every family | with / alone (median of pairs) |",
            "|---|---:|---:|---:|---:|"]
    for model, f in s["models"].items():
        c = f["process_cpu_seconds"]
        rows.append(f"| {model} | {c['sglang']:.2f} s | {c['inert']:.2f} s | {c['plugin']:.2f} s | "
                    f"{f['cpu_ratio_median']['plugin']:.3f} |")
    pairs = [x for f in s["models"].values() for x in f["cpu_ratios"]["plugin"]]
    g, m = r["goals"]["startup_cpu_ratio"], r["machine"]
    threads = ", ".join(f"{k}={v}" for k, v in s["thread_env"].items())
    rows += ["", f"Process CPU time (user + system) of SGLang {s['release']}'s start-up up to its routing decision, "
             f"median of {s['repeats']} runs of each form, run in alternation; with / alone over both models: "
             f"{s['cpu_ratio_median']:.3f} (goal {g['goal']}: {'met' if g['met'] else '**not met**'}; the pairs' "
             f"ratios range from {min(pairs):.2f} to {max(pairs):.2f} on this shared machine). "
             f"{_machine(m)}; {threads}; "
             f"{r['date'][:10]}. How: bench/plugin_bench.py; every run's figures: bench/results/plugin.json."]
    if s.get("marginal"):
        shares = ", ".join(f"{f['share'] * 100:.1f} % ({model}: {f['marginal']:.2f} s of {f['alone']:.2f} s)"
                           for model, f in s["marginal"]["models"].items())
        rows += ["", f"In one process, less exposed to the machine's load (bench/plugin_marginal.py: SGLang's "
                 f"start-up alone, then the plugin loaded and the start-up routed by it), the plugin's CPU is "
                 f"{shares} of SGLang's start-up alone, median of {s['marginal']['repeats']} runs."]
    return "\n".join(rows)
