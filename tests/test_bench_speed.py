"""The speed benchmark (each method's time per token against its drafter, side by side, and where
a token goes), its phase clock, and the switch-interval benchmark: outputs written, numbers
consistent with each other, texts kept and compared."""

from __future__ import annotations

import json
import threading

import pytest
from conftest import needs_trained

from lab.bench import speed, switching
from lab.bench.phases import PhaseClock

pytestmark = needs_trained


def test_every_step_a_breakdown_names_is_a_step_of_the_engine():
    """A step that moved to another class would silently go untimed (its time lands in the
    phase around it), so each is looked up where it is defined."""
    from lab.bench.phases import timed_steps

    for owner, attribute, _ in timed_steps():
        assert attribute in owner.__dict__, f"{owner.__name__}.{attribute}"


def test_phases_count_every_moment_once_for_the_innermost_phase():
    now = [0.0]

    def tick(seconds: float) -> None:
        now[0] += seconds

    clock = PhaseClock(wall=lambda: now[0], cpu=lambda: now[0] / 2)
    with clock.phase("outer"):
        tick(3)
        with clock.phase("draft"):
            tick(1)
            with clock.phase("body"):  # a pass's body is named after the phase that asked
                tick(5)
        with clock.phase("head"):  # asked by nothing but "outer"
            tick(2)
        tick(4)
    assert clock.wall == {"outer": 7, "draft": 1, "draft · body": 5, "outer · head": 2}
    assert clock.cpu["draft · body"] == 2.5 and sum(clock.cpu.values()) == 7.5
    assert clock.calls == {"outer": 1, "draft": 1, "draft · body": 1, "outer · head": 1}

    def other() -> None:  # another thread keeps its own stack: nothing of it lands in "outer"
        with clock.phase("verify"):
            tick(6)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert clock.wall["verify"] == 6 and clock.wall["outer"] == 7


def test_speed_benchmark_measures_ratios_and_breakdowns_side_by_side(tmp_path):
    out = tmp_path / "speed"
    configs = [f"{speed.REFERENCE}=single:member=0", "safe (default)=safe"]
    configs += ["penalised=safe:frequency_penalty=0.5"]
    args = ["--n", "2", "--rounds", "2", "--max-new-tokens", "24", "--out", str(out)]
    speed.main(args + [a for c in configs for a in ("--config", c)])
    data = json.loads((out / "results.json").read_text())
    rows = {r["label"]: r for r in data["rows"]}
    assert set(rows) == {speed.REFERENCE, "safe (default)", "penalised"}
    assert data["configurations"]["penalised"] == {"method": "safe", "frequency_penalty": 0.5}
    assert rows[speed.REFERENCE]["x_drafter_min"] == 1.0
    safe = rows["safe (default)"]
    assert len(safe["x_drafter_rounds"]) == 2
    assert safe["x_drafter_min"] == min(safe["x_drafter_rounds"]) <= safe["x_drafter_median"]
    assert data["texts"][speed.REFERENCE] and len(data["texts"]["safe (default)"]) == 2
    for part in data["breakdowns"]:  # the phases add up to the measured time
        assert sum(part["wall"].values()) == pytest.approx(part["seconds"], rel=0.05)
        assert part["passes"]["draft"] >= part["tokens"] - 2  # one draft step per token or so
    verifying = next(b for b in data["breakdowns"] if b["label"] == "safe (default)")
    assert "verify · body" in verifying["wall"] and verifying["passes"]["verify"] >= 1
    drafter = next(iter(verifying["member_passes"]))  # every pass counted once, by member
    assert drafter == "tb-gpt2-bpe"
    assert verifying["member_passes"][drafter]["draft"] >= verifying["tokens"] - 2
    assert sum(sum(asked.values()) for asked in verifying["member_passes"].values()) == sum(
        verifying["passes"].values()
    )
    table = (out / "results.md").read_text()
    assert "| safe (default) |" in table and "| draft · body |" in table

    again = tmp_path / "again"
    speed.main(args[:-1] + [str(again), "--compare", str(out / "results.json")]
               + [a for c in configs for a in ("--config", c)])  # fmt: skip
    same = json.loads((again / "results.json").read_text())["same_texts"]
    assert same == {label: [2, 2] for label in rows}  # greedy: the same


def test_speed_benchmark_takes_prompts_from_a_file_or_says_why_not(tmp_path):
    lines = tmp_path / "prompts.jsonl"
    lines.write_text('{"prompt": "What is 2 + 2?"}\n\n{"prompt": "Name a colour."}\n')
    name, prompts = speed.load_prompts(str(lines), 10, 1)
    assert name == "prompts" and [p[0]["content"] for p in prompts][1] == "Name a colour."
    assert len(speed.load_prompts("questions", 3, 1)[1]) == 3
    with pytest.raises(SystemExit, match="neither 'arithmetic', 'questions'"):
        speed.main(["--prompts", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)])
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt"}\n')
    with pytest.raises(SystemExit, match='needs a "prompt" string'):
        speed.main(["--prompts", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path)])


def test_switch_interval_benchmark_alternates_and_restores_the_interval(tmp_path):
    import sys

    before = sys.getswitchinterval()
    args = ["--methods", "single", "--n", "2", "--level", "2", "--rounds", "2"]
    switching.main(args + ["--max-new-tokens", "8", "--out", str(tmp_path)])
    assert sys.getswitchinterval() == before
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["mode"] for r in rows][0] == "one at a time" and len(rows) == 3
    assert all(len(r["tokens_per_s"]) == 2 and r["min"] > 0 for r in rows)
