"""The engine used as a library in a plain script: no `if __name__ == "__main__":` guard needed, the script runs
once (the grammar workers never re-run it), and the workers start only when a guide needs them."""

import subprocess
import sys
import textwrap
from pathlib import Path

from specgram.request import SamplingParams

from .helpers import run_to_end

BACKEND = Path(__file__).resolve().parents[2] / "backend"


def test_a_script_without_a_main_guard_runs_once_and_gets_guided_output(tmp_path, tiny_ckpt):
    script = tmp_path / "plain.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(BACKEND)!r})
        from specgram.config import EngineConfig
        from specgram.engine.engine import Engine
        from specgram.engine.generate import generate
        from specgram.request import SamplingParams
        print("script body ran", flush=True)
        engine = Engine.from_config(EngineConfig(checkpoint={str(tiny_ckpt)!r}, max_seq_len=64, max_slots=2))
        req = engine.make_request(SamplingParams(max_tokens=8, guide_type="regex", guide="[ab]{{4}}"), text="hi")
        text = "".join(o.text for g in generate(engine, [req]).generations for o in g.outputs)
        print("output", text, flush=True)
        engine.close()
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("script body ran") == 1, done.stdout
    [line] = [x for x in done.stdout.splitlines() if x.startswith("output ")]
    text = line.removeprefix("output ")
    assert len(text) == 4 and set(text) <= {"a", "b"}, line


def test_workers_start_with_the_first_guide(make_engine):
    engine = make_engine()
    try:
        run_to_end(engine, [engine.make_request(SamplingParams(max_tokens=4), text="hi")])
        assert engine.grammar._pools == [], "an unguided request started the compile workers"
        req = engine.make_request(SamplingParams(max_tokens=4, guide_type="regex", guide="[ab]{4}"), text="hi")
        run_to_end(engine, [req])
        assert len(engine.grammar.pool.worker_pids()) == 2
    finally:
        engine.close()
