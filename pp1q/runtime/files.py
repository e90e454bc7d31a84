"""Files an operator names (a config, a secret, TLS files, a capture, a model's files, an
exit adapter), opened without hanging: a FIFO, socket, device or folder given where a
file belongs is refused by what it is, before it is opened (opening a device can do
things) and so before any read that could block (a FIFO with no writer blocks open() for
ever) or never end (/dev/zero). Files an operator names for output (``--capture``,
``--plot``, an adapter) likewise: open() for writing blocks for ever on a FIFO with no
reader.

The refusal is an OSError whose ``strerror`` says what the path is, so every caller's
existing ``except OSError`` turns it into its own one-line error.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotRegularFileError(OSError):
    """The path is something other than a regular file (its ``strerror`` says what)."""


def _refuse_unless_regular(path, mode: int, *, folder_ok: bool = False) -> None:
    if stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode)):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    wanted = "a regular file or a folder" if folder_ok else "a regular file"
    raise NotRegularFileError(errno.EINVAL, f"is {kind}, not {wanted}", str(path))


def _open_checked(path, flags: int, check) -> int:
    """A descriptor on the regular file at ``path``, opened with ``flags``. ``check(path)``
    refuses by name what is there and is not a regular file before it is opened (opening
    a device can do things: a watchdog arms, a tape rewinds, a serial line raises DTR);
    O_NONBLOCK makes an open of a FIFO swapped in since return at once (for writing:
    ENXIO with no reader, named by checking again), and fstat on the open descriptor
    then checks the very file opened. The caller clears O_NONBLOCK if it matters."""
    check(path)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EISDIR):  # swapped in since the check
            check(path)
        raise
    try:
        _refuse_unless_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path) -> BinaryIO:
    """The regular file at ``path``, open for reading (the caller bounds what it reads).
    What is there and is not a regular file is refused by name before it is opened, and
    the open descriptor is checked again (``_open_checked``); symlinks are followed."""
    fd = _open_checked(path, os.O_RDONLY, check_regular)
    try:
        return os.fdopen(fd, "rb")  # O_NONBLOCK changes nothing for a regular file's reads
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, limit: int) -> tuple[bytes, os.stat_result]:
    """At most ``limit`` + 1 bytes of the regular file at ``path`` (one more than the
    caller accepts, so it can tell "too large"), and its stat."""
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
        return f.read(limit + 1), st


def check_regular(path, *, folder_ok: bool = False) -> None:
    """Refuse ``path`` unless it is a regular file (or, with ``folder_ok``, a folder), for
    a library that opens it by name (OpenSSL's, say). The check and the library's open
    are two steps: a file swapped between them is the operator's own file system at
    work, not a peer's input."""
    _refuse_unless_regular(path, os.stat(path).st_mode, folder_ok=folder_ok)


def check_output(path) -> None:
    """Refuse ``path`` if it exists and is not a regular file, for a library that writes
    it by name (matplotlib's savefig, safetensors' save_file); a missing path passes (the
    writer creates it). Symlinks are followed, as for reads. Checked by name, as
    ``check_regular``: a path swapped before the library's open is the operator's doing."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # a new file (or a dangling link: open creates its target)
        return
    _refuse_unless_regular(path, mode)


def open_output(path, *, buffering: int = -1) -> BinaryIO:
    """The regular file at ``path``, created (mode 0o666 less the umask) or emptied, open
    for writing. What is there already and is not a regular file is refused by name
    before it is opened, and the open descriptor is checked again (``_open_checked``).
    The file is emptied only then, and writes block as usual (O_NONBLOCK is cleared)."""
    fd = _open_checked(path, os.O_WRONLY | os.O_CREAT, check_output)
    try:
        os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise
