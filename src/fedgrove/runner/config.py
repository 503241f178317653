"""Federation and party configuration (TOML), validated once here.

``federation.toml`` (simulate)::

    [federation]
    protocol = "vertical"        # vertical (active/passive) | horizontal (aggregator/client) | hybridtree
                                 # (host/guest) | federated-forest (master/client)
    seed = 0
    timeout = 60                 # seconds a party waits for a peer
    startup_timeout = 300        # party mode: seconds a party waits for a peer it has not heard from yet (the
                                 # parties start at different times); at least timeout
    align = "psi"                # vertical, federated-forest: keep the instances every party holds, found by
                                 # private set intersection of the _id columns (default "exact": every party
                                 # holds the same); hybridtree: each guest keeps the instances the host holds
    max_message_mb = 2048        # the largest message a party sends or takes (a vertical federation's encrypted
                                 # gradients take about 272 bytes a row under OU); over gRPC it travels in pieces
    checkpoint_every = 1         # each party checkpoints after every this many rounds (trees of a forest) and
                                 # after the last; every party must give the same; a resume redoes at most
                                 # this many finished rounds (10: cheap trees train faster, see docs/cli.md)
    predict = true               # predict the test data after training (default: when parties list test files;
                                 # a party config of a role without data, master or aggregator, must say so)
    classes = ["no", "yes"]      # the classes in the order of their codes 0, 1, ...: text labels' names, or
                                 # numeric labels that are not already the codes (LIBSVM's [-1, 1]); every
                                 # party must give the same list (needed when label columns hold either)
    [he]
    scheme = "ou"                # ou | paillier
    key_bits = 2048
    backend = "heu"              # heu | gmpy2 (OU) | phe (Paillier) | plain (no encryption: benchmarks
                                 # only); default HEU where installed, else gmpy2 for OU, phe for Paillier
    rows_per_ciphertext = 3      # vertical and HybridTree (hessian mode): instances per gradient ciphertext
                                 # (default 3 for Paillier, 1 for OU; fedgrove.crypto.packing.RowPacking)
    [params]                     # GBDT parameters (fedgrove.engine.gbdt.GBDTParams); for federated-forest
    n_estimators = 10            # the random forest's (fedgrove.engine.forest.ForestParams)
    max_depth = 4
    [hybridtree]                 # hybridtree only: host_depth, guest_depth (5 + 2, or from [params]
                                 # max_depth: hybrid_depths), mode = "hessian" | "count",
                                 # shared_only = false (true: guests may hold instances the host lacks, as
                                 # with several hosts; the host keeps the instances both hold)
    [forest]                     # federated-forest only: label_mode = "encrypted" | "shared",
                                 # prediction = "one-round" | "classical"
    [simfl]                      # simfl only: n_hashes (L, default min(40, d-1)), r = 4.0,
                                 # distribution = "cauchy" | "gaussian", n_bins = 256, force = false (L >= d),
                                 # schedule = "blocks" | "round-robin"
    [horizontal]                 # horizontal only: contributions = true (each client's split Shapley values;
                                 # clients then send their gradient sums at every split in the clear)
    [fvtree]                     # fvtree only: n_candidates (2; "all"), refit, use_psd, psd_depth, psd_epsilon,
                                 # verify, threshold, endorse_fraction, beta, n_permutations,
                                 # noise = "secret" | "public" (PSD/DP noise seeds: own key | the config's seed)
    [fvtree.dp]                  # optional differential privacy: epsilon, trees_per_ensemble, n_ensembles,
                                 # g_clip, leaf_clip (1.0; "none" for no bound), seeded
    [[party]]
    name = "party0"
    role = "active"              # vertical: active (labels) | passive; horizontal: aggregator | client
    data = "party0.csv"          # paths relative to the config file (the aggregator and master have none)
    label = "label"
    # weight = "w"               # optional: the data file's column of row weights (not a feature); a
                                 # horizontal client's, the vertical active party's, a HybridTree host's
                                 # (hessian mode), a Federated Forest label holder's or a SimFL party's
                                 # (see README)
    test = "party0-test.csv"     # optional: after training, predict these rows (every data party lists its
                                 # part of the same test instances); the lead party writes the predictions
    # categorical = "auto"       # text columns as categories (or a list of columns, or {column = [...]})
    # n_features = 123           # LIBSVM files: read them at this width (else each at its largest index)
    # libsvm_base = 0            # LIBSVM files: their first feature index (else 0 if the file holds index 0, 1 if not)
    [output]
    dir = "runs/vertical"

``party.toml`` holds one ``[party]`` table (plus ``listen`` and ``certs``), a
``[peers]`` table mapping peer names to "host:port", and the same
``[federation]``, ``[he]``, ``[params]`` and ``[output]`` tables.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from fedgrove.crypto.certs import check_party_name
from fedgrove.crypto.he import KEY_BITS, SCHEMES
from fedgrove.crypto.packing import MAX_ROWS
from fedgrove.exceptions import DataError, InvalidParameterError, listing
from fedgrove.transport.channel import MESSAGE_LIMIT_MB

PROTOCOLS = ("vertical", "horizontal", "hybridtree", "federated-forest", "simfl", "fvtree")
ROLES = {"vertical": ("active", "passive"), "horizontal": ("aggregator", "client"), "hybridtree": ("host", "guest"),
         "federated-forest": ("master", "client"), "simfl": ("party",), "fvtree": ("party",)}
# the coordinating role (exactly one party has it); SimFL's parties are peers
LEAD = {"vertical": "active", "horizontal": "aggregator", "hybridtree": "host", "federated-forest": "master",
        "simfl": None, "fvtree": None}
NO_DATA = ("aggregator", "master")  # roles that hold no data file
MAX_MESSAGE_MB = 65536  # the largest [federation] max_message_mb taken
ALIGN = ("exact", "psi")  # [federation] align: the parties hold the same IDs | keep those all hold (PSI)
PSI_PROTOCOLS = ("vertical", "federated-forest", "hybridtree")


@dataclass
class PartySpec:
    name: str
    role: str
    data: Path
    label: str | None = None
    listen: str | None = None
    certs: Path | None = None
    test: Path | None = None
    categorical: object = None  # None, "auto", [column, ...] or {column: [category, ...]}: see load_table
    n_features: int | None = None  # LIBSVM data: the width to read its files at (else its largest feature index)
    libsvm_base: int | None = None  # LIBSVM data: its first feature index, 0 or 1 (else found: see load_table)
    weight: str | None = None  # the data file's column of row weights (a label holder's: see WEIGHTED_ROLES)


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
    forest: dict = field(default_factory=dict)            # label_mode, prediction
    simfl: dict = field(default_factory=dict)             # LSH parameters and tree schedule
    fvtree: dict = field(default_factory=dict)            # FVTreeOptions (and [fvtree.dp])
    horizontal: dict = field(default_factory=dict)        # contributions
    startup_timeout: float = 300.0                        # party mode: wait for a peer not yet heard from
    max_message_mb: float = MESSAGE_LIMIT_MB              # largest message sent or taken
    align: str = "exact"                                  # "psi": train on the IDs every party holds
    checkpoint_every: int = 1                             # rounds between checkpoints (and after the last)
    source: Path | None = None
    predict: bool = False                                 # predict the test data after training
    classes: list[str] | None = None                      # class names of text labels, code order

    @property
    def max_message_bytes(self) -> int:
        """``max_message_mb`` in bytes: the channels' message limit."""
        return int(self.max_message_mb * 2**20)

    @property
    def lead(self) -> str:
        """Name of the party that coordinates (and writes the predictions); for peer protocols the first."""
        role = LEAD[self.protocol]
        return next(p.name for p in self.parties if role is None or p.role == role)

    def fvtree_options(self):
        from fedgrove.protocols.fvtree.party import FVTreeOptions
        from fedgrove.protocols.fvtree.privacy import DPOptions

        o = dict(self.fvtree)
        if o.get("n_candidates") == "all":
            o["n_candidates"] = None
        _none_word(o, "psd_epsilon", "[fvtree]", "exact leaf counts")  # as FVTreeOptions(psd_epsilon=None)
        if "dp" in o:
            if not isinstance(o["dp"], dict):
                raise InvalidParameterError(f"[fvtree] dp must be a table ([fvtree.dp]), got {o['dp']!r}")
            dp = dict(o["dp"])
            _none_word(dp, "leaf_clip", "[fvtree.dp]", "no bound")
            o["dp"] = _build(DPOptions, dp, "[fvtree.dp]")
        return _build(FVTreeOptions, o, "[fvtree]")

    def simfl_options(self):
        from fedgrove.protocols.simfl.lsh import LSHParams
        from fedgrove.protocols.simfl.party import SimFLOptions

        o = dict(self.simfl)
        schedule = o.pop("schedule", "blocks")
        lsh = _build(LSHParams, {**o, "seed": self.seed}, "[simfl]")
        try:
            return SimFLOptions(lsh, schedule)
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"[simfl] {exc}") from None

    def shared_settings(self) -> dict:
        """What every party must have been given alike, compared when a run starts: the protocol and its
        table, the seed, the parameters (but ``n_threads``, each party's own), the class names, whether test
        data is predicted, how often the parties checkpoint (a resume steps a party back one checkpoint at
        most, so they must checkpoint at the same rounds), and who plays which role; resolved, so that a
        default left out and the same value written (or ``1`` and ``1.0``) agree.  Timeouts, paths, addresses
        and certificates are each party's own, and so is ``[he]``: only the key holder reads it (the others
        take the scheme from its key)."""
        if self.protocol == "simfl":
            o = self.simfl_options()
            section = {**o.lsh.to_dict(), "schedule": o.schedule}
        elif self.protocol == "fvtree":
            section = self.fvtree_options().to_dict()
        else:
            section = {"hybridtree": self.hybridtree, "federated-forest": self.forest,
                       "horizontal": self.horizontal}.get(self.protocol)
        params = {k: v for k, v in self.make_params().to_dict().items() if k != "n_threads"}
        settings = {"federation.protocol": self.protocol, "federation.seed": self.seed, "federation.align": self.align,
                    "federation.classes": self.classes, "federation.predict": self.predict,
                    "federation.checkpoint_every": self.checkpoint_every,
                    "roles": {p.name: p.role for p in self.parties}, **{f"params.{k}": v for k, v in params.items()}}
        if section is not None:
            table = "forest" if self.protocol == "federated-forest" else self.protocol
            settings.update({f"{table}.{k}": v for k, v in section.items()})
        return settings

    def make_params(self):
        """The protocol's parameter object from ``[params]``."""
        if self.protocol == "federated-forest":
            from fedgrove.engine.forest import ForestParams

            values = dict(self.params)
            if values.get("max_features") == "all":  # TOML has no None; as `fedgrove train --max-features all`
                values["max_features"] = None
            return _build(ForestParams, values, "[params]")
        from fedgrove.engine.gbdt import GBDTParams

        return _build(GBDTParams, self.params, "[params]")

    def party(self, name: str) -> PartySpec:
        for p in self.parties:
            if p.name == name:
                return p
        raise InvalidParameterError(f"no party named {name!r} in {self.source}")


def _none_word(table: dict, key: str, where: str, meaning: str) -> None:
    """``key = "none"`` in ``table`` read as None, which TOML cannot write; other text refused saying so."""
    value = table.get(key)
    if value == "none":
        table[key] = None
    elif isinstance(value, str):
        raise InvalidParameterError(f"{where} {key} must be a positive number or \"none\" ({meaning}), got "
                                    f"{value!r}")


def hybrid_depths(table: dict, params: dict) -> dict:
    """HybridTree's ``host_depth`` and ``guest_depth`` from ``[hybridtree]`` and ``[params] max_depth`` (its trees
    are ``host_depth + guest_depth`` deep), and ``params["max_depth"]`` set to their sum.

    Whatever is left out follows from the rest: with no depth at all, the paper's 5 + 2; with ``max_depth``
    alone, ``guest_depth`` 2 (``max_depth - 1`` below 3) and ``host_depth`` the remainder; with one of the
    two, the other as the remainder of ``max_depth`` (2 guest layers, or 5 host layers, without it).  All
    three that do not add up are refused, naming them."""
    for key, least in (("host_depth", 1), ("guest_depth", 0), ("max_depth", 1)):
        v = (params if key == "max_depth" else table).get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
            where = "[params]" if key == "max_depth" else "[hybridtree]"
            raise InvalidParameterError(f"{where} {key} must be an integer >= {least}, got {v!r}")
    host, guest, total = table.get("host_depth"), table.get("guest_depth"), params.get("max_depth")
    if total is None:
        host, guest = (5 if host is None else host), (2 if guest is None else guest)
    elif host is None and guest is None:
        guest = 2 if total >= 3 else total - 1
        host = total - guest
    elif host is None or guest is None:
        host, guest = (total - guest, guest) if host is None else (host, total - host)
        if host < 1 or guest < 0:
            given = "guest_depth" if host < 1 else "host_depth"
            raise InvalidParameterError(
                f"[params] max_depth = {total} leaves no room for [hybridtree] {given} = {table[given]}: "
                f"HybridTree's trees are host_depth (at least 1) + guest_depth (at least 0) deep")
    elif host + guest != total:
        raise InvalidParameterError(
            f"[params] max_depth = {total} but [hybridtree] host_depth + guest_depth = {host} + {guest} = "
            f"{host + guest}: HybridTree's trees are host_depth + guest_depth deep; give max_depth = "
            f"{host + guest}, or leave max_depth out")
    params["max_depth"] = host + guest
    return {"host_depth": host, "guest_depth": guest}


def canonical(v):
    """``v`` with every number a float (booleans kept) and nested tables and lists likewise, for comparing
    settings (``1`` and ``1.0`` are one value)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, dict):
        return {str(k): canonical(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [canonical(x) for x in v]
    return str(v)


def shown_setting(v):
    """A :func:`canonical` value as written: a whole number without its ``.0``."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def check_keys(where: str, given, known) -> None:
    """Refuse keys of ``given`` not in ``known`` (a misspelt key would otherwise be ignored without a word),
    naming each with the known key closest to it and every key ``where`` takes."""
    import difflib

    known = list(known)
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    shown = ", ".join(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(
        k, known, 1)) else "") for k in unknown)
    raise InvalidParameterError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {shown}; expected some of "
                                f"{', '.join(known)}")


def _build(cls, values: dict, table: str):
    """``cls(**values)``, with an unknown key named together with the keys ``table`` takes."""
    check_keys(table, values, [f.name for f in dataclasses.fields(cls) if f.init])
    try:
        return cls(**values)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{table} {exc}") from None


def _seconds(fed: dict, key: str, default: float):
    """``federation.<key>``: a positive number of seconds (not true or false)."""
    value = fed.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidParameterError(f"federation.{key} must be a positive number of seconds, got {value!r}")
    return value


def _read(path) -> tuple[dict, Path]:
    path = Path(path)
    if not path.exists():
        raise InvalidParameterError(f"config file {str(path)!r} does not exist")
    if path.is_dir():
        raise InvalidParameterError(f"config file {str(path)!r} is a directory; give its .toml file")
    try:
        d = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # TOML is UTF-8; a BOM (Notepad) is let go
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"{str(path)!r} is not valid TOML: {exc}") from None
    for name in TABLES:  # `params = 5` or `federation = "x"`: read as a table, they raised TypeError
        if name != "party" and name in d and not isinstance(d[name], dict):
            raise InvalidParameterError(f"{path}: {name} must be a [{name}] table, got {d[name]!r}")
    if isinstance(d.get("party"), list) and not all(isinstance(p, dict) for p in d["party"]):
        raise InvalidParameterError(f"{path}: party must be [[party]] tables, one per party")
    return d, path.parent


# the keys each table of a config takes (docs/cli.md, "Configuration reference", lists them, checked by a test);
# [params], [fvtree] and [fvtree.dp] take their classes' fields (config_keys)
FEDERATION_KEYS = ("protocol", "seed", "timeout", "startup_timeout", "max_message_mb", "predict", "classes", "align",
                   "checkpoint_every")
HE_KEYS = ("scheme", "key_bits", "backend", "rows_per_ciphertext")
OUTPUT_KEYS = ("dir",)
HYBRIDTREE_KEYS = ("host_depth", "guest_depth", "mode", "shared_only")
FOREST_KEYS = ("label_mode", "prediction")
SIMFL_KEYS = ("n_hashes", "r", "distribution", "n_bins", "force", "schedule")
HORIZONTAL_KEYS = ("contributions",)
PARTY_KEYS = ("name", "role", "data", "label", "test", "certs", "listen", "categorical", "n_features",
              "libsvm_base", "weight")
# the roles that may hold the labels (a Federated Forest's label holder is one of its clients)
LABELLED_ROLES = {"horizontal": ("client",), "vertical": ("active",), "hybridtree": ("host",),
                  "federated-forest": ("client",), "simfl": ("party",), "fvtree": ("party",)}
# the roles that take row weights (``weight = "column"``): those whose sums the weights scale, the label
# holders' (a Federated Forest client's with the labels only), in every protocol but FV-tree, which takes none
WEIGHTED_ROLES = {k: r for k, r in LABELLED_ROLES.items() if k != "fvtree"}


def config_keys() -> dict[str, tuple[str, ...]]:
    """Every key each table of a config takes, by table (``params: boosting`` and ``params: federated-forest``
    for the two kinds of ``[params]``).  ``[peers]`` and ``[roles]`` (a party config's) take party names."""
    from fedgrove.engine.forest import ForestParams
    from fedgrove.engine.gbdt import GBDTParams
    from fedgrove.protocols.fvtree.party import FVTreeOptions
    from fedgrove.protocols.fvtree.privacy import DPOptions

    def fields(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    return {"federation": FEDERATION_KEYS, "party": PARTY_KEYS, "params: boosting": fields(GBDTParams),
            "params: federated-forest": fields(ForestParams), "he": HE_KEYS, "output": OUTPUT_KEYS,
            "hybridtree": HYBRIDTREE_KEYS, "forest": FOREST_KEYS, "simfl": SIMFL_KEYS, "fvtree": fields(FVTreeOptions),
            "fvtree.dp": fields(DPOptions), "horizontal": HORIZONTAL_KEYS}


def _at(base: Path, value: str) -> Path:
    """A path a config gives, relative to the config's folder; ``~`` is the user's home, as in a shell."""
    return base / Path(value).expanduser()


def _party(d: dict, base: Path, where: str) -> PartySpec:
    check_keys(where, d, PARTY_KEYS)
    for key in ("name", "role"):
        if key not in d:
            raise InvalidParameterError(f"{where}: missing {key!r}")
    if "data" not in d and d["role"] not in NO_DATA:
        raise InvalidParameterError(f"{where}: missing 'data'")
    for key in ("name", "role", "data", "test", "certs", "listen", "weight"):
        if key in d and not isinstance(d[key], str):
            raise InvalidParameterError(f"{where}: {key} must be a string, got {d[key]!r}")
    check_party_name(d["name"], f"{where}: ")  # it names the party's files: "../x" wrote outside the output folder
    certs, test = d.get("certs"), d.get("test")
    return PartySpec(str(d["name"]), str(d["role"]), _at(base, d["data"]) if "data" in d else Path("-"),
                     d.get("label"), d.get("listen"), _at(base, certs) if certs else None,
                     _at(base, test) if test else None,
                     _categorical(d.get("categorical"), where), _n_features(d, where), _libsvm_base(d, where),
                     d.get("weight"))


def _n_features(d: dict, where: str) -> int | None:
    """A party's ``n_features``: the width its LIBSVM files are read at (a whole number >= 1)."""
    value = d.get("n_features")
    if value is None:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise InvalidParameterError(f"{where}: n_features must be a whole number >= 1, got {value!r}")
    _libsvm_only(d, where, "n_features", "as wide as their largest feature index")
    return value


def _libsvm_base(d: dict, where: str) -> int | None:
    """A party's ``libsvm_base``: the index its LIBSVM files number their first feature with, 0 or 1."""
    value = d.get("libsvm_base")
    if value is None:
        return None
    if value not in (0, 1) or isinstance(value, bool):
        raise InvalidParameterError(f"{where}: libsvm_base must be 0 or 1 (the index of a LIBSVM file's first "
                                    f"feature), got {value!r}")
    _libsvm_only(d, where, "libsvm_base", "numbered by index")
    return value


def _libsvm_only(d: dict, where: str, key: str, why: str) -> None:
    """Refuse a LIBSVM-only ``key`` for a party whose data or test file is of another format."""
    from fedgrove.data.io import detect_format

    for file in ("data", "test"):
        try:
            fmt = detect_format(d[file]) if file in d else None
        except DataError:  # said when the file is read
            continue
        if fmt not in (None, "libsvm"):
            raise InvalidParameterError(f"{where}: {key} is for LIBSVM files ({why}), but {file} = {d[file]!r} "
                                        f"is {fmt}, whose columns it names")


def _categorical(value, where: str):
    """A party's ``categorical``: "auto", a list of column names, or a table {column = [categories]}."""
    if value is None or value == "auto":
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, dict) and value and all(
            isinstance(c, list) and c and all(isinstance(v, (str, int)) for v in c) for c in value.values()):
        return {str(k): [str(v) for v in c] for k, c in value.items()}
    raise InvalidParameterError(f"{where}: categorical must be \"auto\", a list of column names or a table "
                                f"{{column = [categories]}}, got {value!r}")


# each protocol's own table, by the protocol it configures
PROTOCOL_TABLES = {"hybridtree": "hybridtree", "forest": "federated-forest", "simfl": "simfl", "fvtree": "fvtree",
                   "horizontal": "horizontal"}
TABLES = ("federation", "params", "he", "output", "party", "peers", "roles", *PROTOCOL_TABLES)
USES_HE = ("vertical", "hybridtree", "federated-forest")
PACKS_ROWS = ("vertical", "hybridtree")  # [he] rows_per_ciphertext: several instances per gradient ciphertext
# where each party holds its own part of the test rows (in the others every party predicts the whole test set)
SPLIT_TEST = ("vertical", "hybridtree", "federated-forest")


def _check_protocol_tables(d: dict, protocol: str, source: Path) -> None:
    """Refuse another protocol's table, and [he] where the protocol encrypts nothing with it: they were ignored,
    so settings the user meant (a forest's label mode, a key size) silently did not apply."""
    for table, owner in PROTOCOL_TABLES.items():
        if table in d and owner != protocol:
            raise InvalidParameterError(f"{source}: [{table}] configures the {owner} protocol, but federation.protocol "
                                        f"is {protocol!r}: remove the table or change the protocol")
    if "he" in d and protocol not in USES_HE:
        raise InvalidParameterError(f"{source}: [he] sets the homomorphic encryption of the {', '.join(USES_HE)} "
                                    f"protocols; the {protocol} protocol uses none: remove the table")
    if "rows_per_ciphertext" in d.get("he", {}) and protocol not in PACKS_ROWS:
        raise InvalidParameterError(f"{source}: [he] rows_per_ciphertext packs instances' gradients for the "
                                    f"{' and '.join(PACKS_ROWS)} protocols; the {protocol} protocol encrypts "
                                    f"each instance's label statistics in a ciphertext of its own: remove the key")


def _common(d: dict, base: Path, source: Path, parties: list[PartySpec], peers=None) -> FederationConfig:
    unknown = sorted(set(d) - set(TABLES))
    if unknown:  # a misspelt table was ignored: its settings silently took their defaults
        import difflib

        hints = [f"[{k}]" + (f" (did you mean [{close[0]}]?)" if (close := difflib.get_close_matches(k, TABLES, 1))
                             else "") for k in unknown]
        raise InvalidParameterError(f"{source}: unknown table{'s' if len(unknown) > 1 else ''} or key "
                                    f"{', '.join(hints)}; expected some of {', '.join(f'[{t}]' for t in TABLES)}")
    fed = d.get("federation", {})
    check_keys("[federation]", fed, FEDERATION_KEYS)
    protocol = fed.get("protocol", "vertical")
    if protocol not in PROTOCOLS:
        raise InvalidParameterError(f"federation.protocol must be one of {PROTOCOLS}, got {protocol!r}")
    _check_protocol_tables(d, protocol, source)
    for p in parties:
        if p.role not in ROLES[protocol]:
            raise InvalidParameterError(f"party {p.name}: role must be one of {ROLES[protocol]}, got {p.role!r}")
        if p.label is not None and p.role not in LABELLED_ROLES[protocol]:
            # it was ignored in training, and dropped a test file's column of that name
            raise InvalidParameterError(f"party {p.name}: label = {p.label!r}, but the {protocol} protocol's "
                                        f"{p.role} holds no labels (its {' or '.join(LABELLED_ROLES[protocol])} "
                                        f"does): remove it")
        if p.weight is not None and p.role not in WEIGHTED_ROLES.get(protocol, ()):
            takes = "; ".join(f"the {k} protocol's {' and '.join(r)}" + (" with the labels" if k == "federated-forest"
                                                                         else "") for k, r in WEIGHTED_ROLES.items())
            raise InvalidParameterError(f"party {p.name}: weight = {p.weight!r}: the {protocol} protocol's "
                                        f"{p.role} takes no row weights (they are taken by {takes}); remove it")
        if p.weight is not None and protocol == "federated-forest" and p.label is None:
            raise InvalidParameterError(f"party {p.name}: weight = {p.weight!r}, but no label: a Federated Forest's "
                                        f"row weights go with its labels; move the weight to the label holder")
    seed = fed.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidParameterError(f"federation.seed must be a non-negative integer, got {seed!r}")
    timeout, startup = _seconds(fed, "timeout", 60), _seconds(fed, "startup_timeout", 300)
    align = fed.get("align", "exact")
    if align not in ALIGN:
        raise InvalidParameterError(f"federation.align must be one of {', '.join(map(repr, ALIGN))}, got {align!r}")
    if align == "psi" and protocol not in PSI_PROTOCOLS:
        raise InvalidParameterError(f"federation.align = \"psi\" is for the {', '.join(PSI_PROTOCOLS)} protocols, "
                                    f"whose parties hold the same instances; the {protocol} protocol does not "
                                    f"align instances: remove it")
    max_mb = fed.get("max_message_mb", MESSAGE_LIMIT_MB)
    if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or not 1 <= max_mb <= MAX_MESSAGE_MB:
        raise InvalidParameterError(f"federation.max_message_mb must be a number of megabytes from 1 to "
                                    f"{MAX_MESSAGE_MB}, got {max_mb!r}")
    every = fed.get("checkpoint_every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise InvalidParameterError(f"federation.checkpoint_every must be a whole number of rounds, 1 or more (1: "
                                    f"after every round), got {every!r}")
    he = {"scheme": "ou", "key_bits": 2048, "backend": None, **d.get("he", {})}
    check_keys("[he]", he, HE_KEYS)
    if he["scheme"] not in SCHEMES:
        raise InvalidParameterError(f"[he] scheme must be one of {', '.join(SCHEMES)}, got {he['scheme']!r}")
    if isinstance(he["key_bits"], bool) or he["key_bits"] not in KEY_BITS:
        raise InvalidParameterError(f"[he] key_bits must be one of {', '.join(map(str, KEY_BITS))}, got "
                                    f"{he['key_bits']!r}")
    if he["backend"] not in (None, "heu", "gmpy2", "phe", "plain"):
        raise InvalidParameterError(f"[he] backend must be 'heu', 'gmpy2', 'phe' or 'plain' (no encryption: "
                                    f"benchmarks only), got {he['backend']!r}")
    only = {"gmpy2": "ou", "phe": "paillier"}.get(he["backend"])
    if only is not None and he["scheme"] != only:
        raise InvalidParameterError(f"[he] backend {he['backend']!r} implements scheme {only!r} only, got scheme "
                                    f"{he['scheme']!r}")
    k = he.get("rows_per_ciphertext")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_ROWS):
        raise InvalidParameterError(f"[he] rows_per_ciphertext must be an integer from 1 to {MAX_ROWS}, got {k!r}")
    params = dict(d.get("params", {}))
    params.setdefault("seed", seed)
    classes = _classes(fed.get("classes"), params, protocol)
    output = d.get("output", {})
    check_keys("[output]", output, OUTPUT_KEYS)
    out = output.get("dir", "fedgrove-run")
    if not isinstance(out, str) or not out:
        raise InvalidParameterError(f"[output] dir must be a directory name, got {out!r}")
    hybrid = {"mode": "hessian", "shared_only": False, **d.get("hybridtree", {})}
    check_keys("[hybridtree]", hybrid, HYBRIDTREE_KEYS)
    if not isinstance(hybrid["shared_only"], bool):
        raise InvalidParameterError(f"[hybridtree] shared_only must be true or false, got {hybrid['shared_only']!r}")
    if hybrid["mode"] not in ("hessian", "count"):
        raise InvalidParameterError(f"[hybridtree] mode must be 'hessian' or 'count', got {hybrid['mode']!r}")
    # another protocol's config may carry a [hybridtree] table: checked, without touching its [params]
    hybrid.update(hybrid_depths(hybrid, params if protocol == "hybridtree" else {}))
    forest = {"label_mode": "encrypted", "prediction": "one-round", **d.get("forest", {})}
    check_keys("[forest]", forest, FOREST_KEYS)
    if forest["label_mode"] not in ("encrypted", "shared"):
        raise InvalidParameterError(f"[forest] label_mode must be 'encrypted' or 'shared' (labels in plaintext "
                                    f"at every client), got {forest['label_mode']!r}")
    if forest["prediction"] not in ("one-round", "classical"):
        raise InvalidParameterError(f"[forest] prediction must be 'one-round' or 'classical', got "
                                    f"{forest['prediction']!r}")
    predict = fed.get("predict", any(p.test is not None for p in parties))
    if not isinstance(predict, bool):
        raise InvalidParameterError(f"federation.predict must be true or false, got {predict!r}")
    simfl = dict(d.get("simfl", {}))
    check_keys("[simfl]", simfl, SIMFL_KEYS)
    cfg = FederationConfig(protocol, seed, float(timeout), he, params, parties, _at(base, out),
                           peers=peers or {}, source=source, hybridtree=hybrid, forest=forest, simfl=simfl,
                           fvtree=dict(d.get("fvtree", {})), predict=predict,
                           horizontal={"contributions": False, **d.get("horizontal", {})},
                           startup_timeout=float(startup), max_message_mb=float(max_mb), classes=classes,
                           align=align, checkpoint_every=every)
    check_keys("[horizontal]", cfg.horizontal, HORIZONTAL_KEYS)
    if not isinstance(cfg.horizontal["contributions"], bool):
        raise InvalidParameterError(f"[horizontal] contributions must be true or false, got "
                                    f"{cfg.horizontal['contributions']!r}")
    cfg.make_params()
    if protocol == "simfl":
        cfg.simfl_options()
    if protocol == "fvtree":
        cfg.fvtree_options()
    return cfg


def _classes(value, params: dict, protocol: str) -> list | None:
    """``federation.classes``: two or more distinct class names (text labels' codes 0, 1, ... in this order),
    or numbers (numeric labels' codes, such as LIBSVM's -1 and 1); a multiclass objective without
    ``n_classes`` takes their number."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) >= 2
            and (all(isinstance(v, str) and v for v in value) or all(_is_label_number(v) for v in value))):
        raise InvalidParameterError(f"federation.classes must list two or more classes, by name (text) or by "
                                    f"label (numbers, such as [-1, 1]), not both, got {value!r}")
    if len(set(value)) != len(value):
        raise InvalidParameterError(f"federation.classes lists a class twice: {value!r}")
    key, objective = label_setting(protocol, params)
    if objective == "regression":
        raise InvalidParameterError(f"federation.classes is for classification, but [params] {key} is "
                                    f"'regression'")
    if objective == "binary" and len(value) != 2:
        raise InvalidParameterError(f"federation.classes lists {len(value)} classes, but [params] objective is "
                                    f"'binary' (set objective = \"multiclass\")")
    if objective == "multiclass":
        if params.setdefault("n_classes", len(value)) != len(value):
            raise InvalidParameterError(f"federation.classes lists {len(value)} classes, [params] n_classes is "
                                        f"{params['n_classes']!r}")
    return list(value)


def label_setting(protocol: str, params: dict) -> tuple[str, str]:
    """The ``[params]`` key that says what the labels are, and its value: Federated Forest's ``task``
    (classification or regression), the boosting protocols' ``objective`` (binary, multiclass or regression)."""
    if protocol == "federated-forest":
        return "task", params.get("task", "classification")
    return "objective", params.get("objective", "binary")


def classes_setting(labels, limit: int | None = None) -> str:
    """The ``[federation] classes = [...]`` line for labels that are not class codes: their distinct values
    sorted, names as text and numbers as numbers (the first ``limit``, then "...")."""
    import json

    import numpy as np

    from fedgrove.data.io import label_text

    y = np.asarray(labels)
    if y.dtype.kind in "fiub":
        seen = [label_text(v) for v in np.unique(y.astype(np.float64))]
    else:
        seen = [json.dumps(v, ensure_ascii=False) for v in sorted({str(v) for v in y.tolist()})]
    shown = seen if limit is None else seen[:limit]
    return "[federation] classes = [" + ", ".join(shown) + (", ...]" if len(shown) < len(seen) else "]")


def _is_label_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def load_federation(path) -> FederationConfig:
    d, base = _read(path)
    if isinstance(d.get("party"), dict):  # a [party] table, which tomllib reads as one dict, not a list of them
        raise InvalidParameterError(f"{path} is one party's config (a [party] table): run it with `fedgrove party "
                                    f"{path}`; a federation file, for `fedgrove simulate`, has a [[party]] table "
                                    f"per party")
    if not isinstance(d.get("party", []), list):
        raise InvalidParameterError(f"{path}: party must be [[party]] tables, one per party")
    parties = [_party(p, base, f"{path}: [[party]] #{k}") for k, p in enumerate(d.get("party", []))]
    if len(parties) < 2:
        raise InvalidParameterError(f"{path}: a federation needs at least two [[party]] tables")
    names = [p.name for p in parties]
    if len(set(names)) != len(names):
        raise InvalidParameterError(f"{path}: party names must be distinct, got {names}")
    cfg = _common(d, base, Path(path), parties)
    lead = LEAD[cfg.protocol]
    if lead is not None and [p.role for p in parties].count(lead) != 1:
        raise InvalidParameterError(f"{path}: the {cfg.protocol} protocol needs exactly one {lead} party")
    # a copied [[party]] table: one party's data read as two parties' (and a test file, where each holds its part)
    for kind in ("data", "test") if cfg.protocol in SPLIT_TEST else ("data",):
        seen: dict[Path, str] = {}
        for p in parties:
            f = getattr(p, kind)
            if f is None:
                continue
            if f.resolve() in seen:
                raise InvalidParameterError(f"{path}: parties {seen[f.resolve()]} and {p.name} both read {f} as "
                                            f"their {kind}; each party reads its own file")
            seen[f.resolve()] = p.name
    _check_test_files(cfg, parties, path)
    return cfg


def _check_test_files(cfg: FederationConfig, parties: list[PartySpec], path) -> None:
    """Prediction needs every data party's part of the test set (of those this config describes), and a party's
    test file must hold the feature columns of its data file (checked on their headers, before training)."""
    missing = [p.name for p in parties if p.role not in NO_DATA and p.test is None]
    if cfg.predict and missing:
        raise InvalidParameterError(f"{path}: prediction after training needs every party with data to list its "
                                    f"part of the test set (test = ...); missing for {missing}")
    from fedgrove.data.io import feature_columns

    for p in parties:
        if p.data is None or p.test is None or not (p.data.is_file() and p.test.is_file()):
            continue  # a missing file is named when it is read
        try:
            # (a test file need not hold the weights)
            trained, tested = feature_columns(p.data, p.label, weight=p.weight), feature_columns(p.test)
        except DataError:
            continue  # said, with the row and value, when the file is read
        if trained is None or tested is None:
            continue  # files without names are matched by position
        absent = [c for c in trained if c not in tested]
        if absent:
            shown = listing(absent, show=repr)
            what = f"all {len(trained)}" if len(absent) == len(trained) else f"{len(absent)} of the {len(trained)}"
            raise InvalidParameterError(f"{path}: party {p.name}: its test file {p.test} lacks {what} feature "
                                        f"columns of its data file {p.data}: {shown}; is each file this party's?")


def _address(value, where: str) -> None:
    """Refuse what cannot be a "host:port" address (gRPC accepted a port out of range, or none, and served
    nowhere a peer could reach)."""
    text = value if isinstance(value, str) else None
    host, _, port = (text or "").rpartition(":")
    if text is None or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidParameterError(f"{where} = {value!r} is not an address \"host:port\" with a port from 1 to "
                                    f"65535 (e.g. \"127.0.0.1:50051\")")


def load_party(path) -> tuple[FederationConfig, PartySpec]:
    d, base = _read(path)
    if isinstance(d.get("party"), list):
        raise InvalidParameterError(f"{path} is a federation file ([[party]] tables, one per party): run all its "
                                    f"parties in one process with `fedgrove simulate {path}`; `fedgrove party` "
                                    f"takes one party's config, with a [party] table")
    if "party" not in d or not isinstance(d["party"], dict):
        raise InvalidParameterError(f"{path}: missing the [party] table")
    me = _party(d["party"], base, f"{path}: [party]")
    if not me.listen:
        raise InvalidParameterError(f"{path}: [party] needs listen = \"host:port\"")
    if me.certs is None:
        raise InvalidParameterError(f"{path}: [party] needs certs = the directory made by `fedgrove certs`")
    peers = d.get("peers", {})
    if not peers or not isinstance(peers, dict):
        raise InvalidParameterError(f"{path}: [peers] must map each peer's name to \"host:port\"")
    _address(me.listen, f"{path}: [party] listen")
    for name, addr in peers.items():
        check_party_name(name, f"{path}: [peers]: ")
        _address(addr, f"{path}: [peers] {name}")
    if me.name in peers:
        raise InvalidParameterError(f"{path}: [peers] lists this party itself ({me.name}); list only the other "
                                    f"parties, with their addresses")
    seen = {me.listen: "this party's listen address"}
    for name, addr in peers.items():
        if addr in seen:
            raise InvalidParameterError(f"{path}: [peers] {name} = {addr!r} is also {seen[addr]}; every party "
                                        f"needs an address of its own")
        seen[addr] = f"{name}'s address"
    roles = d.get("roles", {})
    if not isinstance(roles, dict):
        raise InvalidParameterError(f"{path}: [roles] must map peer names to their roles")
    unknown = sorted(set(roles) - set(peers) - {me.name})
    if unknown:
        raise InvalidParameterError(f"{path}: [roles] names {', '.join(unknown)}, not listed in [peers]; give "
                                    f"every other party's address in [peers] (listed: {', '.join(peers)})")
    if me.name in roles and roles[me.name] != me.role:
        raise InvalidParameterError(f"{path}: [roles] gives this party ({me.name}) the role {roles[me.name]!r}, "
                                    f"[party] role {me.role!r}; give it once, in [party]")
    protocol = d.get("federation", {}).get("protocol", "vertical")
    # a peer's role when [roles] does not give it: the other side of a two-role protocol; Federated Forest
    # clients talk to each other too, so there [roles] must name the master
    default = {"active": "passive", "passive": "active", "aggregator": "client", "client": "aggregator",
               "host": "guest", "guest": "host", "master": "client", "party": "party"}
    if protocol == "federated-forest":
        default["client"] = "client"
    others = [PartySpec(n, roles.get(n, default.get(me.role, "passive")), Path("-")) for n in peers]
    cfg = _common(d, base, Path(path), [me] + others, peers)
    lead = LEAD[cfg.protocol]
    if lead is not None and [p.role for p in cfg.parties].count(lead) != 1:
        unnamed = [n for n in peers if n not in roles]
        taken = (f"; the peers [roles] does not name ({', '.join(unnamed)}) are taken as "
                 f"{default.get(me.role, 'passive')}s: name the others' roles in [roles]"
                 if len(unnamed) > 1 and default.get(me.role) == lead else "")
        raise InvalidParameterError(f"{path}: exactly one party (this one or a peer named in [roles]) must be the "
                                    f"{lead}{taken}")
    _check_test_files(cfg, [me], path)
    return cfg, me
