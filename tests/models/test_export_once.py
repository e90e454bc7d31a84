"""The de-quantized cache entry is written once however many processes ask at once
(pp1q.models.hf.export_once): the lock makes the others wait and find it."""

from __future__ import annotations

import threading
import time

import pytest

from pp1q.models import hf
from pp1q.models.hf import EXPORT_MARKER, export_once


def _slow_export(log: list):
    def export(tmp):
        log.append(tmp.name)
        time.sleep(0.2)  # long enough for the other caller to arrive while it runs
        tmp.mkdir()
        (tmp / EXPORT_MARKER).write_text("{}")
    return export


def test_callers_at_once_export_once_and_all_find_the_entry(tmp_path):
    entry, log, errors = tmp_path / "cache" / "model-abc", [], []

    def call():
        try:
            export_once(entry, _slow_export(log))
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    # threads open the lock file separately, so flock holds them apart as it would
    # two processes
    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [] and len(log) == 1
    assert (entry / EXPORT_MARKER).is_file()
    assert not [p for p in entry.parent.iterdir() if ".tmp-" in p.name]


def test_an_existing_entry_is_not_exported_again(tmp_path):
    entry, log = tmp_path / "model-abc", []
    export_once(entry, _slow_export(log))
    export_once(entry, _slow_export(log))
    assert len(log) == 1


def test_a_folder_that_is_no_export_is_refused(tmp_path):
    entry = tmp_path / "model-abc"
    entry.mkdir()  # someone else's folder under the entry's name: never overwritten
    (entry / "notes.txt").write_text("mine")

    def export(tmp):
        tmp.mkdir()
        (tmp / EXPORT_MARKER).write_text("{}")

    with pytest.raises(FileExistsError, match="not a pp1q export"):
        export_once(entry, export)
    assert (entry / "notes.txt").read_text() == "mine"


def test_an_existing_entry_is_found_without_taking_the_lock(tmp_path, monkeypatch):
    """A read-only cache (no lock file can be made there) still serves its entries."""
    entry = tmp_path / "model-abc"
    export_once(entry, _slow_export([]))

    def no_lock(path):
        raise PermissionError(f"{path}: read-only")

    monkeypatch.setattr(hf, "_exclusive", no_lock)
    export_once(entry, _slow_export([]))  # found: nothing exported, nothing locked
    with pytest.raises(PermissionError):
        export_once(tmp_path / "model-def", _slow_export([]))  # a new one needs the lock
