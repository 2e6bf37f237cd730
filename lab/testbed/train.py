"""Train one testbed model: fixed steps, seeded, CPU. Loss on assistant tokens only."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import torch

from .data import IGNORE, Example, examples


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 40
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 0
    p_add: float = 0.5  # share of addition steps in the training problems
    form_weights: dict = field(default_factory=lambda: {"cot": 0.7, "rag": 0.15, "react": 0.15})
    # stop after this many steps: an early checkpoint of the same run (same data, order and
    # learning-rate schedule as the run of `steps` steps, so its weights are that run's then)
    stop_after: int | None = None


def _batches(data: list[Example], cfg: TrainConfig) -> list[list[Example]]:
    """`cfg.steps` batches, each from one form (similar lengths, little padding)."""
    rng = random.Random(cfg.seed)
    by_form = {f: [e for e in data if e.form == f] for f in cfg.form_weights}
    forms = rng.choices(
        list(cfg.form_weights), weights=list(cfg.form_weights.values()), k=cfg.steps
    )
    cursor = dict.fromkeys(by_form, 0)
    out = []
    for f in forms:
        pool, i = by_form[f], cursor[f]
        out.append([pool[(i + j) % len(pool)] for j in range(cfg.batch_size)])
        cursor[f] = i + cfg.batch_size
    return out


def _collate(batch: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id)
    labels = torch.full((len(batch), width), IGNORE)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, e in enumerate(batch):
        ids[row, : len(e.ids)] = torch.tensor(e.ids)
        labels[row, : len(e.ids)] = torch.tensor(e.labels)
        mask[row, : len(e.ids)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def training_data(tok, cfg: TrainConfig) -> list[Example]:
    """Enough fresh training problems for every batch (one example per problem and form)."""
    per_form = {}
    for form, w in cfg.form_weights.items():
        need = math.ceil(cfg.steps * cfg.batch_size * w * 1.1) + cfg.batch_size
        per_form[form] = need
    return examples(tok, per_form, seed=cfg.seed, p_add=cfg.p_add)


def train(model: torch.nn.Module, tok, cfg: TrainConfig, log_every: int = 100) -> dict:
    """Train `model` in place; returns {"seconds", "final_loss"}."""
    torch.manual_seed(cfg.seed)
    batches = _batches(training_data(tok, cfg), cfg)[: cfg.stop_after]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to min_lr_ratio
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        t = (step - cfg.warmup) / max(cfg.steps - cfg.warmup, 1)
        return cfg.lr * (
            cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))
        )

    model.train()
    t0, smooth = time.time(), None
    for step, batch in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(**_collate(batch, tok.pad_token_id)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if log_every and (step + 1) % log_every == 0:
            print(f"  step {step + 1}/{len(batches)} loss {smooth:.3f} ({time.time() - t0:.0f} s)")
    model.eval()
    return {"seconds": time.time() - t0, "final_loss": smooth}
