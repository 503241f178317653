"""Check a ledger file from scratch: chain, signatures, and every contribution recomputed from the histograms.

:func:`verify_ledger` reads the records in order and checks, for each:

* its sequence number and that its ``prev_hash`` is the previous record's
  hash, and its own hash (editing, deleting, inserting or reordering a record
  breaks this);
* its author's Ed25519 signature: the requester's key is the one in the model
  request (or ``trusted_keys``), every other party's the one in its
  self-signed membership record, which must come before anything it writes;
* for FV-tree: which uploads the endorsements accept (a distance below the
  request's threshold signs; two thirds of the parties, the sender's own
  signature included), against the accepted parties each split record lists;
  and every party's split Shapley value and voting contribution, recomputed
  from the accepted histograms of the chosen feature (sampled values with the
  same permutations), against the contribution records.

The first failure raises :class:`~fedgrove.exceptions.LedgerError` naming the
record (sequence number, kind, author) and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import numpy as np

from fedgrove.crypto.signing import verify
from fedgrove.exceptions import LedgerError, ProtocolError
from fedgrove.ledger import records as rec
from fedgrove.ledger.contributions import shapley_values, split_sums, vote_contributions
from fedgrove.ledger.store import GENESIS, chain_hash, open_records, signed_bytes


@dataclass
class LedgerSummary:
    n_records: int
    parties: list
    head: bytes
    kinds: dict = field(default_factory=dict)
    contributions: dict = field(default_factory=dict)   # party -> {"shapley", "vote", "total", "splits"}
    uploads: dict = field(default_factory=dict)         # party -> {"accepted", "refused"}
    beta: float = 1.0


def verify_ledger(path, trusted_keys: dict | None = None) -> LedgerSummary:
    records = open_records(path)
    if not records:
        raise LedgerError(f"{path} holds no record")
    prev = GENESIS
    keys: dict[str, bytes] = {}
    request = None
    uploads: dict[tuple, dict] = {}      # (tree, layer) -> party -> (HistogramUpload, digest)
    endorse: dict[tuple, dict] = {}      # (tree, layer) -> sender -> number of signatures
    votes: dict[tuple, dict] = {}        # (tree, layer) -> party -> VoteRecord
    splits: dict[tuple, rec.SplitRecord] = {}
    n_bins = None                        # rows per feature in every histogram (the Binning record)
    summary = None
    for pos, r in enumerate(records, start=1):
        where = f"record {r.seq} ({r.kind} by {r.author})"

        def bad(why: str) -> LedgerError:
            return LedgerError(f"{where}: {why}")

        if r.seq != pos:
            raise bad(f"sequence number {r.seq} where {pos} was expected: a record was removed or moved")
        if bytes(r.prev_hash) != prev:
            raise bad("it does not link to the record before it: the chain was cut, reordered or edited")
        if chain_hash(prev, r.kind, r.author, bytes(r.body), bytes(r.signature)) != bytes(r.hash):
            raise bad("its hash does not match its content: it was edited")
        prev = bytes(r.hash)
        try:
            body = r.message()
        except ProtocolError as exc:
            raise bad(f"its body does not decode: {exc}") from None
        if type(body).__name__ != r.kind:
            raise bad(f"its body is a {type(body).__name__}")
        if request is None:
            if not isinstance(body, rec.ModelRequest):
                raise bad("the first record must be the model request")
            request = body
            parties, options, params = _read_request(body, bad)
            if r.author != parties[0]:
                raise bad(f"the model request must be written by the requester {parties[0]}")
            keys[r.author] = _key((trusted_keys or {}).get(r.author, bytes(body.requester_key)), bad)
            summary = LedgerSummary(len(records), parties, b"", beta=options["beta"])
            summary.contributions = {q: {"shapley": 0.0, "vote": 0.0, "total": 0.0, "splits": 0} for q in parties}
            summary.uploads = {q: {"accepted": 0, "refused": 0} for q in parties}
        elif isinstance(body, rec.Membership):
            if r.author != body.party or r.author in keys and r.author != request.parties[0]:
                raise bad("a membership record must be the party's own, once")
            if r.author == request.parties[0] and bytes(body.key) != keys[r.author]:
                raise bad("the requester's membership names another key than its model request")
            keys[r.author] = _key((trusted_keys or {}).get(r.author, bytes(body.key)), bad)
        if r.author not in keys:
            raise bad(f"{r.author} wrote before its membership record (or is not a member)")
        if trusted_keys and r.author in trusted_keys and keys[r.author] != trusted_keys[r.author]:
            raise bad(f"the key of {r.author} is not the trusted one")
        if not verify(keys[r.author], bytes(r.signature), signed_bytes(r.kind, r.author, bytes(r.body))):
            raise bad(f"the signature does not verify under {r.author}'s key")
        summary.kinds[r.kind] = summary.kinds.get(r.kind, 0) + 1
        _check_shapes(body, len(parties), len(request.lo) - 1, bad)
        try:
            key = (getattr(body, "tree", None), getattr(body, "layer", None))
            if isinstance(body, rec.Binning):
                if r.author != request.parties[0]:
                    raise bad("the cut points must be recorded by the requester")
                n_bins = np.asarray(body.n_bins, dtype=np.int64)
            elif isinstance(body, rec.VoteRecord):
                votes.setdefault(key, {})[r.author] = body
            elif isinstance(body, rec.HistogramUpload):
                uploads.setdefault(key, {})[r.author] = (body, hashlib.sha256(bytes(r.body)).digest())
                endorse.setdefault(key, {}).setdefault(r.author, 1)  # the sender's own signature
            elif isinstance(body, rec.Endorsement):
                up = uploads.get(key, {}).get(body.sender)
                if up is None or up[1] != bytes(body.digest):
                    raise bad(f"it endorses an upload of {body.sender} that is not on the ledger")
                if bool(body.endorsed) != (body.distance < options["threshold"]):
                    raise bad(f"its verdict contradicts its distance {body.distance:.4g} and the threshold")
                endorse[key][body.sender] += int(body.endorsed)
            elif isinstance(body, rec.SplitRecord):
                _check_acceptance(body, endorse.get(key, {}), uploads.get(key, {}), request, options, bad)
                splits[key] = body
                for i, q in enumerate(request.parties):
                    n = len(body.nodes or [])
                    if body.accepted.size and (int(body.accepted[0]) >> i) & 1:
                        summary.uploads[q]["accepted"] += 1
                    elif n:
                        summary.uploads[q]["refused"] += 1
            elif isinstance(body, rec.ContributionRecord):
                split = splits.get(key)
                if split is None:
                    raise bad("a contribution record without the split record of its layer")
                if n_bins is None:
                    raise bad("contributions before the cut points were recorded")
                _check_contributions(body, split, uploads.get(key, {}), votes.get(key, {}), request, params, options,
                                     n_bins, bad)
                for i, q in enumerate(request.parties):
                    c = summary.contributions[q]
                    c["shapley"] += float(body.shapley[:, i].sum())
                    c["vote"] += float(body.vote[:, i].sum())
                    c["splits"] += int(np.count_nonzero(body.shapley[:, i] + body.vote[:, i]))
        except (ValueError, IndexError, KeyError, TypeError, AttributeError, OverflowError, ProtocolError) as exc:
            # a record its author signed that none of the checks foresaw is still a finding about that record
            raise bad(f"its content does not hold together ({type(exc).__name__}: {exc})") from None
    for c in summary.contributions.values():
        c["total"] = c["shapley"] + summary.beta * c["vote"]
    summary.head = prev
    return summary


def _read_request(body: rec.ModelRequest, bad) -> tuple[list, dict, dict]:
    """The parties, options and parameters of the model request, each checked for the type verification needs."""
    parties = list(body.parties or [])
    if not parties or not all(isinstance(q, str) and q for q in parties):
        raise bad(f"it must name the parties, requester first; it names {parties}")
    if len(set(parties)) != len(parties):
        raise bad(f"it names a party twice: {parties}")
    if len(parties) > rec.MAX_PARTIES:
        raise bad(f"it names {len(parties)} parties; a ledger's records hold at most {rec.MAX_PARTIES}")
    found = {}
    for what, text in (("options", body.options_json), ("parameters", body.params_json)):
        try:
            found[what] = json.loads(text)
        except ValueError as exc:
            raise bad(f"its {what} are not JSON: {exc}") from None
        if not isinstance(found[what], dict):
            raise bad(f"its {what} must be a JSON object, not {type(found[what]).__name__}")
    options, params = found["options"], found["parameters"]
    numbers = {"options": (options, {"beta": 1.0, "threshold": math.inf, "endorse_fraction": 2 / 3,
                                     "n_permutations": 2000}),
               "parameters": (params, {"reg_lambda": 1.0, "gamma": 0.0, "seed": 0})}
    for what, (d, defaults) in numbers.items():
        for name, default in defaults.items():
            v = d.get(name, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise bad(f"its {what} give {name} = {v!r}, not a number")
            d[name] = v
    if np.asarray(body.lo).size < 1:
        raise bad("it publishes no feature or label range")
    return parties, options, params


def _key(raw: bytes, bad) -> bytes:
    if len(raw) != 32:
        raise bad(f"an Ed25519 public key has 32 bytes, this one {len(raw)}")
    return raw


def _check_shapes(body, n_parties: int, n_features: int, bad) -> None:
    """A record's arrays have one entry per node (and per party) and name features that exist."""
    nodes = len(getattr(body, "nodes", None) or [])

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise bad(what)

    if isinstance(body, rec.Binning):
        need(body.n_bins.shape == (n_features,) and bool(np.all(body.n_bins >= 1)),
             f"it gives {body.n_bins.size} bin counts for {n_features} features (each at least 1)")
        need(body.lengths.shape == (n_features,) and bool(np.all(body.lengths >= 0))
             and int(body.lengths.sum()) == body.cuts.size, "its cut points do not add up to its lengths")
    elif isinstance(body, rec.VoteRecord):
        need(body.features.shape == (nodes,), f"it votes {body.features.size} times for {nodes} nodes")
        need(bool(np.all((body.features >= -1) & (body.features < n_features))),
             f"it votes for a feature outside 0-{n_features - 1}")
    elif isinstance(body, rec.HistogramUpload):
        c, off = body.candidates, body.offsets
        need(c.shape[0] == nodes and bool(np.all((c >= -1) & (c < n_features))),
             f"its candidate features are not one row per node (of {nodes}) of features 0-{n_features - 1}")
        need(off.shape == (nodes + 1,) and int(off[0]) == 0 and bool(np.all(np.diff(off) >= 0))
             and int(off[-1]) == body.hist.shape[0] and body.hist.shape[1:] == (3,),
             "its offsets do not cut its histogram rows (g, h, count) node by node")
    elif isinstance(body, rec.SplitRecord):
        for name in ("features", "bins", "missing_left", "gains", "voters", "accepted"):
            need(getattr(body, name).shape == (nodes,), f"its {name} has {getattr(body, name).size} entries for "
                                                        f"{nodes} nodes")
        need(bool(np.all((body.features >= 0) & (body.features < n_features))),
             f"it splits on a feature outside 0-{n_features - 1}")
    elif isinstance(body, rec.ContributionRecord):
        for name in ("shapley", "vote", "stderr"):
            need(getattr(body, name).shape == (nodes, n_parties),
                 f"its {name} is {getattr(body, name).shape}, not one row per node and a column per party "
                 f"({nodes}, {n_parties})")


def _check_acceptance(split: rec.SplitRecord, signatures: dict, uploads: dict, request, options, bad) -> None:
    parties = list(request.parties)
    need = math.ceil(options["endorse_fraction"] * len(parties) - 1e-9)
    verify_on = bool(options.get("verify", True))
    mask = sum(1 << i for i, q in enumerate(parties)
               if q in uploads and (not verify_on or signatures.get(q, 0) >= need))
    for j, acc in enumerate(split.accepted.tolist()):
        if int(acc) != mask:
            raise bad(f"node {split.nodes[j]} lists accepted parties {_names(acc, parties)}, the endorsements "
                      f"accept {_names(mask, parties)}")


def _names(mask: int, parties: list) -> list:
    return [q for i, q in enumerate(parties) if (int(mask) >> i) & 1]


def _check_contributions(c: rec.ContributionRecord, split: rec.SplitRecord, uploads: dict, votes: dict, request,
                         params, options, n_bins, bad) -> None:
    parties = list(request.parties)
    if list(c.nodes or []) != list(split.nodes or []) or c.shapley.shape != (len(split.nodes), len(parties)):
        raise bad("its nodes do not match the layer's split record")
    lam, gamma = params["reg_lambda"], params["gamma"]
    for j, node in enumerate(split.nodes):
        f, b, ml = int(split.features[j]), int(split.bins[j]), bool(split.missing_left[j])
        acc = [i for i, q in enumerate(parties) if (int(split.accepted[j]) >> i) & 1]
        sums = []
        for i in acc:
            up = uploads[parties[i]][0]
            if node not in (up.nodes or []):
                raise bad(f"node {node}: {parties[i]}'s accepted upload has no histograms of this node")
            k = up.nodes.index(node)
            pos, found = int(up.offsets[k]), None
            cands = up.candidates[k][up.candidates[k] >= 0]
            for cf in cands:
                nb = int(n_bins[cf])
                if cf == f:
                    found = up.hist[pos:pos + nb]
                    break
                pos += nb
            if found is None:
                raise bad(f"node {node}: {parties[i]}'s upload has no histogram of the chosen feature {f}")
            sums.append(split_sums(found, b, ml))
        phi, _, method = shapley_values(np.array(sums), lam, gamma, int(options["n_permutations"]),
                                        seed=int(params["seed"]) + int(c.tree))
        expect = np.zeros(len(parties))
        expect[acc] = phi
        if not np.allclose(c.shapley[j], expect, rtol=1e-9, atol=1e-9):
            raise bad(f"node {node}: the recorded split Shapley values {np.round(c.shapley[j], 6).tolist()} do not "
                      f"recompute from the accepted histograms ({np.round(expect, 6).tolist()})")
        voters = np.array([(int(split.voters[j]) >> i) & 1 for i in range(len(parties))], dtype=bool)
        for q in votes:
            if node not in (votes[q].nodes or []):
                raise bad(f"node {node}: {q}'s vote record of this layer has no vote for it")
        recorded_votes = np.array([votes[q].features[votes[q].nodes.index(node)] == f if q in votes else False
                                   for q in parties])
        if not np.array_equal(voters, recorded_votes):
            raise bad(f"node {node}: the voters listed do not match the vote records")
        if not np.allclose(c.vote[j], vote_contributions(float(split.gains[j]), voters), rtol=1e-9, atol=1e-9):
            raise bad(f"node {node}: the voting contributions do not recompute")


def compare_replicas(paths) -> None:
    """Check that the ledger files are replicas of one ledger: the same records, byte for byte.

    One file alone cannot show that records were removed from its end (what remains is a valid chain);
    another party's replica can.  Each file should have passed :func:`verify_ledger` first.  Raises
    :class:`~fedgrove.exceptions.LedgerError` naming the replicas and the first record where they part."""
    chains = {str(p): [(r.seq, r.kind, r.author, bytes(r.body), bytes(r.signature), bytes(r.prev_hash),
                        bytes(r.hash)) for r in open_records(p)] for p in paths}
    names = list(chains)
    longest = max(names, key=lambda n: len(chains[n]))
    for name in names:
        a, b = chains[name], chains[longest]
        same = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if same is not None:
            raise LedgerError(f"{name} and {longest} differ from record {same + 1} on: they are not replicas of "
                              f"one ledger (one was rewritten, or they come from different runs)")
        if len(a) < len(b):
            raise LedgerError(f"{name} holds {len(a)} records, {longest} {len(b)}: its records are the first "
                              f"{len(a)} of {longest}'s, so records {len(a) + 1}-{len(b)} were removed from its "
                              f"end, or its party stopped before the others")
