"""Train the test task with MotrixLab's real FastSAC, in this process (its collectors spawned)."""

from __future__ import annotations

import os
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

CONFIGS = Path(__file__).parent / "configs"


def train(env: str, runs_root: Path, *, collectors: int, iterations: int, num_envs: int = 64, seed: int = 0) -> Path:
    """One run of ``env`` (a registered name of this package); the run's folder."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from motrix_rl import runner
    from motrix_rl.cli import to_typed_config
    from motrix_rl.config import TrainConfig
    from motrix_rl.plugins import load_plugins

    from . import register

    register()
    load_plugins()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="motrix_rl.configs", version_base=None):
        cfg = compose(
            "train",
            overrides=[
                f"hydra.searchpath=[{CONFIGS.resolve().as_uri()}]",
                "task=redisync-wbt/motrix.fastsac",
                f"task.env={env}",
                f"num_envs={num_envs}",
                f"seed={seed}",
                f"algo.trainer.num_learning_iterations={iterations}",
                f"algo.trainer.async_options.num_collectors={collectors}",
                "logging.interval=50",
            ],
        )
    result = runner.train(runner.TrainRequest(config=to_typed_config(cfg, TrainConfig), runs_root=runs_root))
    return Path(getattr(result, "run_dir", runs_root))
