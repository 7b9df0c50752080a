"""fold.lua's unrolled sections are the generator's output, so an edit of one reaches the other; the
stage profiler finds every landmark it cuts before, so an edit of fold.lua cannot leave it measuring
the wrong stretch."""

from __future__ import annotations

import runpy
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import redisync

from ..conftest import real_redis_or_skip

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_stretches_of_fold_lua_are_what_the_generator_writes(tmp_path):
    check = [sys.executable, str(ROOT / "scripts/generate_fold_pass.py"), "--check"]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    text = (ROOT / "redisync/store/lua/fold.lua").read_text()
    for name in ("join64", "fold_values"):
        assert text.count(f"-- BEGIN GENERATED {name}\n") == 1
        assert text.count(f"-- END GENERATED {name}\n") == 1
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    (copy / "redisync/store/lua").mkdir(parents=True)
    (copy / "scripts/generate_fold_pass.py").write_text((ROOT / "scripts/generate_fold_pass.py").read_text())
    edited = copy / "redisync/store/lua/fold.lua"
    edited.write_text(text.replace("a17 + b17", "a17 - b17", 1))
    check[1] = str(copy / "scripts/generate_fold_pass.py")
    failed = subprocess.run(check, capture_output=True, text=True)
    assert failed.returncode != 0
    assert "generated fold_values differ" in failed.stderr
    # --write puts the generator's text back in place, and only there
    subprocess.run([*check[:2], "--write"], check=True)
    assert edited.read_text() == text


def test_every_landmark_of_the_stage_profiler_stands_once_in_fold_lua_and_is_reached_by_a_fold():
    stages = runpy.run_path(str(ROOT / "scripts/fold_stages.py"), run_name="fold_stages")
    text = (ROOT / "redisync/store/lua/fold.lua").read_text()
    store = redisync.connect(real_redis_or_skip(), run=f"stages-{uuid.uuid4().hex[:8]}")
    try:
        keys, args = stages["captured_fold"](store, 64, 4)
        for n, (landmark, _) in enumerate(stages["LANDMARKS"]):
            cut = stages["cut_before"](text, landmark)
            library = stages["cut_library"](store.redis, landmark, text, n)
            reply = library.fold(keys=keys, args=[*args[:3], int(args[3]) + 1 + n, *args[4:]])
            if landmark is None:
                assert cut == text
                assert reply[0] == b"applied"
            else:  # the cut runs: a fold reaches every landmark (none is in a branch it skips)
                assert cut.count("do return {'cut'} end") == 1, landmark
                assert reply == [b"cut"], landmark
            library.unload()
    finally:
        store.delete()
    with pytest.raises(SystemExit, match="update LANDMARKS"):
        stages["cut_before"](
            text.replace("local t = redis.call('TIME')", "local t = redis.call( 'TIME')"),
            "local t = redis.call('TIME')",
        )
