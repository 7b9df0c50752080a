"""``python -m redisync.bench.client_probe N``: N publishes of the client alone, counted by the
callgrind it runs under (``redisync bench --instructions`` starts it twice, with N and with 0, and
takes the difference): the client's cost in instructions, which the host's load does not move."""

from __future__ import annotations

import os
import subprocess
import sys

from .core import stubbed_publisher


def main(publishes: int) -> None:
    publish, close = stubbed_publisher(None, 64)  # the embedded store: no server, no network
    try:
        for _ in range(50):  # caches and the first publishes' one-time work
            publish()
        pid = str(os.getpid())
        subprocess.run(["callgrind_control", "--zero", pid], check=True, capture_output=True)
        for _ in range(publishes):
            publish()
        subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
    finally:
        close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
