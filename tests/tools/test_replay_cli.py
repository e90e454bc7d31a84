"""``pp1q replay``: analyser lines, --verify/--reverify reports, JSON, exit statuses."""

import json

import capture_vectors
import pytest

from pp1q.cli import main
from pp1q.runtime.capture import read_capture

DATA = capture_vectors.DATA_DIR


def _run(capsys, *argv):
    code = main(["replay", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _frames(name):
    """Wire frames in a capture, CONTEXT included (what the analyser prints)."""
    from pp1q.tools.replay import decode
    header, recs = read_capture(DATA / f"{name}.pp1qcap")
    return [i for i in decode(header.role, recs) if i.what == "frame"]


def test_one_line_per_message(capsys):
    code, out, _ = _run(capsys, DATA / "clean_v2.pp1qcap")
    assert code == 0
    body = [ln for ln in out.splitlines() if not ln.startswith("#")]
    msgs = [ln for ln in body if " V>W " in ln or " W>V " in ln]
    assert len(msgs) == len(_frames("clean_v2"))
    assert sum(" REPLY " in ln for ln in msgs) == 30  # 6 rounds x depth 5
    assert "row:" not in out  # rows only with --verbose
    first_step = next(ln for ln in msgs if " STEP " in ln)
    assert "s0 g1 r1 last_committed=3 depth=5 T=1 dense seed=2026" in first_step


def test_verbose_rows(capsys):
    _, out, _ = _run(capsys, DATA / "fallback_v2.pp1qcap", "--verbose")
    rows = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("row:")]
    assert len(rows) == sum(" REPLY " in ln for ln in out.splitlines())
    assert any("checksum=BAD (checksum_mismatch)" in r for r in rows)
    assert any("INVALID (missing_q" in r for r in rows)
    ok = [r for r in rows if r.endswith("checksum=ok valid")]
    assert ok and all("support=" in r and "/2^24" in r for r in ok)


def test_greedy_rows_carry_no_q(capsys):
    _, out, _ = _run(capsys, DATA / "greedy_v1.pp1qcap", "-v")
    assert "HELLO_ANSWER" in out and " v1 " in out
    rows = [ln for ln in out.splitlines() if "row:" in ln]
    assert rows and all("no q (greedy)" in r for r in rows)


@pytest.mark.parametrize("name", capture_vectors.NAMES)
def test_reverify_exit_zero_and_summary(capsys, name):
    code, out, _ = _run(capsys, DATA / f"{name}.pp1qcap", "--reverify")
    exp = json.loads((DATA / f"{name}.json").read_text())
    assert code == 0
    n = len(exp["commits"])
    assert out.splitlines()[-1] == (
        f"# {exp['proposals_ready']} proposals ready, {len(exp['failures'])} failed, "
        f"{n} commits, 0 divergences, {n} commits re-decided")


def test_verify_json_report(capsys):
    code, out, _ = _run(capsys, DATA / "fallback_v2.pp1qcap", "--verify", "--json")
    rep = json.loads(out)
    exp = json.loads((DATA / "fallback_v2.json").read_text())
    assert code == 0 and rep["ok"]
    assert rep["commits"] == exp["commits"]
    assert [f["reason"] for f in rep["failures"]] == [f["reason"] for f in exp["failures"]]


def test_analysis_json_lines(capsys):
    _, out, _ = _run(capsys, DATA / "clean_v2.pp1qcap", "--json")
    objs = [json.loads(ln) for ln in out.splitlines()]
    steps = [o for o in objs if o.get("type") == "Step"]
    assert steps[0]["fields"]["seed"] == 2026 and steps[0]["dir"] == "V>W"
    assert all("q" not in o.get("fields", {}) for o in objs)  # arrays are not dumped


def test_divergence_exit_status(capsys, tmp_path):
    from pp1q.runtime.capture import write_records
    header, recs = read_capture(DATA / "clean_v2.pp1qcap")
    # drop the worker's first REPLY: the round fails here, the captured COMMIT diverges
    i = next(i for i, r in enumerate(recs) if r.direction == 1 and r.body[5:6] == b"\x04")
    write_records(tmp_path / "d", header, recs[:i] + recs[i + 1:])
    code, out, _ = _run(capsys, tmp_path / "d", "--verify")
    assert code == 1 and "!! DIVERGENCE" in out and "out_of_order" in out


def test_damaged_file_exit_status_and_message(capsys, tmp_path):
    raw = bytearray((DATA / "clean_v2.pp1qcap").read_bytes())
    raw[200] ^= 0x10
    (tmp_path / "bad").write_bytes(bytes(raw))
    code, _, err = _run(capsys, tmp_path / "bad")
    assert code == 2 and "checksum mismatch" in err and "record" in err
    (tmp_path / "cut").write_bytes(bytes((DATA / "clean_v2.pp1qcap").read_bytes()[:-5]))
    code, _, err = _run(capsys, tmp_path / "cut", "--verify")
    assert code == 2 and "truncated" in err
    code, out, err = _run(capsys, tmp_path / "cut", "--verify", "--allow-truncated")
    assert code == 0 and "warning" in err and "commits" in out
    code, _, err = _run(capsys, tmp_path / "missing")
    assert code == 2 and "No such file" in err
