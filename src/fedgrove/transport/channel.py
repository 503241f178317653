"""The Channel API that protocol code uses, whatever carries the bytes.

A :class:`Channel` belongs to one party.  Protocol code calls
:meth:`Channel.send`, :meth:`Channel.recv` and :meth:`Channel.exchange` with
message objects; tags are namespaced automatically by :meth:`Channel.scope`
(``with ch.scope(tree=3, layer=2): ...``), so the same protocol body runs on the
in-process backend and on gRPC.  Every message goes through the codec, so byte
counts are real on both backends.  Per-peer accounting (:class:`CommStats`) is
kept for bytes, messages, rounds and time.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from fedgrove.engine.params import Interval
from fedgrove.exceptions import PeerTimeoutError, ProtocolError
from fedgrove.log import logger
from fedgrove.transport.codec import Message, decode, encode

WAIT_NOTE_AFTER = 15.0  # seconds of waiting for one message before a note is logged, then one every
WAIT_NOTE_EVERY = 60.0
MESSAGE_LIMIT_MB = 2048  # the largest message a party sends or takes, by default ([federation] max_message_mb)


@dataclass
class CommStats:
    bytes_sent: dict[str, int] = field(default_factory=dict)
    bytes_received: dict[str, int] = field(default_factory=dict)
    messages_sent: int = 0
    messages_received: int = 0
    rounds: int = 0            # receive operations that waited on a peer (sequential exchanges)
    wait_seconds: float = 0.0

    @property
    def total_sent(self) -> int:
        return sum(self.bytes_sent.values())

    @property
    def total_received(self) -> int:
        return sum(self.bytes_received.values())

    def as_dict(self) -> dict:
        return {"bytes_sent": dict(self.bytes_sent), "bytes_received": dict(self.bytes_received),
                "total_sent": self.total_sent, "total_received": self.total_received,
                "messages_sent": self.messages_sent, "messages_received": self.messages_received,
                "rounds": self.rounds, "wait_seconds": round(self.wait_seconds, 6)}


class Mailboxes:
    """A party's (or a hub's) incoming messages: one queue per key (sender and tag, and for a hub the receiver).

    A key's queue lives while it holds messages or a receiver waits on it, and is dropped once a receiver has
    emptied it: scoped tags (``tree=3/layer=2/...``) are new keys at every layer of every tree, and kept queues
    (about 4 kB each) grew a long run's memory without bound (an FV-tree run on a9a with four parties: 228 a
    tree, about 0.9 MB).  Puts, lookups and drops are taken under one lock, so a message put while its queue is
    being dropped lands in a new queue that the next receiver finds.
    """

    def __init__(self):
        self._boxes: dict[tuple, queue.Queue] = {}
        self._lock = threading.Lock()

    def put(self, key: tuple, data: bytes) -> None:
        with self._lock:
            box = self._boxes.get(key)
            if box is None:
                box = self._boxes[key] = queue.Queue()
            box.put(data)

    @contextlib.contextmanager
    def waiting(self, key: tuple):
        """The queue of ``key`` for a receiver to wait on; dropped afterwards if the receiver left it empty."""
        with self._lock:
            box = self._boxes.get(key)
            if box is None:
                box = self._boxes[key] = queue.Queue()
        try:
            yield box
        finally:
            with self._lock:
                if box.empty() and self._boxes.get(key) is box:
                    del self._boxes[key]

    def keys(self) -> list[tuple]:
        """The keys with a queue now (messages not yet taken, or a receiver waiting)."""
        with self._lock:
            return list(self._boxes)

    def pending(self) -> int:
        """How many messages are not yet taken."""
        with self._lock:
            return sum(box.qsize() for box in self._boxes.values())


class Channel(ABC):
    """One party's view of the federation."""

    def __init__(self, party: str, peers: list[str], timeout: float = 60.0,
                 max_bytes: int = MESSAGE_LIMIT_MB * 2**20, startup_timeout: float | None = None):
        if party in peers:
            raise ValueError("a party is not its own peer")
        # a negative timeout gave up at the first wait, and NaN never did
        Interval(float, 0, low_open=True).check("timeout", timeout)
        Interval(float, 0, low_open=True, allow_none=True).check("startup_timeout", startup_timeout)
        self.party = party
        self.peers = list(peers)
        self.timeout = timeout
        # until a peer's first message arrives, wait up to the longer startup timeout: parties started by hand
        # (or loading data, or compiling kernels on a busy machine) do not start in step
        self.startup_timeout = max(timeout, startup_timeout) if startup_timeout is not None else timeout
        self._heard: set[str] = set()
        # while this party waits: on whom, and since when (what its progress_age reports)
        self._waiting_on: str | None = None
        self._waiting_since = 0.0
        self.max_bytes = max_bytes
        self.stats = CommStats()
        self._scope: list[str] = []
        self.observers: list = []  # callables(direction, peer, tag, message) for audits and tests

    # -- namespacing -------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, **parts):
        added = [f"{k}={v}" for k, v in parts.items()]
        self._scope.extend(added)
        try:
            yield self
        finally:
            del self._scope[len(self._scope) - len(added):]

    def _tag(self, tag: str) -> str:
        return "/".join(self._scope + [tag])

    # -- messaging ---------------------------------------------------------------------
    def send(self, peer: str, tag: str, message: Message) -> None:
        self._send_encoded([peer], tag, message)

    def _send_encoded(self, peers: list[str], tag: str, message: Message) -> None:
        """Encode ``message`` once and deliver the same bytes to each of ``peers``."""
        for p in peers:
            self._check_peer(p)
        full = self._tag(tag)
        data = encode(message)
        if len(data) > self.max_bytes:
            raise ProtocolError(f"{self.party}: refusing to send {len(data)} bytes to {', '.join(peers)} at {full}: "
                                f"over the limit of {self.max_bytes} bytes ({self.max_bytes / 2**20:g} MB); raise "
                                f"[federation] max_message_mb in every party's config")
        for peer in peers:
            for obs in self.observers:
                obs("send", peer, full, message)
        self._send_bytes_to(peers, full, data)
        for peer in peers:
            self.stats.bytes_sent[peer] = self.stats.bytes_sent.get(peer, 0) + len(data)
            self.stats.messages_sent += 1

    def recv(self, peer: str, tag: str, expect: type | None = None) -> Message:
        self._check_peer(peer)
        full = self._tag(tag)
        t0 = time.perf_counter()
        data = self._recv_bytes(peer, full, self.timeout if peer in self._heard else self.startup_timeout)
        self._heard.add(peer)
        self.stats.wait_seconds += time.perf_counter() - t0
        self.stats.rounds += 1
        self.stats.bytes_received[peer] = self.stats.bytes_received.get(peer, 0) + len(data)
        self.stats.messages_received += 1
        msg = decode(data, expect, self.max_bytes, context=f"from {peer} at {full}")
        for obs in self.observers:
            obs("recv", peer, full, msg)
        return msg

    def broadcast(self, tag: str, message: Message, peers: list[str] | None = None) -> None:
        """Send the same message to each of ``peers`` (default: all), encoded once."""
        self._send_encoded(list(peers if peers is not None else self.peers), tag, message)

    def gather(self, tag: str, expect: type | None = None, peers: list[str] | None = None) -> dict[str, Message]:
        return {p: self.recv(p, tag, expect) for p in (peers if peers is not None else self.peers)}

    def exchange(self, tag: str, outgoing: dict[str, Message], expect: type | None = None) -> dict[str, Message]:
        """Send one message to each listed peer, then receive one from each."""
        for p, m in outgoing.items():
            self.send(p, tag, m)
        return self.gather(tag, expect, list(outgoing))

    def _check_peer(self, peer: str) -> None:
        if peer not in self.peers:
            raise ProtocolError(f"{self.party} has no peer named {peer!r} (peers: {self.peers})")

    @abstractmethod
    def _send_bytes(self, peer: str, tag: str, data: bytes) -> None: ...

    def _send_bytes_to(self, peers: list[str], tag: str, data: bytes) -> None:
        """Deliver the same bytes to several peers (one after the other unless a backend does better)."""
        for peer in peers:
            self._send_bytes(peer, tag, data)

    @abstractmethod
    def _recv_bytes(self, peer: str, tag: str, timeout: float) -> bytes: ...

    def _failure(self) -> str | None:
        """Why the federation is stopping (another party failed), or None."""
        return None

    def progress_age(self) -> float:
        """Seconds since this party, or the party it is waiting on (and so on down the chain), last made
        progress: 0 while it works; while it waits, the time since the later of its own last work and the
        progress last known of the awaited peer.  A cycle of waiting parties (a federation that is stuck) ages,
        whereas a party waiting on one that encrypts for minutes does not."""
        peer = self._waiting_on
        if peer is None:
            return 0.0
        last = max(self._waiting_since, self._peer_progress(peer) or 0.0)
        return max(0.0, time.monotonic() - last)

    def _peer_progress(self, peer: str) -> float | None:
        """When ``peer`` last made progress (``time.monotonic()``): working, or waiting on a party that works;
        None when this backend cannot tell."""
        return None

    def _wait(self, box, peer: str, tag: str, timeout: float) -> bytes:
        """The next item of ``box`` (a queue of ``peer``'s messages at ``tag``), waited for in slices so that a
        failure elsewhere in the federation stops the wait at once.  It fails after ``timeout`` seconds in
        which ``peer`` made no progress: a peer that works (encrypting for minutes, say) or that waits on one
        that works is waited for, one that died or is stuck in a cycle of waits is not."""
        start = time.monotonic()
        deadline, note = start + timeout, start + WAIT_NOTE_AFTER
        self._waiting_on, self._waiting_since = peer, start
        try:
            while True:
                try:
                    return box.get(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    failure = self._failure()
                    if failure is not None:
                        raise ProtocolError(f"{self.party}: stopped waiting for {peer} at {tag}: {failure}") from None
                    refused = self._peer_refused(peer)
                    if refused is not None:
                        raise ProtocolError(f"{self.party}: stopped waiting for {peer} at {tag}: {refused}") from None
                    ended = self._peer_ended(peer)
                    if ended is not None:
                        try:  # its last message may have landed since
                            return box.get_nowait()
                        except queue.Empty:
                            raise ProtocolError(f"{self.party}: {peer} {ended} without sending {tag}") from None
                    gone = self._peer_gone(peer)
                    if gone is not None:
                        try:
                            return box.get_nowait()
                        except queue.Empty:
                            raise PeerTimeoutError(f"{self.party}: stopped waiting for {peer} at {tag}: {peer} "
                                                   f"{gone}") from None
                    progress = self._peer_progress(peer)
                    deadline = max(start, progress or start) + timeout
                    now = time.monotonic()
                    if now >= deadline:
                        still = "" if progress is None else (f" of no progress (neither {peer} nor a party it "
                                                             f"waits for working)")
                        raise PeerTimeoutError(f"{self.party}: no message from {peer} at {tag} within {timeout:g} "
                                               f"s{still}; {peer} stalled or died") from None
                    if now >= note:  # a long wait is said, so that a party started before its peers is not silent
                        note += WAIT_NOTE_EVERY
                        idle = now - (deadline - timeout)
                        if progress is not None and idle < min(timeout / 2, 15.0):
                            logger.info("%s: waiting for %s at %s (%.0f s so far; it is working)", self.party,
                                        peer, tag, now - start)
                        else:
                            logger.info("%s: waiting for %s at %s (%.0f s so far; gives up after %g s without "
                                        "progress)%s", self.party, peer, tag, now - start, timeout,
                                        self._peer_state(peer))
        finally:
            self._waiting_on = None

    def _peer_ended(self, peer: str) -> str | None:
        """How ``peer`` ended ("finished", "stopped") when this backend knows it has, else None."""
        return None

    def _peer_state(self, peer: str) -> str:
        """What this backend knows of a peer not heard from yet, for a note on a long wait ("": nothing)."""
        return ""

    def _peer_refused(self, peer: str) -> str | None:
        """Why ``peer`` can never be reached although it is up (the gRPC backend: the TLS handshake with it
        fails, its certificates being of another federation), else None."""
        return None

    def _peer_gone(self, peer: str) -> str | None:
        """Why ``peer``'s process is known to be gone without a word (the gRPC backend: its port refuses
        connections), else None."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook: only the gRPC backend has resources
        """Release resources (the gRPC backend stops its server)."""
