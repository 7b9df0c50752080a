"""``redisync demo``: a fleet of collector processes (``collector``) run with sync off, then on, and
what they sampled compared (``fleet``)."""
