"""Files an operator names for output (``--capture``), given a FIFO, a folder or a device:
each is refused at once with one line naming what the path is (open() for writing blocked
for ever on a FIFO with no reader; a device or folder gave an unclear error). A regular
file, a new file and a symlink to a regular file are written as before. Each call runs in
a thread with a bounded join (bounded_call), so a hang fails."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from bounded_call import HungError, returns

import pp1q.runtime.capture.writer as writer_module
import pp1q.runtime.files as files
from pp1q.core.errors import ConfigError
from pp1q.runtime.capture import CaptureReader, CaptureWriter, Role, write_records
from pp1q.runtime.config import open_capture
from pp1q.runtime.files import NotRegularFileError, open_output

PLANTED_JOIN_S = 0.5  # how long the planted plain open() is watched hanging


def _capture(path) -> None:
    CaptureWriter(path, role=Role.WORKER, wall_ns=1).close()


@pytest.fixture(params=["fifo", "folder", "device"])
def not_a_file(request, tmp_path) -> tuple[Path, str]:
    if request.param == "device":
        if not Path("/dev/null").exists():
            pytest.skip("no /dev/null here")
        return Path("/dev/null"), "is a character device, not a regular file"
    path = tmp_path / request.param
    if request.param == "fifo":
        os.mkfifo(path)  # and no reader: open(path, "wb") blocks for ever
        return path, "is a FIFO, not a regular file"
    path.mkdir()
    return path, "is a folder, not a regular file"


def test_open_output_refuses_by_kind(not_a_file):
    path, why = not_a_file
    e = returns(open_output, path)
    assert isinstance(e, NotRegularFileError) and e.strerror == why
    assert e.filename == str(path)


def test_a_capture_that_is_not_a_file_is_refused_by_name(not_a_file):
    path, why = not_a_file
    e = returns(_capture, path)
    assert isinstance(e, NotRegularFileError) and e.strerror == why
    e = returns(write_records, path, SimpleNamespace(role=Role.WORKER, start_unix_ns=1), [])
    assert isinstance(e, NotRegularFileError) and e.strerror == why


def test_a_daemons_capture_that_is_not_a_file_is_a_one_line_config_error(not_a_file):
    path, why = not_a_file
    e = returns(open_capture, str(path), "worker", {})
    assert isinstance(e, ConfigError) and e.key == "capture"
    assert str(e) == f"capture = {str(path)!r}: cannot create capture file: {why}"


def test_a_symlink_to_a_fifo_is_refused_as_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "fifo")
    e = returns(_capture, tmp_path / "link")
    assert isinstance(e, NotRegularFileError) and e.strerror == "is a FIFO, not a regular file"


def test_a_new_file_an_old_file_and_a_symlink_to_a_file_are_written(tmp_path):
    new = tmp_path / "new.pp1qcap"
    assert returns(_capture, new) is None
    data = new.read_bytes()
    assert len(data) == 32 and CaptureReader(new).header.role is Role.WORKER
    old = tmp_path / "old.pp1qcap"
    old.write_bytes(b"x" * 1000)  # a longer file is emptied first
    assert returns(_capture, old) is None and old.read_bytes() == data
    target = tmp_path / "target.pp1qcap"
    target.write_bytes(b"x" * 1000)
    link = tmp_path / "link.pp1qcap"
    link.symlink_to(target)  # reads follow symlinks (open_regular): so do writes
    assert returns(_capture, link) is None
    assert link.is_symlink() and target.read_bytes() == data
    with open_output(tmp_path / "plain") as f:  # writes block as usual: no O_NONBLOCK left
        assert os.get_blocking(f.fileno())
    assert (tmp_path / "plain").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_fifo_or_device_swapped_in_after_the_check_is_refused_on_the_open_file(
        tmp_path, monkeypatch):
    """The check by name comes first (a device is not even opened); a path swapped in
    between is caught on the open descriptor (O_NONBLOCK: ENXIO for a FIFO with no reader,
    fstat for the rest), never blocking."""
    real = files.check_output
    skipped = []

    def first_check_missed(path):
        if not skipped:
            skipped.append(path)  # as if the path were swapped right after it
            return None
        return real(path)

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(files, "check_output", first_check_missed)
    e = returns(open_output, fifo)  # no reader: the open fails with ENXIO, named again
    assert isinstance(e, NotRegularFileError) and e.strerror == "is a FIFO, not a regular file"
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        skipped.clear()
        e = returns(open_output, fifo)  # with a reader the open succeeds: fstat refuses
        assert isinstance(e, NotRegularFileError) and e.strerror == "is a FIFO, not a regular file"
    finally:
        os.close(reader)
    if Path("/dev/null").exists():
        skipped.clear()
        e = returns(open_output, "/dev/null")
        assert e.strerror == "is a character device, not a regular file"


def test_the_fifo_test_catches_a_plain_open(tmp_path, monkeypatch):
    """Planted bug: CaptureWriter back on open(path, "wb") hangs on the FIFO, and the
    bounded call reports it (then a reader lets the stuck open return)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    def plain_open(path, buffering=-1):
        return open(path, "wb", buffering=buffering)  # noqa: SIM115 - the planted bug

    monkeypatch.setattr(writer_module, "open_output", plain_open)
    with pytest.raises(HungError, match="hung") as hung:  # what the tests above would say
        returns(_capture, fifo, join_s=PLANTED_JOIN_S)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the stuck open returns
    try:
        hung.value.thread.join(5)
        assert not hung.value.thread.is_alive()
    finally:
        os.close(reader)
