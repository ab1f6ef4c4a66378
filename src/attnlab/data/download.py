"""Fetch the public data sets that attnlab's loaders read, into the data directory.

Standard library only (``urllib.request``, ``hashlib``, ``tarfile``). Every file is
downloaded to ``<file>.part`` (resumed with an HTTP ``Range`` request when a ``.part``
is left from an interrupted run), checked against its sha256 when one is known, and
renamed into place only when whole. An archive already at its destination (left by an
earlier run) is checked against its sha256 too before it is extracted, and downloaded
again when it does not match; so is its size, when known, before it is downloaded (from
the server's ``Content-Length``) and before it is hashed. Tarballs are extracted one
member at a time into a temporary folder next to the target and the folder is then
renamed into place; members with absolute paths, ``..`` components, links or device
files are refused, and so is an archive that holds more members, or more bytes once
decompressed, than its data set can (a decompression bomb is stopped at that limit,
not after it filled the disk).

>>> download("mr", "~/data")        # doctest: +SKIP
PosixPath('/home/me/data/mr')
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Mapping

from ..errors import InputError
from ..io import sha256_file
from .paths import data_dir as _resolve_data_dir

__all__ = ["RemoteFile", "DatasetSpec", "DATASETS", "DownloadError", "download", "list_datasets", "check_base_url"]

_CHUNK = 1 << 20
_TIMEOUT_S = 60
# The most members an archive may hold: MR's has 3 files, CIFAR-10's 8 (and their folders).
MAX_MEMBERS = 300
# What tar adds to the members' bytes once decompressed: a 512-byte header per member (more
# for long names), padding to 512 bytes and the end-of-archive blocks.
_TAR_OVERHEAD = 1 << 20
_NO_LIMIT = 1 << 62  # (bytes: an archive of a data set with no max_extracted_bytes)


def extracted_limit(member_bytes: int) -> int:
    """The most bytes an archive whose members add up to ``member_bytes`` may extract to:
    10% more and 1 MiB, so that a new README does not break the download."""
    return int(member_bytes * 1.1) + (1 << 20)


class DownloadError(InputError):
    """A download or extraction failed; the message is one line meant for the user."""


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch: its canonical ``url``, where it lands (``dest``, relative to
    the data directory), its sha256 and its size in bytes (``None``: not checked)."""

    url: str
    dest: str
    sha256: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """A data set: ``files`` are downloaded; when ``archive_root`` is set they are
    tarballs whose folder ``archive_root`` becomes ``<data_dir>/<target>`` (and the
    tarball is deleted after extraction). ``member_sha256`` checks extracted files
    (paths relative to ``target``). ``required`` (relative to ``target``) decides
    :meth:`present`, as does any folder in ``equivalents`` (another layout of the same
    data that the loaders also read, e.g. CIFAR-10 as image folders). ``max_extracted_bytes``
    bounds what the archive may extract to (see :func:`extracted_limit`; ``None``: only
    :data:`MAX_MEMBERS` is checked)."""

    name: str
    description: str
    target: str
    files: tuple[RemoteFile, ...]
    required: tuple[str, ...]
    archive_root: str | None = None
    member_sha256: Mapping[str, str] = field(default_factory=dict)
    equivalents: tuple[str, ...] = ()
    max_extracted_bytes: int | None = None

    def path(self, data_dir: str | Path | None = None) -> Path:
        return _resolve_data_dir(data_dir) / self.target

    def present(self, data_dir: str | Path | None = None) -> bool:
        root = self.path(data_dir)
        if any((_resolve_data_dir(data_dir) / alt).is_dir() for alt in self.equivalents):
            return True
        return all((root / rel).is_file() for rel in self.required)


_MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"
_MULTI30K_SHA256 = {"train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"}
_MULTI30K_FILES = tuple(
    f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en", "fr", "cs")
)
_CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
# cifar-10-batches-py/: data_batch_1..5 and test_batch of about 31,035,704 bytes each, batches.meta
# and readme.html (a few hundred bytes together)
_CIFAR_BYTES = 6 * 31_035_704 + 4_096
# rt-polaritydata/rt-polarity.pos and .neg (the sha256s below are of these sizes) and a README
_MR_BYTES = 626_139 + 612_256 + 16_384

DATASETS: dict[str, DatasetSpec] = {
    "cifar10": DatasetSpec(
        name="cifar10",
        description="CIFAR-10, original pickled batches (170 MB download) -> cifar-10-batches-py/",
        target="cifar-10-batches-py",
        files=(
            RemoteFile(
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                "cifar-10-python.tar.gz",
                # md5 c58f30108f718f92721af3b95e74349a; the sha256 is torchvision's (its
                # prototype datasets' Cifar10 resource), the size that of the published file
                "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
                170_498_071,
            ),
        ),
        required=_CIFAR_BATCHES,
        archive_root="cifar-10-batches-py",
        equivalents=("cifar10/train",),  # the image-folder copy that attnlab.data.CIFAR10 reads too
        max_extracted_bytes=extracted_limit(_CIFAR_BYTES),
    ),
    "mr": DatasetSpec(
        name="mr",
        description="Movie Review sentence polarity v1.0 (Pang & Lee 2005), Latin-1 text -> mr/",
        target="mr",
        files=(
            RemoteFile(
                "https://www.cs.cornell.edu/people/pabo/movie-review-data/rt-polaritydata.tar.gz",
                "rt-polaritydata.tar.gz",
                # No published sha256 or size of this file (Hugging Face's are of a copy on
                # Google storage): the tarball is unchecked, its two files are checked below,
                # and max_extracted_bytes bounds what it may extract to.
                None,
            ),
        ),
        required=("rt-polarity.pos", "rt-polarity.neg"),
        archive_root="rt-polaritydata",
        member_sha256={
            "rt-polarity.pos": "2da124ec187a9d5a29c9f04e91c540e02baed5af8868f550a26bd6fd4dbf8bf0",
            "rt-polarity.neg": "4ace77d558c3714723843f1d65b60c01e3417b208180f0728808d76ad0eeeaca",
        },
        max_extracted_bytes=extracted_limit(_MR_BYTES),
    ),
    "multi30k": DatasetSpec(
        name="multi30k",
        description="Multi30k task 1 captions de/en/fr/cs, train/val/test_2016_flickr (gzip) -> multi30k/",
        target="multi30k",
        files=tuple(
            RemoteFile(_MULTI30K_URL + f, f"multi30k/{f}", _MULTI30K_SHA256.get(f)) for f in _MULTI30K_FILES
        ),
        required=_MULTI30K_FILES,
    ),
    "tinyshakespeare": DatasetSpec(
        name="tinyshakespeare",
        description="Tiny Shakespeare (Karpathy's char-rnn), 1,115,394 characters of plays -> tinyshakespeare/",
        target="tinyshakespeare",
        files=(
            RemoteFile("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
                       "tinyshakespeare/input.txt",
                       "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", 1_115_394),
        ),
        required=("input.txt",),
    ),
    "vader": DatasetSpec(
        name="vader",
        description="VADER's rated sentences (Hutto & Gilbert 2014): Amazon reviews, tweets, NYT editorials, in "
                    "the vaderSentiment 3.3.2 source archive of the Python package registry -> vader/",
        target="vader",
        files=(
            RemoteFile("https://files.pythonhosted.org/packages/source/v/vaderSentiment/vaderSentiment-3.3.2.tar.gz",
                       "vader/vaderSentiment-3.3.2.tar.gz",
                       "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9", 2_466_783),
        ),
        required=("vaderSentiment-3.3.2.tar.gz",),
    ),
}


def list_datasets(data_dir: str | Path | None = None) -> list[tuple[str, str, bool]]:
    """``(name, description, present)`` for every data set, in registry order."""
    return [(s.name, s.description, s.present(data_dir)) for s in DATASETS.values()]


def download(
    name: str,
    data_dir: str | Path | None = None,
    *,
    base_url: str | None = None,
    progress: Callable[[str], object] | None = print,
) -> Path:
    """Fetch data set ``name`` into the data directory and return its folder.

    ``base_url`` (e.g. ``http://127.0.0.1:8000``) replaces the scheme and host of every
    canonical URL, keeping its path: for mirrors and tests. ``progress`` receives
    one-line messages (``None``: silent). A data set already present is not fetched.
    """
    if name not in DATASETS:
        raise InputError(f"unknown data set {name!r}; choose from: {', '.join(DATASETS)}")
    check_base_url(base_url)  # before the data directory is made
    spec = DATASETS[name]
    say = progress if progress is not None else (lambda _msg: None)
    root = _resolve_data_dir(data_dir)
    target = root / spec.target
    if spec.present(root):
        say(f"{name}: already present in {target}; nothing to download")
        return target
    root.mkdir(parents=True, exist_ok=True)
    for remote in spec.files:
        dest = root / remote.dest
        url = _rebase(remote.url, base_url)
        if spec.archive_root is None and dest.is_file():
            say(f"{name}: {dest.name} already present")
            continue
        if dest.is_file() and not _verify_existing(dest, remote, say):
            dest.unlink()  # a tampered or damaged archive: never extract it
        if not dest.is_file():
            _fetch(url, dest, remote, say)
        if spec.archive_root is not None:
            _extract(dest, spec, root, say)
            dest.unlink()
    if not spec.present(root):  # e.g. a tarball that lacks an expected file
        missing = [r for r in spec.required if not (target / r).is_file()]
        raise DownloadError(f"{name}: download finished but {target} lacks {', '.join(missing)}")
    say(f"{name}: ready in {target}")
    return target


def _verify_existing(dest: Path, remote: RemoteFile, say: Callable[[str], object]) -> bool:
    """Whether an archive left at ``dest`` by an earlier run may be used: its size (checked
    first: it costs nothing) and its sha256 must match (an archive with no known sha256 is
    used as is; its members are checked later)."""
    sha256 = remote.sha256
    size = dest.stat().st_size
    if remote.size is not None and size != remote.size:
        say(f"{dest}: {size:,} bytes in the file already there, expected {remote.size:,}; "
            f"deleting it and downloading it again")
        return False
    if sha256 is None:
        say(f"{dest.name}: already downloaded; no known sha256, not checked")
        return True
    try:
        actual = sha256_file(dest)
    except OSError as exc:
        raise DownloadError(f"could not read {dest} to check its sha256: {exc}; delete it and run again") from None
    if actual == sha256.lower():
        say(f"{dest.name}: already downloaded and its sha256 matches; not downloading it again")
        return True
    say(f"{dest}: sha256 mismatch in the file already there: expected {sha256}, got {actual}; "
        f"deleting it and downloading it again")
    return False


def check_base_url(base_url: str | None, name: str = "base_url") -> None:
    """Refuse a ``base_url`` that is not an ``http://``, ``https://`` or ``file://`` URL, in
    one line naming it as ``name`` (``--base-url`` on the command line)."""
    if base_url is None:
        return
    if not isinstance(base_url, str):
        raise InputError(f"{name} must be an http(s) or file URL (a str); got {type(base_url).__name__}")
    parts = urllib.parse.urlsplit(base_url.strip()) if base_url.strip() == base_url else None
    scheme = parts.scheme.lower() if parts else ""
    if scheme in ("http", "https") and parts.hostname and not any(c.isspace() for c in base_url):
        try:
            parts.port  # noqa: B018  # a port that is not a number raises here, not in urlopen
            return
        except ValueError:
            pass
    if scheme == "file" and parts.path and not parts.query and not parts.fragment:
        return
    raise InputError(f"{name} must be an http://, https:// or file:// URL of a mirror (such as http://127.0.0.1:8000"
                     f" or file:///srv/mirror); got {base_url!r}")


def _rebase(url: str, base_url: str | None) -> str:
    if not base_url:
        return url
    path = urllib.parse.urlsplit(url).path
    return base_url.rstrip("/") + path


def _wrong_size(url: str, part: Path, got: str, expected: int) -> DownloadError:
    part.unlink(missing_ok=True)
    return DownloadError(f"could not download {url}: {got}, but the published file has {expected:,}; "
                         f"refusing it (a wrong or tampered file), nothing was kept")


def _fetch(url: str, dest: Path, remote: RemoteFile, say: Callable[[str], object]) -> None:
    """Download ``url`` to ``dest`` via ``dest.part``, resuming a left-over ``.part``; a known
    size is checked against what the server announces, and the download stops past it."""
    sha256, size = remote.sha256, remote.size
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.is_file() else 0
    if size is not None and offset > size:  # a left-over that cannot be a prefix of the file
        part.unlink()
        offset = 0
    request = urllib.request.Request(url, headers={"User-Agent": "attnlab-download"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        try:
            response = urllib.request.urlopen(request, timeout=_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            if exc.code != 416 or not offset:  # 416: the .part is not a prefix we can extend
                raise
            say(f"{dest.name}: server refused to resume; starting over")
            part.unlink()
            offset = 0
            request.remove_header("Range")
            response = urllib.request.urlopen(request, timeout=_TIMEOUT_S)
        with response:
            status = response.status
            if offset and (status != 206 or not _range_starts_at(response.headers.get("Content-Range"), offset)):
                say(f"{dest.name}: server ignored the resume request; downloading the whole file")
                offset = 0
            elif offset:
                say(f"{dest.name}: resuming at {offset:,} bytes")
            length = response.headers.get("Content-Length")
            total = offset + int(length) if length and length.isdigit() else None
            if size is not None and total is not None and total != size:
                raise _wrong_size(url, part, f"the server offers {total:,} bytes", size)
            say(f"downloading {url} -> {dest}" + (f" ({total:,} bytes)" if total else ""))
            with open(part, "ab" if offset else "wb") as f:
                done, next_report = offset, 0.1
                while block := response.read(_CHUNK):
                    f.write(block)
                    done += len(block)
                    if size is not None and done > size:  # a server that announced no length
                        raise _wrong_size(url, part, f"the server sent more than {size:,} bytes", size)
                    if total and done / total >= next_report and done < total:
                        say(f"  {dest.name}: {100 * done // total}% ({done:,} / {total:,} bytes)")
                        next_report = done / total + 0.1
                f.flush()
                os.fsync(f.fileno())
    except (urllib.error.URLError, OSError) as exc:
        kept = f"; the partial file {part} is kept, run again to resume" if part.is_file() else ""
        raise DownloadError(f"could not download {url}: {exc}{kept}") from None
    if total is not None and done != total:
        raise DownloadError(
            f"could not download {url}: got {done:,} of {total:,} bytes; "
            f"the partial file {part} is kept, run again to resume"
        )
    if size is not None and done < size:  # (a server that announced no length, and stopped short)
        raise DownloadError(
            f"could not download {url}: got {done:,} of {size:,} bytes; "
            f"the partial file {part} is kept, run again to resume"
        )
    if sha256 is not None:
        actual = sha256_file(part)
        if actual != sha256.lower():
            part.unlink()
            raise DownloadError(
                f"{dest.name}: sha256 mismatch: expected {sha256}, got {actual}; "
                f"the download was deleted, run again to retry"
            )
    else:
        say(f"{dest.name}: no known sha256, not checked")
    os.replace(part, dest)


def _range_starts_at(content_range: str | None, offset: int) -> bool:
    # "bytes 100-199/200"
    if not content_range or not content_range.startswith("bytes "):
        return False
    first = content_range[6:].split("-", 1)[0].strip()
    return first.isdigit() and int(first) == offset


def _check_member(member: tarfile.TarInfo, archive: Path) -> None:
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise DownloadError(f"{archive.name}: refusing member with an absolute path: {name!r}")
    if ".." in parts or ".." in name.replace("\\", "/").split("/"):
        raise DownloadError(f"{archive.name}: refusing member that leaves the target folder: {name!r}")
    if not (member.isfile() or member.isdir()):
        raise DownloadError(f"{archive.name}: refusing member that is not a plain file or folder: {name!r}")


class _CappedReader:
    """A read-only stream that raises :class:`_Overflow` once more than ``cap`` bytes were read
    from ``raw``: a tar's decompressed bytes, which tarfile otherwise reads without bound (a
    huge pax header, say, is read into memory whole)."""

    def __init__(self, raw: BinaryIO, cap: int) -> None:
        self.raw, self.cap, self.count = raw, cap, 0

    def read(self, n: int = -1) -> bytes:
        room = self.cap - self.count + 1  # one byte more than allowed tells that the cap is passed
        data = self.raw.read(room if n is None or n < 0 else min(n, room))
        self.count += len(data)
        if self.count > self.cap:
            raise _Overflow(f"it decompresses to more than {self.cap:,} bytes")
        return data


class _Overflow(Exception):
    """An archive past its limits (its message says which); becomes a :class:`DownloadError`."""


def _decompressed(archive: Path) -> BinaryIO:
    """``archive`` opened through the decompressor its first bytes name (gzip, bzip2, xz, or none)."""
    with open(archive, "rb") as f:
        magic = f.read(6)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.open(archive, "rb")
    if magic.startswith(b"BZh"):
        return bz2.open(archive, "rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(archive, "rb")
    return open(archive, "rb")


def _copy_member(source: BinaryIO, out: Path, name: str, budget: int) -> int:
    """Copy a member to ``out`` in blocks; the bytes written, at most ``budget`` (else :class:`_Overflow`)."""
    written = 0
    with open(out, "wb") as f:
        while block := source.read(_CHUNK):
            written += len(block)
            if written > budget:
                raise _Overflow(f"member {name!r} wrote more than the {budget:,} bytes left")
            f.write(block)
    return written


def _unpack(archive: Path, dest: Path, limit: int | None) -> None:
    """Extract ``archive`` into ``dest`` one member at a time, checking each before it is written:
    its name and type (:func:`_check_member`), the number of members (:data:`MAX_MEMBERS`), and
    the bytes, declared and written, against ``limit``. Raises :class:`_Overflow` or
    :class:`DownloadError`; what was extracted is left for the caller to delete."""
    limit = _NO_LIMIT if limit is None else limit
    total = 0
    with _decompressed(archive) as raw, tarfile.open(fileobj=_CappedReader(raw, limit + _TAR_OVERHEAD),
                                                     mode="r|") as tar:
        for count, member in enumerate(tar, 1):  # a stream: a header is read once the member before it is done
            if count > MAX_MEMBERS:
                raise _Overflow(f"it holds more than {MAX_MEMBERS} members")
            _check_member(member, archive)
            out = dest.joinpath(*PurePosixPath(member.name).parts)
            if member.isdir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            if total + member.size > limit:
                raise _Overflow(f"member {member.name!r} declares {member.size:,} bytes, {total + member.size:,} "
                                f"with the members before it")
            out.parent.mkdir(parents=True, exist_ok=True)
            total += _copy_member(tar.extractfile(member), out, member.name, limit - total)


def _extract(archive: Path, spec: DatasetSpec, root: Path, say: Callable[[str], object]) -> None:
    """Extract ``archive`` into a temporary folder in ``root``, check it, move it into place."""
    target = root / spec.target
    say(f"extracting {archive.name} -> {target}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", suffix=".extract", dir=root))
    try:
        try:
            _unpack(archive, tmp, spec.max_extracted_bytes)
        except _Overflow as exc:
            archive.unlink(missing_ok=True)  # never keep an archive we refuse to open
            limit = spec.max_extracted_bytes
            most = f"{limit:,} bytes in " if limit is not None else ""
            raise DownloadError(
                f"{archive.name}: refusing to extract it, a damaged or malicious archive: {exc}, while {spec.name} "
                f"extracts to at most {most}{MAX_MEMBERS} members; it was deleted with what it had extracted, "
                f"run again to download it afresh"
            ) from None
        except DownloadError:
            archive.unlink(missing_ok=True)
            raise
        except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
            archive.unlink(missing_ok=True)
            raise DownloadError(f"could not extract {archive.name}: {exc}; it was deleted, run again") from None
        src = tmp / spec.archive_root
        if not src.is_dir():
            archive.unlink(missing_ok=True)
            raise DownloadError(f"{archive.name} has no folder {spec.archive_root!r}; it was deleted, run again")
        for rel, expected in spec.member_sha256.items():
            path = src / rel
            actual = sha256_file(path) if path.is_file() else "(missing)"
            if actual != expected.lower():
                archive.unlink(missing_ok=True)
                raise DownloadError(
                    f"{archive.name}: {rel}: sha256 mismatch: expected {expected}, got {actual}; "
                    f"the download was deleted, run again to retry"
                )
        if not target.exists():
            os.replace(src, target)
        else:  # a partial earlier copy: move the files over it one by one
            for path in sorted(src.rglob("*")):
                if path.is_file():
                    out = target / path.relative_to(src)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(path, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
