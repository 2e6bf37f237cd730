"""Three tokenizers of three families, trained deterministically on task text.

Their differences are the point: the ensembling methods exist because real models split the same
text differently. All three share two properties the engine relies on:

- exact round trip: the surface strings of ``tok(text, add_special_tokens=False).input_ids``
  concatenate back to ``text`` for any text (``spm`` excepted for a literal U+2581 "▁", which it
  reads as a space, as every SentencePiece model does);
- cuts at whitespace-run starts: a piece never spans a non-whitespace character followed by
  whitespace, so ``encode(t) == encode(t[:s]) + encode(t[s:])`` when ``t[s]`` is whitespace
  (``str.isspace``) and ``t[s-1]`` is not.

| name | family                   | spaces            | " 12" becomes | template |
|------|--------------------------|-------------------|---------------|----------|
| bpe  | byte-level BPE (GPT-2)   | ``Ġ``, ``Ċ``      | ``Ġ12``       | Phi-3    |
| spm  | SentencePiece-like, bytes | ``▁``, no prefix | ``▁ 1 2``     | ChatML   |
| word | word-level BPE, bytes    | raw ``" "``       | ``" " 12``    | Gemma    |

("bytes": byte fallback to ``<0x..>`` tokens; bpe splits rarer numbers too: " 18" -> ``Ġ1 8``.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

MODEL_MAX_LENGTH = 2048

# Python's str.isspace() set, spelled for the Oniguruma regexes of `tokenizers` (its \s differs
# on \x1c-\x1f), so the tokenizers cut exactly where the engine sees a whitespace run start.
WS = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_TAIL = rf"| ?[^{WS}\p{{L}}\p{{N}}]+|[{WS}]+(?![^{WS}])|[{WS}]+"
# GPT-2's pre-tokenizer pattern with that whitespace class.
GPT2_PATTERN = r"'(?:s|t|re|ve|m|ll|d)| ?\p{L}+| ?\p{N}+" + _TAIL
# Same, but a number never takes the space before it, so whole numbers are tokens of their own.
WORD_PATTERN = r"'(?:s|t|re|ve|m|ll|d)| ?\p{L}+|\p{N}+" + _TAIL
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]

PHI3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (  # as Gemma's: no system role, strict alternation, contents trimmed
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# name -> vocab size, special tokens (bos, eos, pad, unk, extra), template, family-specific eos
SPECS = {
    "bpe": dict(
        vocab_size=900,  # small numbers and common words whole, rarer ones split
        bos="<|endoftext|>", eos="<|end|>", pad="<|pad|>", unk=None,
        extra=["<|system|>", "<|user|>", "<|assistant|>"],
        template=PHI3_TEMPLATE,
    ),
    "spm": dict(
        vocab_size=1120,  # 256 of them byte tokens; punctuation sticks to words
        bos="<s>", eos="<|im_end|>", pad="<pad>", unk="<unk>",
        extra=["<|im_start|>", "</s>"],
        template=CHATML_TEMPLATE,
    ),
    "word": dict(
        vocab_size=2000,  # more than the task needs: every task word ends up one token
        bos="<bos>", eos="<end_of_turn>", pad="<pad>", unk="<unk>",
        extra=["<start_of_turn>", "<eos>"],
        template=GEMMA_TEMPLATE,
    ),
}  # fmt: skip


def _specials(spec: dict) -> list[str]:
    names = [spec["pad"], spec["bos"], spec["eos"], spec["unk"], *spec["extra"]]
    return [t for t in dict.fromkeys(names) if t]


def _pipeline(name: str) -> tuple[pre_tokenizers.PreTokenizer, decoders.Decoder]:
    if name == "bpe":
        return (
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            ),
            decoders.ByteLevel(),
        )
    if name == "spm":
        return (
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
                    pre_tokenizers.Split(Regex(f"[{WS}]+"), behavior="isolated"),
                    pre_tokenizers.Digits(individual_digits=True),
                ]
            ),
            decoders.Sequence(
                [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
            ),
        )
    return (
        pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated"),
        decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()]),
    )


def train_tokenizer(name: str, corpus: Iterable[str]) -> PreTrainedTokenizerFast:
    """Train tokenizer `name` ("bpe" | "spm" | "word") on `corpus`; deterministic per corpus."""
    spec = SPECS[name]
    specials = _specials(spec)
    pre, dec = _pipeline(name)
    byte_fallback = name != "bpe"

    tok = Tokenizer(models.BPE(unk_token=spec["unk"], byte_fallback=byte_fallback))
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"] - (len(BYTE_TOKENS) if byte_fallback else 0),
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if name == "bpe" else [],
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)

    if byte_fallback:  # rebuild with <0x00>..<0xFF> as ordinary tokens right after the specials
        trained = json.loads(tok.to_str())["model"]
        learned = [
            t
            for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1])
            if t not in specials
        ]
        vocab = {
            t: i
            for i, t in enumerate(
                specials + BYTE_TOKENS + [t for t in learned if t not in BYTE_TOKENS]
            )
        }
        merges = [
            tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]
        ]
        tok = Tokenizer(
            models.BPE(vocab=vocab, merges=merges, unk_token=spec["unk"], byte_fallback=True)
        )
        tok.pre_tokenizer = pre
        tok.add_special_tokens(specials)
    tok.decoder = dec
    if name == "word":  # like Gemma, plain encode() prepends BOS (the template writes its own)
        bos = spec["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))],
        )

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["pad"],
        unk_token=spec["unk"],
        additional_special_tokens=spec["extra"],
        chat_template=spec["template"],
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_MAX_LENGTH,
    )


def end_of_turn_ids(tok: PreTrainedTokenizerFast) -> list[int]:
    """What the template writes right after an assistant message, up to and including the first
    special token (found by rendering, not hard-coded): e.g. the ids of ``<|im_end|>``."""
    marker = "XYZZY"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}], tokenize=False
    )
    after = text[text.rindex(marker) + len(marker) :]
    ids = tok(after, add_special_tokens=False).input_ids
    special = set(tok.all_special_ids)
    cut = next(i for i, t in enumerate(ids) if t in special)
    return ids[: cut + 1]
