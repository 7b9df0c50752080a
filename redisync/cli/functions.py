"""``redisync functions``: the redisync versions whose Redis Functions a server holds, loaded and retired."""

from __future__ import annotations

import click

from .common import SERVER_URL, connected, not_embedded, table


@click.group(short_help="List, load and retire redisync's Redis Functions.")
def functions() -> None:
    """The redisync versions' function libraries on a server (one per version, side by side).

    Several versions share a server or Cluster (teams, rolling upgrades): load a new version with a
    role that may (the learner's), and prune the old one once no collector runs it."""


@functions.command("list")
@SERVER_URL
def list_(url: str | None) -> None:
    """The libraries on the server; this build's marked."""
    store = connected(not_embedded(url, "functions list"))
    libraries = store.functions()
    if not libraries:
        click.echo(f"no redisync library on the server (this build's version: {store.scripts.version})")
        return
    rows = [
        [lib.name, lib.version, lib.functions, "this build" if lib.version == store.scripts.version else ""]
        for lib in libraries
    ]
    click.echo(table(["library", "version", "functions", ""], rows))


@functions.command()
@SERVER_URL
def load(url: str | None) -> None:
    """Load this build's library (beside any other version's)."""
    store = connected(not_embedded(url, "functions load"))
    store.load_functions()
    click.echo(f"loaded redisync's functions of version {store.scripts.version}")


@functions.command()
@SERVER_URL
@click.option("--keep", multiple=True, help="a version to keep besides this build's (repeat for more)")
def prune(url: str | None, keep: tuple[str, ...]) -> None:
    """Delete every other version's library (its collectors must have stopped: theirs fail to load it
    again only where their role may not load functions)."""
    store = connected(not_embedded(url, "functions prune"))
    gone = store.prune_functions(keep)
    kept = ", ".join(sorted({store.scripts.version, *keep}))
    click.echo(f"deleted {', '.join(gone) if gone else 'nothing'}; kept version(s) {kept}")
