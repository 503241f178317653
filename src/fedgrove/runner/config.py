"""Federation and party configuration (TOML), validated once here.

``federation.toml`` (simulate)::

    [federation]
    protocol = "vertical"        # vertical (active/passive) | horizontal (aggregator/client) | hybridtree (host/guest)
    seed = 0
    timeout = 60                 # seconds a party waits for a peer
    [he]
    scheme = "ou"                # ou | paillier
    key_bits = 2048
    backend = "heu"              # heu | phe | plain (no encryption: benchmarks only)
    [params]                     # GBDT parameters (fedgrove.engine.gbdt.GBDTParams)
    n_estimators = 10
    max_depth = 4
    [[party]]
    name = "party0"
    role = "active"              # vertical: active (labels) | passive; horizontal: aggregator | client
    data = "party0.csv"          # paths relative to the config file (the aggregator has none)
    label = "label"
    [output]
    dir = "runs/vertical"

``party.toml`` holds one ``[party]`` table (plus ``listen`` and ``certs``), a
``[peers]`` table mapping peer names to "host:port", and the same
``[federation]``, ``[he]``, ``[params]`` and ``[output]`` tables.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from fedgrove.exceptions import InvalidParameterError

PROTOCOLS = ("vertical", "horizontal", "hybridtree")
ROLES = {"vertical": ("active", "passive"), "horizontal": ("aggregator", "client"), "hybridtree": ("host", "guest")}


@dataclass
class PartySpec:
    name: str
    role: str
    data: Path
    label: str | None = None
    listen: str | None = None
    certs: Path | None = None


@dataclass
class FederationConfig:
    protocol: str
    seed: int
    timeout: float
    he: dict
    params: dict
    parties: list[PartySpec]
    output_dir: Path
    peers: dict[str, str] = field(default_factory=dict)   # party mode only
    hybridtree: dict = field(default_factory=dict)        # host_depth, guest_depth, mode
    source: Path | None = None

    def party(self, name: str) -> PartySpec:
        for p in self.parties:
            if p.name == name:
                return p
        raise InvalidParameterError(f"no party named {name!r} in {self.source}")


def _read(path) -> tuple[dict, Path]:
    path = Path(path)
    if not path.exists():
        raise InvalidParameterError(f"config file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text()), path.parent
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"{str(path)!r} is not valid TOML: {exc}") from None


def _party(d: dict, base: Path, where: str) -> PartySpec:
    for key in ("name", "role"):
        if key not in d:
            raise InvalidParameterError(f"{where}: missing {key!r}")
    if "data" not in d and d["role"] != "aggregator":
        raise InvalidParameterError(f"{where}: missing 'data'")
    certs = d.get("certs")
    return PartySpec(str(d["name"]), str(d["role"]), base / d["data"] if "data" in d else Path("-"), d.get("label"),
                     d.get("listen"), base / certs if certs else None)


def _common(d: dict, base: Path, source: Path, parties: list[PartySpec], peers=None) -> FederationConfig:
    fed = d.get("federation", {})
    protocol = fed.get("protocol", "vertical")
    if protocol not in PROTOCOLS:
        raise InvalidParameterError(f"federation.protocol must be one of {PROTOCOLS}, got {protocol!r}")
    for p in parties:
        if p.role not in ROLES[protocol]:
            raise InvalidParameterError(f"party {p.name}: role must be one of {ROLES[protocol]}, got {p.role!r}")
    timeout = fed.get("timeout", 60)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise InvalidParameterError(f"federation.timeout must be a positive number of seconds, got {timeout!r}")
    he = {"scheme": "ou", "key_bits": 2048, "backend": None, **d.get("he", {})}
    params = dict(d.get("params", {}))
    params.setdefault("seed", fed.get("seed", 0))
    from fedgrove.engine.gbdt import GBDTParams

    try:
        GBDTParams(**params)
    except TypeError as exc:
        raise InvalidParameterError(f"[params]: {exc}") from None
    out = d.get("output", {}).get("dir", "fedgrove-run")
    hybrid = {"host_depth": 5, "guest_depth": 2, "mode": "hessian", **d.get("hybridtree", {})}
    unknown = set(hybrid) - {"host_depth", "guest_depth", "mode"}
    if unknown:
        raise InvalidParameterError(f"[hybridtree]: unknown keys {sorted(unknown)}; expected host_depth, "
                                    f"guest_depth, mode")
    if hybrid["mode"] not in ("hessian", "count"):
        raise InvalidParameterError(f"[hybridtree] mode must be 'hessian' or 'count', got {hybrid['mode']!r}")
    for key in ("host_depth", "guest_depth"):
        if not isinstance(hybrid[key], int) or hybrid[key] < (1 if key == "host_depth" else 0):
            raise InvalidParameterError(f"[hybridtree] {key} must be a non-negative integer (host_depth >= 1), "
                                        f"got {hybrid[key]!r}")
    return FederationConfig(protocol, int(fed.get("seed", 0)), float(timeout), he, params, parties, base / out,
                            peers=peers or {}, source=source, hybridtree=hybrid)


def load_federation(path) -> FederationConfig:
    d, base = _read(path)
    parties = [_party(p, base, f"{path}: [[party]] #{k}") for k, p in enumerate(d.get("party", []))]
    if len(parties) < 2:
        raise InvalidParameterError(f"{path}: a federation needs at least two [[party]] tables")
    names = [p.name for p in parties]
    if len(set(names)) != len(names):
        raise InvalidParameterError(f"{path}: party names must be distinct, got {names}")
    cfg = _common(d, base, Path(path), parties)
    lead = {"vertical": "active", "horizontal": "aggregator", "hybridtree": "host"}[cfg.protocol]
    if [p.role for p in parties].count(lead) != 1:
        raise InvalidParameterError(f"{path}: the {cfg.protocol} protocol needs exactly one {lead} party")
    return cfg


def load_party(path) -> tuple[FederationConfig, PartySpec]:
    d, base = _read(path)
    if "party" not in d or not isinstance(d["party"], dict):
        raise InvalidParameterError(f"{path}: missing the [party] table")
    me = _party(d["party"], base, f"{path}: [party]")
    if not me.listen:
        raise InvalidParameterError(f"{path}: [party] needs listen = \"host:port\"")
    if me.certs is None:
        raise InvalidParameterError(f"{path}: [party] needs certs = the directory made by `fedgrove certs`")
    peers = d.get("peers", {})
    if not peers or not all(isinstance(v, str) and ":" in v for v in peers.values()):
        raise InvalidParameterError(f"{path}: [peers] must map each peer's name to \"host:port\"")
    roles = d.get("roles", {})
    default = {"active": "passive", "passive": "active", "aggregator": "client", "client": "aggregator",
               "host": "guest", "guest": "host"}
    others = [PartySpec(n, roles.get(n, default.get(me.role, "passive")), Path("-")) for n in peers]
    cfg = _common(d, base, Path(path), [me] + others, peers)
    return cfg, me
