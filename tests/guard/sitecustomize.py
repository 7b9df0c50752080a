"""Installs the shared-server guard (``redisync_test_guard``) in every Python process a test run
starts: ``tests/conftest.py`` puts this folder on ``PYTHONPATH`` and names the shared server."""

import os

if os.environ.get("REDISYNC_TEST_SHARED"):
    try:
        import redis  # noqa: F401  (a process without redis-py sends no command to guard)
    except ImportError:
        pass
    else:
        import redisync_test_guard

        redisync_test_guard.install()
