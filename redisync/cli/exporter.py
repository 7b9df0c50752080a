"""``redisync exporter``: the store's runs as Prometheus metrics (``redisync/exporter.py`` lists them)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

import click
from click.core import ParameterSource

from .. import errors
from . import common
from .common import SERVER_URL, connected, needs, not_embedded


@click.command(short_help="Serve a store's runs as Prometheus metrics.")
@SERVER_URL
@click.option(
    "--run", "runs", multiple=True, help="a run to export (repeat for several; default: every run on the server)"
)
@click.option("--port", default=9465, show_default=True, help="the port to serve /metrics on")
@click.option("--addr", default="0.0.0.0", show_default=True, help="the address to listen on")
def exporter(url: str | None, runs: tuple[str, ...], port: int, addr: str) -> None:
    """Serve Prometheus metrics of the runs in a store: shards by lease state, report ages, versions
    behind, sampling distances, dead letters and fold rate, read afresh at every scrape. The
    inspector role of deploy/users.acl suffices. Runs until interrupted."""
    needs("exporter")
    from prometheus_client import start_http_server
    from prometheus_client.core import REGISTRY

    from ..exporter import FleetCollector

    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the store's failures and recoveries
    url = not_embedded(url, "exporter")
    try:
        connected(url)  # a wrong password or a refused role ends here, said once, not at every scrape
    except errors.ConnectionUnavailable as e:  # a store down now: served as redisync_store_up 0 until it answers
        click.echo(f"redisync exporter: the store does not answer yet ({e}); serving redisync_store_up 0", err=True)
    timeout = click.get_current_context().get_parameter_source("timeout")
    # (unless told otherwise, a scrape's calls wait less than a command's: inside the scrape timeout)
    REGISTRY.register(
        FleetCollector(url, runs, **({} if timeout is ParameterSource.DEFAULT else {"timeout_s": common._timeout_s}))
    )
    try:
        server, thread = start_http_server(port, addr=addr)
    except OSError as e:
        raise errors.ConfigurationError(
            f"cannot serve metrics on {addr}:{port}: {e.strerror or e} (another process listens there? --port)"
        ) from None
    click.echo(f"redisync exporter: serving http://{addr}:{server.server_port}/metrics", err=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop serving, as SIGTERM does
        done.wait()
    server.shutdown()
    thread.join()
