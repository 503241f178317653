"""Peer addresses: their host, whether they are this machine's loopback, the HTTP proxy gRPC would take to
them, and why a party cannot listen on one."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket

# gRPC's core sends a channel's calls through an HTTP CONNECT proxy named by the first of these that is set, unless
# the first set of no_grpc_proxy, no_proxy names the host (https://grpc.github.io/grpc/core/md_doc_environment_variables.html)
_PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy")
_NO_PROXY_VARIABLES = ("no_grpc_proxy", "no_proxy")


def address_host(addr: str) -> str:
    """The host of a peer address, in lower case: ``host:port``, ``[v6 address]:port``, or either after
    ``dns:///`` or ``ipv4:`` / ``ipv6:``."""
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if addr.startswith(scheme):
            addr = addr[len(scheme):]
            break
    if addr.startswith("["):
        host = addr[1:addr.find("]")] if "]" in addr else addr[1:]
    else:
        host = addr.rsplit(":", 1)[0] if addr.count(":") == 1 else addr
    return host.lower()


def is_loopback(addr: str) -> bool:
    """Whether a peer address is this machine's loopback (``localhost``, 127.0.0.0/8, ``::1``)."""
    host = address_host(addr)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def why_not_listening(listen: str) -> str:
    """Why gRPC could not listen on ``listen`` (``host:port``), in words: a plain socket bound there as gRPC binds
    (``SO_REUSEADDR``) tells a port in use, one this user may not take, or an address not of this machine; where
    that bind works, the TLS files are the likelier cause."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, where = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(where)
    except ValueError:
        return "it is not host:port"
    except socket.gaierror as exc:
        return f"the address is not one of this machine's ({exc.strerror})"
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return "another process holds the port (is this party already running?)"
        if exc.errno == errno.EACCES:
            return (f"this user may not listen on port {port} (ports below 1024 need root, or the "
                    f"CAP_NET_BIND_SERVICE capability: choose a higher one)")
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"the address is not one of this machine's ({exc.strerror})"
        return f"{exc.strerror}"
    return ("the port is free, so the likelier cause is the party's certificate and key, which do not match "
            "(or gRPC refused the address)")


def proxy_for(addr: str, environ=os.environ) -> tuple[str, str] | None:
    """(variable, proxy) that gRPC would send calls to ``addr`` through, as it reads the environment; None where
    no proxy is set, where ``no_grpc_proxy`` / ``no_proxy`` names the host (``*``, the host, a domain it ends
    in, or a network of addresses holding it), and for a loopback address, which fedgrove never proxies."""
    var = next((v for v in _PROXY_VARIABLES if environ.get(v)), None)
    if var is None or is_loopback(addr):
        return None
    host = address_host(addr)
    skip = next((environ[v] for v in _NO_PROXY_VARIABLES if environ.get(v)), "")
    for entry in (e.strip().lower() for e in skip.split(",")):
        if entry == "*" or (entry and (host == entry.lstrip(".") or host.endswith("." + entry.lstrip(".")))):
            return None
        try:
            if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                return None
        except ValueError:
            pass
    return var, environ[var]
