"""The verifier's draw secret: the key derivation, the file it comes from, and what
it promises (same seed and same secret, same output; never in a log or a repr)."""

from __future__ import annotations

import logging
import os

import pytest

from pp1q.core.drawkey import MAX_SECRET_BYTES, MIN_SECRET_BYTES, DrawKeys
from pp1q.core.errors import ConfigError, LocalProtocolError
from pp1q.runtime.draw_secret import load_draw_keys, write_secret_file

SECRET = bytes(range(32))


def test_derivation_is_the_documented_hmac():
    import hashlib
    import hmac

    keys = DrawKeys(SECRET)
    mac = hmac.new(SECRET, b"pp1q-verifier-draws:v1\0" + (1234).to_bytes(8, "big"),
                   hashlib.sha256).digest()
    assert keys.seed_for(1234) == int.from_bytes(mac[:8], "big")  # docs/distribution.md
    assert 0 <= keys.seed_for((1 << 64) - 1) < 1 << 64
    with pytest.raises(LocalProtocolError):
        keys.seed_for(1 << 64)


def test_secret_length_is_bounded_and_never_shown():
    for n in (MIN_SECRET_BYTES - 1, MAX_SECRET_BYTES + 1):
        with pytest.raises(ConfigError):
            DrawKeys(bytes(n))
    keys = DrawKeys(SECRET)
    assert SECRET.hex() not in repr(keys) and keys.fingerprint in repr(keys)
    assert DrawKeys(SECRET).fingerprint == keys.fingerprint
    assert DrawKeys(bytes(32)).fingerprint != keys.fingerprint


def test_the_file_is_read_and_must_be_private(tmp_path, caplog):
    path = tmp_path / "draw.secret"
    written = write_secret_file(str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600
    with caplog.at_level(logging.INFO, "pp1q.verifier"):
        assert load_draw_keys(str(path)).fingerprint == written.fingerprint
    assert written.hex() not in caplog.text and written.fingerprint in caplog.text
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError, match="readable by others"):
        load_draw_keys(str(path))
    for text in ("zz" * 16, "ab" * 8 + "a", "ab" * 4):
        path.write_text(text)
        os.chmod(path, 0o600)
        with pytest.raises(ConfigError, match="draw secret"):
            load_draw_keys(str(path))
    with pytest.raises(ConfigError, match="cannot read"):
        load_draw_keys(str(tmp_path / "missing"))


def test_without_a_file_a_random_secret_and_a_warning(caplog):
    with caplog.at_level(logging.WARNING, "pp1q.verifier"):
        a, b = load_draw_keys(None), load_draw_keys(None)
    assert a.fingerprint != b.fingerprint
    assert "other outputs after a restart" in caplog.text
