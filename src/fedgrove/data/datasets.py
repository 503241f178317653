"""Named datasets of the papers, read from a data directory.

The directory is, in order: the ``FEDGROVE_DATA_DIR`` environment variable;
``../shared/data`` next to the working directory or next to this source tree,
when present; otherwise ``~/.cache/fedgrove/data``.  Each dataset lives in a
sub-folder named after it, with its files as published (optionally gzipped).

When a file is missing, :func:`load_dataset` says where to get it; with
``download=True`` it fetches the file from its official source and checks its
SHA-256 before keeping it.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedgrove.data.io import Table, read_csv
from fedgrove.exceptions import DataError

LIBSVM_URL = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"
UCI_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/"


@dataclass(frozen=True)
class RemoteFile:
    name: str          # file name as published
    url: str | None    # official download address (None: no direct download)
    sha256: str        # of the file's decompressed content


@dataclass
class Dataset:
    """A named dataset: a training table, an optional test table and its task."""

    name: str
    train: Table
    test: Table | None
    task: str                 # "binary", "multiclass" or "regression"
    classes: list | None = None

    @property
    def n_classes(self) -> int:
        return len(self.classes) if self.classes is not None else 1


_FILES = {
    "a9a": [RemoteFile("a9a", LIBSVM_URL + "a9a",
                       "f5d5ffd8d865ff41328e7ee043e4b020816914ff6843ff15b98905ddbedce906"),
            RemoteFile("a9a.t", LIBSVM_URL + "a9a.t",
                       "1f448a153f0320399a7e40836eb207655b0bde0f21fc941cc472193daa9f5de9")],
    "cod-rna": [RemoteFile("cod-rna", LIBSVM_URL + "cod-rna",
                           "65b7cc0689fc29bba5db8b50fab0b6446d985f4bf8f6f5dd474f7df8b2f1ab6c"),
                RemoteFile("cod-rna.t", LIBSVM_URL + "cod-rna.t",
                           "58cff16df896436b06343df78ccaef37a6979d819abbcadbec3cb16b93938df6")],
    "adult": [RemoteFile("adult.data", UCI_URL + "adult/adult.data",
                         "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d"),
              RemoteFile("adult.test", UCI_URL + "adult/adult.test",
                         "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05")],
    "spambase": [RemoteFile("spambase.data", UCI_URL + "spambase/spambase.data",
                            "b1ef93de71f97714d3d7d4f58fc9f718da7bbc8ac8a150eff2778616a8097b12")],
    "ionosphere": [RemoteFile("ionosphere.data", UCI_URL + "ionosphere/ionosphere.data",
                              "46d52186b84e20be52918adb93e8fb9926b34795ff7504c24350ae0616a04bbd")],
    # UCI ships waveform only as a .Z archive inside a zip, with no published checksum
    "waveform": [RemoteFile("waveform.data", None,
                            "da332f3121943f586826f5d1b2cdd354548c59f71ddbf28c4d0c2eb623d7bfc3")],
    "kddcup99": [RemoteFile("kddcup.data_10_percent", "http://kdd.ics.uci.edu/databases/kddcup99/"
                            "kddcup.data_10_percent.gz",
                            "f8c8267ebcd9c0ed1fd7d6277fe5bfff8732e9b7db8e61b873542b2a534b6f9a")],
}
_HOMEPAGES = {
    "a9a": "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html#a9a",
    "cod-rna": "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html#cod-rna",
    "adult": "https://archive.ics.uci.edu/dataset/2/adult",
    "spambase": "https://archive.ics.uci.edu/dataset/94/spambase",
    "ionosphere": "https://archive.ics.uci.edu/dataset/52/ionosphere",
    "waveform": "https://archive.ics.uci.edu/dataset/107/waveform+database+generator+version+1",
    "kddcup99": "https://kdd.ics.uci.edu/databases/kddcup99/kddcup99.html",
}


def available_datasets() -> list[str]:
    return sorted(_FILES)


def data_dir() -> Path:
    env = os.environ.get("FEDGROVE_DATA_DIR")
    if env:
        return Path(env).expanduser()  # "~/data" written in an env file, where no shell expands it
    here = Path(__file__).resolve()
    for candidate in (Path.cwd() / ".." / "shared" / "data", here.parents[3] / ".." / "shared" / "data"):
        if candidate.is_dir():
            return candidate.resolve()
    return Path.home() / ".cache" / "fedgrove" / "data"


def dataset_remote_files(name: str) -> list[RemoteFile]:
    if name not in _FILES:
        raise DataError(f"unknown dataset {name!r}; available: {', '.join(available_datasets())}")
    return list(_FILES[name])


def dataset_homepage(name: str) -> str:
    return _HOMEPAGES[name]


def find_file(directory: Path, f: RemoteFile) -> Path | None:
    """The file as published, or gzipped, in ``directory``; None when neither is there."""
    for candidate in (directory / f.name, directory / (f.name + ".gz")):
        if candidate.exists():
            return candidate
    return None


def _sha256_of(path: Path) -> str:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def download_file(f: RemoteFile, directory: Path, url: str | None = None) -> Path:
    """Fetch ``f`` into ``directory``; keep it only if its SHA-256 matches."""
    url = url or f.url
    if url is None:
        raise DataError(f"{f.name} has no direct download; get it from its home page")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / (f.name + ".gz" if url.endswith(".gz") else f.name)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{f.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(tmp)
    try:
        try:
            with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(resp, out)
        except OSError as exc:
            raise DataError(f"download of {url} failed: {exc}") from None
        tmp_named = tmp.with_name(tmp.name + (".gz" if target.name.endswith(".gz") else ""))
        tmp.rename(tmp_named)
        tmp = tmp_named
        got = _sha256_of(tmp)
        if got != f.sha256:
            raise DataError(f"checksum mismatch for {url}: expected sha256 {f.sha256}, got {got}; file discarded")
        os.replace(tmp, target)
        return target
    finally:
        if tmp.exists():
            tmp.unlink()


def dataset_files(name: str, directory: Path | None = None, download: bool = False,
                  base_url: str | None = None) -> list[Path]:
    """Paths of the dataset's files, downloading missing ones when asked."""
    files = dataset_remote_files(name)
    directory = Path(directory or data_dir()) / name
    paths = []
    for f in files:
        path = find_file(directory, f)
        if path is None:
            if download:
                path = fetch_file(name, f, directory, base_url)
            else:
                get = (f"Get it from {f.url} (or run `fedgrove datasets download {name}`)" if f.url else
                       f"Get it from {_HOMEPAGES[name]} (no direct download)")
                raise DataError(f"dataset {name!r}: file {f.name!r} not found in {str(directory)!r}. {get}, or "
                                f"point FEDGROVE_DATA_DIR at a directory that has {name}/{f.name}[.gz]")
        paths.append(path)
    return paths


def fetch_file(name: str, f: RemoteFile, directory: Path, base_url: str | None = None) -> Path:
    """Download one file of dataset ``name`` from its official source (or ``base_url`` + its name)."""
    if base_url:
        return download_file(f, directory, base_url.rstrip("/") + "/" + f.name)
    if f.url is None:
        raise DataError(f"dataset {name!r}: {f.name} has no direct download; get it from {_HOMEPAGES[name]} and "
                        f"put it in {str(directory)!r}")
    return download_file(f, directory)


def _libsvm(path: Path, n_features: int) -> Table:
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(path), n_features=n_features)
    return Table(X.toarray(), (y > 0).astype(np.float64), [f"f{j + 1}" for j in range(n_features)], "label")


_ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
                  "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week", "native_country"]
_KDD_CATEGORICAL = [1, 2, 3]
# the columns' names as UCI's kddcup.names and spambase.names give them
_KDD_COLUMNS = ["duration", "protocol_type", "service", "flag", "src_bytes", "dst_bytes", "land", "wrong_fragment",
                "urgent", "hot", "num_failed_logins", "logged_in", "num_compromised", "root_shell", "su_attempted",
                "num_root", "num_file_creations", "num_shells", "num_access_files", "num_outbound_cmds",
                "is_host_login", "is_guest_login", "count", "srv_count", "serror_rate", "srv_serror_rate",
                "rerror_rate", "srv_rerror_rate", "same_srv_rate", "diff_srv_rate", "srv_diff_host_rate",
                "dst_host_count", "dst_host_srv_count", "dst_host_same_srv_rate", "dst_host_diff_srv_rate",
                "dst_host_same_src_port_rate", "dst_host_srv_diff_host_rate", "dst_host_serror_rate",
                "dst_host_srv_serror_rate", "dst_host_rerror_rate", "dst_host_srv_rerror_rate"]
_SPAM_WORDS = ("make address all 3d our over remove internet order mail receive will people report addresses free "
               "business email you credit your font 000 money hp hpl george 650 lab labs telnet 857 data 415 85 "
               "technology 1999 parts pm direct cs meeting original project re edu table conference").split()
_SPAM_COLUMNS = ([f"word_freq_{w}" for w in _SPAM_WORDS] + [f"char_freq_{c}" for c in ";([!$#"]
                 + [f"capital_run_length_{s}" for s in ("average", "longest", "total")])


def _encode_categoricals(frames: list[pd.DataFrame], columns) -> None:
    """Ordinal codes shared by all frames (categories sorted); missing stays NaN."""
    for col in columns:
        cats = sorted(set().union(*[set(f[col].dropna().unique()) for f in frames]))
        for f in frames:
            f[col] = pd.Categorical(f[col], categories=cats).codes.astype(np.float64)
            f.loc[f[col] < 0, col] = np.nan


def load_dataset(name: str, directory=None, download: bool = False, base_url: str | None = None) -> Dataset:
    """Load a named dataset: a9a, adult, cod-rna, spambase, ionosphere, waveform, kddcup99.

    Labels are 0..K-1 (``classes`` lists the original label of each code).
    Categorical columns (adult, kddcup99) become ordinal codes.
    """
    paths = dataset_files(name, directory, download, base_url)
    if name == "a9a":
        return Dataset(name, _libsvm(paths[0], 123), _libsvm(paths[1], 123), "binary", [-1, 1])
    if name == "cod-rna":
        return Dataset(name, _libsvm(paths[0], 8), _libsvm(paths[1], 8), "binary", [-1, 1])
    if name == "adult":
        read = dict(header=None, names=_ADULT_COLUMNS + ["income"], skipinitialspace=True, na_values=["?"])
        train = read_csv(paths[0], **read)
        test = read_csv(paths[1], skiprows=1, **read)
        train, test = train.dropna(subset=["income"]), test.dropna(subset=["income"])
        cat_cols = [c for c in _ADULT_COLUMNS if not pd.api.types.is_numeric_dtype(train[c])]
        _encode_categoricals([train, test], cat_cols)
        tables = []
        for df in (train, test):
            y = df.pop("income").str.rstrip(".").map({"<=50K": 0.0, ">50K": 1.0}).to_numpy()
            tables.append(Table(df.to_numpy(np.float64), y, list(df.columns), "income"))
        return Dataset(name, tables[0], tables[1], "binary", ["<=50K", ">50K"])
    if name == "spambase":
        d = read_csv(paths[0], header=None).to_numpy(np.float64)
        return Dataset(name, Table(d[:, :-1], d[:, -1], list(_SPAM_COLUMNS), "spam"), None, "binary", [0, 1])
    if name == "ionosphere":
        d = read_csv(paths[0], header=None)
        y = (d.pop(34) == "g").to_numpy(np.float64)
        return Dataset(name, Table(d.to_numpy(np.float64), y, [f"f{j}" for j in range(34)], "class"), None, "binary",
                       ["b", "g"])
    if name == "waveform":
        d = read_csv(paths[0], header=None).to_numpy(np.float64)
        return Dataset(name, Table(d[:, :-1], d[:, -1], [f"f{j}" for j in range(21)], "class"), None, "multiclass",
                       [0, 1, 2])
    if name == "kddcup99":
        d = read_csv(paths[0], header=None)
        label = d.pop(41).str.rstrip(".")
        _encode_categoricals([d], _KDD_CATEGORICAL)
        classes = sorted(label.unique())
        y = pd.Categorical(label, categories=classes).codes.astype(np.float64)
        return Dataset(name, Table(d.to_numpy(np.float64), y, list(_KDD_COLUMNS), "label"), None,
                       "multiclass", classes)
    raise DataError(f"unknown dataset {name!r}")  # unreachable: dataset_files checked the name
