"""What the commands share: the --url options, the extras check, connecting, waiting for a run,
reading a snapshot file, and the figures' formatting."""

from __future__ import annotations

import importlib.util
import io
import shutil
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import errors
from ..store.client import ENV_URL, RunSnapshot, connect

DEFAULT_TIMEOUT_S = 5.0
_timeout_s = DEFAULT_TIMEOUT_S  # the --timeout of the command being run


def _set_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    global _timeout_s
    _timeout_s = value
    return value


_TIMEOUT = click.option(
    "--timeout",
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    expose_value=False,
    callback=_set_timeout,
    help="seconds to wait for the server's answer to each call (one retry): a silent server fails the command "
    "within about twice this",
)
_URL = click.option(
    "--url",
    envvar=ENV_URL,
    default=None,
    help=f"redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL (env {ENV_URL}); unset: embedded",
)
_SERVER_URL = click.option(
    "--url",
    envvar=ENV_URL,
    default=None,
    help=f"the Redis that holds the run: redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL "
    f"(env {ENV_URL}; required: the embedded store would start empty)",
)


def URL(command: Any) -> Any:  # (a decorator, named as the options it adds)
    """``--url`` (unset: the embedded store) and ``--timeout``."""
    return _URL(_TIMEOUT(command))


def SERVER_URL(command: Any) -> Any:
    """``--url`` (required in effect: a server that holds the run) and ``--timeout``."""
    return _SERVER_URL(_TIMEOUT(command))


def cli_connect(url: str | None, run: str = "default") -> Any:
    """A store for a command: each call waits ``--timeout`` for an answer, retried once."""
    return connect(url, run=run, call_timeout_s=_timeout_s, retries=1)


EXTRAS = {
    "demo": ("torch", "tqdm", "matplotlib"),
    "study": ("torch", "tqdm", "matplotlib", "scipy", "gymnasium", "mujoco"),
    "peers": ("torch",),
    "exporter": ("prometheus_client",),
}


def needs(what: str) -> None:
    """Before any work: the modules a command needs, or one line saying which extra brings them."""
    missing = [m for m in EXTRAS[what] if not importable(m)]
    if missing:
        extra = {"peers": "torch", "study": "study", "exporter": "monitoring"}.get(what, "demo")
        raise errors.RedisyncError(
            f"redisync {what if what != 'study' else 'ab'} needs the {extra} extra "
            f"({', '.join(missing)} missing): {install_command(extra)}"
        )


def install_command(extra: str) -> str:
    """How to add ``extra`` the way redisync was installed here: editable from a clone, from a folder
    or a file, or by name."""
    import json
    from importlib.metadata import distributions
    from urllib.parse import unquote, urlsplit

    # (the installed distribution's record: a build's redisync.egg-info in the current folder has none)
    direct = next(
        (d.read_text("direct_url.json") for d in distributions(name="redisync") if d.read_text("direct_url.json")), None
    )
    found = json.loads(direct) if direct else {}
    source = unquote(urlsplit(found.get("url", "")).path) if found.get("url", "").startswith("file://") else ""
    if found.get("dir_info", {}).get("editable") and source:
        setup = Path(source) / "scripts" / "setup"
        return f"pip install -e '{source}[{extra}]'" + (f" (or {setup})" if setup.exists() else "")
    if source:
        return f"pip install '{source}[{extra}]'"
    return f"pip install 'redisync[{extra}]'"


def importable(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def not_embedded(url: str | None, command: str) -> str:
    """A command that reads or writes a run needs a Redis: the embedded store starts empty and is gone at exit."""
    if url is None:
        raise click.UsageError(
            f"{command} works on a run in a Redis: pass --url or set {ENV_URL} "
            "(the embedded store would start empty and be gone when this command exits)"
        )
    return url


def terminal() -> bool:
    """Whether stdout is a terminal: colour, live views and the terminal's width only then."""
    return sys.stdout.isatty()


def render(*things: Any) -> str:
    """Rich renderables as text: coloured for a terminal, plain (and 200 columns wide, so that a
    table is never folded) for a pipe or a file."""
    buf = io.StringIO()
    tty = terminal()
    width = shutil.get_terminal_size().columns if tty else 200
    Console(file=buf, force_terminal=tty, no_color=not tty, width=width, highlight=False).print(*things)
    return buf.getvalue().rstrip("\n")


def rich_table(headers: list[str], rows: list[list[Any]], title: str | None = None) -> Table:
    """A table in the house style: a bold header, a rule under it, no frame; cells are text
    (never read as markup), a cell that is already a rich Text keeps its style."""
    out = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold cyan", title=title)
    for h in headers:
        out.add_column(h)
    for row in rows:
        out.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in row))
    return out


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A table in the house style, as text (see `render`)."""
    return render(rich_table(headers, rows))


def num(x: float, digits: int) -> str:
    """``x`` to ``digits`` decimals, never as a negative zero."""
    return f"{round(x, digits) + 0.0:.{digits}f}"


def age(seconds: float | None) -> str:
    """An age for a table: seconds below two minutes, then minutes, then hours."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


def connected(url: str | None, run: str = "default") -> Any:
    """A store that answered a PING: every connection problem ends here, naming the URL."""
    store = cli_connect(url, run)
    store.ping()
    return store


def run_store(url: str | None, run: str) -> Any:
    """The store of a registered run (RunNotFound, naming the run, otherwise)."""
    store = connected(url, run)
    store.schema  # noqa: B018  (raises RunNotFound, naming the run, when there is none)
    return store


def read_snapshot(path: str) -> RunSnapshot:
    """The snapshot in ``path``, or a CorruptSnapshot that names the file and says what is wrong."""
    try:
        return RunSnapshot.model_validate_json(Path(path).read_bytes())
    except FileNotFoundError:
        raise errors.CorruptSnapshot(f"{path}: no such file") from None
    except OSError as e:
        raise errors.CorruptSnapshot(f"{path}: cannot read it ({e.strerror})") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(map(str, err.get("loc", ())))
        if err["type"] == "json_invalid":
            problem = f"not JSON ({err['msg']})"
        elif err["type"] == "missing":
            problem = f"the field {where!r} is missing"
        else:
            problem = f"the field {where!r} is wrong: {err['msg']}"
        raise errors.CorruptSnapshot(f"{path} is not a redisync snapshot: {problem}") from None
