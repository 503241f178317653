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
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from fedgrove.exceptions import PeerTimeoutError, ProtocolError
from fedgrove.log import logger
from fedgrove.transport.codec import DEFAULT_MAX_BYTES, Message, decode, encode

WAIT_NOTE_AFTER = 15.0  # seconds of waiting for one message before a note is logged, then one every
WAIT_NOTE_EVERY = 60.0


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


class Channel(ABC):
    """One party's view of the federation."""

    def __init__(self, party: str, peers: list[str], timeout: float = 60.0, max_bytes: int = DEFAULT_MAX_BYTES,
                 startup_timeout: float | None = None):
        if party in peers:
            raise ValueError("a party is not its own peer")
        self.party = party
        self.peers = list(peers)
        self.timeout = timeout
        # until a peer's first message arrives, wait up to the longer startup timeout: parties started by hand
        # (or loading data, or compiling kernels on a busy machine) do not start in step
        self.startup_timeout = max(timeout, startup_timeout) if startup_timeout is not None else timeout
        self._heard: set[str] = set()
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
            raise ProtocolError(f"refusing to send {len(data)} bytes to {', '.join(peers)} at {full}: over the "
                                f"{self.max_bytes}-byte message limit")
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

    def _wait(self, box, peer: str, tag: str, timeout: float) -> bytes:
        """The next item of ``box`` (a queue of ``peer``'s messages at ``tag``), waited for in slices so that a
        failure elsewhere in the federation stops the wait at once."""
        start = time.monotonic()
        deadline, note = start + timeout, start + WAIT_NOTE_AFTER
        while True:
            try:
                return box.get(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                failure = self._failure()
                if failure is not None:
                    raise ProtocolError(f"{self.party}: stopped waiting for {peer} at {tag}: {failure}") from None
                now = time.monotonic()
                if now >= deadline:
                    raise PeerTimeoutError(f"{self.party}: no message from {peer} at {tag} within {timeout:g} s; "
                                           f"{peer} stalled or died") from None
                if now >= note:  # a long wait is said, so that a party started before its peers is not silent
                    note += WAIT_NOTE_EVERY
                    logger.info("%s: waiting for %s at %s (%.0f s so far; gives up after %g s)", self.party, peer,
                                tag, now - start, timeout)

    def close(self) -> None:  # noqa: B027 - optional hook: only the gRPC backend has resources
        """Release resources (the gRPC backend stops its server)."""
