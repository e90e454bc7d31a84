"""Files an operator names (a config, a secret, TLS files, a capture, a model's files, an
exit adapter), opened without hanging: a FIFO, socket, device or folder given where a
file belongs is refused by what it is, before any read that could block (a FIFO with no
writer blocks open() for ever) or never end (/dev/zero).

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


def open_regular(path) -> BinaryIO:
    """The regular file at ``path``, open for reading (the caller bounds what it reads).
    O_NONBLOCK makes opening a FIFO return at once; fstat on the open descriptor then
    checks the very file read (no window between a check and the open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _refuse_unless_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")  # O_NONBLOCK changes nothing for a regular file's reads


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
