"""``python -m redisync.cli``."""

from . import main

main()
