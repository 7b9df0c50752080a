"""The synced normaliser as a framework's model holds it (`redisync.integrations.normalizers`)."""

from __future__ import annotations

import copy

import torch

from redisync.integrations.normalizers import FleetNormalization
from redisync.terms.torch.normalization import SyncedEmpiricalNormalization


class _Fleet:
    """What the normaliser asks of its process's fleet after each update: a hand-over and a swap."""

    def __init__(self):
        self.calls: list[str] = []

    def on_step(self):
        self.calls.append("on_step")

    def at_reset_boundary(self):
        self.calls.append("at_reset_boundary")


def _trained(shape=(3,)) -> SyncedEmpiricalNormalization:
    module = SyncedEmpiricalNormalization(shape, eps=1e-3, until=500)
    module.update(torch.arange(12, dtype=torch.float32).reshape(4, 3))
    return module


def test_the_replacement_carries_the_modules_shape_settings_state_and_mode():
    """Shape, eps, until, the buffers (mean, var, std, count) and training/eval come from the replaced module."""
    module = _trained().eval()
    fleet = _Fleet()
    synced = FleetNormalization.replacing(module, key="obs/norm", fleet=fleet, mode="pooled")
    assert synced.shape == (3,)
    assert (synced.eps, synced.until, synced.key, synced.mode) == (1e-3, 500, "obs/norm", "pooled")
    torch.testing.assert_close(synced.mean, module.mean)
    torch.testing.assert_close(synced.std, module.std)
    assert int(synced.count) == int(module.count) == 4
    assert not synced.training
    assert synced.fleet is fleet


def test_an_update_meets_the_fleet_while_training_and_a_copy_is_not_synced():
    """Each update while training hands over and swaps in (never the network); in eval it does not;
    a deep copy (an exported model's) carries no fleet."""
    fleet = _Fleet()
    synced = FleetNormalization.replacing(_trained(), key="obs/norm", fleet=fleet)
    synced.update(torch.ones(2, 3))
    assert fleet.calls == ["on_step", "at_reset_boundary"]
    synced.eval()
    synced.update(torch.ones(2, 3))
    assert fleet.calls == ["on_step", "at_reset_boundary"]
    exported = copy.deepcopy(synced)
    assert exported.fleet is None
    assert synced.fleet is fleet
