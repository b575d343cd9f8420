"""Whole-domain evaluation, for the analyses that look at every config (diff, table, lint), and
what they share: the declared domain enumerated, the size limit, the progress step and
`--where NAME=VALUE`.

One by one, a config costs a dict, a key check, eight type checks and a Decision. Here configs
are tuples of valid canonical values fed in bulk to the policy's probe (codegen: the same compiled
rules in a loop, without look-ups or checks), results come back as plain tuples, and outcomes
are interned so that later work is per distinct outcome, not per config. Configs are numbered in
mixed radix over their axes (the last axis varies fastest, as itertools.product enumerates them),
which is how the analyses address them and how compare.cover represents sets of them.
"""
from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from operator import itemgetter

from engine.errors import ConfigError, Problem
from engine.values import parse_int, show, shown

CHUNK = 1024  # configs per call of the probe: results are handled while they are in the cache
# the most configs a whole-domain operation enumerates (diff, table; lint skips its whole-domain
# checks beyond it): a policy file must not be able to make one run for hours
MAX_CONFIGS = 2_000_000
PROGRESS_EVERY = 16384  # configs between two progress calls of a whole-domain operation


# the most rule evaluations (configs x rules) one whole-domain operation does: a legal policy with
# thousands of rules must not make `check` run for minutes; HISPARSE_MAX_WORK raises it
MAX_WORK = 200_000_000


def max_work() -> int:
    """HISPARSE_MAX_WORK when it is a positive decimal number, else MAX_WORK."""
    import os

    raw = (os.environ.get("HISPARSE_MAX_WORK") or "").strip()
    value = parse_int(raw) if raw.isdigit() else None
    return value if value else MAX_WORK


def too_much_work(size: int, rules: int) -> int | None:
    """The rule evaluations of `size` configs over `rules` rules when past max_work(), else None."""
    work = size * max(rules, 1)
    return work if work > max_work() else None


def check_size(size: int, what: str, rules: int = 0) -> None:
    """Refuse, before any work, a whole-domain operation over more than MAX_CONFIGS configs, or
    over more rule evaluations (configs x rules) than max_work()."""
    if size > MAX_CONFIGS:
        raise ConfigError([Problem("C506", f"{what} has {size:,} configs, more than the {MAX_CONFIGS:,} a "
                                   "whole-domain operation enumerates", hint="restrict it with --where NAME=VALUE")])
    work = too_much_work(size, rules)
    if work is not None:
        raise ConfigError([Problem("C506", f"{what}: {size:,} configs x {rules:,} rules = {work:,} rule "
                                   f"evaluations, more than the {max_work():,} a whole-domain operation does",
                                   hint="restrict it with --where NAME=VALUE, or raise HISPARSE_MAX_WORK")])


def parse_where(policy, items: list[str]) -> dict:
    """NAME=VALUE strings (values typed by the input) -> fixed inputs."""
    fixed = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        key = policy.canonical_key(name.strip())
        if not sep and key is not None:  # a declared input without its value: no did-you-mean
            values = list(policy.inputs[key].values)
            raise ConfigError([Problem("C501", f"--where {shown(item)}: expected NAME=VALUE, e.g. "
                                               f"{name.strip()}={show(values[0]) if values else 'VALUE'}",
                                       hint=f"values of {key}: {', '.join(show(v) for v in values)}"
                                       if values else "")])
        if not sep or key is None:
            from engine.suggest import did_you_mean

            raise ConfigError([Problem("C501", f"--where {shown(item)}: expected NAME=VALUE with a declared input",
                                       hint=did_you_mean(name.strip(), policy.input_names))])
        spec = policy.inputs[key]
        text = text.strip()
        if spec.nullable and text in ("", "null", "unset"):
            value = None
        elif spec.type == "bool":
            value = {"true": True, "false": False}.get(text.lower(), text)
        elif spec.type == "int":
            value = parse_int(text)
            if value is None:
                raise ConfigError([Problem("C503", f"--where {name.strip()}={shown(text)}: expected a "
                                                   "64-bit integer")])
        else:
            value = text
        for name, value in policy.normalize({key: value}).items():
            if name in fixed and fixed[name] != value:  # never a silent last-wins
                raise ConfigError([Problem("C501", f"--where {name} is given twice ({show(fixed[name])}, "
                                                   f"{show(value)}): one value per input",
                                           hint="leave the input out to cover all its values")])
            fixed[name] = value
    return fixed


# -- the declared domain ----------------------------------------------------------------------
def cubes(policy, inputs: Mapping | None = None) -> list[list[list]]:
    """The declared domain as products: per part of `domain.parts`, the values of each input
    in input order (an input the part does not name: its default); without parts, one product
    of every input's values (int and str inputs: their representative values). `inputs` maps
    name -> values that replace an input's values in every part."""
    inputs = inputs or {}
    specs = policy.inputs
    if not policy.domain_parts:
        return [[list(inputs.get(n, specs[n].domain())) for n in policy.input_names]]
    return [[list(inputs.get(n, chosen.get(n, (specs[n].default,)))) for n in policy.input_names]
            for _, chosen in policy.domain_parts]


def configs(policy, inputs: Mapping | None = None) -> Iterator[dict]:
    """Every config of the declared domain, once each, as complete canonical dicts (the parts
    in order; a config of two parts comes with the first). `inputs` as for cubes."""
    names = policy.input_names
    for cube, masks, full in _parts(policy, inputs):
        yield from (dict(zip(names, combo)) for combo in _new_combos(cube, masks, full))


def _new_combos(cube: list, masks: list, mask: int) -> Iterator[tuple]:
    """The combos of `cube` in product order that no earlier part holds (the AND of their values'
    masks is 0), streamed depth first without recursion: once the values so far leave no earlier
    part, the rest is a plain product."""
    stack = [(0, (), mask)]
    while stack:
        i, prefix, m = stack.pop()
        if not m:
            yield from (prefix + rest for rest in itertools.product(*cube[i:]))
        elif i < len(cube):  # children pushed last value first, so they come out in order
            stack.extend((i + 1, prefix + (v,), m & b) for v, b in zip(reversed(cube[i]), reversed(masks[i])))


def config_count(policy) -> int:
    """How many configs the declared domain holds (counted by part masks, none enumerated)."""
    total = 0
    for cube, masks, full in _parts(policy):
        counts = {full: 1}
        for bits in masks:
            nxt: dict = {}
            for m, n in counts.items():
                for b in bits:
                    nxt[m & b] = nxt.get(m & b, 0) + n
            counts = nxt
        total += counts.get(0, 0)
    return total


def _parts(policy, inputs: Mapping | None = None):
    """(cube, masks, full) per part in order: masks[i][j] has bit e set when earlier part e holds
    value j of input i; full has a bit per earlier part (0 for the first part)."""
    earlier: list = []
    for cube in cubes(policy, inputs):
        masks = [[sum(1 << e for e, part in enumerate(earlier) if _key(v) in part[i]) for v in values]
                 for i, values in enumerate(cube)]
        yield cube, masks, (1 << len(earlier)) - 1
        earlier.append([frozenset(_key(v) for v in values) for values in cube])


def _key(value):
    """A value as a set member that tells True from 1 (a config's values are compared by type too)."""
    return (type(value), value)


def results(policy, configs, held: list | None = None, chosen: list | None = None):
    """Lists of (values, sources, log, violations, scope), one per config of `configs` (tuples of valid
    canonical values in the policy's input order), in order, a chunk at a time. `held` /
    `chosen`: counters per rule (see Policy.probe); without them, the probe that counts nothing
    and gives (rewritten values and backends, log, first violation, scope)."""
    counting = held is not None or chosen is not None
    probe = policy.probe(counting)
    n = len(policy.rule_meta)
    held = [0] * n if held is None else held
    chosen = [0] * n if chosen is None else chosen
    it = iter(configs)
    while True:
        chunk = list(itertools.islice(it, CHUNK))
        if not chunk:
            return
        out: list = []
        probe(chunk, out.append, held, chosen)
        if len(out) != len(chunk):  # an evaluation path that left the loop instead of finishing
            raise RuntimeError(f"the probe of {policy.ref} gave {len(out)} results for {len(chunk)} configs")
        yield out


def classes(policy, lint: bool = False, admitting=None):
    """(configs, weights): one config per class of the declared domain (classes.py) in domain
    order, and how many configs its class holds; `lint`: classes as the lint reads them (the
    counting evaluator's tests and the capability scan, `admitting` as Classes takes it), else as
    an outcome holds them. Where the
    walk over classes would cost more than the configs themselves: every config, each its own."""
    from engine.analysis.classes import Classes

    if policy.domain_parts:  # a union of parts: every config, once, each its own class
        return [tuple(c.values()) for c in configs(policy)], itertools.repeat(1)
    domains = [policy.inputs[n].domain() for n in policy.input_names]
    cubes = Classes(policy, domains, lint, admitting=admitting).cubes(budget=size(len(d) for d in domains))
    if cubes is None:
        return itertools.product(*domains), itertools.repeat(1)
    return ([tuple(d[s[0]] for d, s in zip(domains, c)) for c, _ in cubes],
            [size(len(s) for s in c) for c, _ in cubes])


def reorder(order: list[int]):
    """A function from a tuple to the tuple of its items at `order` (always a tuple)."""
    if not order:
        return lambda t: ()
    if len(order) == 1:
        i = order[0]
        return lambda t: (t[i],)
    return itemgetter(*order)


def strides(sizes: list[int]) -> list[int]:
    out, step = [], 1
    for size in reversed(sizes):
        out.append(step)
        step *= size
    return out[::-1]


def size(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def coords(index: int, sizes: list[int]) -> list[int]:
    """The value indices of config number `index`."""
    out = []
    for s in reversed(sizes):
        index, r = divmod(index, s)
        out.append(r)
    return out[::-1]


def numbers(choices: list[list[int]], steps: list[int]):
    """The config numbers of the product of `choices` (value indices per axis), in order."""
    return map(sum, itertools.product(*([i * step for i in c] for c, step in zip(choices, steps))))


def projection(sizes: list[int], kept: list[int]):
    """For each config of the product of `sizes`, in order, its number in the product of only
    the axes `kept` (sorted axis indices)."""
    if 1 in sizes:  # an axis of one value changes no number
        live = [i for i, s in enumerate(sizes) if s > 1]
        return projection([sizes[i] for i in live], [live.index(i) for i in kept if sizes[i] > 1])
    inner = size(sizes[kept[-1] + 1:]) if kept else size(sizes)
    if kept == list(range(len(kept))):  # a leading block of axes: each number repeats
        if inner == 1:
            return iter(range(size(sizes)))
        return itertools.chain.from_iterable(itertools.repeat(i, inner) for i in range(size(sizes[:len(kept)])))
    steps = strides([sizes[i] for i in kept])
    step_of = dict(zip(kept, steps))
    return numbers([list(range(s)) for s in sizes], [step_of.get(i, 0) for i in range(len(sizes))])


@contextmanager
def no_gc():
    """Bulk evaluation allocates millions of short-lived tuples while it keeps long-lived tables:
    the cyclic collector would scan those tables again and again for nothing (nothing here makes
    cycles)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
