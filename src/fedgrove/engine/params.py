"""Declarative parameter validation, done once at the public boundary."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

from fedgrove.exceptions import InvalidParameterError


@dataclass(frozen=True)
class Interval:
    """Accepts finite numbers of ``kind`` in [low, high] (open ends with the flags)."""

    kind: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    allow_none: bool = False

    def check(self, name, value):
        if value is None and self.allow_none:
            return
        ok_type = isinstance(value, numbers.Integral) if self.kind is int else isinstance(value, numbers.Real)
        if isinstance(value, bool) or not ok_type:
            raise InvalidParameterError(f"{name} must be {'an integer' if self.kind is int else 'a number'}"
                                        f"{' or None' if self.allow_none else ''}, got {value!r}")
        if not math.isfinite(value):  # NaN passed every bound (and failed no split); infinity gave NaN scores
            raise InvalidParameterError(f"{name} must be a finite number, got {value!r}")
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise InvalidParameterError(f"{name} must be {'>' if self.low_open else '>='} {self.low}, got {value!r}")
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            raise InvalidParameterError(f"{name} must be {'<' if self.high_open else '<='} {self.high}, got {value!r}")


@dataclass(frozen=True)
class OneOf:
    options: tuple

    def check(self, name, value):
        if value not in self.options:
            raise InvalidParameterError(f"{name} must be one of {list(self.options)}, got {value!r}")


@dataclass(frozen=True)
class Flag:
    """Accepts True or False only (not 0, 1 or a string)."""

    def check(self, name, value):
        if not isinstance(value, bool):
            raise InvalidParameterError(f"{name} must be true or false, got {value!r}")


def validate(params, constraints: dict) -> None:
    """Check every field of the dataclass ``params`` that has a constraint, after turning numpy numbers (a
    search grid's values) into Python's: the settings are written as JSON (models, ledgers, messages), which
    takes no numpy number."""
    for f in fields(params):
        value = getattr(params, f.name)
        if isinstance(value, np.generic):
            value = value.item()
            object.__setattr__(params, f.name, value)  # frozen dataclasses too
        if f.name in constraints:
            constraints[f.name].check(f.name, value)


def check_types(where: str, **given) -> None:
    """Refuse, by name, an argument of a public entry point (training, a simulation) that is not of its type
    (``name=(value, cls)``, ``cls`` a class or a tuple of them; ``None`` passes where the tuple holds
    ``type(None)``): a dict or ``None`` for the parameters, or a missing key pair, failed later as an
    AttributeError (inside a party)."""
    for name, (value, cls) in given.items():
        if not isinstance(value, cls):
            want = " or ".join("None" if c is type(None) else c.__name__ for c in (cls if isinstance(cls, tuple)
                                                                                    else (cls,)))
            hint = " (e.g. fedgrove.keygen('ou', 2048))" if name == "he" else ""
            raise InvalidParameterError(f"{where}: {name} must be a {want}{hint}, got {type(value).__name__}")
