"""The ``redisync`` command line: demo, ab (the study), bench, and inspect, watch, snapshot, restore, functions.

Every command takes ``--url`` (default: ``REDISYNC_URL``, else the embedded store; the commands on
a run refuse to start without one). A failure prints one line naming what went wrong and exits with
status 1; a missing extra is named before any work.
"""

from __future__ import annotations

import sys

import click

from .. import __version__, errors
from ..store.client import ServerError
from .advise import advise
from .aggregate import aggregate
from .bench import bench
from .demo import demo
from .exporter import exporter
from .functions import functions
from .runs import delete, inspect, restore, snapshot
from .study import ab
from .watch import watch


@click.group(
    epilog="Start with 'redisync demo --keep' (no Redis needed); with a Redis, 'redisync watch --url "
    "redis://HOST:6379/0 --run RUN' follows a training run. 'redisync COMMAND --help' says more."
)
@click.version_option(__version__, prog_name="redisync")
def cli() -> None:
    """redisync: one versioned fleet state for every collector of an RL trainer.

    Collectors publish what their shard saw; the store folds it into one fleet state that every
    collector takes at its next reset boundary. These commands show it, measure it and study it."""


for command in (demo, advise, ab, bench, inspect, watch, exporter, aggregate, snapshot, restore, delete, functions):
    cli.add_command(command)


def main() -> None:
    """The ``redisync`` command: one line and status 1 for a failure, 130 for Ctrl-C."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.NoSuchOption as e:  # a Redis named another way: the option is --url
        named = e.option_name.lstrip("-").lower() in ("redis", "redis-url", "host", "server")
        if named and e.ctx is not None and any("--url" in p.opts for p in e.ctx.command.params):
            e = click.exceptions.NoSuchOption(
                e.option_name, f"No such option '{e.option_name}'. Did you mean '--url'?", ctx=e.ctx
            )
        e.show()
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (errors.RedisyncError, ServerError, OSError) as e:
        click.echo(f"redisync: error: {e}", err=True)
        sys.exit(1)
