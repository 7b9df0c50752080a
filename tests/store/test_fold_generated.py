"""The fold's unrolled sections (merge.lua's and shared.lua's) are the generator's output, so an edit
of one reaches the other; the stage profiler finds every landmark it cuts before, so an edit of the
fold's Lua cannot leave it measuring the wrong stretch."""

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
    """An edit of a generated stretch fails --check, and --write puts the generator's text back."""
    check = [sys.executable, str(ROOT / "scripts/generate_fold_pass.py"), "--check"]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    lua = ROOT / "redisync/store/lua"
    texts = {path: (lua / path).read_text() for path in ("shared.lua", "semantics/merge.lua")}
    for path, name in (("shared.lua", "join64"), ("semantics/merge.lua", "constants")):
        assert texts[path].count(f"-- BEGIN GENERATED {name}\n") == 1
        assert texts[path].count(f"-- END GENERATED {name}\n") == 1
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    (copy / "redisync/store/lua/semantics").mkdir(parents=True)
    (copy / "scripts/generate_fold_pass.py").write_text((ROOT / "scripts/generate_fold_pass.py").read_text())
    for path, text in texts.items():
        (copy / "redisync/store/lua" / path).write_text(text)
    edited = copy / "redisync/store/lua/shared.lua"
    edited.write_text(texts["shared.lua"].replace("(t[i + 17] or '')", "(t[i + 18] or '')", 1))
    check[1] = str(copy / "scripts/generate_fold_pass.py")
    failed = subprocess.run(check, capture_output=True, text=True)
    assert failed.returncode != 0
    assert "generated join64 differ" in failed.stderr
    # --write puts the generator's text back in place, and only there
    subprocess.run([*check[:2], "--write"], check=True)
    assert edited.read_text() == texts["shared.lua"]
    assert (copy / "redisync/store/lua/semantics/merge.lua").read_text() == texts["semantics/merge.lua"]


def test_every_landmark_of_the_stage_profiler_stands_once_in_fold_lua_and_is_reached_by_a_fold():
    """Each landmark stands on one line of the fold's Lua, and a fold reaches it."""
    stages = runpy.run_path(str(ROOT / "scripts/fold_stages.py"), run_name="fold_stages")
    text = stages["fold_sources"]()
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
                assert "".join(cut.values()).count("do return {'cut'} end") == 1, landmark
                assert reply == [b"cut"], landmark
            library.unload()
    finally:
        store.delete()
    with pytest.raises(SystemExit, match="update LANDMARKS"):
        stages["cut_before"](
            text
            | {"fold.lua": text["fold.lua"].replace("local t = redis.call('TIME')", "local t = redis.call( 'TIME')")},
            "local t = redis.call('TIME')",
        )
