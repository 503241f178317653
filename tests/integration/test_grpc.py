"""gRPC transport with mutual TLS: delivery, identity checks, refusal of foreign certificates."""

import contextlib
import socket
import threading
import time

import numpy as np
import pytest

from fedgrove.crypto.certs import create_federation_certs
from fedgrove.exceptions import PeerTimeoutError, ProtocolError, Terminated
from fedgrove.transport.codec import Message, array_field, register
from fedgrove.transport.grpc_backend import GrpcChannel, TLSFiles


@register
class Ping(Message):
    data: np.ndarray = array_field("<f8", 1)


_GIVEN: set[int] = set()


def _port():
    """A free port on 127.0.0.1 that this process has not been given before: the kernel may hand a port just
    closed out again, and two parties given the same one refuse their configs (a test failed so in CI)."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def _tls(d, name):
    return TLSFiles(d / "ca.pem", d / f"{name}.pem", d / f"{name}.key")


def _two_federations(tmp_path):
    """Certificates of alice and bob from two CAs: ours, and a foreign one with the same names."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    create_federation_certs(ours, ["alice", "bob"])
    create_federation_certs(theirs, ["alice", "bob"])
    return ours, theirs


@contextlib.contextmanager
def _starting_later(delay, start, then=None):
    """In another thread, after ``delay`` seconds, the channel ``start()`` makes, then ``then(channel)`` if given;
    yields the list the channel lands in, and on leaving waits for the thread and closes the channel."""
    started = []

    def run():
        time.sleep(delay)
        started.append(start())
        if then is not None:
            then(started[0])

    later = threading.Thread(target=run)
    later.start()
    try:
        yield started
    finally:
        later.join()
        for ch in started:
            ch.close()


def _alice_and_bob(d, timeout, alice=None, bob=None):
    """alice and bob, each serving on its own port, with certificates of one federation CA (``alice``, ``bob``:
    their channels' other settings)."""
    create_federation_certs(d, ["alice", "bob"])
    pa, pb = _port(), _port()
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(d, "alice"), timeout=timeout,
                    **(alice or {}))
    b = GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}"}, _tls(d, "bob"), timeout=timeout,
                    **(bob or {}))
    return a, b


@pytest.fixture
def pair(tmp_path):
    a, b = _alice_and_bob(tmp_path, 10)
    yield a, b
    a.close()
    b.close()


def test_messages_cross_processes_boundaries_over_mutual_tls(pair):
    a, b = pair
    with a.scope(tree=0):
        a.send("bob", "ping", Ping(np.arange(5.0)))
    with b.scope(tree=0):
        got = b.recv("alice", "ping", Ping)
    np.testing.assert_array_equal(got.data, np.arange(5.0))
    assert a.stats.bytes_sent["bob"] == b.stats.bytes_received["alice"] > 40
    assert b.mailboxes.keys() == []


def test_a_mailbox_is_dropped_once_its_messages_are_taken(pair):
    """Every layer of every tree is a new tag: a queue kept per tag grew a long-running party's memory."""
    a, b = pair
    for t in range(50):
        with a.scope(tree=t):
            a.send("bob", "ping", Ping(np.full(2, t)))
    with a.scope(tree=50):
        a.send("bob", "ping", Ping(np.zeros(1)))
    deadline = time.monotonic() + 10
    while b.mailboxes.pending() < 51 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.mailboxes.pending() == 51
    for t in range(50):
        with b.scope(tree=t):
            assert b.recv("alice", "ping", Ping).data.tolist() == [t, t]
    assert b.mailboxes.keys() == [("alice", "tree=50/ping")]


def test_a_peer_that_works_longer_than_the_timeout_is_waited_for_and_one_that_dies_is_not(tmp_path):
    # its signs of life keep a working peer waited for (encrypting a million gradients takes minutes: the
    # parties waiting on it gave up); a peer whose process ends sends none, and is given up on after the timeout
    import time

    a, b = _alice_and_bob(tmp_path, 0.4)
    try:
        a.send("bob", "hello", Ping(np.arange(2.0)))
        b.recv("alice", "hello", Ping)
        late = threading.Timer(2.0, lambda: a.send("bob", "late", Ping(np.arange(3.0))))  # alice works 2 s
        late.start()
        t0 = time.monotonic()
        assert len(b.recv("alice", "late", Ping).data) == 3
        assert 1.9 < time.monotonic() - t0 < 10
        late.join()  # alice's send has its answer before alice goes
        a.close(notify=False)  # as when its process is killed
        t0 = time.monotonic()
        with pytest.raises(PeerTimeoutError, match="no message from alice at never within 0.4 s of no progress"):
            b.recv("alice", "never")
        assert time.monotonic() - t0 < 5
    finally:
        a.close()
        b.close()


def test_a_peer_that_ended_without_sending_is_named_at_once(tmp_path):
    import time

    a, b = _alice_and_bob(tmp_path, 30)
    try:
        a.send("bob", "hello", Ping(np.arange(2.0)))
        a.send("bob", "last", Ping(np.arange(2.0)))
        a.close()  # its last message is still read
        assert len(b.recv("alice", "hello", Ping).data) == 2 and len(b.recv("alice", "last", Ping).data) == 2
        t0 = time.monotonic()
        with pytest.raises(ProtocolError, match="bob: alice ended without sending never"):
            b.recv("alice", "never")
        assert time.monotonic() - t0 < 5
    finally:
        b.close()


def test_two_parties_waiting_on_each_other_over_grpc_time_out(tmp_path):
    import time

    a, b = _alice_and_bob(tmp_path, 0.5)
    errors = {}

    def wait(ch, peer):
        try:
            ch.recv(peer, "never")
        except PeerTimeoutError as exc:
            errors[ch.party] = exc

    try:
        a.send("bob", "hello", Ping(np.arange(2.0)))
        b.send("alice", "hello", Ping(np.arange(2.0)))
        b.recv("alice", "hello", Ping)
        a.recv("bob", "hello", Ping)
        t0 = time.monotonic()
        threads = [threading.Thread(target=wait, args=(a, "bob")), threading.Thread(target=wait, args=(b, "alice"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(errors) == ["alice", "bob"] and time.monotonic() - t0 < 10
    finally:
        a.close()
        b.close()


def test_a_second_party_on_a_port_in_use_is_refused_not_given_half_the_calls(tmp_path):
    # gRPC binds with SO_REUSEPORT by default: a second process on the same port used to start and take a share
    # of the calls meant for the first
    create_federation_certs(tmp_path, ["alice", "bob"])
    pa, pb = _port(), _port()
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(tmp_path, "alice"), timeout=10)
    b = GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}"}, _tls(tmp_path, "bob"), timeout=10)
    try:
        with pytest.raises(ProtocolError, match=f"cannot listen on 127.0.0.1:{pa}: another process holds the port"):
            GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(tmp_path, "alice"), timeout=5)
        for k in range(8):  # every call reaches the first
            b.send("alice", f"still{k}", Ping(np.arange(3.0) + k))
            np.testing.assert_array_equal(a.recv("bob", f"still{k}", Ping).data, np.arange(3.0) + k)
    finally:
        a.close()
        b.close()


def test_a_partys_tls_files_are_checked_before_it_connects(tmp_path):
    # otherwise the handshakes fail and the peers wait out the startup timeout for a party that never answers
    import datetime
    import shutil

    from fedgrove.crypto.certs import check_party_certs
    from fedgrove.exceptions import DataError

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    create_federation_certs(ours, ["alice", "bob"])
    create_federation_certs(theirs, ["alice"])
    check_party_certs(ours / "ca.pem", ours / "alice.pem", ours / "alice.key", "alice")
    with pytest.raises(DataError, match="bob.pem is the certificate of bob, not of alice"):
        check_party_certs(ours / "ca.pem", ours / "bob.pem", ours / "bob.key", "alice")
    with pytest.raises(DataError, match="was not issued by .*ca.pem"):
        check_party_certs(ours / "ca.pem", theirs / "alice.pem", theirs / "alice.key", "alice")
    with pytest.raises(DataError, match="alice.key is not the key of"):
        check_party_certs(ours / "ca.pem", ours / "alice.pem", theirs / "alice.key", "alice")
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=400)
    with pytest.raises(DataError, match="valid from .* UTC, not now"):
        check_party_certs(ours / "ca.pem", ours / "alice.pem", ours / "alice.key", "alice", now=later)
    broken = tmp_path / "broken"
    shutil.copytree(ours, broken)
    (broken / "alice.pem").write_text("not a certificate")
    with pytest.raises(DataError, match="cannot read its TLS files"):
        check_party_certs(broken / "ca.pem", broken / "alice.pem", broken / "alice.key", "alice")


@pytest.mark.parametrize("how", ["send", "recv"])
def test_a_certificate_from_another_ca_is_refused(tmp_path, how):
    # alice holds another federation's certificates.  send: its first message to bob fails in the handshake, said
    # at once, not after waiting out the connect timeout.  recv: bob waits for alice's first message; alice's
    # calls fail in the handshake and it cannot tell bob, who waited out the startup timeout and then said alice
    # "stalled or died" although it was up all along; bob probes alice and says why
    ours, theirs = _two_federations(tmp_path)
    pa, pb = _port(), _port()
    b = GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}"}, _tls(ours, "bob"), timeout=2,
                    startup_timeout=60)
    intruder = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(theirs, "alice"), timeout=5,
                           connect_timeout=3)
    try:
        t0 = time.monotonic()
        if how == "send":
            with pytest.raises(ProtocolError, match="the TLS handshake with bob failed .*same federation CA"):
                intruder.send("bob", "ping", Ping(np.zeros(1)))
            assert time.monotonic() - t0 < 3
        else:
            with pytest.raises(ProtocolError, match="stopped waiting for alice at ping: the TLS handshake with "
                                                    "alice failed .*same federation CA") as caught:
                b.recv("alice", "ping", Ping)
            assert not isinstance(caught.value, PeerTimeoutError)
            assert time.monotonic() - t0 < 20
        assert b.mailboxes.keys() == []
    finally:
        intruder.close()
        b.close()


def test_a_peer_with_a_foreign_certificate_that_starts_later_is_refused_when_it_comes_up(tmp_path):
    # the first message used to wait for the peer to be ready, which retried the failed handshakes in silence
    # until the connect timeout (300 s for a party), then said the peer was down although it was up all along
    ours, theirs = _two_federations(tmp_path)
    pa, pb = _port(), _port()
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(theirs, "alice"), timeout=5,
                    connect_timeout=60)
    try:
        with _starting_later(1.0, lambda: GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}"},
                                                      _tls(ours, "bob"), timeout=5)):
            t0 = time.monotonic()
            with pytest.raises(ProtocolError, match="the TLS handshake with bob failed .*same federation CA"):
                a.send("bob", "ping", Ping(np.zeros(1)))
            assert time.monotonic() - t0 < 20
    finally:
        a.close()


def test_a_party_waiting_on_a_peer_that_comes_up_later_receives_from_it(tmp_path, monkeypatch, caplog):
    # the probes of a peer that is not up yet, then up and of the same federation, change nothing but the notes
    # on the long wait, which say whether the peer is up
    import logging

    from fedgrove.transport import channel as channel_module

    monkeypatch.setattr(channel_module, "WAIT_NOTE_AFTER", 0.5)
    monkeypatch.setattr(channel_module, "WAIT_NOTE_EVERY", 0.5)
    create_federation_certs(tmp_path, ["alice", "bob"])
    pa, pb = _port(), _port()
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(tmp_path, "alice"), timeout=0.4,
                    startup_timeout=30)

    def sends(b):
        time.sleep(3.0)  # alice probes bob meanwhile (its reconnection back-off is up to 2 s)
        b.send("alice", "ping", Ping(np.arange(3.0)))

    try:
        with _starting_later(1.5, lambda: GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}"},
                                                      _tls(tmp_path, "bob"), timeout=5), sends) as started:
            with caplog.at_level(logging.INFO, logger="fedgrove"):
                np.testing.assert_array_equal(a.recv("bob", "ping", Ping).data, np.arange(3.0))
            assert a._probed.get("bob") is True
            assert started[0].mailboxes.keys() == []
        assert f"nothing answers at 127.0.0.1:{pb}: bob is not up yet, or not at that address" in caplog.text
        assert f"bob is up at 127.0.0.1:{pb}" in caplog.text
    finally:
        a.close()


def test_a_first_message_to_a_peer_not_up_yet_waits_for_it_saying_so(tmp_path, monkeypatch, caplog):
    import logging

    from fedgrove.transport import grpc_backend

    monkeypatch.setattr(grpc_backend, "WAIT_NOTE_AFTER", 0.5)
    create_federation_certs(tmp_path, ["alice", "bob"])
    pa, pb = _port(), _port()
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(tmp_path, "alice"), timeout=5,
                    connect_timeout=60)
    try:
        with _starting_later(1.5, lambda: GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}"},
                                                      _tls(tmp_path, "bob"), timeout=5)) as started:
            with caplog.at_level(logging.INFO, logger="fedgrove"):
                a.send("bob", "ping", Ping(np.arange(2.0)))  # delivered once bob is up
            while not started:  # (its server took the message as the channel was being made)
                time.sleep(0.01)
            np.testing.assert_array_equal(started[0].recv("alice", "ping", Ping).data, np.arange(2.0))
        assert f"alice: bob at 127.0.0.1:{pb} is not up yet" in caplog.text
        with pytest.raises(PeerTimeoutError, match="nothing answered at .*bob is not running, or not at that address"):
            a2 = GrpcChannel("alice", f"127.0.0.1:{_port()}", {"bob": f"127.0.0.1:{_port()}"},
                             _tls(tmp_path, "alice"), timeout=5, connect_timeout=1)
            try:
                a2.send("bob", "ping", Ping(np.zeros(1)))
            finally:
                a2.close()
    finally:
        a.close()


@pytest.mark.parametrize("how", ["send", "recv"])
def test_a_peer_address_that_is_another_partys_is_named_at_once(tmp_path, how):
    # alice's config gives bob the address of carol: the handshake fails on the name; alice waited out the startup
    # timeout, noting that bob was not up (send: its first message to bob; recv: waiting for bob's, it probes bob)
    create_federation_certs(tmp_path, ["alice", "bob", "carol"])
    pa, pc = _port(), _port()
    c = GrpcChannel("carol", f"127.0.0.1:{pc}", {"alice": f"127.0.0.1:{pa}"}, _tls(tmp_path, "carol"), timeout=5)
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pc}"}, _tls(tmp_path, "alice"), timeout=2,
                    connect_timeout=30, startup_timeout=60)
    try:
        t0 = time.monotonic()
        said = f"the party at 127.0.0.1:{pc} is not bob .*check bob's address"
        if how == "send":
            with pytest.raises(ProtocolError, match=said):
                a.send("bob", "ping", Ping(np.zeros(1)))
        else:
            with pytest.raises(ProtocolError, match="stopped waiting for bob at ping: " + said):
                a.recv("bob", "ping", Ping)
        assert time.monotonic() - t0 < 10
        assert c.mailboxes.keys() == []  # (a probe leaves nothing behind)
    finally:
        a.close()
        c.close()


def test_a_party_cannot_send_under_another_name(tmp_path):
    create_federation_certs(tmp_path, ["alice", "bob", "carol"])
    pa, pb = _port(), _port()
    b = GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}", "carol": "127.0.0.1:1"},
                    _tls(tmp_path, "bob"), timeout=5)
    # carol's certificate, claiming to be alice
    liar = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(tmp_path, "carol"), timeout=5)
    try:
        with pytest.raises(ProtocolError, match="PERMISSION_DENIED"):
            liar.send("bob", "ping", Ping(np.zeros(1)))
    finally:
        liar.close()
        b.close()


def test_tampered_and_truncated_payloads_are_rejected_naming_peer_and_stage(pair):
    from fedgrove.transport.codec import encode

    a, b = pair
    good = encode(Ping(np.arange(4.0)))
    a._send_bytes("bob", "tree=2/ping", good[:-3])                      # truncated
    a._send_bytes("bob", "tree=2/ping", good.replace(b'"shape":[4]', b'"shape":[9]'))  # tampered
    with b.scope(tree=2):
        for _ in range(2):
            with pytest.raises(ProtocolError, match=r"malformed message \(from alice at tree=2/ping\)"):
                b.recv("alice", "ping", Ping)
        a._send_bytes("bob", "tree=2/ping", good)                          # the receiver is still fine
        np.testing.assert_array_equal(b.recv("alice", "ping", Ping).data, np.arange(4.0))


def test_a_message_larger_than_a_piece_travels_in_pieces_and_arrives_whole_and_in_order(tmp_path, monkeypatch):
    # a single call was capped by gRPC's message size: a vertical federation of 1.1 million rows failed at its
    # first tree (299 MB of encrypted gradients against a 256 MB limit)
    pieces = []
    add_piece = GrpcChannel._add_piece
    monkeypatch.setattr(GrpcChannel, "_add_piece", lambda self, env: pieces.append(env.part) or add_piece(self, env))
    a, b = _alice_and_bob(tmp_path, 10, alice={"chunk_bytes": 1000})
    try:
        big = [np.arange(float(n)) for n in (5000, 3, 800)]  # 40 kB in 41 pieces, one whole, 6.4 kB in 7 pieces
        with a.scope(tree=1):
            for x in big:  # the same tag: the mailbox keeps them in the order sent
                a.send("bob", "grad", Ping(x))
        with b.scope(tree=1):
            for x in big:
                np.testing.assert_array_equal(b.recv("alice", "grad", Ping).data, x)
        assert len(pieces) == 41 + 7 and sorted(pieces) == sorted([*range(41), *range(7)])
        assert a.stats.bytes_sent["bob"] == b.stats.bytes_received["alice"] > 46_400
        b.send("alice", "back", Ping(np.arange(3000.0)))  # bob's own pieces are its default size: one call
        np.testing.assert_array_equal(a.recv("bob", "back", Ping).data, np.arange(3000.0))
        assert len(pieces) == 48 and not b._partial
    finally:
        a.close()
        b.close()


def test_a_message_over_the_receivers_limit_is_refused_naming_it_and_the_setting(tmp_path):
    a, b = _alice_and_bob(tmp_path, 10, alice={"chunk_bytes": 1000}, bob={"max_bytes": 20_000})
    try:
        with pytest.raises(ProtocolError, match=r"bob refused the message at big: INVALID_ARGUMENT a message of "
                                                r"\d+ bytes is over bob's limit of 20000 bytes \(\[federation\] "
                                                r"max_message_mb\)"):
            a.send("bob", "big", Ping(np.arange(4000.0)))
        with pytest.raises(ProtocolError, match=r"bob: refusing to send \d+ bytes to alice at big: over the limit "
                                                r"of 20000 bytes .* raise \[federation\] max_message_mb"):
            b.send("alice", "big", Ping(np.arange(4000.0)))
        a.send("bob", "small", Ping(np.arange(100.0)))  # bob still takes what fits
        np.testing.assert_array_equal(b.recv("alice", "small", Ping).data, np.arange(100.0))
    finally:
        a.close()
        b.close()


def test_pieces_that_do_not_fit_together_are_refused_and_nothing_reaches_the_mailbox(pair):
    import grpc

    from fedgrove.transport.grpc_backend import Envelope

    a, b = pair
    a.send("bob", "hello", Ping(np.arange(1.0)))  # alice has reached bob
    b.recv("alice", "hello", Ping)
    stub = a._stubs["bob"]

    def piece(**kw):
        return Envelope(**{"sender": "alice", "receiver": "bob", "tag": "x", "payload": b"abcd", "message": 7,
                           "part": 0, "parts": 2, "size": 8, **kw})

    for bad in ({"parts": 1}, {"part": 2}, {"size": 3}):  # one piece; past the last; more bytes than announced
        with pytest.raises(grpc.RpcError) as err:
            stub(piece(**bad))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stub(piece())
    with pytest.raises(grpc.RpcError):
        stub(piece(tag="y", part=1))  # another tag under the same message number
    stub(piece(message=8))
    with pytest.raises(grpc.RpcError):
        stub(piece(message=8, part=1, payload=b"abc"))  # fewer bytes than announced
    assert not b._partial and b.mailboxes.pending() == 0


def test_a_message_that_takes_longer_than_the_timeout_to_cross_a_slow_link_is_delivered(tmp_path, monkeypatch):
    # each piece is a call with its own deadline: a link that keeps delivering is not given up on (one call
    # carrying the whole message had to finish within the timeout)
    add_piece = GrpcChannel._add_piece

    def slow(self, env):
        time.sleep(0.3)
        return add_piece(self, env)

    monkeypatch.setattr(GrpcChannel, "_add_piece", slow)
    a, b = _alice_and_bob(tmp_path, 1.0, alice={"chunk_bytes": 1000})
    try:
        a.send("bob", "hello", Ping(np.arange(1.0)))
        b.recv("alice", "hello", Ping)
        t0 = time.monotonic()
        a.send("bob", "big", Ping(np.arange(5000.0)))  # 41 pieces, 8 at a time: 6 x 0.3 s
        assert time.monotonic() - t0 > 1.5
        np.testing.assert_array_equal(b.recv("alice", "big", Ping).data, np.arange(5000.0))
    finally:
        a.close()
        b.close()


def test_a_broadcast_reaches_the_live_peers_and_names_the_one_that_is_down(tmp_path):
    create_federation_certs(tmp_path, ["alice", "bob", "carol"])
    pa, pb, pc = _port(), _port(), _port()  # nobody serves on carol's port
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}", "carol": f"127.0.0.1:{pc}"},
                    _tls(tmp_path, "alice"), timeout=5, connect_timeout=1)
    b = GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}", "carol": f"127.0.0.1:{pc}"},
                    _tls(tmp_path, "bob"), timeout=5)
    try:
        with pytest.raises(PeerTimeoutError, match="could not deliver to carol at ping"):
            a.broadcast("ping", Ping(np.arange(3.0)))
        np.testing.assert_array_equal(b.recv("alice", "ping", Ping).data, np.arange(3.0))
        assert "carol" not in a.stats.bytes_sent
    finally:
        a.close()
        b.close()


_LATE_CALLS = """
import sys, time
from fedgrove.transport.grpc_backend import GrpcChannel, TLSFiles
me, other, mine, theirs, certs = sys.argv[1:6]
ch = GrpcChannel(me, f"127.0.0.1:{mine}", {other: f"127.0.0.1:{theirs}"},
                 TLSFiles(f"{certs}/ca.pem", f"{certs}/{me}.pem", f"{certs}/{me}.key"), timeout=10)
if me == "sender":  # keeps calling, from several threads, while the other process closes its channel and exits
    def calls():
        t0 = time.time()
        while time.time() - t0 < 3:
            ch.notify_failure(RuntimeError("stopping"), timeout=0.5)
    threads = [threading.Thread(target=calls) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
else:
    time.sleep(1.0)
ch.close()
"""


def test_a_process_that_closes_its_channel_exits_without_a_traceback_while_calls_still_arrive(tmp_path):
    # close() used to start the server's shutdown without waiting for it: a call arriving as the process exited
    # made gRPC's server thread print "cannot schedule new futures after interpreter shutdown" (about one exit
    # in three here)
    import subprocess
    import sys

    create_federation_certs(tmp_path / "certs", ["sender", "closer"])
    for _ in range(3):
        ps, pc = _port(), _port()
        args = [str(tmp_path / "certs")]
        sender = subprocess.Popen([sys.executable, "-c", _LATE_CALLS, "sender", "closer", str(ps), str(pc), *args],
                                  stderr=subprocess.DEVNULL)
        closer = subprocess.run([sys.executable, "-c", _LATE_CALLS, "closer", "sender", str(pc), str(ps), *args],
                                capture_output=True, text=True, timeout=60)
        sender.wait(timeout=60)
        assert closer.returncode == 0 and "Traceback" not in closer.stderr, closer.stderr[-2000:]


def test_certs_in_a_folder_with_a_ca_keep_it_and_issue_only_the_new_parties(tmp_path, capsys):
    """`fedgrove certs` a second time made a new CA and new certificates without a word: every party that had
    been given its files could no longer talk to the others.  Now the CA is kept, valid certificates are left
    as they are, new parties get theirs from the same CA, and nothing is written when a name is bad."""
    from fedgrove.cli.main import main
    from fedgrove.crypto.certs import check_party_certs

    out = tmp_path / "certs"
    assert main(["certs", "alice", "bob", "-o", str(out)]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    assert main(["certs", "alice", "bob", "-o", str(out)]) == 0
    assert "nothing to do" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert main(["certs", "alice", "carol", "-o", str(out)]) == 0
    assert "certificates of carol from the CA already there (alice already had valid ones)" in \
        " ".join(capsys.readouterr().err.split())
    assert all((out / name).read_bytes() == data for name, data in before.items())
    for name in ("alice", "bob", "carol"):
        check_party_certs(out / "ca.pem", out / f"{name}.pem", out / f"{name}.key", name)
    assert main(["certs", "bob", "--force", "-o", str(out)]) == 0  # a new key for bob, same CA
    assert (out / "bob.key").read_bytes() != before["bob.key"] and (out / "ca.pem").read_bytes() == before["ca.pem"]
    check_party_certs(out / "ca.pem", out / "bob.pem", out / "bob.key", "bob")
    (out / "dave.pem").write_bytes((out / "bob.pem").read_bytes())  # somebody else's certificate under dave's name
    (out / "dave.key").write_bytes((out / "bob.key").read_bytes())
    assert main(["certs", "dave", "-o", str(out)]) == 2
    assert "is the certificate of bob, not of dave; issue dave's again with --force" in capsys.readouterr().err
    assert main(["certs", "erin", "a/b", "-o", str(tmp_path / "fresh")]) == 2  # checked before writing
    assert not (tmp_path / "fresh").exists()
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "ca.pem").write_bytes(before["ca.pem"])
    assert main(["certs", "erin", "-o", str(tmp_path / "half")]) == 2
    assert "holds ca.pem without ca.key" in capsys.readouterr().err


@pytest.mark.parametrize("name, said", [("ca", "its files would be the federation CA's"),
                                        ("CA", "its files would be the federation CA's"),
                                        ("\u00fcber", "ASCII letters, digits")])
def test_certs_refuse_a_party_named_ca_or_with_letters_outside_ascii(tmp_path, capsys, name, said):
    """A party named 'ca' was given the CA's own files (ca.pem and ca.key: nothing but the CA was written, and
    the message listed no party); a name with a non-ASCII letter passed the name check and failed as a
    traceback from the certificate library (a DNS name is ASCII).  Both are refused, naming the name."""
    from fedgrove.cli.main import main

    assert main(["certs", "alice", name, "-o", str(tmp_path / "c")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said in err and repr(name) in err and "Traceback" not in err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("stop, said", [(KeyboardInterrupt, r"interrupted \(Ctrl-C\)"),
                                         (Terminated, r"stopped \(SIGTERM\)")])
def test_a_party_stopped_by_ctrl_c_or_sigterm_tells_its_peers_how_to_go_on(pair, stop, said):
    a, b = pair
    a.notify_failure(stop())
    with pytest.raises(ProtocolError, match=rf"alice.*{said}; restart every party with --resume"):
        b.recv("alice", "ping", Ping)


def test_a_send_to_a_peer_that_died_stops_when_another_party_reports_a_failure(tmp_path):
    # FV-tree's parties all send to all: with one killed, a survivor caught sending to it waited out its call's
    # deadline (the timeout, each call in turn: four minutes with the example's 120 s) although the other
    # survivors had told it at once that they had failed
    create_federation_certs(tmp_path, ["alice", "bob", "carol"])
    ports = {n: _port() for n in ("alice", "bob", "carol")}

    def channel(name, **kw):
        peers = {n: f"127.0.0.1:{p}" for n, p in ports.items() if n != name}
        return GrpcChannel(name, f"127.0.0.1:{ports[name]}", peers, _tls(tmp_path, name), timeout=60, **kw)

    a, b, c = channel("alice"), channel("bob"), channel("carol")
    try:
        a.broadcast("hello", Ping(np.arange(2.0)))  # alice has reached both
        c.close(notify=False)  # carol's process dies, telling nobody
        threading.Timer(1.0, lambda: b.notify_failure(ProtocolError("bob: lost carol"))).start()
        t0 = time.monotonic()
        with pytest.raises(ProtocolError, match="alice: stopped sending to carol at ping: party bob failed: "
                                                "bob: lost carol"):
            a.broadcast("ping", Ping(np.arange(3.0)))
        assert time.monotonic() - t0 < 10  # not the 60 s of the call's deadline
        np.testing.assert_array_equal(b.recv("alice", "ping", Ping).data, np.arange(3.0))
    finally:
        a.close(notify=False)
        b.close(notify=False)


def test_a_call_dropped_by_a_stopping_peer_is_reported_by_the_failure_it_announced(pair):
    # a peer stopping on a signal tells the others, then its server drops the calls in flight (CANCELLED): a
    # party whose call it dropped said "bob refused the message at tree=3/ctl: CANCELLED", not why bob stopped
    import grpc

    class Dropped(grpc.RpcError):
        def __init__(self, code):
            self._code = code

        def code(self):
            return self._code

        def details(self):
            return self._code.name

    a, _ = pair
    for code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE):
        err = a._call_error("bob", "tree=3/ctl", 10, Dropped(code))
        assert isinstance(err, PeerTimeoutError) and "alice: lost the connection to bob at tree=3/ctl" in str(err)
    assert "refused the message" in str(a._call_error("bob", "t", 10, Dropped(grpc.StatusCode.INVALID_ARGUMENT)))
    a.failure = "party bob failed: it was stopped (SIGTERM)"
    err = a._call_error("bob", "tree=3/ctl", 10, Dropped(grpc.StatusCode.CANCELLED))
    assert str(err) == "alice: stopped sending to bob at tree=3/ctl: party bob failed: it was stopped (SIGTERM)"


def test_a_peer_whose_process_ended_without_a_word_is_given_up_on_before_the_timeout(tmp_path):
    # a party killed outright (SIGKILL, the out-of-memory killer) tells nobody: its peers waited out the whole
    # timeout (600 s is a fair setting for large encrypted runs).  Its port refuses their progress beats at
    # once, which a live peer's never does, busy or not: after a few refused beats they stop, naming it
    a, b = _alice_and_bob(tmp_path, 60)
    a._beat_every, a._gone_after = 0.2, 1.0  # (60 s of timeout: beats every 5 s, given up on after 15 s)
    try:
        a.send("bob", "hello", Ping(np.arange(2.0)))
        b.recv("alice", "hello", Ping)
        b.send("alice", "last", Ping(np.arange(1.0)))
        b.close(notify=False)  # bob's process is killed
        t0 = time.monotonic()
        np.testing.assert_array_equal(a.recv("bob", "last", Ping).data, np.arange(1.0))  # what came is read
        with pytest.raises(PeerTimeoutError, match=r"alice: stopped waiting for bob at next: bob refuses "
                                                   r"connections at 127\.0\.0\.1:\d+ \(for \d+ s, with no word "
                                                   r"from it\): its process ended; restart every party with "
                                                   r"--resume"):
            a.recv("bob", "next", Ping)
        with pytest.raises(PeerTimeoutError, match="alice: could not deliver to bob at more: bob refuses"):
            a.send("bob", "more", Ping(np.arange(3.0)))
        assert time.monotonic() - t0 < 20
    finally:
        a.close(notify=False)


def test_a_party_whose_handshake_failed_keeps_its_port_open_for_the_peers_starting_later(tmp_path):
    # bob's certificates are of another federation: it fails on its first message to alice and exits; carol,
    # starting after that, found nothing at bob's address and waited out its startup timeout (300 s for a party),
    # then said bob was not running
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    create_federation_certs(ours, ["alice", "bob", "carol"])
    create_federation_certs(theirs, ["alice", "bob", "carol"])
    pa, pb, pc = _port(), _port(), _port()
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, _tls(ours, "alice"), timeout=5)
    b = GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}", "carol": f"127.0.0.1:{pc}"},
                    _tls(theirs, "bob"), timeout=5, linger=6)
    c = None
    try:
        with pytest.raises(ProtocolError, match="the TLS handshake with alice failed"):
            b.send("alice", "ping", Ping(np.zeros(1)))
        closing = threading.Thread(target=b.close)
        closing.start()  # bob exits, lingering
        time.sleep(0.5)
        c = GrpcChannel("carol", f"127.0.0.1:{pc}", {"bob": f"127.0.0.1:{pb}"}, _tls(ours, "carol"), timeout=5,
                        startup_timeout=60)
        t0 = time.monotonic()
        with pytest.raises(ProtocolError, match="the TLS handshake with bob failed .*same federation CA"):
            c.send("bob", "ping", Ping(np.zeros(1)))
        assert time.monotonic() - t0 < 6
        closing.join()
    finally:
        a.close()
        b.close()
        if c is not None:
            c.close()


# --- a proxy set in the environment (as for pip, in many companies) -----------------------------------------------

def _dead_proxy(monkeypatch):
    """Every proxy variable gRPC reads set to a port where nothing listens: a call sent through it fails."""
    dead = f"http://127.0.0.1:{_port()}"
    for var in ("grpc_proxy", "https_proxy", "http_proxy"):
        monkeypatch.setenv(var, dead)
    for var in ("no_grpc_proxy", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    return dead


def test_peers_on_this_machine_are_reached_directly_whatever_proxy_is_set(tmp_path, monkeypatch):
    # with https_proxy set, gRPC sent a localhost federation's calls to the proxy, and every party waited for
    # peers that were up ("not up yet") until it gave up
    _dead_proxy(monkeypatch)
    a, b = _alice_and_bob(tmp_path, 10)
    try:
        a.send("bob", "ping", Ping(np.arange(3.0)))
        assert b.recv("alice", "ping", Ping).data.tolist() == [0.0, 1.0, 2.0]
    finally:
        a.close()
        b.close()


def _this_machines_address():
    """An address of this machine that is not loopback (None where it has none)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 9))  # no packet is sent: the route picks the address
        host = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if host.startswith("127.") or host == "0.0.0.0" else host


def test_a_peer_that_does_not_answer_through_the_proxy_names_it_and_the_way_around(tmp_path, monkeypatch):
    host = _this_machines_address()
    if host is None:
        pytest.skip("this machine has no address but loopback")
    dead = _dead_proxy(monkeypatch)
    create_federation_certs(tmp_path, ["alice", "bob"])
    pa, pb = _port(), _port()

    def channels():
        return (GrpcChannel("alice", f"{host}:{pa}", {"bob": f"{host}:{pb}"}, _tls(tmp_path, "alice"), timeout=1.5),
                GrpcChannel("bob", f"{host}:{pb}", {"alice": f"{host}:{pa}"}, _tls(tmp_path, "bob"), timeout=1.5))

    a, b = channels()
    try:
        with pytest.raises(PeerTimeoutError) as err:
            a.send("bob", "ping", Ping(np.arange(2.0)))
    finally:
        a.close()
        b.close()
    assert f"the calls go through the proxy {dead} that grpc_proxy sets; no_grpc_proxy={host} reaches bob " \
           f"directly" in str(err.value), str(err.value)
    monkeypatch.setenv("no_grpc_proxy", host)  # the way around it that the message gives
    a, b = channels()
    try:
        a.send("bob", "ping", Ping(np.arange(2.0)))
        assert b.recv("alice", "ping", Ping).data.tolist() == [0.0, 1.0]
    finally:
        a.close()
        b.close()


def test_a_peer_whose_host_name_does_not_resolve_is_named_so(tmp_path, monkeypatch):
    # a host name not in the DNS (a typo in [peers]) was reported as "nothing answered ... not running, or not at
    # that address" after the startup timeout; now the name and the resolver's words are given
    for var in ("grpc_proxy", "https_proxy", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    create_federation_certs(tmp_path, ["alice", "bob"])
    a = GrpcChannel("alice", f"127.0.0.1:{_port()}", {"bob": f"bob.invalid:{_port()}"}, _tls(tmp_path, "alice"),
                    timeout=1.0)
    try:
        with pytest.raises(PeerTimeoutError, match=r"within 1 s: bob\.invalid does not resolve \(.+\)"):
            a.send("bob", "ping", Ping(np.arange(2.0)))
    finally:
        a.close()
