"""attnlab.data.download against a local HTTP server (127.0.0.1 only) serving small fakes."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import tarfile
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import attnlab
from attnlab.cli import main
from attnlab.data import download as dl
from attnlab.errors import InputError

from refusals import one_line


MR_PATH = "people/pabo/movie-review-data/rt-polaritydata.tar.gz"
M30K_PATH = "multi30k/dataset/raw/master/data/task1/raw"
POS = "the rock is destined to be great .\nsimply a joy \xe9 .\n".encode("latin-1")
NEG = "simplistic , silly and tedious .\n".encode("latin-1")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class RangeHandler(SimpleHTTPRequestHandler):
    """Serves files from ``directory``; honours ``Range: bytes=N-`` with 206 unless
    ``server.ignore_range``. Records (path, Range header) in ``server.seen``."""

    def do_GET(self):
        rng = self.headers.get("Range")
        self.server.seen.append((self.path, rng))
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start = 0
        if rng and rng.startswith("bytes=") and rng.endswith("-") and not self.server.ignore_range:
            start = int(rng[6:-1])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "remote"
    root.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(RangeHandler, directory=str(root)))
    httpd.seen, httpd.ignore_range, httpd.root = [], False, root
    httpd.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def put(server, rel: str, data: bytes) -> None:
    path = server.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def patch_spec(monkeypatch, name, **changes):
    monkeypatch.setitem(dl.DATASETS, name, dataclasses.replace(dl.DATASETS[name], **changes))


@pytest.fixture
def fake_mr(server, monkeypatch):
    data = make_tar({
        "rt-polaritydata.README.1.0.txt": b"readme\n",
        "rt-polaritydata/rt-polarity.pos": POS,
        "rt-polaritydata/rt-polarity.neg": NEG,
    })
    put(server, MR_PATH, data)
    spec = dl.DATASETS["mr"]
    patch_spec(monkeypatch, "mr",
               files=(dataclasses.replace(spec.files[0], sha256=sha(data)),),
               member_sha256={"rt-polarity.pos": sha(POS), "rt-polarity.neg": sha(NEG)})
    return data


@pytest.fixture
def fake_multi30k(server, monkeypatch):
    contents = {}
    for remote in dl.DATASETS["multi30k"].files:
        fname = remote.dest.split("/")[-1]
        contents[fname] = gzip.compress(f"line of {fname}\n".encode() * 200, mtime=0)
        put(server, f"{M30K_PATH}/{fname}", contents[fname])
    files = tuple(dataclasses.replace(r, sha256=sha(contents[r.dest.split("/")[-1]]) if r.sha256 else None)
                  for r in dl.DATASETS["multi30k"].files)
    patch_spec(monkeypatch, "multi30k", files=files)
    return contents


def test_registry_and_list(tmp_path):
    assert set(dl.DATASETS) == {"cifar10", "mr", "multi30k", "tinyshakespeare", "vader"}
    assert len(dl.DATASETS["multi30k"].files) == 12
    assert sum(r.sha256 is not None for r in dl.DATASETS["multi30k"].files) == 1
    rows = dl.list_datasets(tmp_path)
    assert [(n, p) for n, _, p in rows] == [("cifar10", False), ("mr", False), ("multi30k", False),
                                            ("tinyshakespeare", False), ("vader", False)]
    assert all(d for _, d, _ in rows)


def test_the_tiny_shakespeare_checksum_is_that_of_the_shared_copy():
    import os

    from attnlab.io import sha256_file

    copy = Path(os.environ.get("ATTNLAB_DATA_DIR", "/nonexistent")) / "tinyshakespeare" / "input.txt"
    if not copy.is_file():
        pytest.skip("no copy of Tiny Shakespeare under ATTNLAB_DATA_DIR to check the checksum against")
    [remote] = dl.DATASETS["tinyshakespeare"].files
    assert (sha256_file(copy), copy.stat().st_size) == (remote.sha256, remote.size)


def test_vader_is_downloaded_as_the_registry_serves_it_and_read_where_it_lies(tmp_path, server):
    from attnlab.data.readers.vader import VADER_FILE, load_vader, vader_archive

    try:
        archive = vader_archive()
    except FileNotFoundError:
        pytest.skip("vaderSentiment's source archive absent: make models downloads it into .venv/share/attnlab")
    put(server, "packages/source/v/vaderSentiment/" + VADER_FILE, archive.read_bytes())
    out = dl.download("vader", tmp_path / "data", base_url=server.base, progress=None)
    assert sorted(p.name for p in out.iterdir()) == [VADER_FILE]
    assert vader_archive(tmp_path / "data") == out / VADER_FILE
    assert len(load_vader("nyt", tmp_path / "data")[0]) == 2788


def test_mr_download_extracts_then_second_call_fetches_nothing(tmp_path, server, fake_mr):
    msgs = []
    out = dl.download("mr", tmp_path / "data", base_url=server.base, progress=msgs.append)
    assert out == tmp_path / "data" / "mr"
    assert (out / "rt-polarity.pos").read_bytes() == POS and (out / "rt-polarity.neg").read_bytes() == NEG
    assert server.seen == [(f"/{MR_PATH}", None)]
    # no tarball, .part or temporary folder left behind
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["mr"]
    assert {n: p for n, _, p in dl.list_datasets(tmp_path / "data")} == {"cifar10": False, "mr": True, "multi30k": False,
                                                                   "tinyshakespeare": False, "vader": False}

    msgs.clear()
    assert dl.download("mr", tmp_path / "data", base_url=server.base, progress=msgs.append) == out
    assert len(server.seen) == 1
    assert any("already present" in m for m in msgs)


def test_multi30k_files_and_env_data_dir(tmp_path, server, fake_multi30k, monkeypatch):
    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(tmp_path / "env"))
    out = dl.download("multi30k", base_url=server.base, progress=None)
    assert out == tmp_path / "env" / "multi30k"
    assert sorted(p.name for p in out.iterdir()) == sorted(fake_multi30k)
    for fname, data in fake_multi30k.items():
        assert (out / fname).read_bytes() == data
    assert len(server.seen) == 12
    dl.download("multi30k", base_url=server.base, progress=None)
    assert len(server.seen) == 12


def test_checksum_mismatch_raises_and_keeps_nothing(tmp_path, server, fake_multi30k, monkeypatch):
    files = dl.DATASETS["multi30k"].files
    bad = tuple(dataclasses.replace(r, sha256="0" * 64) if r.dest.endswith("train.de.gz") else r for r in files)
    patch_spec(monkeypatch, "multi30k", files=bad)
    with pytest.raises(ValueError) as err:
        dl.download("multi30k", tmp_path, base_url=server.base, progress=None)
    msg = str(err.value)
    assert "train.de.gz" in msg and "0" * 64 in msg and sha(fake_multi30k["train.de.gz"]) in msg
    assert not (tmp_path / "multi30k" / "train.de.gz").exists()
    assert not (tmp_path / "multi30k" / "train.de.gz.part").exists()


def test_member_checksum_mismatch_in_tarball(tmp_path, server, fake_mr, monkeypatch):
    patch_spec(monkeypatch, "mr", member_sha256={"rt-polarity.pos": "1" * 64})
    with pytest.raises(ValueError, match="rt-polarity.pos: sha256 mismatch"):
        dl.download("mr", tmp_path / "data", base_url=server.base, progress=None)
    assert list((tmp_path / "data").iterdir()) == []  # neither the tarball nor a partial mr/


@pytest.mark.parametrize("ignore_range", [False, True])
def test_interrupted_download_resumes_with_range(tmp_path, server, fake_mr, ignore_range):
    server.ignore_range = ignore_range
    half = len(fake_mr) // 2
    (tmp_path / "rt-polaritydata.tar.gz.part").write_bytes(fake_mr[:half])
    msgs = []
    out = dl.download("mr", tmp_path, base_url=server.base, progress=msgs.append)
    assert server.seen == [(f"/{MR_PATH}", f"bytes={half}-")]
    assert (out / "rt-polarity.pos").read_bytes() == POS
    assert not (tmp_path / "rt-polaritydata.tar.gz.part").exists()
    expected = "ignored the resume request" if ignore_range else f"resuming at {half:,} bytes"
    assert any(expected in m for m in msgs)


def test_resume_of_plain_file_gives_exact_bytes(tmp_path, server, fake_multi30k):
    data = fake_multi30k["train.de.gz"]
    (tmp_path / "multi30k").mkdir()
    (tmp_path / "multi30k" / "train.de.gz.part").write_bytes(data[: len(data) // 2])
    dl.download("multi30k", tmp_path, base_url=server.base, progress=None)
    assert (tmp_path / "multi30k" / "train.de.gz").read_bytes() == data
    assert (f"/{M30K_PATH}/train.de.gz", f"bytes={len(data) // 2}-") in server.seen


@pytest.mark.parametrize("member", ["../evil", "rt-polaritydata/../../evil", "/tmp/evil"])
def test_path_traversal_member_is_refused(tmp_path, server, monkeypatch, member):
    data = make_tar({"rt-polaritydata/rt-polarity.pos": POS, "rt-polaritydata/rt-polarity.neg": NEG, member: b"x"})
    put(server, MR_PATH, data)
    patch_spec(monkeypatch, "mr", member_sha256={})
    root = tmp_path / "data"
    with pytest.raises(ValueError, match="refusing member"):
        dl.download("mr", root, base_url=server.base, progress=None)
    assert not (tmp_path / "evil").exists() and not (root / "mr").exists()
    assert [p.name for p in root.iterdir()] == []  # tarball and temporary folder removed


def test_symlink_member_is_refused(tmp_path, server, monkeypatch):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("rt-polaritydata/rt-polarity.pos")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    put(server, MR_PATH, buf.getvalue())
    with pytest.raises(ValueError, match="not a plain file"):
        dl.download("mr", tmp_path, base_url=server.base, progress=None)


def test_unknown_name_lists_choices(tmp_path):
    with pytest.raises(ValueError, match="unknown data set 'imagenet'; choose from: cifar10, mr, multi30k"):
        dl.download("imagenet", tmp_path)


def test_http_error_is_a_one_line_value_error(tmp_path, server):
    with pytest.raises(ValueError, match="could not download .*404"):
        dl.download("mr", tmp_path, base_url=server.base, progress=None)


def test_cifar10_tarball_lands_in_batches_folder(tmp_path, server, monkeypatch):
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta", "readme.html"]
    data = make_tar({f"cifar-10-batches-py/{n}": n.encode() for n in names})
    put(server, "~kriz/cifar-10-python.tar.gz", data)
    spec = dl.DATASETS["cifar10"]
    patch_spec(monkeypatch, "cifar10", files=(dataclasses.replace(spec.files[0], sha256=sha(data), size=len(data)),))
    out = dl.download("cifar10", tmp_path, base_url=server.base, progress=None)
    assert out == tmp_path / "cifar-10-batches-py"
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-10-batches-py", "remote"]


def test_cifar10_image_folder_layout_counts_as_present(tmp_path):
    from attnlab.data.download import DATASETS

    assert not DATASETS["cifar10"].present(tmp_path)
    (tmp_path / "cifar10" / "train").mkdir(parents=True)
    assert DATASETS["cifar10"].present(tmp_path)


CIFAR_PATH = "~kriz/cifar-10-python.tar.gz"
CIFAR_NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]


@pytest.fixture
def fake_cifar10(server, monkeypatch):
    data = make_tar({f"cifar-10-batches-py/{n}": f"good {n}".encode() for n in CIFAR_NAMES})
    put(server, CIFAR_PATH, data)
    spec = dl.DATASETS["cifar10"]
    patch_spec(monkeypatch, "cifar10", files=(dataclasses.replace(spec.files[0], sha256=sha(data), size=len(data)),))
    return data


def test_tampered_archive_at_destination_is_replaced_by_a_verified_download(tmp_path, server, fake_cifar10):
    tampered = bytearray(fake_cifar10)  # of the right size: only its sha256 tells
    tampered[len(tampered) // 2] ^= 0xFF
    tampered = bytes(tampered)
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(tampered)
    msgs = []
    out = dl.download("cifar10", tmp_path, base_url=server.base, progress=msgs.append)
    assert all((out / n).read_bytes() == f"good {n}".encode() for n in CIFAR_NAMES)
    assert server.seen == [(f"/{CIFAR_PATH}", None)]
    said = [m for m in msgs if "sha256" in m and "cifar-10-python.tar.gz" in m]
    assert len(said) == 1 and sha(tampered) in said[0] and sha(fake_cifar10) in said[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-10-batches-py", "remote"]


def test_verified_archive_at_destination_is_extracted_without_downloading(tmp_path, server, fake_cifar10):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(fake_cifar10)
    msgs = []
    out = dl.download("cifar10", tmp_path, base_url=server.base, progress=msgs.append)
    assert all((out / n).read_bytes() == f"good {n}".encode() for n in CIFAR_NAMES)
    assert server.seen == []
    assert any("cifar-10-python.tar.gz" in m and "sha256 matches" in m for m in msgs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-10-batches-py", "remote"]


def test_tampered_archive_whose_fresh_download_is_also_wrong_raises(tmp_path, server, fake_cifar10, monkeypatch):
    spec = dl.DATASETS["cifar10"]
    patch_spec(monkeypatch, "cifar10", files=(dataclasses.replace(spec.files[0], sha256="2" * 64),))
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"left over")
    with pytest.raises(ValueError, match="cifar-10-python.tar.gz: sha256 mismatch") as info:
        dl.download("cifar10", tmp_path, base_url=server.base, progress=None)
    assert sha(fake_cifar10) in str(info.value) and len(server.seen) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["remote"]


def test_unchecked_mr_tarball_at_destination_is_still_extracted(tmp_path, server, fake_mr, monkeypatch):
    spec = dl.DATASETS["mr"]
    patch_spec(monkeypatch, "mr", files=(dataclasses.replace(spec.files[0], sha256=None),))
    (tmp_path / "rt-polaritydata.tar.gz").write_bytes(fake_mr)
    out = dl.download("mr", tmp_path, base_url=server.base, progress=None)
    assert (out / "rt-polarity.pos").read_bytes() == POS and server.seen == []


# --- archives are checked before, and bounded while, they are extracted -----------------


def test_the_published_cifar10_size_and_the_extraction_limits():
    cifar = dl.DATASETS["cifar10"]
    assert cifar.files[0].size == 170_498_071
    assert cifar.files[0].sha256 == "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
    assert cifar.max_extracted_bytes == int((6 * 31_035_704 + 4_096) * 1.1) + 2**20 == 205_888_728
    assert dl.DATASETS["mr"].max_extracted_bytes == int((626_139 + 612_256 + 16_384) * 1.1) + 2**20 == 2_428_832
    assert dl.MAX_MEMBERS == 300


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_gzip_bomb_is_refused_at_the_limit_leaving_nothing(tmp_path, server, monkeypatch):
    bomb = make_tar({"rt-polaritydata/rt-polarity.pos": bytes(50_000_000)})  # 50 MB of zeros, ~50 KB gzipped
    assert len(bomb) < 200_000
    put(server, MR_PATH, bomb)
    patch_spec(monkeypatch, "mr", max_extracted_bytes=3_000_000)
    root = tmp_path / "data"
    start = time.perf_counter()
    with pytest.raises(dl.DownloadError) as info:
        dl.download("mr", root, base_url=server.base, progress=None)
    assert time.perf_counter() - start < 2.0
    message = str(info.value)
    assert message.startswith("rt-polaritydata.tar.gz: refusing to extract it, a damaged or malicious archive")
    assert "'rt-polaritydata/rt-polarity.pos' declares 50,000,000 bytes" in message and "3,000,000 bytes" in message
    assert list(root.iterdir()) == [] and _tree_bytes(tmp_path) - len(bomb) < 100_000


def test_extraction_stops_at_the_limit_while_writing(tmp_path, server, monkeypatch):
    members = {f"rt-polaritydata/part{i}": bytes(400_000) for i in range(10)}  # 4 MB in all, 400 KB each
    put(server, MR_PATH, make_tar(members))
    patch_spec(monkeypatch, "mr", max_extracted_bytes=1_000_000)
    written = []
    real_copy = dl._copy_member
    monkeypatch.setattr(dl, "_copy_member", lambda *a: written.append(real_copy(*a)) or written[-1])
    with pytest.raises(dl.DownloadError, match=r"'rt-polaritydata/part2' declares 400,000 bytes, 1,200,000 with the "
                                               r"members before it, while mr extracts to at most 1,000,000 bytes"):
        dl.download("mr", tmp_path / "data", base_url=server.base, progress=None)
    assert written == [400_000, 400_000] and list((tmp_path / "data").iterdir()) == []


def test_a_huge_tar_header_is_refused_without_reading_it_whole(tmp_path, server, monkeypatch):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("rt-polaritydata/rt-polarity.pos")
        info.pax_headers = {"comment": "x" * 20_000_000}  # read into memory whole by tarfile, if let
        info.size = len(POS)
        tar.addfile(info, io.BytesIO(POS))
    put(server, MR_PATH, buf.getvalue())
    patch_spec(monkeypatch, "mr", max_extracted_bytes=1_000_000)
    with pytest.raises(dl.DownloadError, match=r"it decompresses to more than 2,048,576 bytes"):
        dl.download("mr", tmp_path / "data", base_url=server.base, progress=None)
    assert list((tmp_path / "data").iterdir()) == []


def test_an_archive_of_too_many_members_is_refused(tmp_path, server, monkeypatch):
    put(server, MR_PATH, make_tar({f"rt-polaritydata/f{i}": b"" for i in range(301)}))
    with pytest.raises(dl.DownloadError, match="refusing to extract it, a damaged or malicious archive: it holds more "
                                               "than 300 members"):
        dl.download("mr", tmp_path / "data", base_url=server.base, progress=None)
    assert list((tmp_path / "data").iterdir()) == []


def test_an_archive_of_the_wrong_size_is_refused_before_it_is_downloaded(tmp_path, server, fake_cifar10, monkeypatch):
    spec = dl.DATASETS["cifar10"]
    patch_spec(monkeypatch, "cifar10", files=(dataclasses.replace(spec.files[0], size=len(fake_cifar10) + 1),))
    with pytest.raises(dl.DownloadError, match=rf"the server offers {len(fake_cifar10):,} bytes, but the published "
                                               rf"file has {len(fake_cifar10) + 1:,}"):
        dl.download("cifar10", tmp_path, base_url=server.base, progress=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["remote"]


def test_an_archive_of_the_wrong_size_at_the_destination_is_downloaded_again_unhashed(tmp_path, server, fake_cifar10,
                                                                                     monkeypatch):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"left over")
    hashed = []
    real_sha = dl.sha256_file
    monkeypatch.setattr(dl, "sha256_file", lambda path: hashed.append(Path(path).name) or real_sha(path))
    msgs = []
    out = dl.download("cifar10", tmp_path, base_url=server.base, progress=msgs.append)
    assert (out / "test_batch").read_bytes() == b"good test_batch"
    assert any(f"9 bytes in the file already there, expected {len(fake_cifar10):,}" in m for m in msgs)
    assert hashed == ["cifar-10-python.tar.gz.part"]  # the fresh download only


def test_a_wrong_archive_sha256_is_refused_before_any_extraction(tmp_path, server, fake_cifar10, monkeypatch):
    spec = dl.DATASETS["cifar10"]
    patch_spec(monkeypatch, "cifar10", files=(dataclasses.replace(spec.files[0], sha256="3" * 64),))
    made = []
    real_mkdtemp = dl.tempfile.mkdtemp
    monkeypatch.setattr(dl.tempfile, "mkdtemp", lambda *a, **k: made.append(k) or real_mkdtemp(*a, **k))
    with pytest.raises(dl.DownloadError, match="cifar-10-python.tar.gz: sha256 mismatch"):
        dl.download("cifar10", tmp_path, base_url=server.base, progress=None)
    assert made == [] and sorted(p.name for p in tmp_path.iterdir()) == ["remote"]


@pytest.mark.skipif(not os.environ.get("ATTNLAB_DATA_DIR") or
                    not (Path(os.environ.get("ATTNLAB_DATA_DIR", "")) / "mr" / "rt-polarity.pos").is_file(),
                    reason="real MR absent: set ATTNLAB_DATA_DIR to a folder holding mr/")
def test_the_real_mr_files_fit_the_real_limits(tmp_path, server):
    real = Path(os.environ["ATTNLAB_DATA_DIR"]) / "mr"
    names = ("rt-polarity.pos", "rt-polarity.neg")
    put(server, MR_PATH, make_tar({"rt-polaritydata.README.1.0.txt": b"readme\n" * 500,
                                   **{f"rt-polaritydata/{n}": (real / n).read_bytes() for n in names}}))
    out = dl.download("mr", tmp_path / "data", base_url=server.base, progress=None)
    assert [(out / n).stat().st_size for n in names] == [626_139, 612_256]


# ---------------------------------------------------------------------------- --base-url


@pytest.mark.parametrize("url", ["nota url", "ftp://mirror.example.org/data", "http://", "http://127.0.0.1:port",
                                 "/srv/mirror"])
def test_a_base_url_that_is_not_a_url_is_refused_naming_base_url(tmp_path, capsys, url):
    data = tmp_path / "data"
    assert main(["data", "download", "mr", "--data-dir", str(data), "--base-url", url]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("attnlab data: error: --base-url must be an http://, https:// or file:// URL")
    assert repr(url) in line
    assert not data.exists()  # refused before anything was made
    with pytest.raises(InputError, match=r"^base_url must be an http://, https:// or file:// URL .*got "):
        attnlab.data.download.download("mr", data, base_url=url, progress=None)
    assert not data.exists()
