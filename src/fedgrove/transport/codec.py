"""A strict binary codec for protocol messages.

A message is a dataclass deriving from :class:`Message`; its annotated fields
are its schema.  Allowed field types: ``int``, ``float``, ``bool``, ``str``,
``bytes``, ``list[int]``, ``list[str]``, ``list[bytes]`` and numpy arrays declared
with :func:`array_field` (dtype and number of dimensions fixed).

Wire format: ``b"FGM3"``, a 4-byte big-endian header length, a UTF-8 JSON
header (type name and per-field descriptors), then the raw buffers of arrays,
byte strings and lists of integers or byte strings, in field order.  A
``list[int]`` travels as little-endian integers of the narrowest of 1, 2, 4
and 8 bytes that holds them all, and a ``list[bytes]`` as its parts' lengths
(likewise) followed by the parts, so the header's size does not grow with
a list's (in ``FGM1`` they were JSON in the header, whose 1 MiB
limit a Federated Forest's leaf sets passed at about 90,000 leaves).  An
array of signed integers of 2 to 8 bytes travels likewise in the narrowest
signed type that holds its values (the descriptor's ``w``; ``FGM3``, where
``FGM2`` sent its declared type: HybridTree's hand-off nodes and leaves went
in 4 bytes each) and is decoded to its declared type.  An array of integers
(signed or not) or booleans whose values span a narrower range than that
travels as each value's distance from an offset (the descriptor's ``o``) in
as few bits as the largest distance needs (``b``, 1 to 56;
:mod:`fedgrove.transport.bitpack`), where that saves more bytes than the two
descriptors cost (``FGM4``: SimFL's hash values, a forest's bootstrap
counts, HybridTree's routed leaves).  ``FGM2`` and ``FGM3`` messages are
``FGM4`` messages without the newer descriptors, and are read as such (a
ledger written by an older fedgrove stays readable).
:func:`decode` checks everything before it builds anything: total size
against the limit, magic, header size, known type, exactly the declared
fields, each of the declared kind, dtype and rank, buffer offsets contiguous
and inside the payload, lengths equal to shape x itemsize (and to the parts'
lengths).
Any violation raises :class:`~fedgrove.exceptions.ProtocolError`; the receiver
never crashes on bytes it was sent.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import typing
from dataclasses import dataclass, field

import numpy as np

from fedgrove.exceptions import ProtocolError
from fedgrove.transport import bitpack

MAGIC = b"FGM4"
_READ = (b"FGM2", b"FGM3", MAGIC)  # the older formats are this one without its newer descriptors
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
MAX_HEADER = 1 << 20
_REGISTRY: dict[str, type] = {}
_ALLOWED_DTYPES = {"<f8", "<f4", "<i8", "<i4", "<i2", "|i1", "|u1", "<u2", "<u4", "<u8", "|b1"}
_DTYPES = {s: np.dtype(s) for s in _ALLOWED_DTYPES}
_BUFFER_KINDS = ("nd", "bytes", "list int", "list bytes")  # the kinds whose values travel after the header
_NARROWED = {"<i8", "<i4", "<i2"}  # array types whose values travel in the narrowest signed type that holds them
_PACKED = {"<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "<u2", "|u1", "|b1"}  # ... or as distances in a few bits
_BOUNDS = {s: (0, 1) if s == "|b1" else (int(np.iinfo(_DTYPES[s]).min), int(np.iinfo(_DTYPES[s]).max))
           for s in _PACKED}
_PACK_DESCRIPTORS = 32  # bytes that a packed array's "b" and "o" may add to the header: packed where it saves more
_INT64 = np.iinfo(np.int64)
_INTS = {w: np.dtype(f"<i{w}") for w in (1, 2, 4, 8)}  # a list's integers travel in the narrowest
# (width, least, greatest, struct code) of each: np.iinfo per list and width was a fifth of encoding a forest's
# short per-node lists (by hand)
_WIDTHS = tuple((w, int(np.iinfo(_INTS[w]).min), int(np.iinfo(_INTS[w]).max), c) for w, c in zip(_INTS, "bhiq"))
_CODES = {w: c for w, _, _, c in _WIDTHS}
_SHORT_LIST = 256  # a list[int] of plain ints up to this long is packed without numpy (faster, the same bytes)
# JSON gives exactly int, float, bool, str, list, dict or None; bool is not an int here
_SCALAR_OK = {
    "int": lambda x: type(x) is int,
    "float": lambda x: type(x) in (int, float),
    "bool": lambda x: type(x) is bool,
    "str": lambda x: type(x) is str,
}
_LIST_ELEMENTS = {"str": str}


@dataclass
class Message:
    """Base class of protocol messages (nouns: ``EncryptedGradients``, ``SplitDecision``)."""


def array_field(dtype, ndim: int):
    """Declare a numpy array field of fixed dtype and rank."""
    dt = np.dtype(dtype)
    return field(default_factory=lambda: np.zeros((0,) * ndim, dtype=dt), metadata={"dtype": dt.str, "ndim": ndim})


def register(cls):
    """Class decorator: make a message type known to the codec."""
    if "__dataclass_fields__" not in cls.__dict__:  # a subclass of a dataclass is not one itself
        cls = dataclass(cls)
    name = wire_name(cls)
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise TypeError(f"message type {name} registered twice")
    _REGISTRY[name] = cls
    cls.__fg_schema__ = _schema(cls)
    return cls


def wire_name(cls) -> str:
    """The type name on the wire: module and class, so protocols may reuse class names."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _schema(cls) -> dict[str, tuple]:
    hints = typing.get_type_hints(cls)
    spec = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if "dtype" in f.metadata:
            if f.metadata["dtype"] not in _ALLOWED_DTYPES:
                raise TypeError(f"{cls.__name__}.{f.name}: dtype {f.metadata['dtype']} is not one the codec "
                                f"carries ({sorted(_ALLOWED_DTYPES)})")
            spec[f.name] = ("nd", f.metadata["dtype"], f.metadata["ndim"])
        elif t in (int, float, bool, str, bytes):
            spec[f.name] = (t.__name__,)
        elif t in (list[int], list[bytes]):
            spec[f.name] = ("list " + typing.get_args(t)[0].__name__,)
        elif t == list[str]:
            spec[f.name] = ("list", "str")
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported field type {t}")
    return spec


def encode(msg: Message) -> bytes:
    cls = type(msg)
    if getattr(cls, "__fg_schema__", None) is None or _REGISTRY.get(wire_name(cls)) is not cls:
        raise TypeError(f"{cls.__name__} is not a registered message type")
    header = {"type": wire_name(cls), "fields": {}}
    buffers = []
    offset = 0
    for name, spec in cls.__fg_schema__.items():
        value = getattr(msg, name)
        kind = spec[0]
        if kind == "nd":
            arr = np.ascontiguousarray(value, dtype=np.dtype(spec[1]))
            if arr.ndim != spec[2]:
                raise TypeError(f"{cls.__name__}.{name} must have {spec[2]} dimensions, got {arr.ndim}")
            header["fields"][name] = {"shape": list(arr.shape), "off": offset}
            raw = _compact(arr, spec[1], header["fields"][name]) if spec[1] in _PACKED and arr.size else None
            if raw is None:
                raw = arr.tobytes()
            header["fields"][name]["len"] = len(raw)
        elif kind == "bytes":
            raw = bytes(value)
            header["fields"][name] = {"off": offset, "len": len(raw)}
        elif kind == "list int":
            w, raw = _int_buffer(cls, name, value)
            header["fields"][name] = {"w": w, "off": offset, "len": len(raw)}
        elif kind == "list bytes":
            parts = [bytes(v) for v in value]
            w, lens = _int_buffer(cls, name, [len(p) for p in parts])
            raw = lens + b"".join(parts)
            header["fields"][name] = {"n": len(parts), "w": w, "off": offset, "len": len(raw)}
        else:
            header["fields"][name] = {"v": value}
            continue
        buffers.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    return MAGIC + struct.pack(">I", len(head)) + head + b"".join(buffers)


def _int_buffer(cls, name: str, value) -> tuple[int, bytes]:
    """A ``list[int]`` field's value as (width, little-endian bytes): :func:`_narrow` of :func:`_int_list`, a
    short list of plain ints by :mod:`struct`."""
    if type(value) is list and len(value) <= _SHORT_LIST and all(type(x) is int for x in value):
        lo, hi = (min(value), max(value)) if value else (0, 0)
        for w, least, greatest, code in _WIDTHS:
            if least <= lo and hi <= greatest:
                return w, struct.pack(f"<{len(value)}{code}", *value)
        raise TypeError(f"{cls.__name__}.{name} must be a list of 64-bit integers, got {str(value)[:60]}")
    return _narrow(_int_list(cls, name, value))


def _int_list(cls, name: str, value) -> np.ndarray:
    """A ``list[int]`` field's value as little-endian int64 (refused: bools, non-integers, values outside)."""
    arr = np.asarray(value)
    if arr.size == 0:
        return np.zeros(0, dtype="<i8")
    ok = (arr.ndim == 1 and arr.dtype.kind in "iu" and not (arr.dtype.kind == "u" and arr.max() > _INT64.max)
          and not (isinstance(value, (list, tuple)) and any(type(x) is bool for x in value)))
    if not ok:  # object arrays (integers beyond 64 bits, mixed types) are not kind "i" or "u"
        raise TypeError(f"{cls.__name__}.{name} must be a list of 64-bit integers, got {str(value)[:60]}")
    return arr.astype("<i8")


def _compact(arr: np.ndarray, dtype: str, descriptor: dict) -> bytes | None:
    """A non-empty integer or boolean array's buffer, and its descriptor's ``"b"`` and ``"o"``, or ``"w"``:
    its values as distances from an offset in as few bits as the largest needs (at least one) where that saves
    more than :data:`_PACK_DESCRIPTORS` bytes on the narrowest signed width that holds them (signed types of 2
    to 8 bytes) or its own (the rest); else signed values in that narrowest width where it is narrower than
    their type; else None (the array's own bytes)."""
    lo, hi = int(arr.min()), int(arr.max())
    bits = max(1, (hi - lo).bit_length())
    width = _width(lo, hi) if dtype in _NARROWED else arr.itemsize
    if bits <= bitpack.MAX_BITS and bitpack.packed_size(arr.size, bits) + _PACK_DESCRIPTORS < arr.size * width:
        offset = min(lo, _BOUNDS[dtype][1] - (1 << bits) + 1)  # every distance of ``bits`` bits decodes in range
        descriptor.update(b=bits, o=offset)
        return bitpack.pack(arr, offset, bits)
    if width < arr.itemsize:
        descriptor["w"] = width
        return arr.astype(_INTS[width]).tobytes()
    return None


def _unpacked(raw, shape: list, dtype: np.dtype, bits, offset) -> np.ndarray | None:
    """The array :func:`_compact` packed (None: ``bits`` or ``offset`` out of range for ``dtype``, or ``raw`` not
    their packed values)."""
    least, greatest = _BOUNDS[dtype.str]
    if (type(bits) is not int or not 1 <= bits <= bitpack.MAX_BITS or type(offset) is not int
            or offset < least or offset + (1 << bits) - 1 > greatest):
        return None
    out = bitpack.unpack(raw, math.prod(shape), offset, bits, dtype)
    return None if out is None else out.reshape(shape)


def _narrow(arr: np.ndarray) -> tuple[int, bytes]:
    """Integers as the narrowest little-endian signed type that holds them all: (its bytes, the buffer)."""
    w = _width(*((int(arr.min()), int(arr.max())) if arr.size else (0, 0)))
    return w, arr.astype(_INTS[w]).tobytes()


def _width(lo: int, hi: int) -> int:
    """Bytes of the narrowest signed integer type that holds ``lo`` to ``hi``."""
    return next(w for w, least, greatest, _ in _WIDTHS if least <= lo and hi <= greatest)


def _parts(raw: memoryview, n: int, w: int, body: int) -> list[bytes] | None:
    """A ``list[bytes]`` field's parts: ``n`` lengths of ``w`` bytes, then the parts (``body`` bytes); None when
    the lengths do not add up to ``body``."""
    if n <= _SHORT_LIST:  # (a few parts: numpy's calls cost more than the parts)
        lens = struct.unpack(f"<{n}{_CODES[w]}", raw[:w * n])
        if any(x < 0 for x in lens) or sum(lens) != body:  # (Python's sum does not wrap)
            return None
        parts, at = [], w * n
        for x in lens:
            parts.append(bytes(raw[at:at + x]))
            at += x
        return parts
    lens = np.frombuffer(raw[:w * n], dtype=_INTS[w]).astype(np.int64)
    # each part between 0 and the body's length, so the sum cannot wrap (n <= ln)
    if np.any(lens < 0) or np.any(lens > body) or int(lens.sum()) != body:
        return None
    ends = np.cumsum(lens) + w * n
    return [bytes(raw[a:b]) for a, b in zip((ends - lens).tolist(), ends.tolist())]


def decode(data: bytes, expect: type | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
           context: str = "") -> Message:
    """Decode and validate; ``expect`` restricts the message type."""
    where = f" ({context})" if context else ""

    def bad(reason: str) -> ProtocolError:
        return ProtocolError(f"malformed message{where}: {reason}")

    if len(data) > max_bytes:
        raise bad(f"{len(data)} bytes exceeds the limit of {max_bytes}")
    if len(data) >= 8 and data[:3] == MAGIC[:3] and data[:4] not in _READ:
        raise bad(f"wire format {data[:4].decode('latin-1')!r}, this party reads {MAGIC.decode()!r} "
                  f"(is the sender a fedgrove of another version?)")
    if len(data) < 8 or data[:4] not in _READ:
        raise bad("bad magic / truncated")
    (hlen,) = struct.unpack(">I", data[4:8])
    if hlen > MAX_HEADER or 8 + hlen > len(data):
        raise bad("header length out of range")
    try:
        header = json.loads(data[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("header is not valid JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("fields"), dict):
        raise bad("header has no field table")
    cls = _REGISTRY.get(header.get("type"))
    if cls is None:
        raise bad(f"unknown message type {header.get('type')!r}")
    if expect is not None and cls is not expect:
        raise bad(f"expected {expect.__name__}, got {cls.__name__}")
    payload = memoryview(data)[8 + hlen:]
    fields = header["fields"]
    schema = cls.__fg_schema__
    if set(fields) != set(schema):
        raise bad(f"{cls.__name__} fields {sorted(fields)} do not match the schema {sorted(schema)}")
    values = {}
    expected_off = 0
    size = len(payload)
    for name, spec in schema.items():
        d = fields[name]
        if not isinstance(d, dict):
            raise bad(f"field {name} descriptor is not an object")
        kind = spec[0]
        if kind in _BUFFER_KINDS:
            off, ln = d.get("off"), d.get("len")
            if type(off) is not int or type(ln) is not int or off != expected_off or ln < 0 or off + ln > size:
                raise bad(f"field {name} buffer out of range")
            raw = payload[off:off + ln]
            expected_off = off + ln
            if kind == "nd":
                shape, dtype = d.get("shape"), _DTYPES[spec[1]]
                if not (type(shape) is list and len(shape) == spec[2]
                        and all(type(s) is int and s >= 0 for s in shape)):
                    raise bad(f"field {name} must be a {spec[2]}-d array")
                if "b" in d or "o" in d:  # distances from an offset, packed (FGM4)
                    if spec[1] not in _PACKED or "w" in d or data[:4] != MAGIC:
                        raise bad(f"field {name} is not an array that travels packed")
                    values[name] = _unpacked(raw, shape, dtype, d.get("b"), d.get("o"))
                    if values[name] is None:
                        raise bad(f"field {name} packed bits out of range or do not fit its length")
                    continue
                w = d.get("w", dtype.itemsize)
                if "w" in d and (spec[1] not in _NARROWED or type(w) is not int or w not in _INTS
                                 or w >= dtype.itemsize):
                    raise bad(f"field {name} integer width out of range")
                if math.prod(shape) * w != ln:
                    raise bad(f"field {name} length does not match its shape")
                if w == dtype.itemsize:
                    values[name] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
                else:
                    values[name] = np.frombuffer(raw, dtype=_INTS[w]).astype(dtype).reshape(shape)
            elif kind == "bytes":
                values[name] = bytes(raw)
            elif kind == "list int":
                w = d.get("w")
                if type(w) is not int or w not in _INTS:
                    raise bad(f"field {name} integer width out of range")
                if ln % w:
                    raise bad(f"field {name} length is not a whole number of {w}-byte integers")
                count = ln // w
                values[name] = (list(struct.unpack(f"<{count}{_CODES[w]}", raw)) if count <= _SHORT_LIST
                                else np.frombuffer(raw, dtype=_INTS[w]).tolist())
            else:
                n, w = d.get("n"), d.get("w")
                if type(w) is not int or w not in _INTS:
                    raise bad(f"field {name} integer width out of range")
                if type(n) is not int or not 0 <= n <= ln // w:
                    raise bad(f"field {name} part count out of range")
                values[name] = _parts(raw, n, w, ln - w * n)
                if values[name] is None:
                    raise bad(f"field {name} part lengths do not add up")
        else:
            v = d.get("v")
            if kind == "list":
                elem = _LIST_ELEMENTS[spec[1]]
                if not (type(v) is list and all(type(x) is elem for x in v)):
                    raise bad(f"field {name} must be a list of {spec[1]}")
            elif not _SCALAR_OK[kind](v):
                raise bad(f"field {name} must be {kind}")
            values[name] = float(v) if kind == "float" else v
    if expected_off != size:
        raise bad("trailing bytes after the last field")
    return cls(**values)
