"""The study's pre-registered plans, one module each, named by what the plan asks.

Each module holds its plan: the arms, seeds, tests and decisions fixed before its first run. A
plan's registration is its commit: `PLANS` says, for each, the commit that fixed it and the paths of
its module and plan page at that commit — the only evidence a pre-registration gives, whatever the
names at HEAD (``git show <commit>:<path>``). ``redisync ab --plan ID [--stage NAME]`` runs one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """One pre-registered plan: what it asks, where it lives now, and what it was registered as."""

    id: str
    """What ``redisync ab --plan`` takes."""
    asks: str
    module: str
    """Its module now (``redisync.study.…``)."""
    page: str
    """Its plan page now (``docs/ab/…``)."""
    registered: str
    """The commit that fixed the plan, before its first run."""
    registered_module: str
    """Its module's path at that commit."""
    registered_page: str
    """Its plan page's path at that commit ('' where the plan was its module alone)."""
    records: str
    """Where its run records are kept (``records/ab/…``)."""
    judged: tuple[str, ...]
    """The folders (under ``records``) of the runs the plan judges, each made after its registration
    from a clean tree (its run files record their commit); empty where the runs predate recorded
    provenance (the toy plans: their commands and dates are in their results)."""
    stages: tuple[str, ...]
    """The stages ``--stage`` names, in the order they run (the first is run when none is named)."""


PLANS: tuple[Plan, ...] = (
    Plan(
        "toy-study",
        "does drift between collector shards hurt training (the toy task: gate, then every sync arm)?",
        "redisync.study.study",
        "docs/ab/report.md",
        "0312e32",
        "redisync/study/study.py",
        "",
        "records/ab",
        (),
        ("all", "gate"),
    ),
    Plan(
        "toy-dose-mechanism",
        "when does not syncing hurt: dose, mechanism, heterogeneity?",
        "redisync.study.plans.toy_dose_mechanism",
        "docs/ab/follow-up-plan.md",
        "16d6584",
        "redisync/study/follow_up.py",
        "docs/ab/follow-up-plan.md",
        "records/ab/follow-up",
        (),
        ("all",),
    ),
    Plan(
        "toy-mechanism-semantics",
        "the mechanism, which semantics, and where the harm ends",
        "redisync.study.plans.toy_mechanism_semantics",
        "docs/ab/second-follow-up-plan.md",
        "30c7625",
        "redisync/study/second_follow_up.py",
        "docs/ab/second-follow-up-plan.md",
        "records/ab/second-follow-up",
        (),
        ("all",),
    ),
    Plan(
        "walker-ema-window",
        "does drift hurt on rigid-body physics, and does the EMA's window decide when?",
        "redisync.study.plans.walker_ema_window",
        "docs/ab/third-study-plan.md",
        "c35f961",
        "redisync/study/third_study.py",
        "docs/ab/third-study-plan.md",
        "records/ab/third-study",
        ("runs/gate",),
        ("all",),
    ),
    Plan(
        "walker-contrast",
        "does drift hurt on a walker that can learn (pilots, gate, contrast)?",
        "redisync.study.plans.walker_contrast",
        "docs/ab/fourth-study-plan.md",
        "ce58dde",
        "redisync/study/fourth_study.py",
        "docs/ab/fourth-study-plan.md",
        "records/ab/fourth-study",
        ("gate", "contrast"),
        ("pilots", "gate", "contrast"),
    ),
    Plan(
        "walker-fleet-shapes",
        "when does drift hurt on physics: a replication, and fleet shapes of low and high measured drift",
        "redisync.study.plans.walker_fleet_shapes",
        "docs/ab/fifth-study-plan.md",
        "630af40",
        "redisync/study/fifth_study.py",
        "docs/ab/fifth-study-plan.md",
        "records/ab/fifth-study",
        ("16x32", "4x128-alpha0.001", "64x8"),
        ("all",),
    ),
)

BY_ID = {plan.id: plan for plan in PLANS}
