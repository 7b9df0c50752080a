"""fold.lua's unrolled sections are the generator's output, so an edit of one reaches the other; the
stage profiler finds every landmark it cuts before, so an edit of fold.lua cannot leave it measuring
the wrong stretch."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_unrolled_sections_of_fold_lua_are_what_the_generator_writes(tmp_path):
    check = [sys.executable, str(ROOT / "scripts/generate_fold_pass.py"), "--check"]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    fold = ROOT / "redisync/store/lua/fold.lua"
    text = fold.read_text()
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    (copy / "redisync/store/lua").mkdir(parents=True)
    (copy / "scripts/generate_fold_pass.py").write_text((ROOT / "scripts/generate_fold_pass.py").read_text())
    (copy / "redisync/store/lua/fold.lua").write_text(text.replace("a17 + b17", "a17 - b17", 1))
    check[1] = str(copy / "scripts/generate_fold_pass.py")
    failed = subprocess.run(check, capture_output=True, text=True)
    assert failed.returncode != 0 and "fused pass differ" in failed.stderr


def test_every_landmark_of_the_stage_profiler_stands_once_in_fold_lua():
    stages = runpy.run_path(str(ROOT / "scripts/fold_stages.py"), run_name="fold_stages")
    text = (ROOT / "redisync/store/lua/fold.lua").read_text()
    cuts = [stages["cut_before"](text, landmark) for landmark, _ in stages["LANDMARKS"]]
    assert cuts[-1] == text and all(cut.count("do return {'cut'} end") == 1 for cut in cuts[:-1])
    at = [cut.index("do return {'cut'} end") for cut in cuts[:-1]]
    assert at == sorted(at), "the landmarks are not in the order fold.lua runs them"
    with pytest.raises(SystemExit, match="update LANDMARKS"):
        stages["cut_before"](
            text.replace("local t = redis.call('TIME')", "local t = redis.call( 'TIME')"),
            "local t = redis.call('TIME')",
        )
