"""Render the docs site's pages in headless Chromium at 1280 px and report what overflows.

Builds the site (``mkdocs build``), serves it on loopback, and loads each page in a wrapper page (same
origin) whose script measures, once the page has laid out: the page's own horizontal overflow, and every
code block, table and paragraph of the content whose content is wider than its box (a line cut off,
or hidden behind a scroll bar), and every code span in a table cell broken over two lines (an option's
name wrapped mid-word). Chromium prints the wrapper's DOM with the findings; with ``--shots DIR``
it also saves a screenshot of each page. Usage::

    python scripts/docs_overflow_check.py [--chromium /usr/bin/chromium] [--shots DIR] [PAGE ...]

PAGE: a page's path in the site (``reference/cli/``); default: every page of the nav. Prints one line per
page and a JSON document last; exits 1 when a page overflows.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1280, 900
PROBE = """<!doctype html><html><body><iframe id="f" src="/%(page)s" style="width:%(width)dpx;height:%(height)dpx;border:0"></iframe>
<pre id="out">pending</pre>
<script>
document.getElementById('f').addEventListener('load', function () {
  setTimeout(function () {
    var d = document.getElementById('f').contentDocument, found = [];
    var root = d.scrollingElement;
    if (root.scrollWidth > root.clientWidth + 1) found.push({what: 'page', over: root.scrollWidth - root.clientWidth});
    d.querySelectorAll('.md-content pre, .md-content table, .md-content p').forEach(function (e) {
      var box = e.tagName === 'TABLE' ? (e.closest('.md-typeset__scrollwrap') || e) : e;
      var inner = e.tagName === 'PRE' ? (e.querySelector('code') || e) : e;
      var over = inner.scrollWidth - box.clientWidth;
      if (over > 1) found.push({what: e.tagName.toLowerCase(), over: over, text: (e.innerText || '').slice(0, 80)});
    });
    d.querySelectorAll('.md-content td code').forEach(function (e) {
      if (e.getClientRects().length > 1) found.push({what: 'wrapped code', text: e.innerText.slice(0, 80)});
    });
    document.getElementById('out').textContent = 'RESULT ' + JSON.stringify(found);
  }, 500);
});
</script></body></html>"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        """Serves without a line per request."""


def nav_pages() -> list[str]:
    """Every page of mkdocs.yml's nav, as its path in the built site."""
    text = (ROOT / "mkdocs.yml").read_text()
    pages = re.findall(r":\s+([\w/.-]+\.md)\s*$", text, re.M)
    return ["" if p == "index.md" else p[: -len(".md")] + "/" for p in pages]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("pages", nargs="*")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--shots", type=Path)
    args = parser.parse_args()
    pages = args.pages or nav_pages()
    with tempfile.TemporaryDirectory(prefix="redisync-site-") as tmp:
        site = Path(tmp) / "site"
        subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)], cwd=ROOT, check=True
        )
        handler = functools.partial(_Quiet, directory=str(site))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        chrome = [
            args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp}/profile", f"--window-size={WIDTH + 40},{HEIGHT + 200}",
        ]  # fmt: skip
        results, failed = {}, False
        for page in pages:
            probe = site / f"_probe_{abs(hash(page))}.html"
            probe.write_text(PROBE % {"page": page, "width": WIDTH, "height": HEIGHT})
            done = subprocess.run(
                [*chrome, "--virtual-time-budget=8000", "--dump-dom", f"{base}/{probe.name}"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            found = re.search(r"RESULT (\[.*?\])</pre>", done.stdout, re.S)
            if found is None:
                results[page] = {"error": "the probe did not finish", "stderr": done.stderr[-500:]}
                failed = True
            else:
                results[page] = json.loads(
                    found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
                )
                failed = failed or bool(results[page])
            if args.shots:
                args.shots.mkdir(parents=True, exist_ok=True)
                name = (page.strip("/").replace("/", "-") or "index") + ".png"
                subprocess.run(
                    [*chrome, f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={args.shots / name}", f"{base}/{page}"],
                    capture_output=True, timeout=120,
                )  # fmt: skip
            print(f"{page or '/'}: {'ok' if results[page] == [] else results[page]}", flush=True)
        server.shutdown()
    print(json.dumps({"width_px": WIDTH, "pages": results}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
