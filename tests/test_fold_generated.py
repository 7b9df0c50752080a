"""fold.lua's unrolled sections are the generator's output, so an edit of one reaches the other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
