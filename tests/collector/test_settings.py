"""The sync settings: declared once (names, defaults, checks), named by `new_syncer` with those defaults."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from redisync import errors
from redisync.collector.settings import SyncSettings
from redisync.collector.syncer import Syncer
from redisync.collector.workers import new_syncer


def test_new_syncer_names_every_option_with_the_syncers_defaults():
    """It took ``**kwargs``: help() and IDEs showed none of the options a user tunes. Every sync
    setting (declared once, in `SyncSettings`) and every other option of the `Syncer` is a named
    argument of `new_syncer` with the same default, described."""
    ours = inspect.signature(new_syncer).parameters
    theirs = {
        n: p.default for n, p in inspect.signature(Syncer.__init__).parameters.items() if n not in ("self", "settings")
    }
    theirs |= {f.name: f.default for f in dataclasses.fields(SyncSettings)}
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours.values())
    for name, default in theirs.items():
        assert name in ours, name
        assert ours[name].default == default, name
        assert f"{name}:" in (new_syncer.__doc__ or ""), f"{name} is not described"
    for field in dataclasses.fields(SyncSettings):
        assert f"{field.name}:" in (SyncSettings.__doc__ or ""), f"{field.name} is not explained"


def test_a_sync_setting_out_of_range_is_refused_naming_it():
    """A negative interval or a zero lease would make a worker spin or its shard lapse as it renews:
    refused where the settings are declared, with the setting's name and value, before anything starts."""
    for bad, message in [
        ({"lease_s": 0}, "lease_s must be a positive number of seconds, got 0"),
        ({"poll_every_s": -1.0}, "poll_every_s must be a non-negative number of seconds, got -1.0"),
        ({"retry_every_s": float("nan")}, "retry_every_s must be a non-negative number of seconds, got nan"),
        ({"publish_every_steps": 2.5}, "publish_every_steps must be a whole number of steps, got 2.5"),
        ({"publish_every_steps": 0}, "publish_every_steps must be at least 1, got 0"),
    ]:
        with pytest.raises(errors.ConfigurationError, match=re.escape(message)):
            SyncSettings(**bad)
