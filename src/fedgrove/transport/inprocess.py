"""In-process backend: parties are threads, messages are bytes in per-link queues."""

from __future__ import annotations

import threading
import time

from fedgrove.exceptions import InvalidParameterError
from fedgrove.transport.channel import Channel, Mailboxes


class InProcessHub:
    """The shared mailbox of an in-process federation."""

    def __init__(self, parties: list[str]):
        self.parties = list(parties)
        for name in self.parties:
            if not isinstance(name, str) or not name:
                raise InvalidParameterError(f"party names must be non-empty strings, got {name!r}")
        twice = sorted({n for n in self.parties if self.parties.count(n) > 1})
        if twice:  # the roles are keyed by name: one of the two ran, with its part of the data alone
            raise InvalidParameterError(f"party names must be distinct; {twice[0]!r} is given "
                                        f"{self.parties.count(twice[0])} times")
        self.mailboxes = Mailboxes()  # keyed by (sender, receiver, tag)
        self._lock = threading.Lock()
        self.failure: str | None = None  # set when a party fails, so the others stop waiting
        self._channels: dict[str, InProcessChannel] = {}
        self.running: set[str] = set()       # parties whose role runs now (in :func:`run_parties`)
        self.ended: dict[str, str] = {}      # parties whose role has ended: "finished" or "stopped"
        self.ended_at: dict[str, float] = {}  # when (``time.monotonic()``): its last progress

    def fail(self, party: str, exc: BaseException) -> None:
        self.stop(f"party {party} failed: {exc}")

    def stop(self, reason: str) -> None:
        """Make every party waiting on a message stop with ``reason`` (the first reason given stands)."""
        with self._lock:
            if self.failure is None:
                self.failure = reason

    def channel(self, party: str, timeout: float = 60.0, **kw) -> "InProcessChannel":
        ch = InProcessChannel(self, party, [p for p in self.parties if p != party], timeout, **kw)
        self._channels[party] = ch
        return ch

    def progress(self, party: str) -> float | None:
        """When ``party`` last made progress: now while its role runs and does not wait; while it waits, the
        later of its wait's start and the progress of the party it waits on (down the chain; a cycle of waits
        ends at the latest start among them; a party whose role has ended made its last progress when it ended,
        so that one waiting on it has a timeout's time to take the message it may have sent last).  None when
        its role does not run under :func:`run_parties`."""
        now, latest, seen = time.monotonic(), None, set()
        while party in self.running and party not in seen:
            seen.add(party)
            ch = self._channels.get(party)
            waiting_on, since = (ch._waiting_on, ch._waiting_since) if ch is not None else (None, 0.0)
            if waiting_on is None:
                return now
            latest = since if latest is None else max(latest, since)
            party = waiting_on
        if latest is not None and party not in seen and party in self.ended_at:
            latest = max(latest, self.ended_at[party])
        return latest


class InProcessChannel(Channel):
    def __init__(self, hub: InProcessHub, party: str, peers: list[str], timeout: float = 60.0, **kw):
        super().__init__(party, peers, timeout, **kw)
        self.hub = hub

    def _send_bytes(self, peer, tag, data):
        self.hub.mailboxes.put((self.party, peer, tag), data)

    def _recv_bytes(self, peer, tag, timeout):
        with self.hub.mailboxes.waiting((peer, self.party, tag)) as box:
            return self._wait(box, peer, tag, timeout)

    def _failure(self):
        return self.hub.failure

    def _peer_progress(self, peer):
        return self.hub.progress(peer)

    def _peer_ended(self, peer):
        return self.hub.ended.get(peer)


def run_parties(hub: InProcessHub, roles: dict, timeout: float = 60.0, **channel_options) -> tuple[dict, dict]:
    """Run ``roles[party](channel)`` for every party in its own thread (``channel_options``: the channels'
    other settings, such as ``max_bytes``).

    Returns (results, channels) keyed by party, in the order of ``roles`` (not the order the parties finished
    in, so that what is reported from them reads the same every run).  When a party fails the others
    stop waiting at once; the first failure is re-raised after all threads end.
    """
    results, errors = {}, {}
    channels = {p: hub.channel(p, timeout, **channel_options) for p in roles}

    def target(party, fn):
        try:
            results[party] = fn(channels[party])
            hub.ended[party] = "finished"
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.setdefault(party, exc)
            hub.ended[party] = "stopped"
            hub.fail(party, exc)
        finally:
            hub.ended_at[party] = time.monotonic()
            hub.running.discard(party)

    threads = [threading.Thread(target=target, args=(p, fn), name=f"party-{p}", daemon=True)
               for p, fn in roles.items()]
    hub.running.update(roles)
    for p in roles:  # a hub run again (training, then prediction) starts its parties afresh
        hub.ended.pop(p, None)
        hub.ended_at.pop(p, None)
    for t in threads:
        t.start()
    try:
        _join(threads)
    except KeyboardInterrupt:  # Ctrl-C (a notebook's interrupt): the parties stop at their next wait, not later
        hub.stop("the federation was interrupted (Ctrl-C)")
        raise
    if errors:
        first = hub.failure.split(" failed:")[0].removeprefix("party ")
        raise errors.get(first, next(iter(errors.values())))
    return {p: results[p] for p in roles}, channels


def _join(threads) -> None:
    """Join ``threads`` in slices of 0.1 s, so that Ctrl-C's KeyboardInterrupt reaches the main thread.

    The kernel may hand a signal sent to the process to any thread that does not block it (a party's, numba's,
    gRPC's); handed to another thread, it does not wake the main thread from a plain ``join``, and the
    interrupt came only after every party had timed out.  Woken every 0.1 s, the main thread runs the pending
    handler."""
    for t in threads:
        while t.is_alive():
            t.join(0.1)
