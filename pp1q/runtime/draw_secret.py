"""The verifier's draw secret (pp1q.core.drawkey) from its settings.

``draw_secret_file`` names a file holding the secret as hex digits (32..128 of them,
surrounding whitespace ignored). A file, not a value in the TOML or on the command line:
config files are shared and versioned, options show in ``ps`` and in the argv of spawned
ranks, and a file can be readable by the daemon's user alone, which is required here
(like ssh's private keys: group or other access refuses the file). Without the setting
the verifier generates a random secret at start: outputs are then not reproducible
across restarts (the daemon logs that).
"""

from __future__ import annotations

import logging
import os
import stat

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import ConfigError
from pp1q.runtime.files import read_regular

log = logging.getLogger("pp1q.verifier")

MAX_SECRET_FILE_BYTES = 4096  # a hex secret is at most 128 digits; bound the read


def load_draw_keys(path: str | None) -> DrawKeys:
    if path is None:
        keys = DrawKeys.generate()
        log.warning("no draw_secret_file: a random draw secret for this run (fingerprint %s); "
                    "the same seed gives other outputs after a restart", keys.fingerprint)
        return keys
    try:
        raw, st = read_regular(path, MAX_SECRET_FILE_BYTES)
        mode = st.st_mode
    except OSError as e:
        raise ConfigError(f"draw_secret_file = {path!r}: cannot read it: {e.strerror}",
                          key="draw_secret_file") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"draw_secret_file = {path!r}: readable by others "
                          f"(mode {stat.S_IMODE(mode):o}); chmod 600 it",
                          key="draw_secret_file")
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"draw_secret_file = {path!r}: larger than a hex secret",
                          key="draw_secret_file")
    try:
        keys = DrawKeys.from_hex(raw.decode("ascii"))
    except UnicodeDecodeError:
        raise ConfigError(f"draw_secret_file = {path!r}: not hex digits",
                          key="draw_secret_file") from None
    log.info("draw secret from %s (fingerprint %s)", path, keys.fingerprint)
    return keys


def write_secret_file(path: str, keys: DrawKeys | None = None) -> DrawKeys:
    """Write a (new) secret where ``load_draw_keys`` reads it, mode 600 (demo, tests)."""
    keys = keys or DrawKeys.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(keys.hex() + "\n")
    return keys
