import urllib.request

import pytest
from new_threads import NewThreads

from pp1q import __version__
from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause
from pp1q.runtime.metrics import Metrics


def test_two_daemons_in_one_process_do_not_share_counters():
    a, b = Metrics("verifier"), Metrics("worker")
    a.fallback(FallbackCause.WATCHDOG_TIMEOUT)
    a.validation_failure(Reason.CHECKSUM_MISMATCH)
    assert a.value("pp1q_fallbacks_total", cause="watchdog_timeout") == 1
    assert b.value("pp1q_fallbacks_total", cause="watchdog_timeout") == 0
    assert a.value("pp1q_validation_failures_total", reason="checksum_mismatch") == 1


def test_metric_names_follow_conventions():
    m = Metrics("verifier", {"target": "toy"})
    for family in m.registry.collect():
        assert family.name.startswith("pp1q_")
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
    assert m.value("pp1q_build_info", role="verifier", version=__version__, target="toy") == 1


def test_served_over_http_on_loopback():
    m = Metrics("worker")
    m.steps.inc(3)
    server = m.serve("127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert "pp1q_steps_total 3.0" in body
    assert 'pp1q_peers_refused_total{reason="tls_handshake"} 0.0' in body  # zeros shown
    assert "pp1q_fallbacks_total" not in body  # a verifier family: not the worker's


def test_served_until_shutdown_then_its_thread_ends():
    """shutdown() returns once the serving thread has left its loop (pp1q.runtime.
    metrics_http polls at POLL_S, not socketserver's 0.5 s); the port is then closed."""

    m = Metrics("verifier")
    threads = NewThreads()  # this server's thread, not another test's of the same name
    server = m.serve("127.0.0.1", 0)
    port = server.server_port
    [serving] = threads.alive("metrics-http")
    server.shutdown()
    server.server_close()
    serving.join(5.0)
    assert not serving.is_alive()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
