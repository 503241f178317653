"""In-process backend: parties are threads, messages are bytes in per-link queues."""

from __future__ import annotations

import queue
import threading

from fedgrove.transport.channel import Channel


class InProcessHub:
    """The shared mailbox of an in-process federation."""

    def __init__(self, parties: list[str]):
        self.parties = list(parties)
        self._boxes: dict[tuple[str, str, str], queue.Queue] = {}
        self._lock = threading.Lock()
        self.failure: str | None = None  # set when a party fails, so the others stop waiting

    def fail(self, party: str, exc: BaseException) -> None:
        self.stop(f"party {party} failed: {exc}")

    def stop(self, reason: str) -> None:
        """Make every party waiting on a message stop with ``reason`` (the first reason given stands)."""
        with self._lock:
            if self.failure is None:
                self.failure = reason

    def box(self, src: str, dst: str, tag: str) -> queue.Queue:
        key = (src, dst, tag)
        with self._lock:
            if key not in self._boxes:
                self._boxes[key] = queue.Queue()
            return self._boxes[key]

    def channel(self, party: str, timeout: float = 60.0, **kw) -> "InProcessChannel":
        return InProcessChannel(self, party, [p for p in self.parties if p != party], timeout, **kw)


class InProcessChannel(Channel):
    def __init__(self, hub: InProcessHub, party: str, peers: list[str], timeout: float = 60.0, **kw):
        super().__init__(party, peers, timeout, **kw)
        self.hub = hub

    def _send_bytes(self, peer, tag, data):
        self.hub.box(self.party, peer, tag).put(data)

    def _recv_bytes(self, peer, tag, timeout):
        return self._wait(self.hub.box(peer, self.party, tag), peer, tag, timeout)

    def _failure(self):
        return self.hub.failure


def run_parties(hub: InProcessHub, roles: dict, timeout: float = 60.0) -> tuple[dict, dict]:
    """Run ``roles[party](channel)`` for every party in its own thread.

    Returns (results, channels) keyed by party.  When a party fails the others
    stop waiting at once; the first failure is re-raised after all threads end.
    """
    results, errors = {}, {}
    channels = {p: hub.channel(p, timeout) for p in roles}

    def target(party, fn):
        try:
            results[party] = fn(channels[party])
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.setdefault(party, exc)
            hub.fail(party, exc)

    threads = [threading.Thread(target=target, args=(p, fn), name=f"party-{p}", daemon=True)
               for p, fn in roles.items()]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:  # Ctrl-C (a notebook's interrupt): the parties stop at their next wait, not later
        hub.stop("the federation was interrupted (Ctrl-C)")
        raise
    if errors:
        first = hub.failure.split(" failed:")[0].removeprefix("party ")
        raise errors.get(first, next(iter(errors.values())))
    return results, channels
