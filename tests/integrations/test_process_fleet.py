"""The process's fleet that the framework drop-ins share: one Syncer per process, started at the first
env step with every term the task built, and the store and shard named by the environment."""

from __future__ import annotations

import pytest

import redisync
from redisync.errors import ConfigurationError
from redisync.integrations import ProcessFleet, shard_from_env, store_from_env
from redisync.terms.torch import AdaptiveMotionSampler, SyncedEmpiricalNormalization


def test_the_fleet_starts_at_the_first_step_with_every_term_added_before(make_store):
    """A process fleet starts one Syncer at the first env step, with every term added before it, as the shard
    it was given."""
    store = make_store()
    fleet = ProcessFleet(store, 3, publish_every_steps=1)
    sampler, norm = AdaptiveMotionSampler(500, 0.02), SyncedEmpiricalNormalization(2)
    fleet.add(sampler)
    assert fleet.at_reset_boundary() is False
    assert fleet.syncer is None
    fleet.add(norm)
    fleet.on_step()  # the first env step starts one Syncer for both terms
    try:
        assert fleet.syncer is not None
        assert fleet.syncer.terms == [sampler, norm]
        assert fleet.syncer.shard.shard_id == 3
        with pytest.raises(ConfigurationError, match="after the fleet's Syncer started"):
            fleet.add(SyncedEmpiricalNormalization(2, key="obs/late"))
        with pytest.raises(ConfigurationError, match="before the first env step"):
            fleet.configure(publish_every_steps=10)
        fleet.flush()
        assert fleet.syncer.wait_synced(timeout=10)
        assert set(store.fleet().keys) == {"motion/bin_failed", "obs/norm"}
    finally:
        fleet.stop()
        fleet.stop()  # twice is harmless (it also runs at interpreter exit)


def test_the_environment_names_the_store_and_the_shard(monkeypatch, real_url):
    """The environment names the store, the run and the shard (REDISYNC_SHARD, else torchrun's RANK)."""
    monkeypatch.setenv("REDISYNC_URL", real_url)
    monkeypatch.setenv("REDISYNC_RUN", "fleet-env-test")
    monkeypatch.delenv("REDISYNC_SHARD", raising=False)
    monkeypatch.setenv("RANK", "2")  # torchrun's
    assert shard_from_env() == 2
    monkeypatch.setenv("REDISYNC_SHARD", "5")  # ours comes first
    assert shard_from_env() == 5
    assert ProcessFleet().shard_id == 5
    store = store_from_env()
    assert store.run == "fleet-env-test"
    assert store.url.startswith("redis://")
    monkeypatch.setenv("REDISYNC_SHARD", "five")
    with pytest.raises(ConfigurationError, match="REDISYNC_SHARD"):
        shard_from_env()
    monkeypatch.delenv("REDISYNC_URL")
    assert store_from_env().url == redisync.store.client.EMBEDDED
