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
    assert sum(" REPLY " in ln for ln in msgs) == 15  # dense slot 0: 3 rounds x depth 5
    assert sum(" PROPOSAL " in ln for ln in msgs) == 3  # sparse slot 1: one a round
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


def _proposal_blocks(out: str) -> list[tuple[str, list[str]]]:
    """(PROPOSAL line, its detail lines) in the analyser's output."""
    lines, blocks = out.splitlines(), []
    for i, ln in enumerate(lines):
        if " PROPOSAL " in ln:
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith(("row #", "rows:")):
                j += 1
            blocks.append((ln, [d.strip() for d in lines[i + 1:j]]))
    return blocks


def test_proposal_lines_name_every_position(capsys):
    """A PROPOSAL line: slot, generation, round, its positions, tokens and entries; with
    -v a row line per position. The tokens are the drafts the replay hands out."""
    from pp1q.tools.replay import replay_verifier

    _, out, _ = _run(capsys, DATA / "clean_v2.pp1qcap", "-v")
    blocks = _proposal_blocks(out)
    ready = [r for r in replay_verifier(DATA / "clean_v2.pp1qcap").ready if r.slot == 1]
    assert len(blocks) == len(ready) == 3
    for (line, rows), r in zip(blocks, ready, strict=True):
        a, b = r.first_position, r.first_position + len(r.draft_ids) - 1
        assert (f"W>V  PROPOSAL      s1 g{r.generation} r{r.round_id} pos={a}..{b} "
                f"tokens={','.join(map(str, r.draft_ids))} entries=6,6,6,6,6") in line
        assert len(rows) == 5
        for i, (row, token) in enumerate(zip(rows, r.draft_ids, strict=True), start=1):
            assert row.startswith(f"row #{i} pos={a + i - 1}: support=6 token={token} q=")
            assert row.endswith("checksum=ok valid")


def test_proposal_faults_in_the_verbose_rows(capsys):
    """fallback_v2's slot 2: a corrupt PROPOSAL (payload dropped, one line) and one
    naming a token its row gives q = 0 (that position INVALID, its checksum ok)."""
    _, out, _ = _run(capsys, DATA / "fallback_v2.pp1qcap", "-v")
    blocks = _proposal_blocks(out)
    bad = [(ln, rows) for ln, rows in blocks if ln.endswith("[checksum_mismatch]")]
    assert [rows for _, rows in bad] == [["rows: checksum=BAD (checksum_mismatch), "
                                          "payload dropped"]]
    invalid = [row for _, rows in blocks for row in rows if "INVALID" in row]
    assert len(invalid) == 1 and invalid[0].startswith("row #3 ")
    assert "q=0/2^24" in invalid[0] and "checksum=ok INVALID (zero_q_at_token)" in invalid[0]


def test_a_row_checksum_that_does_not_match_its_row_is_shown(capsys, tmp_path):
    """Frame checksums resealed over a forged row checksum: the frame is intact, the row
    is not what its checksum says; the analyser says so on that row, --verify fails it."""
    import dataclasses

    import msgspec

    from pp1q.runtime.capture import write_records
    from pp1q.wire import HEADER_BYTES, MsgType, read_header
    from pp1q.wire.framing import reseal

    header, recs = read_capture(DATA / "clean_v2.pp1qcap")
    i = next(i for i, r in enumerate(recs)
             if r.direction == 1 and r.body[5] == MsgType.PROPOSAL)
    body = recs[i].body
    n = read_header(body).control_len
    head = msgspec.msgpack.decode(body[HEADER_BYTES:HEADER_BYTES + n])
    head[8][3] ^= 1 << 40  # row 4's checksum (still a u64 of the same encoded size)
    frame = bytearray(body[:HEADER_BYTES] + msgspec.msgpack.encode(head) + body[HEADER_BYTES + n:])
    reseal(frame)
    recs[i] = dataclasses.replace(recs[i], body=bytes(frame))
    write_records(tmp_path / "r", header, recs)
    _, out, _ = _run(capsys, tmp_path / "r", "-v")
    [(line, rows)] = _proposal_blocks(out)[:1]
    assert "[" not in line  # the frame itself is intact
    assert [r.split(": ")[0] for r in rows if "BAD (row checksum)" in r] == ["row #4 pos=6"]
    code, out, _ = _run(capsys, tmp_path / "r", "--verify")
    assert code == 1 and "PROPOSAL_FAILED s1 g1 r1 reason=checksum_mismatch" in out


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
    props = [o for o in objs if o.get("type") == "Proposal"]
    assert props and all(set(o["fields"]) == {
        "session", "slot", "generation", "round_id", "first_position", "context_version",
        "tokens", "entries", "row_checksums"} for o in props)  # its control part, whole
    assert all(len(o["fields"]["tokens"]) == 5 for o in props)
    contexts = [o for o in objs if o.get("type") == "Context"]
    assert contexts and all("tokens" not in o["fields"] for o in contexts)  # a payload


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


def test_the_analyser_describes_every_message_type():
    """A new message type without a line here would stop `pp1q replay` at its first frame
    (as PROPOSAL did before its formatter)."""
    from pp1q.tools.replay.analyse import DESCRIBE
    from pp1q.wire import MsgType
    from pp1q.wire.messages import TYPE_OF

    assert {TYPE_OF[cls] for cls in DESCRIBE} == set(MsgType)
    assert len({label for label, _ in DESCRIBE.values()}) == len(DESCRIBE)
    assert all(label == TYPE_OF[cls].name for cls, (label, _) in DESCRIBE.items())


def _crafted(tmp_path, *records) -> str:
    """A capture of ``records`` (kind, direction, conn, body), checksums right."""
    from pp1q.runtime.capture.format import Role, file_header, record_head
    raw = file_header(Role.VERIFIER, 0)
    for kind, d, conn, body in records:
        raw += record_head(kind, d, conn, 0, body) + body
    path = tmp_path / "crafted.pp1qcap"
    path.write_bytes(raw)
    return path


@pytest.mark.parametrize("meta, why", [
    (b"[" * 4000, "nested too deeply"),  # was: a RecursionError traceback, exit 1
    (b'{"step_timeout_s": "x"}', "step_timeout_s 'x'"),  # was: a ValueError traceback
    (b'{"step_timeout_s": [1]}', "step_timeout_s [1]"),  # was: a TypeError traceback
    (b'{"step_timeout_s": -1}', "step_timeout_s -1"),
    (b'{"step_timeout_s": true}', "step_timeout_s True"),
], ids=["deep", "string", "list", "negative", "bool"])
def test_crafted_metadata_is_one_line_and_exit_two(capsys, tmp_path, meta, why):
    from pp1q.runtime.capture import Direction, Kind
    path = _crafted(tmp_path, (Kind.INFO, Direction.NONE, 0, meta))
    code, _, err = _run(capsys, path, "--verify")
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err


def test_connections_open_at_once_are_bounded_and_closed_ones_let_go(capsys, tmp_path):
    """Each open connection holds decoders (64 KiB each, made at its first DATA); a
    capture of many OPENs made the replay hold gigabytes (2.8 GB for 20,000 records)."""
    from pp1q.runtime.capture import Direction, Kind
    from pp1q.runtime.capture.format import MAX_OPEN_CONNECTIONS
    from pp1q.tools.replay.streams import StreamSet
    from pp1q.wire import MAGIC as WIRE_MAGIC
    opened = b'{"protocol": "wire"}'
    cycles = [rec for c in range(1, 2 * MAX_OPEN_CONNECTIONS)
              for rec in ((Kind.OPEN, Direction.NONE, c, opened),
                          (Kind.DATA, Direction.IN, c, WIRE_MAGIC[:2]),
                          (Kind.CLOSE, Direction.NONE, c, b"{}"))]
    header, recs = read_capture(_crafted(tmp_path, *cycles))
    streams, most = StreamSet(header.role), 0
    for rec in recs:  # open, feed and close, one connection after another
        streams.items(rec)
        most = max(most, len(streams._streams))
    assert most == 2 and not streams._streams  # one connection's two directions at most
    code, _, _ = _run(capsys, tmp_path / "crafted.pp1qcap", "--verify")
    assert code == 0
    many = [(Kind.OPEN, Direction.NONE, c, opened) for c in range(1, MAX_OPEN_CONNECTIONS + 2)]
    code, out, err = _run(capsys, _crafted(tmp_path, *many))
    assert code == 2 and f"more than {MAX_OPEN_CONNECTIONS} connections open" in err


@pytest.mark.parametrize("argv, why", [
    (["--worker", "nohost"], "--worker 'nohost' is not HOST:PORT"),
    (["--worker", "127.0.0.1:1", "--verify"], "one at a time"),
    (["--worker", "127.0.0.1:1", "--wait-s", "0"], "--wait-s 0: not within"),
    (["--worker", "127.0.0.1:1", "--wait-s", "nan"], "--wait-s nan: not within"),
    (["--worker", "127.0.0.1:1", "--follow"], "--worker need the whole capture"),
], ids=["address", "verify", "zero-wait", "nan-wait", "follow"])
def test_worker_option_refusals_are_one_line_and_exit_two(capsys, argv, why):
    """``--worker`` (the live replay, tests/tools/test_replay_live.py) refuses what it
    cannot do before connecting anywhere."""
    code, _, err = _run(capsys, DATA / "clean_v2.pp1qcap", *argv)
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err
