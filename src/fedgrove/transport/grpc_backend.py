"""gRPC backend: one process per party, mutual TLS, one generic RPC.

Each party serves ``fedgrove.Federation/Exchange`` and calls its peers'.  An
envelope (sender, receiver, tag, payload) lands in the receiver's mailbox,
one FIFO queue per (sender, tag) while it holds messages
(:class:`~fedgrove.transport.channel.Mailboxes`), where :meth:`GrpcChannel.recv` waits for it.
A message larger than :attr:`GrpcChannel.chunk_bytes` travels as numbered
pieces (message number, piece, pieces, total size), a few in flight at once,
each a call of its own with its own deadline, and is put together by the
receiver before it reaches the mailbox: a single call was capped by gRPC's
message size and had to finish within one timeout however slow the link.
The server accepts only clients whose certificate is signed by the
federation's CA, and only envelopes whose sender is the name in that
certificate.  The envelope types are built at run time from the definition
in ``federation.proto`` (no generated code).
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import re
import threading
import time
from concurrent import futures
from pathlib import Path

# gRPC's core logs every failed TLS handshake and reconnection attempt at INFO on stderr; fedgrove reports the
# failures itself (a GRPC_VERBOSITY set by the user wins)
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
import grpc  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from fedgrove.exceptions import PeerTimeoutError, ProtocolError, Terminated
from fedgrove.log import logger
from fedgrove.transport.addresses import address_host, is_loopback, proxy_for, why_not_listening
from fedgrove.transport.channel import WAIT_NOTE_AFTER, WAIT_NOTE_EVERY, Channel, Mailboxes

_METHOD = "/fedgrove.Federation/Exchange"
FAILURE_TAG = "!failed"  # a party that fails tells its peers why (no protocol tag starts with "!")
PROGRESS_TAG = "!progress"  # every few seconds, to each peer reached: seconds since its last progress
ENDED_TAG = "!ended"  # a party closing its channel tells the peers it reached: none waits on it any longer
PROBE_TAG = "!probe"  # asks only whether the TLS handshake with a peer works (taken, and otherwise ignored)


def _build_types():
    fdp = descriptor_pb2.FileDescriptorProto(name="fedgrove/federation.proto", package="fedgrove", syntax="proto3")
    env = fdp.message_type.add(name="Envelope")
    F = descriptor_pb2.FieldDescriptorProto
    # message, part, parts, size: a piece of a message sent in ``parts`` pieces (parts = 0: a whole message)
    for num, (name, typ) in enumerate([("sender", F.TYPE_STRING), ("receiver", F.TYPE_STRING),
                                       ("tag", F.TYPE_STRING), ("payload", F.TYPE_BYTES),
                                       ("message", F.TYPE_UINT64), ("part", F.TYPE_UINT32),
                                       ("parts", F.TYPE_UINT32), ("size", F.TYPE_UINT64)], start=1):
        env.field.add(name=name, number=num, type=typ, label=F.LABEL_OPTIONAL)
    ack = fdp.message_type.add(name="Ack")
    ack.field.add(name="error", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("fedgrove.Envelope")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("fedgrove.Ack")))


Envelope, Ack = _build_types()


# how gRPC's core says that the certificate at a peer's address names another party (grpcio 1.60; newer releases)
_WRONG_PEER = ("is not in peer certificate", "hostname verification")
# gRPC's details where a host name did not resolve, by release: "DNS resolution failed for ...", "errors resolving
# ...: address lookup failed ..."
_UNRESOLVED = re.compile(r"DNS resolution failed|errors resolving|lookup failed", re.IGNORECASE)
_RETRY_EVERY = 0.25  # seconds between tries of a first message to a peer that is not up yet
_SLICE = 0.1  # seconds a send waits for its call before it looks whether a party failed or the peer is gone
RESUME_HINT = "restart every party with --resume to continue from the checkpoints"
CHUNK_BYTES = 4 * 1024 * 1024  # a larger message travels in pieces of this size
WINDOW = 8  # pieces of one message in flight to a peer at once


class _FirstCall:
    """A first message to a peer, delivered in the background: tried at once and then every ``_RETRY_EVERY``
    seconds while the peer is not up yet, each try failing fast, until it is delivered, the handshake fails, or
    ``limit`` seconds have passed; a note every so often says which peer is awaited.  A TLS handshake that fails
    (certificates of another federation) is so reported as soon as the peer answers, whether it was up before
    this party or started after it (a call that waits for the peer to be ready retries a failed handshake in
    silence until the limit, then blames a peer that was up all along).  ``result()`` waits and answers like a
    call."""

    def __init__(self, channel: GrpcChannel, peer: str, env, limit: float):
        self.ack, self.error = None, None
        self._thread = threading.Thread(target=self._run, args=(channel, peer, env, limit),
                                        name=f"fedgrove-connect-{peer}", daemon=True)
        self._thread.start()

    def _run(self, channel, peer, env, limit):
        start = time.monotonic()
        deadline, note = start + limit, start + WAIT_NOTE_AFTER
        unresolved = None  # gRPC's words where the peer's host name did not resolve at the last try
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                why = (f"{address_host(channel.addresses[peer])} does not resolve ({unresolved})" if unresolved else
                       f"nothing answered at {channel.addresses[peer]} ({peer} is not running, or not at that "
                       f"address){channel._via_proxy(peer)}")
                self.error = PeerTimeoutError(f"{channel.party}: could not deliver to {peer} at {env.tag} within "
                                              f"{limit:g} s: {why}")
                return
            try:
                self.ack = channel._stubs[peer](env, timeout=left, wait_for_ready=False)
                return
            except grpc.RpcError as exc:
                details = exc.details() or ""
                unresolved = details if _UNRESOLVED.search(details) else None
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    self.error = exc
                    return
                refusal = channel._refusal(peer, details)
                if refusal is not None:
                    self.error = ProtocolError(f"{channel.party}: {refusal}")
                    return
            except Exception as exc:  # noqa: BLE001 - the channel closed under it: said by result()
                self.error = exc
                return
            if channel.failure is not None:  # a peer failed: stop trying, as a receive stops waiting
                self.error = ProtocolError(f"{channel.party}: stopped trying to reach {peer}: {channel.failure}")
                return
            now = time.monotonic()
            if now >= note:
                note += WAIT_NOTE_EVERY
                if unresolved:  # a name not (yet) in the DNS: retried like a peer not up yet
                    logger.info("%s: %s's host %s does not resolve (%.0f s so far; gives up after %g s): %s",
                                channel.party, peer, address_host(channel.addresses[peer]), now - start, limit,
                                unresolved)
                else:
                    logger.info("%s: %s at %s is not up yet (%.0f s so far; gives up after %g s)%s", channel.party,
                                peer, channel.addresses[peer], now - start, limit, channel._via_proxy(peer))
            time.sleep(min(_RETRY_EVERY, max(0.0, deadline - now)))

    def result(self, timeout: float | None = None):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise grpc.FutureTimeoutError()
        if self.error is not None:
            raise self.error
        return self.ack


class TLSFiles:
    """Paths of the CA certificate and this party's certificate and key."""

    def __init__(self, ca: str | Path, cert: str | Path, key: str | Path):
        self.ca = Path(ca).read_bytes()
        self.cert = Path(cert).read_bytes()
        self.key = Path(key).read_bytes()


class GrpcChannel(Channel):
    """A party's Channel over gRPC with mutual TLS.

    Parameters
    ----------
    party : this party's name (= its certificate's common name)
    listen : "host:port" to serve on
    peers : {peer name: "host:port"}
    tls : TLSFiles
    chunk_bytes : a message larger than this travels in pieces of this size (default ``CHUNK_BYTES``)
    linger : seconds that :meth:`close` keeps the port open after a TLS handshake with a peer failed, so that
        peers starting later meet the failed handshake and say so, rather than finding nothing at this
        party's address and waiting out their startup timeout (such a failure cannot be told to a peer)
    """

    def __init__(self, party: str, listen: str, peers: dict[str, str], tls: TLSFiles, timeout: float = 60.0,
                 connect_timeout: float | None = None, chunk_bytes: int | None = None, linger: float = 0.0,
                 **kw):
        super().__init__(party, list(peers), timeout, **kw)
        self.linger = linger
        self._handshake_failed = False
        chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self._message_numbers = itertools.count(1)
        self._partial: dict[tuple[str, int], dict] = {}  # (sender, message number) -> the pieces so far
        self.addresses = dict(peers)
        self.connect_timeout = connect_timeout if connect_timeout is not None else timeout
        self._reached: set[str] = set()  # peers that took a message: before that, the startup timeout applies
        self.mailboxes = Mailboxes()  # keyed by (sender, tag)
        self._lock = threading.Lock()
        self.failure: str | None = None  # set when a peer reports that it failed, so this party stops waiting
        self._ended: set[str] = set()    # peers that closed their channels
        self._progress_at: dict[str, float] = {}  # when each peer last made progress: its messages and beats
        self._refused_since: dict[str, float] = {}  # reached peers whose port refuses this party's beats, since when
        self._probed: dict[str, bool] = {}  # peers probed: whether the last probe was taken (else nothing answered)
        self._unreachable: dict[str, str] = {}  # peers a probe could not reach, and why (a failed TLS handshake)
        limit = chunk_bytes + 65536  # a piece and its envelope (a whole message's own limit: max_bytes)
        opts = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
        creds = grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca,
                                            require_client_auth=True)
        # no SO_REUSEPORT (gRPC's default on Linux): a second process on the same port would share its calls
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                                   options=opts + [("grpc.so_reuseport", 0)])
        handler = grpc.method_handlers_generic_handler("fedgrove.Federation", {
            "Exchange": grpc.unary_unary_rpc_method_handler(self._on_exchange, request_deserializer=Envelope.FromString,
                                                            response_serializer=Ack.SerializeToString)})
        self._server.add_generic_rpc_handlers((handler,))
        try:
            bound = self._server.add_secure_port(listen, creds)
        except RuntimeError:  # newer grpcio raise where older ones return 0
            bound = 0
        if bound == 0:
            raise ProtocolError(f"{party}: cannot listen on {listen}: {why_not_listening(listen)}")
        self._server.start()
        client_creds = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key,
                                                    certificate_chain=tls.cert)
        self._stubs = {}
        self._channels = []
        # reconnection attempts at most 2 s apart (gRPC's back-off grows to 2 minutes): a peer started long after
        # this party is reached within seconds of coming up
        backoff = [("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 2000)]
        # a peer on this machine is never reached through a proxy (one set for the internet, as pip's, sent the
        # calls of a localhost federation there, and every party waited for peers that were up); the proxy that a
        # remote peer's calls take, where the environment sets one, is named when the peer does not answer
        self._proxies = {peer: proxy_for(addr) for peer, addr in peers.items()}
        for peer, addr in peers.items():
            direct = [("grpc.enable_http_proxy", 0)] if is_loopback(addr) else []
            ch = grpc.secure_channel(addr, client_creds,
                                     options=opts + backoff + direct + [("grpc.ssl_target_name_override", peer)])
            self._channels.append(ch)
            self._stubs[peer] = ch.unary_unary(_METHOD, request_serializer=Envelope.SerializeToString,
                                               response_deserializer=Ack.FromString)
        # signs of life: a peer that works for longer than the timeout (encrypting a million gradients) is
        # waited for, one whose process died is not
        self._beat_every = max(0.05, min(5.0, timeout / 4))
        # a reached peer whose port has refused connections this long has lost its process (killed outright: no
        # notice came); a peer that is busy, or beyond a broken network, is not refused but waited for
        self._gone_after = max(3.0, 3 * self._beat_every)
        self._closed = threading.Event()
        self._beats = threading.Thread(target=self._beat, name=f"fedgrove-progress-{party}", daemon=True)
        self._beats.start()

    def _beat(self) -> None:
        """Send each peer this party has reached its :meth:`progress_age`, every ``_beat_every`` seconds, best
        effort (a peer that is down is the receiving side's business)."""
        pending = []  # the calls in flight are kept: a call whose future is dropped is cancelled
        while not self._closed.wait(self._beat_every):
            payload = f"{self.progress_age():.3f}".encode()
            pending = [call for call in pending if not call.done()]
            awaited = self._waiting_on
            if awaited is not None and awaited not in self._reached and awaited not in self._heard \
                    and awaited not in self._unreachable:
                # a peer awaited that neither took nor sent a message: if it is up but its certificates are of
                # another federation, its own calls fail in the handshake and it cannot say so to this party,
                # which would wait out the startup timeout and then blame a peer that was up all along (probed
                # while awaited: whether it is up is said in the notes on a long wait)
                env = Envelope(sender=self.party, receiver=awaited, tag=PROBE_TAG)
                try:
                    call = self._stubs[awaited].future(env, timeout=2 * self._beat_every, wait_for_ready=False)
                    call.add_done_callback(functools.partial(self._probe_answered, awaited))
                except Exception:  # noqa: BLE001 - closing meanwhile
                    return
                pending.append(call)
            for peer in sorted(self._reached):
                env = Envelope(sender=self.party, receiver=peer, tag=PROGRESS_TAG, payload=payload)
                try:
                    call = self._stubs[peer].future(env, timeout=2 * self._beat_every)
                    call.add_done_callback(functools.partial(self._beat_answered, peer))
                except Exception:  # noqa: BLE001 - closing meanwhile
                    return
                pending.append(call)

    def _beat_answered(self, peer: str, call) -> None:
        """Note whether ``peer``'s port refused a beat (its process is gone) or took it (it is there)."""
        try:
            call.result()
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE and "connection refused" in (exc.details() or "").lower():
                with self._lock:
                    self._refused_since.setdefault(peer, time.monotonic())
            return
        except Exception:  # noqa: BLE001 - cancelled as the channel closes
            return
        with self._lock:
            self._refused_since.pop(peer, None)

    def _probe_answered(self, peer: str, call) -> None:
        """Note whether ``peer`` took a probe (it is up, its handshake works), failed the TLS handshake (why, in
        words: it is not probed again), or did not answer (not up yet)."""
        try:
            call.result()
        except grpc.RpcError as exc:
            details = exc.details() or ""
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                refusal = self._refusal(peer, details)
                if refusal is not None:
                    self._unreachable[peer] = refusal
                else:
                    self._probed[peer] = False
            return
        except Exception:  # noqa: BLE001 - cancelled as the channel closes
            return
        self._probed[peer] = True

    def _peer_state(self, peer: str) -> str:
        if peer in self._heard or peer in self._reached or peer not in self._probed:
            return ""
        if self._probed[peer]:
            return f"; {peer} is up at {self.addresses[peer]}"
        return (f"; nothing answers at {self.addresses[peer]}: {peer} is not up yet, or not at that address"
                f"{self._via_proxy(peer)}")

    def _via_proxy(self, peer: str) -> str:
        """Where calls to ``peer`` go through a proxy the environment sets: which, and how to go around it."""
        if self._proxies.get(peer) is None:
            return ""
        var, uri = self._proxies[peer]
        return (f" (the calls go through the proxy {uri} that {var} sets; no_grpc_proxy="
                f"{address_host(self.addresses[peer])} reaches {peer} directly)")

    def _peer_refused(self, peer: str) -> str | None:
        return self._unreachable.get(peer)

    def _peer_gone(self, peer: str) -> str | None:
        since = self._refused_since.get(peer)
        if since is None or time.monotonic() - since < self._gone_after:
            return None
        return (f"refuses connections at {self.addresses[peer]} (for {time.monotonic() - since:.0f} s, with no "
                f"word from it): its process ended; {RESUME_HINT}")

    # -- server side ---------------------------------------------------------------------
    def _on_exchange(self, env, context):
        names = context.auth_context().get("x509_common_name", [])
        caller = names[0].decode() if names else None
        if caller != env.sender or env.sender not in self.addresses or env.receiver != self.party:
            logger.warning("%s: refused an envelope claiming sender %r from certificate %r", self.party,
                           env.sender, caller)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "sender does not match the client certificate")
        if env.tag == PROBE_TAG:  # the sender is waiting on this party: not a sign that it works
            return Ack(error="")
        now = time.monotonic()
        if env.tag == PROGRESS_TAG:
            try:
                age = max(0.0, float(bytes(env.payload).decode()))
            except ValueError:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a progress beat holds seconds")
            with self._lock:
                self._progress_at[env.sender] = max(self._progress_at.get(env.sender, 0.0), now - age)
            return Ack(error="")
        with self._lock:
            self._progress_at[env.sender] = now
            self._refused_since.pop(env.sender, None)  # it is there
        if env.tag == ENDED_TAG:
            self._ended.add(env.sender)
            return Ack(error="")
        if env.tag == FAILURE_TAG:
            with self._lock:
                if self.failure is None:
                    self.failure = f"party {env.sender} failed: {bytes(env.payload)[:1000].decode(errors='replace')}"
            return Ack(error="")
        if env.parts:
            refused = self._add_piece(env)
            if refused:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused)
        else:
            self.mailboxes.put((env.sender, env.tag), bytes(env.payload))
        return Ack(error="")

    def _add_piece(self, env) -> str | None:
        """Keep a piece of a message sent in pieces; the last one to arrive puts the whole message in the
        mailbox (before its call is answered, so the sender's next message comes after it).  Returns why a
        piece is refused: one that does not fit the pieces before it, or a message over this party's limit."""
        key = (env.sender, env.message)
        with self._lock:
            whole = self._partial.get(key)
            if whole is None:
                if env.size > self.max_bytes:
                    return (f"a message of {env.size} bytes is over {self.party}'s limit of {self.max_bytes} "
                            f"bytes ([federation] max_message_mb)")
                if env.parts < 2 or env.size < env.parts - 1:
                    return f"a message in {env.parts} pieces of {env.size} bytes in all"
                whole = self._partial[key] = {"tag": env.tag, "parts": env.parts, "size": env.size, "pieces": {},
                                              "bytes": 0}
            piece = bytes(env.payload)
            if (env.tag, env.parts, env.size) != (whole["tag"], whole["parts"], whole["size"]) \
                    or env.part >= env.parts or env.part in whole["pieces"] \
                    or whole["bytes"] + len(piece) > whole["size"]:
                del self._partial[key]
                return f"piece {env.part} of message {env.message} does not fit the pieces before it"
            whole["pieces"][env.part] = piece
            whole["bytes"] += len(piece)
            if len(whole["pieces"]) < whole["parts"]:
                return None
            del self._partial[key]
            if whole["bytes"] != whole["size"]:
                return f"message {env.message} holds {whole['bytes']} bytes, not the {whole['size']} announced"
            data = b"".join(whole["pieces"][k] for k in range(whole["parts"]))
        self.mailboxes.put((env.sender, whole["tag"]), data)
        return None

    # -- client side ---------------------------------------------------------------------
    def _send_bytes(self, peer, tag, data):
        self._send_bytes_to([peer], tag, data)

    def _send_bytes_to(self, peers, tag, data):
        """All peers' calls are in flight at once: a broadcast waits for the slowest peer, not for the sum.  A
        message over ``chunk_bytes`` goes in pieces: the first to every peer (a first call waits for a peer not
        up yet), then the others, up to ``WINDOW`` in flight to each peer; each call has its own deadline, so a
        slow link that keeps delivering is not given up on."""
        size, step = len(data), self.chunk_bytes
        parts = -(-size // step) if size > step else 0
        number = next(self._message_numbers) if parts else 0

        def envelope(peer, k):
            payload = data[k * step:(k + 1) * step] if parts else data
            return Envelope(sender=self.party, receiver=peer, tag=tag, payload=payload, message=number, part=k,
                            parts=parts, size=size if parts else 0)

        calls, failures = [], {}
        for peer in peers:
            if peer in self._reached:
                limit = self.connect_timeout
                calls.append((peer, limit, self._stubs[peer].future(envelope(peer, 0), timeout=limit,
                                                                    wait_for_ready=True)))
            else:
                limit = max(self.connect_timeout, self.startup_timeout)
                calls.append((peer, limit, _FirstCall(self, peer, envelope(peer, 0), limit)))
        for peer, limit, call in calls:  # wait for every call, then report the first failure
            failures[peer] = self._answer(peer, tag, limit, call)
            if failures[peer] is None:
                self._reached.add(peer)
        live = [peer for peer in peers if failures[peer] is None]
        in_flight = {peer: collections.deque() for peer in live}
        for k in range(1, parts):
            for peer in list(live):
                window = in_flight[peer]
                window.append(self._stubs[peer].future(envelope(peer, k), timeout=self.connect_timeout,
                                                       wait_for_ready=True))
                if len(window) >= WINDOW:
                    failures[peer] = self._answer(peer, tag, self.connect_timeout, window.popleft())
                    if failures[peer] is not None:
                        live.remove(peer)
        for peer in live:
            for call in in_flight[peer]:
                failures[peer] = failures[peer] or self._answer(peer, tag, self.connect_timeout, call)
        failure = next((failures[peer] for peer in peers if failures[peer] is not None), None)
        if failure is not None:
            raise failure

    def _answer(self, peer, tag, limit, call) -> Exception | None:
        """Wait for a call; None when the peer took the message, else the error to report.  It is waited for in
        slices, so that another party's failure notice stops the wait at once, as it stops a receive: a call
        to a peer that died waits for it to come back until the call's deadline, and with every peer of an
        all-to-all protocol (FV-tree) caught in such sends, the survivors took minutes to stop."""
        while True:
            try:
                ack = call.result(timeout=_SLICE)
                break
            except grpc.FutureTimeoutError:
                gone = self._peer_gone(peer)
                if self.failure is not None or gone is not None:
                    if hasattr(call, "cancel"):
                        call.cancel()
                    if self.failure is not None:
                        return self._stopped_sending(peer, tag)
                    return PeerTimeoutError(f"{self.party}: could not deliver to {peer} at {tag}: {peer} {gone}")
            except grpc.RpcError as exc:
                return self._call_error(peer, tag, limit, exc)
            except ProtocolError as exc:  # a first call's verdict (handshake, peer never up, a peer failed)
                return exc
        if ack.error:
            return ProtocolError(f"{self.party}: {peer} rejected the message at {tag}: {ack.error}")
        return None

    def _call_error(self, peer, tag, limit, exc: grpc.RpcError) -> Exception:
        """What a failed call means, in words: first a failure another party reported (a peer that stops on an
        error or a signal tells the others before its server drops the calls in flight), then the call's own."""
        if self.failure is not None:
            return self._stopped_sending(peer, tag)
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return PeerTimeoutError(f"{self.party}: could not deliver to {peer} at {tag} within {limit:g} s; "
                                    f"{peer} is down or unreachable")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):  # the connection broke under the
            # call, or the peer's server dropped it shutting down: the peer's process ended
            return PeerTimeoutError(f"{self.party}: lost the connection to {peer} at {tag} ({exc.details()}); "
                                    f"{peer} stopped, or the network between them failed")
        return ProtocolError(f"{self.party}: {peer} refused the message at {tag}: {code.name} {exc.details()}")

    def _stopped_sending(self, peer, tag) -> ProtocolError:
        return ProtocolError(f"{self.party}: stopped sending to {peer} at {tag}: {self.failure}")

    def _refusal(self, peer: str, details: str) -> str | None:
        """Why a call to ``peer`` that failed UNAVAILABLE with ``details`` can never succeed, in words: the peer
        answered but the TLS handshake failed (certificates of another federation, noted for :meth:`close`), or
        the party at its address is another one of this federation; None when the peer is not up, or not
        reachable."""
        said = details.lower()
        if "handshake" in said:
            self._handshake_failed = True
            reason = details.split("last error: ", 1)[-1]
            return (f"the TLS handshake with {peer} failed ({reason}); both parties' certificates must come from "
                    f"the same federation CA (`fedgrove certs`), with that CA's ca.pem in each party's certs folder")
        if any(m in said for m in _WRONG_PEER):  # a party of the federation, but not this one
            return (f"the party at {self.addresses[peer]} is not {peer} (its certificate names another party of "
                    f"the federation); check {peer}'s address among this party's peers")
        return None

    def _recv_bytes(self, peer, tag, timeout):
        with self.mailboxes.waiting((peer, tag)) as box:
            return self._wait(box, peer, tag, timeout)

    def _failure(self):
        return self.failure

    def notify_failure(self, exc: BaseException, timeout: float = 2.0) -> None:
        """Tell every peer, best effort, that this party has failed and why (a peer that is down is skipped)."""
        if isinstance(exc, KeyboardInterrupt):
            how = "stopped (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
            text = f"it was {how}; {RESUME_HINT}".encode()
        else:
            text = (str(exc) or type(exc).__name__).encode()[:1000]
        self._tell(self.peers, FAILURE_TAG, text, timeout)

    def _tell(self, peers, tag: str, payload: bytes, timeout: float) -> None:
        """Send a notice to ``peers`` at once and wait for the calls, best effort (a peer that is down is
        skipped; the others then time out as they would have)."""
        calls = []
        for peer in peers:
            env = Envelope(sender=self.party, receiver=peer, tag=tag, payload=payload)
            try:
                calls.append(self._stubs[peer].future(env, timeout=timeout))
            except Exception:  # noqa: BLE001 - best effort
                continue
        for call in calls:
            try:
                call.result()
            except grpc.RpcError:
                pass

    def _peer_progress(self, peer):
        return self._progress_at.get(peer)

    def _peer_ended(self, peer):
        return "ended" if peer in self._ended else None

    def close(self, grace: float = 1.0, notify: bool = True) -> None:
        """Close the channels to the peers and stop the server, waiting for it to have stopped: ``stop`` only
        starts the shutdown, and a process that exits meanwhile can have gRPC's server thread take a late call
        (another party's failure notice) after the interpreter has begun shutting down, which printed a
        traceback.  ``notify``: tell the peers this party reached that it has ended (false: leave, as a killed
        process does)."""
        if self._closed.is_set():
            return
        if self._handshake_failed and self.linger > 0:
            logger.info("%s: a TLS handshake with a peer failed; keeps its port open %g s so that the peers "
                        "starting meanwhile meet the failed handshake too, and say so", self.party, self.linger)
            time.sleep(self.linger)
        self._closed.set()
        self._beats.join(timeout=5.0)
        if notify:  # a peer still waiting on this party is told at once, not after its timeout
            self._tell(sorted(self._reached), ENDED_TAG, b"", 1.0)
        for ch in self._channels:
            ch.close()
        self._server.stop(grace).wait(grace + 5.0)

