"""The JSONSchemaBench JME cases of the repository's copy (tests/data/jsonschemabench/JME): one loader, one
order (by case number: JME_0, JME_1, JME_2, ..., JME_10), for the benchmarks, perf_analyzer inputs and tests.
Only the repository's copy is read, so a workload never depends on the machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

JME_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "jsonschemabench" / "JME"


def load_jme(limit: int | None = None) -> list[dict]:
    """-> [{name, schema, guide (the schema as a JSON string), instance (its first valid test's data, or None)}]."""
    files = sorted(JME_DIR.glob("*.json"), key=lambda f: int(re.findall(r"\d+", f.stem)[-1]))
    out = []
    for f in files[:limit]:
        d = json.loads(f.read_text())
        valid = [t["data"] for t in d.get("tests", []) if t.get("valid", True)]
        out.append(
            dict(name=f.stem, schema=d["schema"], guide=json.dumps(d["schema"]), instance=valid[0] if valid else None)
        )
    return out
