"""`llm-ensembling calibrate`: the trust a server loads, measured for the ensemble its config
describes and written where `serve` reads it; bad input named at the call."""

from __future__ import annotations

import json

import pytest

from core import Ensemble
from core.cli import main
from core.serve.settings import build_settings, read_config

PROMPTS = ["What is 2 + 3?", "Tom has 4 apples. He eats 1. How many are left?", "Name a color."]


@pytest.fixture
def config(tmp_path, tiny_dirs):
    """An ensemble.toml of two tiny members voting with rerank, its trust in trust.json."""
    members = ", ".join(json.dumps(tiny_dirs[name]) for name in ("tb-gpt2-bpe", "tb-qwen2-spm"))
    path = tmp_path / "ensemble.toml"
    weights = tmp_path / "trust.json"
    path.write_text(f'method = "rerank"\nmembers = [{members}]\nweights = "{weights}"\n')
    return path, weights


def test_calibrate_writes_the_trust_serve_loads_for_its_config(config, tmp_path, tiny_dirs, capsys):
    path, weights = config
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n\n")
    args = ["calibrate", "--config", str(path), "--prompts", str(prompts)]
    assert main([*args, "--max-new-tokens", "8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["saved"] == str(weights) and weights.is_file()
    pair = [tiny_dirs["tb-gpt2-bpe"], tiny_dirs["tb-qwen2-spm"]]
    direct = Ensemble.from_pretrained(pair, "rerank")
    assert report["weights"] == pytest.approx(direct.calibrate(PROMPTS, max_new_tokens=8))
    served = build_settings(read_config(str(path))).ensemble.load()  # what serve loads
    assert served.member_weights == pytest.approx(report["weights"])
    assert served.summary()["self_preference"] == report["self_preference"]
    assert served.learn_weights is False


def test_calibrate_reads_message_lists_from_jsonl_and_writes_to_out(tiny_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    lines = [json.dumps(PROMPTS[0]), json.dumps([{"role": "user", "content": PROMPTS[1]}])]
    prompts.write_text("\n".join(lines))
    out = tmp_path / "elsewhere.json"
    args = ["calibrate", "--model", tiny_dirs["tb-gpt2-bpe"], "--model", tiny_dirs["tb-llama-word"]]
    args += ["--method", "specem", "--prompts", str(prompts), "--max-new-tokens", "8"]
    assert main([*args, "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["saved"] == str(out) and out.is_file()


@pytest.mark.parametrize(
    "content, extra, needle",
    [
        (None, [], "--out trust.json"),
        ('"fine"\n{not json\n', ["--out", "x.json"], "line 2: not JSON"),
        ("\n\n", ["--out", "x.json"], "holds no prompt"),
    ],
)
def test_bad_calibrate_input_is_named_with_the_fix(
    tiny_dirs, tmp_path, capsys, content, extra, needle
):
    args = ["calibrate", "--model", tiny_dirs["tb-gpt2-bpe"]]
    args += ["--model", tiny_dirs["tb-qwen2-spm"], *extra]
    if content is not None:
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text(content)
        args += ["--prompts", str(prompts)]
    assert main(args) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
