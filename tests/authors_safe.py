"""A small reference of the SAFE authors' released UniTE loop, written from reading it (their
SAFE/safe_generate_unite.py: `safe_generate_unite`, `get_top_k_tokens`, `update_vocab`,
`vocab_softmax`, `average_and_sample`; upstream yoon6503/SAFE), to check the library's
preset="authors" against: two models, greedy, no KV cache (the cache changes no number).

It works as that code does, on token ids and decoded strings, not on the library's byte
offsets: the drafter keeps its ids (an ensembled id is appended as it is), drafts `gamma`
tokens even past its stop, the verifier re-tokenizes the whole decoded response (special tokens
recognised), positions align where the decoded prefixes match after `lstrip(" ")`, and the
ensemble runs over decoded top-10 strings (a stop is its text) with each model's value for a
string outside its top-10 read from its first sub-token that is not its " " token.
"""

from __future__ import annotations

import torch

# `safe_generate_unite`: a verifier id decoding to one of these ends the turn
END_STRINGS = ("<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<|end|>", "</s>")


def top_strings(logits: torch.Tensor, tokenizer, k: int = 10) -> dict[str, list]:
    """`get_top_k_tokens`: decoded string -> [logit, id] over the top-k, highest first; a string
    two ids decode to keeps its first place and takes the later id's values."""
    found: dict[str, list] = {}
    for i in torch.topk(logits, k).indices.tolist():
        found[tokenizer.decode(i)] = [float(logits[i]), i]
    return found


def fill_union(own: dict[str, list], union, tokenizer, logits: torch.Tensor) -> dict[str, list]:
    """`update_vocab` then `vocab_softmax`: strings of the union outside this model's top-k are
    read by their one token, else by their first sub-token other than the " " token ("" reads
    the " " token); then the logits are softmaxed over the union."""
    own = dict(own)
    blank = tokenizer.encode(" ", add_special_tokens=False)[0]
    for s in union:
        if s in own:
            continue
        ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(s)) if s else [blank]
        sub = ids[0] if len(ids) == 1 else next(i for i in ids if i != blank)
        own[s] = [float(logits[sub]), sub]
    probs = torch.softmax(torch.tensor([v[0] for v in own.values()]), 0).tolist()
    return {s: [p, v[1]] for (s, v), p in zip(own.items(), probs, strict=True)}


def choose(drafter: dict, drafter_top: list[str], verifier: dict, threshold: float = 0.1):
    """`average_and_sample` with heuristic sharpening: the 0.5/0.5 average; where its max is
    below one half, each candidate above `threshold` among the drafter's top-k (not " ") gains
    every other candidate that starts with it. The first maximum wins (drafter's order)."""
    mean = {s: 0.5 * drafter[s][0] + 0.5 * verifier[s][0] for s in drafter}
    if max(mean.values()) < 0.5:
        before = dict(mean)
        for s in [s for s, p in before.items() if p > threshold and s in drafter_top]:
            if s != " ":
                mean[s] += sum(p for t, p in before.items() if t != s and t.startswith(s))
    best = max(mean.values())
    s = next(s for s, p in mean.items() if p == best)
    return s, drafter[s][1], verifier[s][1]


def ensemble(d_logits, d_tok, v_logits, v_tok, k: int = 10):
    """One ensemble step: the chosen string, the drafter id it appends, the verifier's id."""
    d_top, v_top = top_strings(d_logits, d_tok, k), top_strings(v_logits, v_tok, k)
    union = list(d_top) + [s for s in v_top if s not in d_top]
    d_all = fill_union(d_top, union, d_tok, d_logits)
    v_all = fill_union(v_top, union, v_tok, v_logits)
    return choose(d_all, list(d_top), v_all)


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def generate(drafter, verifier, messages, max_new: int, gamma: int = 5) -> tuple[str, int]:
    """`safe_generate_unite` on two members' models and tokenizers: the response text (the
    drafter's stop left out) and the number of ensemble steps."""
    d_tok, v_tok = drafter.tokenizer, verifier.tokenizer
    d_prompt, v_prompt = drafter.render(messages), verifier.render(messages)
    end_strings = (d_tok.eos_token, v_tok.eos_token, *END_STRINGS)
    seq, plen, vplen = list(d_prompt), len(d_prompt), len(v_prompt)
    cur, vcur, steps = plen, vplen, 0
    while cur < plen + max_new:
        rows = []
        for _ in range(gamma):  # Generate: gamma greedy tokens, past the stop too
            rows.append(_logits(drafter.model, seq)[-1])
            seq.append(int(torch.argmax(rows[-1])))
        text = d_tok.decode(seq[plen:])
        vseq = list(v_prompt) + v_tok(text, add_special_tokens=False)["input_ids"]
        if cur > plen:  # where the verifier's tokens reach the committed text again
            before = d_tok.decode(seq[plen:cur])
            if len(before) > len(v_tok.decode(vseq[vplen:])):
                vcur = len(vseq)
            else:
                vcur -= gamma
                while len(before) > len(v_tok.decode(vseq[vplen:vcur])):
                    vcur += 1
        v_logits = _logits(verifier.model, vseq)
        hit = None
        for i in range(len(vseq) - vcur):  # Verify: earliest verifier position first
            v_row, v_token = v_logits[vcur + i - 1], vseq[vcur + i]
            v_text = v_tok.decode(vseq[vplen : vcur + i]).lstrip(" ")
            for j in range(gamma):
                d_text = d_tok.decode(seq[plen : cur + j]).lstrip(" ")
                if d_text == v_text:  # token j-1 is not OOV-like
                    p_d = float(torch.softmax(rows[j], -1)[seq[cur + j]])
                    p_v = float(torch.softmax(v_row, -1)[v_token])
                    if p_d + p_v < 1.0 and int(torch.argmax(v_row)) != v_token:
                        hit = (j, v_row)
                    break
                if len(d_text) > len(v_text):
                    break
            if hit:
                break
        if hit:  # Ensemble: one drafter id replaces token j, the rest of the draft goes
            j, v_row = hit
            _, d_id, v_id = ensemble(rows[j], d_tok, v_row, v_tok)
            if v_tok.decode(v_id) in end_strings:
                d_id = d_tok.eos_token_id
            seq = seq[: cur + j] + [d_id]
            steps += 1
        new = seq[cur:]
        if d_tok.eos_token_id in new:
            return d_tok.decode(seq[plen : cur + new.index(d_tok.eos_token_id)]), steps
        cur += j + 1 if hit else gamma
    return d_tok.decode(seq[plen:]), steps
