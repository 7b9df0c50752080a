"""The layout is checked, not prose: the import contracts in pyproject.toml (layers, no torch below
the terms) hold, a violation is caught, and ruff's lint and format pass."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath else dict(os.environ)
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.extras("lint-imports")
def test_the_import_contracts_hold():
    """The package's import contracts hold (layers, no torch in the runtime, the store imports no tool)."""
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "3 kept, 0 broken" in out.stdout


@pytest.mark.extras("lint-imports")
def test_an_upward_import_breaks_a_contract(tmp_path):
    """A copy of the package whose store imports the collector: lint-imports refuses it."""
    shutil.copytree(ROOT / "redisync", tmp_path / "redisync", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    keys = tmp_path / "redisync" / "store" / "keys.py"
    keys.write_text(keys.read_text() + "\nfrom ..collector import syncer  # noqa: E402  (the deliberate violation)\n")
    out = lint_imports(tmp_path, pythonpath=tmp_path)
    assert out.returncode != 0
    assert "BROKEN" in out.stdout, out.stdout[-3000:]
    assert "redisync.store.keys -> redisync.collector.syncer" in out.stdout, out.stdout[-3000:]


@pytest.mark.extras("ruff")
def test_ruff_lint_and_format_pass():
    """ruff's lint and format checks pass over the tree."""
    lint = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0, lint.stdout[-3000:]
    fmt = subprocess.run(
        [str(BIN / "ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert fmt.returncode == 0, fmt.stdout[-3000:]


@pytest.mark.extras("mypy")
def test_the_type_check_passes():
    """mypy on the whole package, strict on the store, the collector runtime and the terms, basic elsewhere
    (pyproject.toml's [tool.mypy]): no error."""
    out = subprocess.run([str(BIN / "mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "Success: no issues found" in out.stdout


def test_every_public_name_of_the_package_says_what_it_is():
    """The API reference is generated from the docstrings: every public module, class, function and
    method (the research code of study/ and the tools of bench/ and demo/ aside) has one."""
    import ast

    missing = []
    for path in sorted((ROOT / "redisync").rglob("*.py")):
        if {"study", "bench", "demo"} & set(path.parts):
            continue
        tree = ast.parse(path.read_text())
        if not ast.get_docstring(tree):
            missing.append(f"{path.relative_to(ROOT)}: the module")

        def walk(node, prefix, path=path):
            for n in ast.iter_child_nodes(node):
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not n.name.startswith("_"):
                    if not ast.get_docstring(n):
                        missing.append(f"{path.relative_to(ROOT)}:{n.lineno} {prefix}{n.name}")
                    if isinstance(n, ast.ClassDef):
                        walk(n, f"{prefix}{n.name}.")

        walk(tree, "")
    assert not missing, "\n".join(missing)


def test_a_hung_test_ends_the_run_instead_of_waiting_out_ci(tmp_path):
    """pyproject's per-test timeout is in force (pytest-timeout, the thread method): a test that hangs
    is stopped with every thread's stack printed. Unknown markers are refused (--strict-markers)."""
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    (tmp_path / "test_typo.py").write_text("import pytest\n\n@pytest.mark.integraton\ndef test_typo():\n    pass\n")
    base = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(tmp_path),
    ]
    hung = subprocess.run(
        [*base, "-o", "timeout=2", str(tmp_path / "test_hang.py")], capture_output=True, text=True, timeout=120
    )
    assert hung.returncode != 0
    assert "Timeout" in hung.stdout + hung.stderr
    typo = subprocess.run([*base, str(tmp_path / "test_typo.py")], capture_output=True, text=True, timeout=120)
    assert typo.returncode != 0
    assert "'integraton' not found in `markers` configuration option" in typo.stdout + typo.stderr


def test_a_semantics_lives_in_its_modules_and_the_sidecar_is_a_worker_not_a_syncer():
    """The envelope stays the envelope (fold.lua at most 600 lines: each semantics' Lua is its own
    module, itself at most 650 lines written by hand), and no module of the sidecar subclasses or builds a
    Syncer (the collector's Syncer holds its worker; the sidecar process runs a network loop for a Relay)."""
    import ast

    fold = ROOT / "redisync/store/lua/fold.lua"
    assert len(fold.read_text().splitlines()) <= 600
    # each semantics' Lua module at most 650 lines written by hand (the generated stretches aside)
    for module in (ROOT / "redisync/store/lua/semantics").glob("*.lua"):
        text = re.sub(r"-- BEGIN GENERATED (\w+)\n.*?-- END GENERATED \1\n", "", module.read_text(), flags=re.S)
        assert len(text.splitlines()) <= 650, module.name
    for path in sorted((ROOT / "redisync/collector").glob("sidecar*.py")):
        tree = ast.parse(path.read_text())
        bases = {
            node.name: [ast.unparse(b) for b in node.bases] for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
        }
        assert not [name for name, base in bases.items() if any(b.endswith("Syncer") for b in base)], (path, bases)
        built = [
            ast.unparse(node.func)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("Syncer", "new_syncer")
        ]
        assert not built, (path, built)


def test_the_life_cycle_is_the_envelopes_and_merge_lua_is_the_exact_sum():
    """Who has left a key is judged once, by the fold's envelope (lifecycle.lua, as the Python
    reference fold hands its semantics the leases): no semantics' Lua reads a run-wide key (the run's
    meta, shards hash, lease and give-up indexes, written indexes) or the served clock itself, and
    merge.lua keeps the exact pooled sum in at most 400 lines written by hand."""
    run_wide = re.compile(r"fold\.(run|run_meta|shards|clock)\b|\bKEYS\b|lease_ends|gave_up|written:")
    found = {}
    for module in (ROOT / "redisync/store/lua/semantics").glob("*.lua"):
        code = re.sub(r"--[^\n]*", "", module.read_text())
        hits = sorted({m.group(0) for m in run_wide.finditer(code)})
        if hits:
            found[module.name] = hits
    assert not found, f"semantics reading run-wide keys themselves: {found}"
    merge = (ROOT / "redisync/store/lua/semantics/merge.lua").read_text()
    hand = re.sub(r"-- BEGIN GENERATED (\w+)\n.*?-- END GENERATED \1\n", "", merge, flags=re.S)
    assert len(hand.splitlines()) <= 400
    fold = (ROOT / "redisync/store/lua/fold.lua").read_text()
    assert "LIFECYCLE.judge(" in fold
    assert "LIFECYCLE.record(" in fold


def test_docs_hold_documentation_and_the_records_live_apart():
    """docs/ holds the site's pages, their figures and the studies' plans and reports; what runs left
    (run files, results, benchmark outputs, logs, screenshots of a check) lives in records/."""
    tracked = subprocess.run(["git", "ls-files", "docs"], cwd=ROOT, capture_output=True, text=True, check=True)
    docs = tracked.stdout.split()
    assert docs
    stray = [p for p in docs if not p.endswith((".md", ".png", ".css")) or "site-check" in p or "/bench/" in p]
    assert not stray, f"records kept among the docs: {stray[:10]}"
    records = subprocess.run(["git", "ls-files", "records"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "records/README.md" in records.stdout.split()


def test_a_semantics_reads_only_what_the_fold_passes_it():
    """A semantics' Lua reads the fold being made from the context it is passed (``fold.shard``,
    ``fold.now_s``, ...), never from the envelope's own variables (shared.lua's block "One fold's own
    state"): its check, apply and pull say in their arguments what they depend on."""
    shared = (ROOT / "redisync/store/lua/shared.lua").read_text()
    block = shared.split("-- One fold's own state", 1)[1].split("\n\n", 1)[0]
    state = {
        name.strip()
        for line in block.splitlines()
        if line.startswith("local ")
        for name in line[len("local ") :].split("--")[0].split(",")
    }
    state |= {"run_clock"}
    assert {"KEYS", "shard", "inc", "seq", "now_s", "own", "run"} <= state, state
    read = {}
    for module in (ROOT / "redisync/store/lua/semantics").glob("*.lua"):
        code = re.sub(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"", "''", module.read_text())
        code = re.sub(r"--[^\n]*", "", code)
        names = {m.group(1) for m in re.finditer(r"(?<![\w.])([A-Za-z_]\w*)(?!\w)", code)} & state
        if names:
            read[module.name] = sorted(names)
    assert not read, f"semantics reading the envelope's own variables instead of the fold context: {read}"


def test_terms_and_integrations_ask_their_role_not_a_mode_or_semantics_string():
    """A term's modes map to a `Role` once (terms/role.py); the terms and the drop-ins ask it (syncs,
    broadcasts, acts_alone) and never compare a mode with ``"local"``/``"observe"`` or a role's
    semantics with a name (the registry is the one place that names a semantics)."""
    pattern = re.compile(
        r"""(mode\s*[!=]=\s*["'](local|observe|pooled)["']|mode in \(["']local|semantics\s*[!=]=\s*["'])"""
    )
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in ("redisync/terms", "redisync/integrations")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line.split("#")[0])
    ]
    assert not found, "\n".join(found)


def test_only_the_store_client_talks_to_redis():
    """The store client's modules alone import redis-py or reach into a store's connection
    (``.redis``): the inspector, the exporter, watch, the aggregator, the collector's listener and
    the bench go through their API (the bench measures the server through `Store.server`)."""
    allowed = {
        "redisync/store/" + name
        for name in (
            "connection.py",
            "runs.py",
            "protocol.py",
            "reads.py",
            "subscription.py",
            "library.py",
            "server.py",
        )
    }
    talking = []
    for path in sorted((ROOT / "redisync").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            imports = re.search(r"^\s*(import redis\b|from redis\b)", code)
            if imports or re.search(r"\.redis\b", code.replace("redisync.", "")):
                talking.append(f"{rel}:{n}: {line.strip()}")
    assert not talking, "\n".join(talking)


def test_every_test_says_the_invariant_it_holds():
    """Every test function has a docstring (the invariant it holds, as rsl_rl's tests say theirs)."""
    import ast

    bare = [
        f"{path.relative_to(ROOT)}::{node.name}"
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
        and not ast.get_docstring(node)
    ]
    assert bare == [], bare
