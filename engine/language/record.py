"""Plain records for the rule model: fields by name, built, compared and shown like a dataclass's,
without the dataclasses module, whose import alone costs more than building a policy from its
cached document."""
from __future__ import annotations


class Record:
    """FIELDS in order; DEFAULTS: field -> default (a class, such as dict, is called for a fresh one)."""

    __slots__ = ()
    FIELDS: tuple = ()
    DEFAULTS: dict = {}

    def __init__(self, *args, **kw):
        name = type(self).__name__
        if len(args) > len(self.FIELDS):
            raise TypeError(f"{name}() takes {len(self.FIELDS)} fields, got {len(args)}")
        given = dict(zip(self.FIELDS, args))
        for key, value in kw.items():
            if key not in self.FIELDS or key in given:
                raise TypeError(f"{name}() got an unexpected or repeated field {key!r}")
            given[key] = value
        for field in self.FIELDS:
            if field in given:
                value = given[field]
            elif field in self.DEFAULTS:
                value = self.DEFAULTS[field]
                value = value() if isinstance(value, type) else value
            else:
                raise TypeError(f"{name}() missing field {field!r}")
            object.__setattr__(self, field, value)

    def astuple(self) -> tuple:
        return tuple(getattr(self, f) for f in self.FIELDS)

    def __eq__(self, other):
        return self.astuple() == other.astuple() if type(other) is type(self) else NotImplemented

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS) + ")"


class Frozen(Record):
    """An immutable, hashable record."""

    __slots__ = ()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}")

    __delattr__ = __setattr__

    def __hash__(self):
        return hash((type(self).__name__,) + self.astuple())
