"""JSON text for states that are rewritten often but change little (per-tree checkpoints).

A :class:`FrozenJSON` is a dict its producer promises not to change (a finished
tree's dict, memoised by the tree): its JSON text is computed once and reused.
The checkpoint store appends each such text once to its tree log.
:func:`dumps` writes the same JSON as ``json.dumps`` (default separators) but
takes every ``FrozenJSON`` it meets from its cached text, for writing a whole
state at once (``bench/checkpoint.py`` times it against the tree log).
"""

from __future__ import annotations

import json


class FrozenJSON(dict):
    """A dict that will not change after creation; its JSON text is computed once."""

    __slots__ = ("_text",)

    def _frozen(self, *args, **kwargs):
        raise TypeError("a FrozenJSON dict does not change (its JSON text is cached); copy it with dict(d)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _frozen

    def __reduce__(self):  # copy, deepcopy and pickle rebuild it whole, never item by item
        return (FrozenJSON, (dict(self),))

    def text(self) -> str:
        try:
            return self._text
        except AttributeError:
            self._text = json.dumps(self)
            return self._text


def memoised(owner, key, build) -> FrozenJSON:
    """``owner``'s JSON-ready data, ``build()`` made a :class:`FrozenJSON` once and returned again while ``key``
    (compared by ``==``: exact copies of the arrays it stands for) is unchanged; kept in ``owner.__dict__``."""
    memo = owner.__dict__.get("_dict_memo")
    if memo is not None and memo[0] == key:
        return memo[1]
    d = FrozenJSON(build())
    owner.__dict__["_dict_memo"] = (key, d)
    return d


def dumps(obj) -> str:
    """``json.dumps(obj)``, reusing the cached text of every :class:`FrozenJSON` inside dicts and lists."""
    if isinstance(obj, FrozenJSON):
        return obj.text()
    if isinstance(obj, dict):
        if not _holds_frozen(obj.values()):
            return json.dumps(obj)
        return "{" + ", ".join(f"{json.dumps(k if isinstance(k, str) else _key(k))}: {dumps(v)}"
                               for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        if not _holds_frozen(obj):
            return json.dumps(obj)
        return "[" + ", ".join(dumps(v) for v in obj) + "]"
    return json.dumps(obj)


def _holds_frozen(values) -> bool:
    """Whether a FrozenJSON is among ``values`` or one level further down (dicts and lists of them)."""
    for v in values:
        if isinstance(v, FrozenJSON):
            return True
        if isinstance(v, dict) and any(isinstance(w, (FrozenJSON, dict, list)) for w in v.values()):
            return True
        if isinstance(v, list) and v and isinstance(v[0], (FrozenJSON, dict, list)):
            return True
    return False


def _key(k) -> str:
    """A non-string key as json.dumps writes it (numbers, booleans, None)."""
    return json.loads(json.dumps({k: 0})).popitem()[0]
