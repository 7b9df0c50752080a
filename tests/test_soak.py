"""A short soak in CI: 32 collector processes, Redis SIGKILLed and SIGSTOPped, nothing lost."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SOAK = Path(__file__).resolve().parents[1] / "scripts" / "soak.py"


def test_short_soak_loses_nothing(capsys):
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    code = soak.main(["--collectors", "32", "--seconds", "20", "--elements", "1024", "--publish-every", "0.1",
                      "--faults", "kill@6:1,stop@13:2"])
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    assert "lost 0" in out and "NOT RECOVERED" not in out and "every slot back" in out
