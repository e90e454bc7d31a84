"""Files an operator names, given a FIFO, a folder or a device where a file belongs: each
is refused at once with one line naming what the path is (a FIFO with no writer blocked
open() for ever). Each call runs in a thread with a bounded join (bounded_call), so a
hang fails."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from bounded_call import returns

import pp1q.runtime.files as files
from pp1q.core.errors import ConfigError
from pp1q.runtime.capture.reader import CaptureReader
from pp1q.runtime.config import load
from pp1q.runtime.draw_secret import load_draw_keys
from pp1q.runtime.files import NotRegularFileError, open_regular, read_regular
from pp1q.runtime.settings import WorkerSettings


@pytest.fixture(params=["fifo", "folder"])
def not_a_file(request, tmp_path) -> tuple[Path, str]:
    path = tmp_path / request.param
    if request.param == "fifo":
        os.mkfifo(path)
        return path, "is a FIFO, not a regular file"
    path.mkdir()
    return path, "is a folder, not a regular file"


def test_read_regular_refuses_by_kind_and_bounds_the_read(not_a_file, tmp_path):
    path, why = not_a_file
    e = returns(read_regular, path, 16)
    assert isinstance(e, NotRegularFileError) and e.strerror == why
    if Path("/dev/zero").exists():  # a device never ends: refused before a read
        e = returns(read_regular, "/dev/zero", 16)
        assert e.strerror == "is a character device, not a regular file"
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    data, st = read_regular(f, 16)
    assert data == b"x" * 17 and st.st_size == 100  # one more than the limit: "too large"


def test_a_config_that_is_not_a_file_is_a_one_line_config_error(not_a_file):
    path, why = not_a_file
    e = returns(load, path, "verifier")
    assert isinstance(e, ConfigError) and str(e) == f"cannot read config {path}: {why}"


def test_a_draw_secret_that_is_not_a_file_is_a_one_line_config_error(not_a_file):
    path, why = not_a_file
    e = returns(load_draw_keys, str(path))
    assert isinstance(e, ConfigError) and why in str(e) and "\n" not in str(e)


def test_a_capture_that_is_not_a_file_is_refused_by_name(not_a_file):
    path, why = not_a_file
    e = returns(CaptureReader, path)
    assert isinstance(e, OSError) and e.strerror == why  # pp1q replay prints the line


@pytest.fixture(params=["fifo", "device"])
def not_a_checkpoint(request, tmp_path) -> tuple[Path, str]:
    """A checkpoint may be a folder, so the model tests take a FIFO and a device."""
    if request.param == "device":
        if not Path("/dev/null").exists():
            pytest.skip("no /dev/null here")
        return Path("/dev/null"), "is a character device, not a regular file or a folder"
    path = tmp_path / "model.gguf"
    os.mkfifo(path)
    return path, "is a FIFO, not a regular file or a folder"


def test_a_model_that_is_not_a_file_or_folder_is_a_one_line_config_error(not_a_checkpoint):
    from pp1q.models.serving import model_path

    path, why = not_a_checkpoint
    e = returns(model_path, str(path))
    assert isinstance(e, ConfigError) and str(e) == f"model = {str(path)!r}: {why}"


@pytest.mark.parametrize("planted", ["model.safetensors", "config.json"])
def test_a_checkpoint_folder_holding_a_fifo_is_refused_by_name(tmp_path, planted):
    """The weights are hashed for HELLO before transformers sees them: a FIFO among them
    blocked that open for ever; a FIFO config.json was skipped, for transformers to hang
    on."""
    from pp1q.models.hf import checkpoint_identity

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / planted).unlink(missing_ok=True)
    os.mkfifo(folder / planted)
    e = returns(checkpoint_identity, folder)
    assert isinstance(e, NotRegularFileError) and e.filename == str(folder / planted)
    assert e.strerror == "is a FIFO, not a regular file"


def test_a_fifo_beside_a_checkpoints_weights_is_refused_by_name(tmp_path):
    """transformers opens a folder's other files itself (the tokenizer's, say): a FIFO
    among them blocked its load for ever; now the folder is refused by that entry."""
    from pp1q.models.hf import checkpoint_identity

    folder = tmp_path / "ckpt"
    (folder / "subfolder").mkdir(parents=True)  # a folder among them is fine
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "vocab.json").symlink_to(folder / "gone.json")  # so is a dangling link
    before = checkpoint_identity(folder)
    os.mkfifo(folder / "tokenizer.json")
    e = returns(checkpoint_identity, folder)
    assert isinstance(e, NotRegularFileError) and e.filename == str(folder / "tokenizer.json")
    assert e.strerror == "is a FIFO, not a regular file or a folder"
    os.unlink(folder / "tokenizer.json")
    (folder / "tokenizer.json").write_text("{}")
    assert checkpoint_identity(folder) == before  # the identity hashes the weights alone


def test_a_daemon_given_such_a_folder_refuses_in_one_line(tmp_path):
    pytest.importorskip("transformers", reason="real models need: pip install 'pp1q[hf]'")
    from pp1q.models.serving import load_drafter

    folder = tmp_path / "ckpt"
    folder.mkdir()
    os.mkfifo(folder / "model.safetensors")
    e = returns(load_drafter, WorkerSettings(model=str(folder)))
    assert isinstance(e, ConfigError) and e.key == "model"
    assert str(e) == (f"model = {str(folder)!r}: {folder / 'model.safetensors'} "
                      f"is a FIFO, not a regular file")


def test_an_exit_adapter_that_is_not_a_file_is_a_one_line_config_error(not_a_file):
    pytest.importorskip("safetensors", reason="exit adapters need: pip install 'pp1q[hf]'")
    from pp1q.models.exit_adapter import load_adapter

    path, why = not_a_file
    e = returns(load_adapter, path)
    assert isinstance(e, ConfigError) and e.key == "draft_adapter"
    assert str(e) == f"draft_adapter = {str(path)!r}: {why}"  # was: "no such file"


WATCH_S = 0.5  # how long a blocked writer on the FIFO watches for a reader's open


def _a_reader_opened(fifo: Path, refuse) -> bool:
    """Whether ``refuse(fifo)``, called again and again for WATCH_S, opened the FIFO.
    A writer's blocking open waits for a reader, and any reader's open ends that wait,
    however soon it closes (Linux counts the reader's opens): a device or FIFO opened
    only to be refused is seen, as an open() with side effects would be."""
    writer: list[int] = []
    t = threading.Thread(target=lambda: writer.append(os.open(fifo, os.O_WRONLY)),
                         daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + WATCH_S
        while t.is_alive() and time.monotonic() < deadline:
            e = returns(refuse, fifo)
            assert isinstance(e, NotRegularFileError)
            assert e.strerror == "is a FIFO, not a regular file"
            time.sleep(0.005)
        return not t.is_alive()
    finally:  # the test's own reader lets a still-blocked writer go
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            t.join(5)
            assert not t.is_alive()
        finally:
            os.close(reader)
            for fd in writer:
                os.close(fd)


def test_a_fifo_or_device_is_refused_without_being_opened(tmp_path):
    """What is not a regular file is refused by name before open() (opening a device can
    arm a watchdog, rewind a tape, raise a serial line's DTR): a FIFO stands in for the
    device, as its opens can be seen."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not _a_reader_opened(fifo, open_regular)
    assert not _a_reader_opened(fifo, lambda p: read_regular(p, 16))
    link = tmp_path / "link"
    link.symlink_to(fifo)  # followed, and still not opened
    assert not _a_reader_opened(fifo, lambda _: open_regular(link))


def test_the_open_watch_catches_an_open_before_the_check(tmp_path):
    """Planted bug: the old order (open non-blocking, then fstat) refuses the FIFO in the
    same words, and the watch above sees it opened."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def open_then_check(path):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            files._refuse_unless_regular(path, os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    assert _a_reader_opened(fifo, open_then_check)


def test_a_fifo_swapped_in_after_the_check_is_refused_on_the_open_file(tmp_path,
                                                                         monkeypatch):
    """A path swapped between the check by name and the open is caught on the open
    descriptor (O_NONBLOCK: the open of a FIFO returns at once; fstat refuses it)."""
    monkeypatch.setattr(files, "check_regular", lambda path, **_: None)  # as if swapped
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    e = returns(read_regular, fifo, 16)
    assert isinstance(e, NotRegularFileError) and e.strerror == "is a FIFO, not a regular file"
    assert e.filename == str(fifo)
    f = tmp_path / "f"
    f.write_bytes(b"data")
    assert read_regular(f, 16)[0] == b"data"
