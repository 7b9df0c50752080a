"""Publish and pull over rediss:// with certificate verification, against a throw-away CA."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import redisync
from redisync import errors
from redisync.redis_server import free_port
from redisync.store.schema import Schema, merge

from ..servers import RedisProcess

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)


def make_certificates(d: Path) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.crt"),
        "-subj",
        "/CN=redisync test CA",
        "-days",
        "1",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(d / "server.key"),
        "-out",
        str(d / "server.csr"),
        "-subj",
        "/CN=127.0.0.1",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509",
        "-req",
        "-in",
        str(d / "server.csr"),
        "-CA",
        str(d / "ca.crt"),
        "-CAkey",
        str(d / "ca.key"),
        "-CAcreateserial",
        "-out",
        str(d / "server.crt"),
        "-days",
        "1",
        "-extfile",
        str(d / "san.ext"),
    )


@pytest.fixture
def tls_server(tmp_path):
    make_certificates(tmp_path)
    tls_port = free_port()
    server = RedisProcess(
        tmp_path,
        None,
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(tmp_path / "server.crt"),
        "--tls-key-file",
        str(tmp_path / "server.key"),
        "--tls-ca-cert-file",
        str(tmp_path / "ca.crt"),
        "--tls-auth-clients",
        "no",
    ).start()
    yield tls_port, tmp_path
    server.kill()


def test_publish_and_pull_over_verified_tls(tls_server):
    """A collector publishes and pulls over TLS with the server's certificate verified."""
    port, d = tls_server
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={d / 'ca.crt'}"
    store = redisync.connect(url, run="tls")
    store.register(Schema.of({"obs/norm": merge(2, lifecycle="history")}))
    shard = store.shard(0)
    assert shard.publish({"obs/norm": {"count": 3, "sum": [1.0, 2.0]}}).applied
    np.testing.assert_array_equal(shard.pull().keys["obs/norm"].parts()["sum"], [1.0, 2.0])


def test_an_unknown_certificate_authority_is_refused(tls_server, tmp_path_factory):
    """A server certificate signed by another authority is refused."""
    port, _ = tls_server
    other = tmp_path_factory.mktemp("other-ca")
    make_certificates(other)  # a CA that did not sign the server's certificate
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={other / 'ca.crt'}"
    with pytest.raises(errors.ConnectionUnavailable, match="certificate verify failed"):
        redisync.connect(url, run="tls", socket_connect_timeout=2).register(
            Schema.of({"obs/norm": merge(2, lifecycle="history")})
        )
