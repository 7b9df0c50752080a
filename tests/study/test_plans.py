"""The plans table: every pre-registered plan's registration is real (its module and page exist at
the commit that fixed it) and every run a plan judges was made after it, at a commit that holds it."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path

import pytest

from redisync.study.plans import PLANS

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def _exists(commit: str, path: str) -> bool:
    return _git("cat-file", "-e", f"{commit}:{path}").returncode == 0


@pytest.mark.parametrize("plan", PLANS, ids=[p.id for p in PLANS])
def test_every_plan_cites_what_it_was_registered_as_and_lives_where_it_says(plan):
    """The module and page a plan was registered as exist at its registration commit; its module file
    and page exist now; ids and modules are one each (no plan named by the order it ran in)."""
    assert _exists(plan.registered, plan.registered_module), (plan.id, plan.registered_module)
    if plan.registered_page:
        assert _exists(plan.registered, plan.registered_page), (plan.id, plan.registered_page)
    assert (ROOT / (plan.module.replace(".", "/") + ".py")).is_file()
    assert (ROOT / plan.page).is_file()
    assert (ROOT / plan.records).is_dir()
    assert plan.stages
    assert not any(word in plan.module for word in ("follow_up", "third", "fourth", "fifth"))


@pytest.mark.extras("torch", "scipy", "gymnasium")
@pytest.mark.parametrize("plan", PLANS, ids=[p.id for p in PLANS])
def test_every_plans_module_imports(plan):
    """Each plan's module imports under the name PLANS gives it (the study extra's modules)."""
    importlib.import_module(plan.module)


def test_plan_ids_and_modules_are_unique():
    """One id and one module per plan."""
    assert len({p.id for p in PLANS}) == len({p.module for p in PLANS}) == len(PLANS)


# run files recorded from a tree with uncommitted changes, before such a run was refused: the study
# page says so (the third study's gate: "two of them with uncommitted changes")
DISCLOSED_DIRTY = {"walker-ema-window": 2}


@pytest.mark.parametrize("plan", [p for p in PLANS if p.judged], ids=[p.id for p in PLANS if p.judged])
def test_every_judged_run_was_made_after_its_plan_at_a_commit_that_holds_it(plan):
    """Each run file a plan judges records its commit: that commit exists, descends from the plan's
    registration (the plan came first), and holds the plan's module as registered (the code that ran);
    a dirty tree only where the study page discloses it."""
    runs = [f for folder in plan.judged for f in sorted((ROOT / plan.records / folder).glob("*.json"))]
    assert runs, plan.id
    recorded = [json.loads(f.read_text())["provenance"]["commit"] for f in runs]
    assert sum(c.endswith("+dirty") for c in recorded) == DISCLOSED_DIRTY.get(plan.id, 0)
    if plan.id in DISCLOSED_DIRTY:
        assert "two of them with uncommitted changes" in " ".join((ROOT / "docs" / "study.md").read_text().split())
    commits = {c.removesuffix("+dirty") for c in recorded}
    for commit in commits:
        assert _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0, (plan.id, commit)
        assert _git("merge-base", "--is-ancestor", plan.registered, commit).returncode == 0, (plan.id, commit)
        assert _exists(commit, plan.registered_module) or _exists(commit, plan.module.replace(".", "/") + ".py")


def test_no_study_module_is_named_by_the_order_it_ran_in():
    """A plan's module says what it asks; the order plans ran in is history, which PLANS' commits keep."""
    ordinal = re.compile(r"(first|second|third|fourth|fifth|sixth|follow_up)")
    named = [
        p.relative_to(ROOT).as_posix() for p in (ROOT / "redisync" / "study").rglob("*.py") if ordinal.search(p.stem)
    ]
    assert not named
    tests = [p.name for p in (ROOT / "tests" / "study").glob("test_*.py") if ordinal.search(p.stem)]
    assert not tests
