"""Same seed and same secret give the same output across verifier restarts; another
secret gives another output; the secret never appears in the daemons' logs."""

from __future__ import annotations

import pytest
from daemon_harness import Pair

from pp1q.runtime.draw_secret import write_secret_file

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

PROMPT = [3, 7]
SEEDS = range(1, 9)


def _outputs(tmp_path, secret) -> tuple[list, list, str]:
    tmp_path.mkdir()
    pair = Pair(tmp_path, vocab=16, preset="far",
                verifier_args=["--draw-secret-file", str(secret)])
    client = pair.client()
    try:
        spec = [client.generate(PROMPT, 6, seed=s)["token_ids"] for s in SEEDS]
        base = [client.generate(PROMPT, 6, seed=s, speculative=False)["token_ids"]
                for s in SEEDS]
    finally:
        client.close()
        pair.close()
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    return spec, base, logs


def test_same_seed_and_secret_same_output_another_secret_another(tmp_path):
    one, two = tmp_path / "one.secret", tmp_path / "two.secret"
    keys = write_secret_file(str(one))
    write_secret_file(str(two))
    first = _outputs(tmp_path / "a", one)
    again = _outputs(tmp_path / "b", one)  # a fresh pair of daemons: a restart
    other = _outputs(tmp_path / "c", two)
    assert first[:2] == again[:2]
    assert first[0] != other[0] and first[1] != other[1]
    assert keys.hex() not in first[2] + again[2] and keys.fingerprint in first[2]
