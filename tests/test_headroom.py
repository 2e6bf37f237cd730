"""The headroom benchmark end to end through the CLI: every member alone, the ceiling and the
share of the gap each ensemble closes computed from this run's own answers, ratios side by side,
the weights learned on the warm-up problems or measured by calibration."""

from __future__ import annotations

import json

import pytest

from core.testbed import WEAK_MODEL, model_paths
from lab.cli import main

pytestmark = pytest.mark.skipif(
    not all((p / "model.safetensors").is_file() for p in model_paths(weak=True)),
    reason="testbed not built: run python -m lab.testbed.build",
)


def test_headroom_rows_ceiling_gap_ratios_and_weights(tmp_path):
    out = tmp_path / "headroom"
    args = ["bench", "--headroom", "--n", "3", "--warmup", "2", "--calibrate", "2"]
    args += ["--sets", "three,weak"]
    args += ["--methods", "safe", "--max-new-tokens", "40", "--out", str(out)]
    assert main(args) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["warmup"] == {"problems": 2, "seed": 2} and data["seed"] == 1
    assert data["calibration"] == {"problems": 2, "seed": 2, "split": "train"}
    assert data["command"].startswith("python -m lab bench --headroom") and data["date"]
    rows = {row["label"]: row for row in data["rows"]}
    names = [p.name for p in model_paths(weak=True)]
    assert names[-1] == WEAK_MODEL
    singles = {n: rows[f"single {n}"] for n in names}
    right = {n: [p["correct"] for p in data["per_problem"][f"single {n}"]] for n in names}
    three, four = "bpe + spm + word", "bpe + spm + word + early"
    assert {f"{three}: safe", f"{four}: safe"} <= set(rows)
    assert any(label.startswith(f"{three}: safe (") for label in rows)  # its best options too
    assert {f"{three}: safe (calibrated)", f"{four}: safe (calibrated)"} <= set(rows)
    for label, row in rows.items():
        if row["method"] == "single":
            assert row["weights"] is None and row["calibration_seconds"] is None
            continue
        members = names if label.startswith(four) else names[:3]
        ceiling = sum(any(r[i] for r in (right[n] for n in members)) for i in range(3)) / 3
        best = max(singles[n]["accuracy"] for n in members)
        assert row["ceiling"] == pytest.approx(ceiling) and row["best_single"] == best
        if ceiling > best:
            expected = (row["accuracy"] - best) / (ceiling - best)
            assert row["gap_closed"] == pytest.approx(expected)
        weights = row["weights"]
        if label.endswith("(calibrated)"):
            assert weights is not None and row["calibration_seconds"] > 0
        if weights is not None:  # None: equal weights (nothing moved them)
            assert set(weights) == set(members) and sum(weights.values()) == pytest.approx(1.0)
        drafter = singles[row["drafter"]]
        assert row["ratio_to_drafter"] == pytest.approx(
            row["ms_per_token"] / drafter["ms_per_token"]
        )
    table = (out / "results.md").read_text()
    assert "gap closed" in table
    assert "weights (2 warm-up problems, calibrated on 2; seed 2)" in table


def test_a_configuration_may_add_generation_settings_to_its_requests(tmp_path):
    out = tmp_path / "headroom"
    args = ["bench", "--headroom", "--n", "4", "--warmup", "0", "--methods", "single"]
    args += ["--config", "penalised=single:member=0,frequency_penalty=2,presence_penalty=2"]
    args += ["--max-new-tokens", "40", "--out", str(out)]
    assert main(args) == 0
    data = json.loads((out / "results.json").read_text())
    rows = {row["label"]: row for row in data["rows"]}
    penalised = rows["penalised"]
    assert penalised["options"] == {"member": 0}
    assert penalised["generation"] == {"frequency_penalty": 2, "presence_penalty": 2}
    plain = [p["text"] for p in data["per_problem"][f"single {model_paths(weak=True)[0].name}"]]
    assert [p["text"] for p in data["per_problem"]["penalised"]] != plain
