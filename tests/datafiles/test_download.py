"""The image datasets fetched on first use (``data.download: true``, issue #52) by torchvision's
own download and md5 checks, served from 127.0.0.1 (tiny files in the real formats; the
torchvision classes' mirrors and md5s patched for the test): never the network."""

from __future__ import annotations

import functools
import hashlib
import http.server
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest
from support.configs import small_config
from support.images import as_official_cifar, write_cifar10, write_emnist, write_fmnist

from raysoft.api import check_data
from raysoft.config import ConfigError, parse_config
from raysoft.datafiles.download import cache_root, download_root, ensure_files


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 serving ``tmp_path/served``; yields (folder, base URL)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.mark.slow  # torchvision's import alone takes seconds on a loaded 2-core machine
def test_fmnist_is_fetched_through_torchvision_then_read(server, tmp_path, monkeypatch):
    from torchvision.datasets import FashionMNIST

    served, url = server
    arrays = write_fmnist(served, gz=True)
    resources = [(f"{name}.gz", md5(served / f"{name}.gz")) for name in arrays]
    monkeypatch.setattr(FashionMNIST, "mirrors", [url])
    monkeypatch.setattr(FashionMNIST, "resources", resources)
    root = tmp_path / "data"
    cfg = check_data(parse_config(small_config(data={"name": "fmnist", "root": str(root), "download": True,
                                                     "distributions": 2}, model={"name": "cnn"})))
    assert cfg.data.root == str(root)
    raw = root / "FashionMNIST" / "raw"
    assert (raw / "train-images-idx3-ubyte").read_bytes()[16:] == arrays["train-images-idx3-ubyte"].tobytes()
    from raysoft.data.images import load_fmnist

    assert (load_fmnist(str(root)).train_y == arrays["train-labels-idx1-ubyte"]).all()
    mtime = (raw / "train-images-idx3-ubyte").stat().st_mtime_ns
    monkeypatch.setattr(FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])  # nothing is fetched a second time
    assert ensure_files("fmnist", str(root)) == str(root)
    assert (raw / "train-images-idx3-ubyte").stat().st_mtime_ns == mtime


@pytest.mark.slow  # torchvision's import alone takes seconds on a loaded 2-core machine
def test_a_wrong_md5_or_no_network_is_one_line_naming_the_folder(server, tmp_path, monkeypatch):
    from torchvision.datasets import FashionMNIST

    served, url = server
    arrays = write_fmnist(served, gz=True)
    monkeypatch.setattr(FashionMNIST, "mirrors", [url])
    monkeypatch.setattr(FashionMNIST, "resources", [(f"{name}.gz", "0" * 32) for name in arrays])
    root = tmp_path / "data"
    raw = small_config(data={"name": "fmnist", "root": str(root), "download": True}, model={"name": "cnn"})
    with pytest.raises(ConfigError, match=rf"^data: fmnist: download into {root} failed \(.*\); without the network, "
                                          rf"put the four Fashion-MNIST IDX files .* in {root} and set data.root"):
        check_data(parse_config(raw))
    monkeypatch.setattr(FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])  # nothing listens: offline
    with pytest.raises(ConfigError, match=r"^data: fmnist: download into .* failed \(.*\); without the network"):
        check_data(parse_config(raw))


@pytest.mark.slow  # torchvision's import alone takes seconds on a loaded 2-core machine
def test_cifar10_archive_is_fetched_and_md5_checked(server, tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    served, url = server
    made = tmp_path / "made"
    write_cifar10(made)
    with tarfile.open(served / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(made / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    folder = made / "cifar-10-batches-py"
    monkeypatch.setattr(CIFAR10, "url", url + "cifar-10-python.tar.gz")
    monkeypatch.setattr(CIFAR10, "tgz_md5", md5(served / "cifar-10-python.tar.gz"))
    monkeypatch.setattr(CIFAR10, "train_list", [[f"data_batch_{i}", md5(folder / f"data_batch_{i}")]
                                                for i in range(1, 6)])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5(folder / "test_batch")]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5(folder / "batches.meta")})
    as_official_cifar(monkeypatch, made, 10)
    monkeypatch.setenv("RAYSOFT_DATA", str(tmp_path / "env"))  # no data.root: $RAYSOFT_DATA
    cfg = check_data(parse_config(small_config(data={"name": "cifar10", "download": True},
                                               model={"name": "cifar_cnn"})))
    assert cfg.data.root == str(tmp_path / "env")
    assert md5(tmp_path / "env" / "cifar-10-batches-py" / "data_batch_3") == md5(folder / "data_batch_3")


@pytest.mark.slow  # torchvision's import alone takes seconds on a loaded 2-core machine
def test_emnist_zip_is_fetched_and_unpacked(server, tmp_path, monkeypatch):
    import gzip

    from torchvision.datasets import EMNIST

    served, url = server
    made = tmp_path / "made"
    write_emnist(made)
    with zipfile.ZipFile(served / "gzip.zip", "w") as z:
        for f in sorted((made / "EMNIST" / "raw").iterdir()):
            z.writestr(f"gzip/{f.name}.gz", gzip.compress(f.read_bytes()))
    monkeypatch.setattr(EMNIST, "url", url + "gzip.zip")
    monkeypatch.setattr(EMNIST, "md5", md5(served / "gzip.zip"))
    root = tmp_path / "data"
    assert ensure_files("emnist_letters", str(root)) == str(root)
    for f in (made / "EMNIST" / "raw").iterdir():
        assert (root / "EMNIST" / "raw" / f.name).read_bytes() == f.read_bytes()


def test_where_the_files_go(tmp_path, monkeypatch):
    monkeypatch.delenv("RAYSOFT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache_root() == str(tmp_path / "cache" / "raysoft")
    assert download_root("cifar100", None) == str(tmp_path / "cache" / "raysoft")
    assert download_root("cifar100", "/x") == "/x"
    monkeypatch.setenv("RAYSOFT_DATA", "/env")
    assert download_root("emnist_letters", None) == "/env"
