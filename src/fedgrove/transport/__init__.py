"""Transport: the Channel API protocols talk to, a strict message codec, and two
backends (in-process threads, gRPC between processes with mutual TLS)."""

from fedgrove.transport.channel import Channel, CommStats
from fedgrove.transport.codec import Message, decode, encode, register

__all__ = ["Channel", "CommStats", "Message", "encode", "decode", "register"]
