"""Codec strictness and the in-process Channel."""

import numpy as np
import pytest

from fedgrove.exceptions import PeerTimeoutError, ProtocolError
from fedgrove.transport.codec import Message, array_field, decode, encode, register
from fedgrove.transport.inprocess import InProcessHub, run_parties


@register
class Probe(Message):
    values: np.ndarray = array_field("<f8", 2)
    ids: np.ndarray = array_field("<i8", 1)
    blob: bytes = b""
    parts: list[bytes] = None
    count: int = 0
    name: str = ""
    flags: list[int] = None


def _probe():
    return Probe(np.arange(6.0).reshape(2, 3), np.array([5, 7]), b"\x00\x01", [b"ab", b"", b"c"], 3, "x", [1, 2])


def _with_header(data: bytes, header: bytes) -> bytes:
    """``data`` with its JSON header replaced (and the header length fixed)."""
    old = int.from_bytes(data[4:8], "big")
    return data[:4] + len(header).to_bytes(4, "big") + header + data[8 + old:]


def test_round_trip():
    m = decode(encode(_probe()), Probe)
    np.testing.assert_array_equal(m.values, np.arange(6.0).reshape(2, 3))
    assert m.ids.tolist() == [5, 7] and m.blob == b"\x00\x01" and m.parts == [b"ab", b"", b"c"]
    assert (m.count, m.name, m.flags) == (3, "x", [1, 2])


@pytest.mark.parametrize("damage", ["truncate", "flip-header", "wrong-type", "oversize", "trailing", "shape",
                                    "shape-overflow", "bool-size"])
def test_tampered_or_truncated_messages_are_rejected(damage):
    data = encode(_probe())
    if damage == "truncate":
        data = data[:-5]
    elif damage == "flip-header":
        data = data[:12] + b"#" + data[13:]
    elif damage == "wrong-type":
        data = data.replace(b'"count":{"v":3}', b'"count":{"v":"3"}')
    elif damage == "trailing":
        data = data + b"\x00"
    elif damage == "shape":
        data = data.replace(b'"shape":[2,3]', b'"shape":[3,3]')
    elif damage == "shape-overflow":  # 30 x (the inverse of 5 modulo 2**63) elements: 6 in 64-bit arithmetic
        data = _with_header(data, data[8:8 + int.from_bytes(data[4:8], "big")].replace(
            b'"shape":[2,3]', b'"shape":[30,%d]' % pow(5, -1, 2**63)))
    elif damage == "bool-size":
        data = data.replace(b'"count":{"v":3}', b'"count":{"v":true}')
    with pytest.raises(ProtocolError, match="malformed message \\(from peer\\)"):
        decode(data, Probe, max_bytes=100 if damage == "oversize" else 1 << 20, context="from peer")


def _header(data: bytes) -> bytes:
    return data[8:8 + int.from_bytes(data[4:8], "big")]


def test_long_lists_travel_after_the_header_whose_size_does_not_grow_with_them():
    # in FGM1 lists were JSON in the header: a Federated Forest's leaf sets of about 90,000 leaves passed its
    # 1 MiB limit and the master refused the answer ("header length out of range")
    n = 300_000
    big = Probe(np.zeros((0, 3)), np.zeros(0, dtype=np.int64), b"", [bytes([i % 7]) * (i % 5) for i in range(n)],
                1, "x", list(range(-n // 2, n // 2)))
    data = encode(big)
    assert len(_header(data)) < len(_header(encode(_probe()))) + 30  # only the offsets' digits grow
    m = decode(data, Probe)
    assert m.flags == big.flags and m.parts == big.parts
    assert decode(encode(Probe(flags=[], parts=[])), Probe).flags == []
    assert decode(encode(Probe(flags=[2**63 - 1, -2**63], parts=[b""])), Probe).flags == [2**63 - 1, -2**63]


@pytest.mark.parametrize("flags, width", [([1, 2], 1), ([-128, 127], 1), ([128], 2), ([-32769], 4),
                                          ([2**31], 8), ([], 1)])
def test_a_list_of_ints_travels_in_the_narrowest_width_that_holds_it(flags, width):
    import json

    data = encode(Probe(flags=flags, parts=[b"x" * 300]))
    fields = json.loads(_header(data))["fields"]
    assert (fields["flags"]["w"], fields["flags"]["len"]) == (width, width * len(flags))
    assert (fields["parts"]["w"], fields["parts"]["len"]) == (2, 302)
    assert decode(data, Probe).flags == flags


@pytest.mark.parametrize("n", [0, 5, 256, 257, 3000])
def test_a_short_list_a_long_one_and_an_array_of_ints_travel_alike(n):
    # lists of up to 256 plain ints are packed and read by struct, longer ones and arrays by numpy: the same bytes
    rng = np.random.default_rng(n)
    for high in (100, 30_000, 2**31, 2**63 - 1):
        v = rng.integers(-high, high, size=n, endpoint=True).tolist()
        data = encode(Probe(flags=v, parts=[b"ab"] * n))
        assert data == encode(Probe(flags=np.asarray(v, dtype=np.int64), parts=[b"ab"] * n))
        assert decode(data, Probe).flags == v


@register
class IntArrays(Message):
    a64: np.ndarray = array_field("<i8", 2)
    a32: np.ndarray = array_field("<i4", 1)
    a16: np.ndarray = array_field("<i2", 1)
    u16: np.ndarray = array_field("<u2", 1)


@pytest.mark.parametrize("high, width", [(0, 1), (127, 1), (128, 2), (32_767, 2), (40_000, 4), (2**31, 8)])
def test_an_array_of_signed_integers_travels_in_the_narrowest_width_and_comes_back_in_its_type(high, width):
    # HybridTree's hand-off nodes and leaves went in 4 bytes each (FGM2); signed integer arrays now travel in the
    # narrowest signed type that holds their values, never wider than their own, unsigned ones as they are
    import json

    a64 = np.array([[-1, high], [3, -high]], dtype=np.int64)
    small = np.clip(a64[0], -2**31, 2**31 - 1).astype(np.int32)
    msg = IntArrays(a64, small, np.array([-5, 9], dtype=np.int16), np.array([1, 2], dtype=np.uint16))
    data = encode(msg)
    fields = json.loads(_header(data))["fields"]
    assert fields["a64"].get("w", 8) == width and fields["a64"]["len"] == 4 * width
    assert fields["a32"].get("w", 4) == min(width, 4) and fields["a16"]["w"] == 1 and "w" not in fields["u16"]
    back = decode(data, IntArrays)
    for name in ("a64", "a32", "a16", "u16"):
        got, sent = getattr(back, name), getattr(msg, name)
        assert got.dtype == sent.dtype and got.flags.writeable
        np.testing.assert_array_equal(got, sent)
    empty = decode(encode(IntArrays()), IntArrays)
    assert empty.a64.shape == (0, 0) and empty.a64.dtype == np.int64


@pytest.mark.parametrize("value", [[True, False], [1, True], [2**63], [1, 2**64], [1.5], [[1, 2]], None])
def test_a_list_of_ints_that_is_not_one_is_not_sent(value):
    with pytest.raises(TypeError, match="Probe.flags must be a list of 64-bit integers"):
        encode(Probe(flags=value, parts=[]))


@pytest.mark.parametrize("field, change", [
    ("flags", lambda d: {**d, "w": 8}),  # 2 bytes: not whole 8-byte integers
    ("flags", lambda d: {**d, "w": 3}),
    ("flags", lambda d: {**d, "w": "1"}),
    ("flags", lambda d: {k: v for k, v in d.items() if k != "w"}),
    ("parts", lambda d: {**d, "w": 16}),
    ("parts", lambda d: {**d, "n": d["n"] + 1}),  # the lengths would take the parts' bytes
    ("parts", lambda d: {**d, "n": -1}),
    ("parts", lambda d: {**d, "n": 10**6}),
    ("parts", lambda d: {**d, "n": "3"}),
    ("ids", lambda d: {**d, "w": 8}),  # an array's width: narrower than its type, a signed integer type
    ("ids", lambda d: {**d, "w": 3}),
    ("ids", lambda d: {**d, "w": 2}),  # 2 bytes of one-byte integers are not 2 of two bytes
    ("ids", lambda d: {k: v for k, v in d.items() if k != "w"}),
    ("values", lambda d: {**d, "w": 1}),
])
def test_a_list_whose_descriptor_does_not_fit_its_bytes_is_refused(field, change):
    import json

    data = encode(_probe())
    header = json.loads(_header(data))
    header["fields"][field] = change(header["fields"][field])
    with pytest.raises(ProtocolError, match="malformed message"):
        decode(_with_header(data, json.dumps(header).encode()), Probe)


@pytest.mark.parametrize("n_parts", [3, 300])  # read by struct, or (more than 256) by numpy
def test_list_part_lengths_that_do_not_add_up_are_refused(n_parts):
    probe = _probe()
    probe.parts = [b"ab", b"", b"c"] * (n_parts // 3)
    data = bytearray(encode(probe))
    header = _header(bytes(data))
    import json

    d = json.loads(header)["fields"]["parts"]
    at = 8 + len(header) + d["off"]  # the first part's length, 2 in one byte: make it 3 (then -1)
    assert d["w"] == 1 and data[at] == 2
    for bad in (3, 255):
        data[at] = bad
        with pytest.raises(ProtocolError, match="field parts part lengths do not add up"):
            decode(bytes(data), Probe)


def test_a_message_of_another_wire_format_says_so():
    data = b"FGM1" + encode(_probe())[4:]
    with pytest.raises(ProtocolError, match=r"wire format 'FGM1', this party reads 'FGM4' \(is the sender a "
                                            r"fedgrove of another version\?\)"):
        decode(data, Probe, context="from peer")


@pytest.mark.parametrize("older", [b"FGM2", b"FGM3"])
def test_messages_of_the_formats_fgm4_extends_are_read(older):
    # an FGM3 message (narrowed arrays) is an FGM4 message without packed arrays, FGM2's without narrowed ones
    # either: a ledger written by those versions stays readable; packed descriptors need FGM4's magic
    msg = IntArrays(np.array([[1, -3]]), np.array([7], dtype=np.int32), np.array([2], dtype=np.int16),
                    np.array([9], dtype=np.uint16))
    data = encode(msg)
    assert data[:4] == b"FGM4" and b'"b":' not in _header(data)
    back = decode(older + data[4:], IntArrays)
    for name in ("a64", "a32", "a16", "u16"):
        np.testing.assert_array_equal(getattr(back, name), getattr(msg, name))
    packed = encode(IntArrays(a32=np.arange(1000, dtype=np.int32)))
    assert b'"b":' in _header(packed)
    with pytest.raises(ProtocolError, match="field a32 is not an array that travels packed"):
        decode(older + packed[4:], IntArrays)


@register
class Packable(Message):
    i8: np.ndarray = array_field("<i8", 2)
    i4: np.ndarray = array_field("<i4", 1)
    i2: np.ndarray = array_field("<i2", 1)
    i1: np.ndarray = array_field("|i1", 1)
    u8: np.ndarray = array_field("<u8", 1)
    u4: np.ndarray = array_field("<u4", 1)
    u2: np.ndarray = array_field("<u2", 1)
    u1: np.ndarray = array_field("|u1", 1)
    b1: np.ndarray = array_field("|b1", 1)
    f8: np.ndarray = array_field("<f8", 1)


def _extremes(dtype, n, rng, span):
    """``n`` values of ``dtype`` spanning ``span`` distinct values at the type's low end, high end and middle."""
    if dtype == np.bool_:
        return [rng.integers(0, 2, n).astype(bool), np.ones(n, dtype=bool), np.zeros(n, dtype=bool)]
    info = np.iinfo(dtype)
    span = min(span, int(info.max) - int(info.min))
    low, mid = int(info.min), (int(info.min) + int(info.max)) // 2
    return [np.array([base + int(v) for v in rng.integers(0, span + 1, n)], dtype=object).astype(dtype)
            for base in (low, int(info.max) - span, mid - span // 2)]


@pytest.mark.parametrize("name", ["i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1", "b1"])
@pytest.mark.parametrize("span", [0, 1, 5, 200, 70_000, 2**40])
def test_an_array_of_a_narrow_range_travels_packed_and_comes_back_exactly(name, span):
    # FGM4: integer and boolean arrays whose values span a narrow range travel as distances from an offset in as
    # few bits as they need, at the bottom, top and middle of their type (an unsigned 64-bit offset above int64)
    import json

    rng = np.random.default_rng(span)
    dtype = Packable.__dataclass_fields__[name].metadata["dtype"]
    for values in _extremes(np.dtype(dtype).type, 3000, rng, span):
        msg = Packable(**{name: values.reshape(2, -1) if name == "i8" else values})
        data = encode(msg)
        d = json.loads(_header(data))["fields"][name]
        lo, hi = int(values.min()), int(values.max())
        width = 1 if name == "b1" else np.dtype(dtype).itemsize
        if name in ("i8", "i4", "i2"):  # against the narrowest signed width that holds them (FGM3)
            width = next(w for w in (1, 2, 4, 8) if -2**(8 * w - 1) <= lo and hi < 2**(8 * w - 1))
        distinct = hi - lo
        if max(1, distinct.bit_length()) * 3000 // 8 + 32 < 3000 * width:
            assert d["b"] == max(1, distinct.bit_length()) and d["len"] == (3000 * d["b"] + 7) // 8
        else:
            assert "b" not in d
        back = getattr(decode(data, Packable), name)
        sent = getattr(msg, name)
        assert back.dtype == sent.dtype and back.shape == sent.shape and back.flags.writeable
        np.testing.assert_array_equal(back, sent)


def test_small_arrays_and_floats_are_not_packed():
    import json

    msg = Packable(i4=np.arange(10, dtype=np.int32), f8=np.zeros(1000), u4=np.zeros(1000, dtype=np.uint32))
    fields = json.loads(_header(encode(msg)))["fields"]
    assert "b" not in fields["i4"] and fields["i4"]["w"] == 1  # 10 bytes narrowed: packing saves too little
    assert "b" not in fields["f8"] and fields["f8"]["len"] == 8000
    assert fields["u4"]["b"] == 1 and fields["u4"]["len"] == 125 and fields["u4"]["o"] == 0


@pytest.mark.parametrize("change, why", [
    (lambda d: {**d, "b": 0}, "packed bits out of range"),  # (no bits: any count of values in no bytes)
    (lambda d: {**d, "b": 57}, "packed bits out of range"),
    (lambda d: {**d, "b": "3"}, "packed bits out of range"),
    (lambda d: {**d, "b": 4}, "packed bits out of range"),  # 3 bits a value: the length does not fit 4
    (lambda d: {**d, "o": 2**31 - 7}, "packed bits out of range"),  # its largest distance above int32
    (lambda d: {**d, "o": -2**31 - 1}, "packed bits out of range"),
    (lambda d: {**d, "o": 1.5}, "packed bits out of range"),
    (lambda d: {k: v for k, v in d.items() if k != "b"}, "packed bits out of range"),
    (lambda d: {**d, "w": 1}, "is not an array that travels packed"),
    (lambda d: {**d, "shape": [d["shape"][0] + 3]}, "packed bits out of range or do not fit its length"),
])
def test_a_packed_array_whose_descriptor_does_not_fit_is_refused(change, why):
    import json

    data = encode(Packable(i4=np.arange(1000, dtype=np.int32) % 7))
    header = json.loads(_header(data))
    assert header["fields"]["i4"]["b"] == 3 and header["fields"]["i4"]["o"] == 0
    header["fields"]["i4"] = change(header["fields"]["i4"])
    with pytest.raises(ProtocolError, match=f"malformed message: field i4 {why}"):
        decode(_with_header(data, json.dumps(header).encode()), Packable)
    header["fields"]["f8"] = {**header["fields"]["f8"], "b": 1, "o": 0}  # packed floats: no such thing
    with pytest.raises(ProtocolError, match="malformed message: field (i4|f8)"):
        decode(_with_header(data, json.dumps(header).encode()), Packable)


def test_a_packed_array_with_bits_set_past_its_last_value_is_refused():
    # 1001 values of 3 bits end 5 bits into the last byte: those bits are zero, or the bytes are not the values'
    import json

    data = bytearray(encode(Packable(i4=np.arange(1001, dtype=np.int32) % 7)))
    d = json.loads(_header(bytes(data)))["fields"]["i4"]
    end = 8 + len(_header(bytes(data))) + d["off"] + d["len"] - 1
    assert d["b"] == 3 and d["len"] == 376 and data[end] < 32
    data[end] |= 64
    with pytest.raises(ProtocolError, match="field i4 packed bits out of range or do not fit its length"):
        decode(bytes(data), Packable)


def test_a_timeout_that_is_not_a_positive_number_is_refused():
    from fedgrove.exceptions import InvalidParameterError

    hub = InProcessHub(["a", "b"])
    # -1 gave up at the first wait; NaN never gave up
    for bad, message in ((-1, "timeout must be > 0, got -1"), (float("nan"), "timeout must be a finite number")):
        with pytest.raises(InvalidParameterError, match=message):
            hub.channel("a", bad)


def test_party_names_must_be_distinct_and_match_the_parts():
    from fedgrove.exceptions import InvalidParameterError
    from fedgrove.protocols import party_names

    # the roles are keyed by name: with a name given twice one party ran, on its part of the data alone
    with pytest.raises(InvalidParameterError, match="party names must be distinct; 'a' is given 2 times"):
        InProcessHub(["a", "b", "a"])
    with pytest.raises(InvalidParameterError, match="party names must be non-empty strings, got ''"):
        InProcessHub(["a", ""])
    # a shorter list left the parties beyond it out of the federation
    with pytest.raises(InvalidParameterError, match="1 name for 2 parties: give one name for each item of parts"):
        party_names(["a"], 2, "party", "parts")
    assert party_names(None, 2, "client", "X_parts") == ["client0", "client1"]
    assert party_names(("x", "y"), 2, "party", "parts") == ["x", "y"]


def test_channel_scopes_tags_counts_bytes_and_times_out():
    hub = InProcessHub(["a", "b"])

    def a(ch):
        with ch.scope(tree=1, layer=2):
            ch.send("b", "probe", _probe())
            return ch.recv("b", "reply", Probe).count

    def b(ch):
        with ch.scope(tree=1, layer=2):
            m = ch.recv("a", "probe", Probe)
            m.count += 1
            ch.send("a", "reply", m)
        return None

    results, channels = run_parties(hub, {"a": a, "b": b})
    assert results["a"] == 4
    sa, sb = channels["a"].stats, channels["b"].stats
    assert sa.bytes_sent["b"] == sb.bytes_received["a"] == len(encode(_probe()))
    assert hub.mailboxes.keys() == []  # every message taken: no queue kept
    lonely = InProcessHub(["a", "b"]).channel("a", timeout=0.3)
    with pytest.raises(PeerTimeoutError, match="no message from b"):
        lonely.recv("b", "never")


def test_results_come_back_in_the_order_of_the_roles_not_of_finishing():
    """What `fedgrove simulate` reports per party read in whatever order the threads ended (party0, party2,
    party1 in one run, another order in the next)."""
    hub = InProcessHub(["a", "b", "c"])

    def a(ch):  # the first role ends last: it waits for both others' messages
        return ch.recv("b", "probe", Probe).count + ch.recv("c", "probe", Probe).count

    def b(ch):
        ch.send("a", "probe", _probe())
        return "b"

    def c(ch):
        ch.send("a", "probe", _probe())
        return "c"

    results, channels = run_parties(hub, {"a": a, "b": b, "c": c})
    assert list(results) == ["a", "b", "c"] and results == {"a": 6, "b": "b", "c": "c"}
    results, _ = run_parties(InProcessHub(["a", "b", "c"]), {"c": c, "b": b, "a": a})
    assert list(results) == ["c", "b", "a"]


def test_a_mailbox_is_kept_while_it_holds_messages_and_dropped_once_taken():
    """Scoped tags are new keys at every layer of every tree: a queue kept per key grew a long run's memory
    (about 4 kB a key; an FV-tree run on a9a with four parties opened 228 keys a tree)."""
    hub = InProcessHub(["a", "b"])

    def a(ch):
        for t in range(200):
            with ch.scope(tree=t, layer=t % 7):
                ch.send("b", "probe", _probe())
                ch.send("b", "probe", _probe())  # two on one key: the second waits in its queue
        with ch.scope(tree=200):
            ch.send("b", "left", _probe())  # never taken
        return None

    def b(ch):
        got = 0
        for t in range(200):
            with ch.scope(tree=t, layer=t % 7):
                got += ch.recv("a", "probe", Probe).count + ch.recv("a", "probe", Probe).count
        return got

    results, _ = run_parties(hub, {"a": a, "b": b})
    assert results["b"] == 2 * 200 * 3
    assert hub.mailboxes.keys() == [("a", "b", "tree=200/left")] and hub.mailboxes.pending() == 1
    with hub.channel("b").scope(tree=200) as ch:
        assert ch.recv("a", "left", Probe).count == 3
    assert hub.mailboxes.keys() == []
    with pytest.raises(ProtocolError, match="b finished without sending never"):
        hub.channel("a", timeout=0.2).recv("b", "never")
    assert hub.mailboxes.keys() == []  # nor is one kept for a receive that failed


def test_a_failing_party_stops_the_others_quickly():
    import time

    hub = InProcessHub(["a", "b"])

    def a(ch):
        raise RuntimeError("boom")

    def b(ch):
        return ch.recv("a", "never")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="boom"):
        run_parties(hub, {"a": a, "b": b}, timeout=30)
    assert time.monotonic() - t0 < 5


_INTERRUPTED_FEDERATION = """
import os, signal, sys, threading, time
from fedgrove.exceptions import ProtocolError
from fedgrove.transport.inprocess import InProcessHub, run_parties

# Python leaves SIGINT ignored where its parent ignored it (a non-interactive shell's background jobs: the
# CI runs of 2026-11-30 and 2026-12-02 that failed): set the handler an interactive Python has
signal.signal(signal.SIGINT, signal.default_int_handler)
hub = InProcessHub(["a", "b"])
stopped = {}

def waits(ch):
    try:
        return ch.recv("b" if ch.party == "a" else "a", "never")
    except ProtocolError as exc:
        stopped[ch.party] = str(exc)
        raise

def interrupt():
    if sys.argv[1] == "process":  # as Ctrl-C does: the kernel picks the thread
        os.kill(os.getpid(), signal.SIGINT)
    else:  # handed to a party's thread
        signal.pthread_kill(next(t for t in threading.enumerate() if t.name == "party-a").ident, signal.SIGINT)

threading.Timer(0.5, interrupt).start()
t0 = time.monotonic()
try:
    run_parties(hub, {"a": waits, "b": waits}, timeout=20)
    print("finished")
except KeyboardInterrupt:
    print(f"KeyboardInterrupt after {time.monotonic() - t0:.1f} s")
except ProtocolError as exc:
    print(f"no KeyboardInterrupt: {exc}")
while len(stopped) < 2 and time.monotonic() - t0 < 5:
    time.sleep(0.05)
print(sorted(stopped), all("interrupted (Ctrl-C)" in m for m in stopped.values()))
"""


@pytest.mark.parametrize("target", ["process", "party thread"])
def test_an_interrupt_stops_the_waiting_parties_too(target):
    # Ctrl-C in a notebook raised in the calling thread only: the parties' threads waited on until their timeout.
    # And the kernel may hand the process's SIGINT to any thread that does not block it: given to a party's
    # thread, it left the main thread asleep in join(), and the KeyboardInterrupt came only after the parties'
    # timeout (the party-thread case).  In a fresh interpreter whose SIGINT handler is Python's own: a test
    # process started by a shell in the background inherits SIGINT ignored, so the signal was lost there (the
    # failed CI runs of 2026-11-30 and 2026-12-02).
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _INTERRUPTED_FEDERATION, target.split()[0]], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first.startswith("KeyboardInterrupt after") and float(first.split()[2]) < 3, out.stdout
    assert second == "['a', 'b'] True", out.stdout


def test_a_peer_not_yet_heard_from_gets_the_startup_timeout_then_the_normal_one():
    import time

    hub = InProcessHub(["a", "b"])
    a, b = hub.channel("a", timeout=0.2, startup_timeout=1.5), hub.channel("b", timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(PeerTimeoutError, match="within 1.5 s"):
        a.recv("b", "first")
    assert 1.4 < time.monotonic() - t0 < 5
    b.send("a", "first", _probe())
    assert a.recv("b", "first", Probe).count == _probe().count
    t0 = time.monotonic()
    with pytest.raises(PeerTimeoutError, match="within 0.2 s"):
        a.recv("b", "second")  # b has been heard from: the normal timeout
    assert time.monotonic() - t0 < 1.0
    assert hub.channel("a", timeout=5, startup_timeout=1).startup_timeout == 5  # never shorter than timeout


def test_a_long_wait_is_noted_in_the_log(monkeypatch, caplog):
    import logging
    import threading

    from fedgrove.transport import channel

    monkeypatch.setattr(channel, "WAIT_NOTE_AFTER", 0.2)
    monkeypatch.setattr(channel, "WAIT_NOTE_EVERY", 0.3)
    hub = InProcessHub(["a", "b"])
    a, b = hub.channel("a", timeout=5), hub.channel("b", timeout=5)
    late = threading.Timer(0.7, lambda: b.send("a", "late", _probe()))
    late.start()
    with caplog.at_level(logging.INFO, logger="fedgrove"):
        assert a.recv("b", "late", Probe).count == _probe().count
    notes = [r.getMessage() for r in caplog.records if "waiting for b" in r.getMessage()]
    assert len(notes) == 2 and "gives up after 5 s" in notes[0]  # after 0.2 s and 0.5 s, not at 0.8 s


def test_a_peer_that_works_longer_than_the_timeout_is_waited_for_down_a_chain_of_waits():
    # the timeout is for a peer that makes no progress: a busy one (encrypting a million gradients takes minutes)
    # failed the parties waiting on it, and so did one waiting on a busy third party
    import time

    hub = InProcessHub(["a", "b", "c"])

    def a(ch):
        return ch.recv("b", "relay", Probe).count

    def b(ch):
        m = ch.recv("c", "work", Probe)
        ch.send("a", "relay", m)
        return m.count

    def c(ch):
        time.sleep(1.0)  # works for more than three timeouts
        ch.send("b", "work", _probe())
        return 0

    t0 = time.monotonic()
    results, _ = run_parties(hub, {"a": a, "b": b, "c": c}, timeout=0.3)
    assert results == {"a": 3, "b": 3, "c": 0} and time.monotonic() - t0 < 5


def test_a_party_waiting_on_one_that_just_ended_has_made_progress_when_it_ended():
    # the test above failed once on a loaded machine: c sent b its message and ended; before b's thread woke to
    # take it, a saw b waiting on c (no longer running) since the start, 0.3 s of "no progress", and gave up
    import time

    hub = InProcessHub(["a", "b", "c"])
    channels = {p: hub.channel(p, 0.3) for p in "abc"}
    hub.running.update("ab")
    channels["b"]._waiting_on, channels["b"]._waiting_since = "c", time.monotonic() - 5.0
    assert hub.progress("b") == channels["b"]._waiting_since  # c never ran here: b's own wait is all there is
    hub.ended_at["c"] = ended = time.monotonic() - 0.1
    assert hub.progress("b") == ended
    channels["c"]._waiting_on, channels["c"]._waiting_since = "b", time.monotonic()
    hub.running.add("c")  # a cycle of waits (b on c, c on b) ages from its latest start, whatever c's end before
    assert hub.progress("b") == channels["c"]._waiting_since


def test_parties_waiting_on_each_other_time_out():
    import time

    hub = InProcessHub(["a", "b"])

    def waits(ch):
        return ch.recv("b" if ch.party == "a" else "a", "never")

    t0 = time.monotonic()
    with pytest.raises(PeerTimeoutError, match="within 0.4 s of no progress"):
        run_parties(hub, {"a": waits, "b": waits}, timeout=0.4)
    assert time.monotonic() - t0 < 5


def test_a_peer_that_finished_without_sending_is_named_at_once():
    import time

    hub = InProcessHub(["a", "b"])

    def a(ch):
        with ch.scope(tree=1):
            return ch.recv("b", "never")

    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match="a: b finished without sending tree=1/never"):
        run_parties(hub, {"a": a, "b": lambda ch: 1}, timeout=30)
    assert time.monotonic() - t0 < 5


def test_a_hub_run_again_waits_for_its_parties_afresh():
    # the first run's "finished" stood in the second: a party waiting on one that had finished the first run
    # was told at once that it had finished without sending
    import time

    hub = InProcessHub(["a", "b"])
    run_parties(hub, {"a": lambda ch: 0, "b": lambda ch: 0})

    def b(ch):
        time.sleep(0.3)
        ch.send("a", "second", _probe())

    results, _ = run_parties(hub, {"a": lambda ch: ch.recv("b", "second", Probe).count, "b": b}, timeout=5)
    assert results["a"] == 3


# --- which peers gRPC would reach through a proxy set in the environment ------------------------------------------

@pytest.mark.parametrize("addr, host", [("127.0.0.1:50050", "127.0.0.1"), ("localhost:1", "localhost"),
                                        ("[::1]:50050", "::1"), ("dns:///bank.example:443", "bank.example"),
                                        ("ipv4:10.0.0.7:9", "10.0.0.7"), ("bank.example", "bank.example")])
def test_the_host_of_a_peer_address(addr, host):
    from fedgrove.transport.addresses import address_host

    assert address_host(addr) == host


@pytest.mark.parametrize("addr, loopback", [("127.0.0.1:1", True), ("127.3.2.1:1", True), ("localhost:1", True),
                                            ("[::1]:1", True), ("10.0.0.1:1", False), ("bank.example:1", False),
                                            ("[fd00::2]:1", False)])
def test_loopback_addresses(addr, loopback):
    from fedgrove.transport.addresses import is_loopback

    assert is_loopback(addr) is loopback


@pytest.mark.parametrize("environ, addr, expected", [
    ({}, "bank.example:443", None),
    ({"https_proxy": "http://proxy:3128"}, "bank.example:443", ("https_proxy", "http://proxy:3128")),
    ({"http_proxy": "http://a:1", "grpc_proxy": "http://b:2"}, "10.0.0.7:9", ("grpc_proxy", "http://b:2")),
    ({"https_proxy": "http://proxy:3128"}, "127.0.0.1:50050", None),  # loopback: never
    ({"https_proxy": "http://proxy:3128"}, "localhost:50050", None),
    ({"https_proxy": "http://p:1", "no_proxy": "other.example, bank.example"}, "bank.example:443", None),
    ({"https_proxy": "http://p:1", "no_proxy": ".example"}, "bank.example:443", None),  # a domain it ends in
    ({"https_proxy": "http://p:1", "no_proxy": "ank.example"}, "bank.example:443", ("https_proxy", "http://p:1")),
    ({"https_proxy": "http://p:1", "no_proxy": "*"}, "bank.example:443", None),
    ({"https_proxy": "http://p:1", "no_proxy": "10.0.0.0/8"}, "10.0.0.7:9", None),  # a network holding it
    ({"https_proxy": "http://p:1", "no_proxy": "10.0.0.0/8"}, "11.0.0.7:9", ("https_proxy", "http://p:1")),
    # the first of no_grpc_proxy, no_proxy that is set is read, as gRPC reads them
    ({"https_proxy": "http://p:1", "no_grpc_proxy": "x.example", "no_proxy": "bank.example"}, "bank.example:1",
     ("https_proxy", "http://p:1")),
])
def test_the_proxy_grpc_would_take_as_it_reads_the_environment(environ, addr, expected):
    from fedgrove.transport.addresses import proxy_for

    assert proxy_for(addr, environ) == expected


# --- why gRPC could not listen --------------------------------------------------------------------------------------

def test_why_a_party_cannot_listen_is_told_from_a_plain_bind(monkeypatch):
    # the message listed every possible cause at once ("another process holds the port ..., the address is not one of
    # this machine's, or its certificate and key do not match"); a plain bind tells which
    import errno
    import socket

    from fedgrove.transport.addresses import why_not_listening

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert why_not_listening(f"127.0.0.1:{port}") == \
            "another process holds the port (is this party already running?)"
    assert why_not_listening("203.0.113.7:50050").startswith("the address is not one of this machine's (")
    assert why_not_listening("bank.invalid:50050").startswith("the address is not one of this machine's (")
    assert why_not_listening("127.0.0.1:port") == "it is not host:port"
    assert why_not_listening(f"127.0.0.1:{port}").startswith("the port is free, so the likelier cause is the "
                                                             "party's certificate and key")

    class Refused(socket.socket):  # a user who may not bind the port (not root, below 1024)
        def bind(self, where):
            raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket, "socket", Refused)
    assert why_not_listening("127.0.0.1:80") == ("this user may not listen on port 80 (ports below 1024 need "
                                                 "root, or the CAP_NET_BIND_SERVICE capability: choose a higher one)")


@pytest.mark.parametrize("bits", [1, 2, 3, 7, 8, 9, 17, 31, 55, 56])
def test_packed_values_are_their_bits_lowest_first_as_numpy_packbits_lays_them(bits):
    # the layout bitpack documents: value k in bits k * bits .. of the little-endian bit stream, zero padding
    from fedgrove.transport import bitpack

    rng = np.random.default_rng(bits)
    for n in (1, 7, 8, 9, 1000):
        dist = rng.integers(0, 2**bits, n, dtype=np.int64)
        offset = -2**62 + 5
        data = bitpack.pack(dist + offset, offset, bits)
        stream = ((dist[:, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(-1)
        assert data == np.packbits(stream, bitorder="little").tobytes()
        np.testing.assert_array_equal(bitpack.unpack(data, n, offset, bits, np.int64), dist + offset)
    assert bitpack.unpack(data[:-1], n, offset, bits, np.int64) is None
    with pytest.raises(ValueError, match="bits must be between 1 and 56, got 57"):
        bitpack.pack(dist, 0, 57)
