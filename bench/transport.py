"""gRPC transport: a large message in 4 MB pieces against the same message in one call.

Two parties (alice, bob) in this process, each serving on its own localhost
port with mutual TLS, as ``fedgrove party`` does.  For each size, alice sends
bob one message of random float64 values and bob receives and decodes it; the
seconds from send to decoded are timed, ``--repeats`` times (median), with
the default pieces (``fedgrove.transport.grpc_backend.CHUNK_BYTES``, 8 in
flight) and with pieces larger than the message (one call, as before pieces
existed).  Prints MB/s and the ratio; writes bench/results/transport.json.

    python bench/transport.py [--sizes-mb 1 10 100 300 --repeats 3]
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from fedgrove.crypto.certs import create_federation_certs
from fedgrove.experiments.report import machine, write_json
from fedgrove.transport.codec import Message, array_field, register
from fedgrove.transport.grpc_backend import CHUNK_BYTES, WINDOW, GrpcChannel, TLSFiles

RESULTS = Path(__file__).resolve().parent / "results" / "transport.json"


@register
class Payload(Message):
    data: np.ndarray = array_field("<f8", 1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair(d: Path, chunk_bytes: int):
    pa, pb = _port(), _port()
    tls = {n: TLSFiles(d / "ca.pem", d / f"{n}.pem", d / f"{n}.key") for n in ("alice", "bob")}
    limit = 2**31 - 1  # the message limit: over every size timed
    a = GrpcChannel("alice", f"127.0.0.1:{pa}", {"bob": f"127.0.0.1:{pb}"}, tls["alice"], timeout=600,
                    chunk_bytes=chunk_bytes, max_bytes=limit)
    b = GrpcChannel("bob", f"127.0.0.1:{pb}", {"alice": f"127.0.0.1:{pa}"}, tls["bob"], timeout=600,
                    chunk_bytes=chunk_bytes, max_bytes=limit)
    return a, b


def time_sends(d: Path, chunk_bytes: int, x: np.ndarray, repeats: int) -> list[float]:
    a, b = _pair(d, chunk_bytes)
    try:
        a.send("bob", "warm", Payload(np.zeros(1)))  # connect first: the timed sends find the peer reached
        b.recv("alice", "warm", Payload)
        runs = []
        for r in range(repeats):
            t0 = time.perf_counter()
            sender = threading.Thread(target=a.send, args=("bob", f"m{r}", Payload(x)))
            sender.start()
            got = b.recv("alice", f"m{r}", Payload)
            sender.join()
            runs.append(time.perf_counter() - t0)
            if not np.array_equal(got.data, x):
                raise SystemExit("the message arrived changed")
        return runs
    finally:
        a.close()
        b.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 100, 300])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        create_federation_certs(d, ["alice", "bob"])
        for mb in args.sizes_mb:
            x = rng.normal(size=int(mb * 1e6) // 8)
            one_call = int(x.nbytes) + 1024  # larger than the message and its header: a single call
            pieces = time_sends(d, CHUNK_BYTES, x, args.repeats)
            whole = time_sends(d, one_call, x, args.repeats)
            row = {"mb": x.nbytes / 1e6, "pieces_seconds": pieces, "one_call_seconds": whole,
                   "pieces_mb_per_s": x.nbytes / 1e6 / float(np.median(pieces)),
                   "one_call_mb_per_s": x.nbytes / 1e6 / float(np.median(whole))}
            row["ratio_pieces_over_one_call_seconds"] = float(np.median(pieces) / np.median(whole))
            rows.append(row)
            print(f"{row['mb']:.0f} MB: in pieces {row['pieces_mb_per_s']:.0f} MB/s, in one call "
                  f"{row['one_call_mb_per_s']:.0f} MB/s (time ratio {row['ratio_pieces_over_one_call_seconds']:.2f})",
                  flush=True)
    write_json(args.out, {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                          "piece_bytes": CHUNK_BYTES, "pieces_in_flight": WINDOW, "repeats": args.repeats,
                          "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
