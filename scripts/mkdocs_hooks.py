"""mkdocs hooks: the CLI reference's defaults as a reader expects them.

mkdocs-click prints an option's default as click holds it; from click 8.3 on, an option given no
default holds click's ``UNSET`` sentinel, which the page would show as ``Sentinel.UNSET``. A flag
without a default is off; any other option without one has none.
"""

from __future__ import annotations

import re
from typing import Any

_FLAG = re.compile(r"(<td>boolean</td>\s*<td>.*?</td>\s*<td>)<code>Sentinel\.UNSET</code>", re.S)


def on_page_content(html: str, **_: Any) -> str:
    """Flags without a default read ``false``; other options without one, a dash."""
    return _FLAG.sub(r"\1<code>false</code>", html).replace("<code>Sentinel.UNSET</code>", "&ndash;")
