"""Raw prompts (`GenerationConfig.raw_prompt=True`): the text reaches every member as it is, with
no chat template, through the core, LlamaIndex's `complete(..., formatted=True)` and the CLI
(`/v1/completions` is tested with the server, tests/test_serve_openai.py)."""

from __future__ import annotations

import torch
from gguf_files import write_tiny_gguf

from core import Ensemble, HFMember
from core.cli import main
from core.testbed import model_paths
from llamaindex_ensemble import EnsembleLLM

FEW_SHOT = "Q: 2 + 3\nA: 5\nQ: 4 + 4\nA:"


def _own_greedy(member, text: str, n: int) -> str:
    """transformers' own greedy continuation of the tokenizer's ids for `text`, up to the
    member's first stop id: what a raw prompt must give a single member."""
    ids = member.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = member.model.generate(
            ids, max_new_tokens=n, do_sample=False, pad_token_id=member.tokenizer.eos_token_id
        )
    new = out[0, ids.shape[1] :].tolist()
    stop = next((i for i, t in enumerate(new) if t in member.stop_ids), len(new))
    return member.vocab.decode_bytes(new[:stop]).decode("utf-8", errors="ignore")


def test_a_raw_prompt_is_the_text_each_member_reads(shipped_members):
    for member in shipped_members:
        single = Ensemble([member], "single")
        out = single.generate(FEW_SHOT, raw_prompt=True, max_new_tokens=8)
        assert out.stats.prompt_tokens[member.name] == len(member.tokenizer(FEW_SHOT).input_ids)
        assert out.text == _own_greedy(member, FEW_SHOT, 8)
        templated = single.generate(FEW_SHOT, max_new_tokens=8)
        assert templated.stats.prompt_tokens[member.name] > out.stats.prompt_tokens[member.name]


def test_every_method_reads_the_raw_text_and_streams_what_it_generates(make_ensemble):
    for method in ("token", "safe", "specem", "rerank"):
        ens = make_ensemble(method)
        out = ens.generate(FEW_SHOT, raw_prompt=True, max_new_tokens=6)
        expected = {m.name: len(m.tokenizer(FEW_SHOT).input_ids) for m in ens.members}
        assert out.stats.prompt_tokens == expected, method
        streamed = ens.stream(FEW_SHOT, raw_prompt=True, max_new_tokens=6)
        assert "".join(d.text for d in streamed) == out.text, method


def test_a_schema_still_constrains_a_raw_answer(make_ensemble):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    out = make_ensemble("single").generate(
        'JSON: {"a": 1}\nJSON:', raw_prompt=True, response_format=schema, max_new_tokens=24
    )
    assert out.text.lstrip().startswith('{"a"')


def test_the_bos_token_is_added_once_where_the_tokenizer_adds_one(tmp_path):
    member = HFMember.load(write_tiny_gguf(tmp_path / "bos.gguf", add_bos=True), device="cpu")
    bos = member.tokenizer.bos_token_id
    ens = Ensemble([member], "single")
    plain = ens.stream("the cat", raw_prompt=True, max_new_tokens=1)
    assert plain.members[0].prompt_ids[0] == bos
    spelled = ens.stream("<|im_start|>the cat", raw_prompt=True, max_new_tokens=1)
    assert spelled.members[0].prompt_ids == plain.members[0].prompt_ids  # not twice
    plain.close(), spelled.close()


def test_llamaindex_formatted_complete_is_raw_and_plain_complete_is_a_user_turn(make_ensemble):
    llm = EnsembleLLM(ensemble=make_ensemble("token"), max_new_tokens=6)
    raw = llm.complete(FEW_SHOT, formatted=True)
    counts = {m.name: len(m.tokenizer(FEW_SHOT).input_ids) for m in llm.ensemble.members}
    assert raw.raw["stats"]["prompt_tokens"] == counts
    assert raw.text == llm.ensemble.generate(FEW_SHOT, raw_prompt=True, max_new_tokens=6).text
    streamed = list(llm.stream_complete(FEW_SHOT, formatted=True))
    assert streamed[-1].text == raw.text
    chat_like = llm.complete(FEW_SHOT)
    assert chat_like.text == llm.ensemble.generate(FEW_SHOT, max_new_tokens=6).text


async def test_llamaindex_async_formatted_complete_is_raw(make_ensemble):
    llm = EnsembleLLM(ensemble=make_ensemble("single"), max_new_tokens=6)
    expected = llm.ensemble.generate(FEW_SHOT, raw_prompt=True, max_new_tokens=6).text
    assert (await llm.acomplete(FEW_SHOT, formatted=True)).text == expected
    pieces = [r async for r in await llm.astream_complete(FEW_SHOT, formatted=True)]
    assert pieces[-1].text == expected


def test_the_cli_generates_from_raw_text(capsys):
    path = str(model_paths()[0])
    code = main(["generate", FEW_SHOT, "--model", path, "--method", "single", "--raw",
                 "--max-new-tokens", "6", "--device", "cpu"])  # fmt: skip
    assert code == 0
    expected = Ensemble.from_pretrained([path], "single", device="cpu").generate(
        FEW_SHOT, raw_prompt=True, max_new_tokens=6
    )
    assert capsys.readouterr().out == expected.text + "\n"


def test_the_cli_refuses_a_system_prompt_with_raw_text(capsys):
    path = str(model_paths()[0])
    assert main(["generate", FEW_SHOT, "--model", path, "--raw", "--system", "Be brief."]) == 2
    assert "--raw sends the prompt as it is" in capsys.readouterr().err
