"""Member trust: how far an ensemble trusts each member, learned from its own decisions.

There is one `MemberTrust` per `Ensemble`, shared by all of its requests. Like the loaded
models, it lives longer than any one request. Labels are never needed. At each decision a
method reports how far each member it asked backed what was committed, as a reward in
[0, 1] (`TrustView.update`, the one call a method makes). A bounded multiplicative rule
turns these rewards into weights that sum to 1. The rule is Hedge (`hedge`, which SpecEM also
uses inside a request) with a constant step, discounted: before each step the weights are
raised to the power 1 - eta/SPREAD, so older decisions fade. The log-weights then settle at
SPREAD times each member's recent rate of backing what was committed. They neither collapse
onto the one member that backs a little more often nor stop adapting. A lower clamp keeps
every weight above 0. A request's decisions update the trust when the request finishes, in one
locked step: concurrent requests lose no update, and a request that fails leaves no trace.

`Ensemble.calibrate` may also set each member's self-preference (`SelfPreference`): how far it
sets its own answers apart from the others' when it judges them. SpecEM's and rerank's votes
read each voter's scores at a temperature of its margin over the least partial voter's, so a
member that is merely surer of its own text does not win every vote. It is measured once and
frozen with the weights, never learned.

The methods read the weights as follows:
- weighted aggregation in `token` and SAFE;
- the prior of SpecEM's vote;
- SAFE's choice of drafter;
- a floor: a member whose weight is below `floor` times an equal share (1/K for K members) is
  not asked at all, so it costs nothing. Every `probe_every`-th request asks it again, so it
  can recover.

A request reads the weights as they stand when it starts, and keeps them to its end. When the
weights are frozen (`learn=False`), nothing moves them and no probe runs, so a request's text
depends on that request alone. When every weight is equal (a fresh ensemble, or after
`reset`), every method decides exactly as it does without trust.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch

from .errors import InvalidConfigError
from .events import TrustUpdated
from .validate import check_bool
from .vocab import EOS

# Learned log-weights settle at SPREAD x each member's recent rate of backing the committed text,
# so a member that backs every decision ends at most e**SPREAD (20x) above one that backs none,
# however long it learns: weights stay a graded mixture, not a collapse onto one member.
SPREAD = 3.0
MAX_ETA = 50.0  # Hedge's step, bounded: exp(50) cannot overflow, so weights never become NaN
PREFERENCE_SCORES = ("logprob", "min")  # the softmaxed vote scores a self-preference is in
MIN_WEIGHT = 1e-6  # no weight falls below this: each stays positive, so each can recover
FILE_FORMAT = "llm-ensembling member weights"


def hedge(weights: torch.Tensor, rewards: torch.Tensor, lr: float, t: int) -> torch.Tensor:
    """Multiplicative weights: w <- normalise(w * exp(eta_t * r)), eta_t = lr * sqrt(1/K) / t.

    eta_t is capped at MAX_ETA, and a weight that underflows is clamped to MIN_WEIGHT (the
    rest is then normalised again). So whatever `lr` is, the weights stay finite and positive.
    Within these bounds the result is the plain rule, bit for bit."""
    eta = min(lr * math.sqrt(1.0 / weights.shape[0]) / t, MAX_ETA)
    updated = weights * torch.exp(eta * rewards)
    updated = updated / updated.sum()
    if bool((updated < MIN_WEIGHT).any()):
        updated = updated.clamp_min(MIN_WEIGHT)
        updated = updated / updated.sum()
    return updated


def backers(
    names: Sequence[str], probs: torch.Tensor, strings: Sequence[str], chosen: int
) -> dict[str, float]:
    """The reward at one decision over aligned candidate strings (`probs[member, candidate]`,
    `chosen` the committed candidate). A member gets 1 when its likeliest candidate spells the
    same text as the committed one as far as both go, and 0 otherwise. "As far as both go"
    means one of the two strings is a prefix of the other. So a member that splits a word
    differently ("▁" or " butt" where " buttons" was committed) still backs it, and one that
    wanted another word does not. An end of turn backs only an end of turn."""
    best, top = probs.max(1)
    target = strings[chosen]

    def backs(i: int) -> bool:
        own = strings[int(top[i])]
        if best[i] <= 0 or EOS in (own, target):
            return best[i] > 0 and own == target
        return own.startswith(target) or target.startswith(own)

    return {name: float(backs(i)) for i, name in enumerate(names)}


@dataclass(frozen=True)
class SelfPreference:
    """How far each member, as a judge, sets its own answer apart from the other members'
    answers: the mean absolute difference between its score of its own answer and its mean
    score of the others' (in the vote's `score`: "logprob", mean token log-prob; "min", the
    least likely token's), measured on calibration prompts where the answers differ. Each
    member prefers its own text, an instruction-tuned one by several nats where a base model
    prefers its own by about one, so without a correction the surer judge decides every vote
    whoever is right."""

    score: str
    margins: dict[str, float]

    def temperatures(self, names: Sequence[str]) -> list[float] | None:
        """Each of these voters' softmax temperature: its margin over the least margin among
        them (at least 1), so every judge's usual separation is the least partial one's and a
        judge that separates little is never sharpened. None when nothing moves."""
        margins = [self.margins[n] for n in names]
        least = min(margins)
        temperatures = [m / least for m in margins]
        return temperatures if any(t != 1.0 for t in temperatures) else None

    def to_json(self) -> dict:
        return {"score": self.score, "margins": dict(self.margins)}


@dataclass(frozen=True)
class TrustPlan:
    """The trust as one request sees it. `weights` is the snapshot the request uses; `asked`
    lists the members it runs, in ensemble order. A member under the floor is left out unless
    this request probes."""

    weights: dict[str, float]
    asked: list[str]
    probe: bool = False
    self_preference: SelfPreference | None = None


class TrustView:
    """One request's handle on the trust: the weights it started with, and `update`, which
    records a decision. The recorded decisions reach the trust only when the request finishes
    (`commit`, one locked step). A request that fails or is cancelled leaves the trust as it
    was."""

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        trust: MemberTrust | None = None,
        self_preference: SelfPreference | None = None,
    ) -> None:
        self.weights = dict(weights or {})
        self.self_preference = self_preference  # calibrated, frozen; None: no correction
        self._trust = trust
        self._decisions: list[dict[str, float]] = []

    def of(self, names: Sequence[str]) -> list[float] | None:
        """The weights of these members, in this order. None means they are all equal, and
        then a method decides exactly as it does without trust."""
        values = [self.weights.get(n, 1.0) for n in names]
        return None if len(set(values)) <= 1 else values

    def update(self, rewards: Mapping[str, float]) -> None:
        """Report one decision: member name -> how far it backed what was committed (0..1)."""
        if self._trust is not None and self._trust.learn:
            self._decisions.append({n: float(r) for n, r in rewards.items()})

    def commit(self) -> TrustUpdated | None:
        """The request finished: its decisions update the trust. Returns the event, or None
        when nothing moved."""
        decisions, self._decisions = self._decisions, []
        return self._trust.apply(decisions) if self._trust is not None else None


class MemberTrust:
    """Its settings are the ensemble's options learn_weights, weight_lr, weight_floor and
    probe_every (`core.options` declares and checks them):
    - `learn`: update the weights from requests. False freezes them.
    - `lr`: the Hedge step. Each update multiplies a member's weight by exp(eta * reward),
      where eta = lr * sqrt(1/K) and K is the number of members it covers. It first discounts
      the weights by the power 1 - eta/SPREAD. A larger `lr` learns and forgets faster, but
      not further.
    - `floor`: a member whose weight is below `floor` times an equal share (1/K) is not asked.
      It must be in [0, 1), so equal weights ask everyone, and so does 0.
    - `probe_every`: every N-th request also asks the members under the floor. Only learning
      trust probes."""

    def __init__(
        self,
        names: Sequence[str],
        *,
        learn: bool,
        lr: float,
        floor: float,
        probe_every: int,
    ) -> None:
        self.names = list(names)
        self.learn, self.lr, self.floor, self.probe_every = learn, lr, floor, probe_every
        self._lock = threading.Lock()
        self._weights = _uniform(len(self.names))
        self.self_preference: SelfPreference | None = None  # set by calibration only
        self.updates = 0  # updates applied since the last reset or load
        self.requests = 0  # requests planned (the probe schedule counts them)

    # --- reading ---------------------------------------------------------------------------

    @property
    def weights(self) -> dict[str, float]:
        with self._lock:
            return self._named(self._weights)

    def plan(self) -> TrustPlan:
        """A request starts: count it, and return its snapshot and the members it asks."""
        with self._lock:
            self.requests += 1
            weights = self._weights.clone()
            probe = self.learn and self.requests % self.probe_every == 0
            preference = self.self_preference
        bar = self.floor / len(self.names)
        named = self._named(weights)
        asked = [n for n, w in named.items() if probe or w >= bar]
        return TrustPlan(named, asked, probe, preference)

    def summary(self) -> dict:
        return {
            "member_weights": self.weights,
            "learn_weights": self.learn,
            "weight_lr": self.lr,
            "weight_floor": self.floor,
            "probe_every": self.probe_every,
            "weight_updates": self.updates,
            "self_preference": self.self_preference.to_json() if self.self_preference else None,
        }

    # --- writing ---------------------------------------------------------------------------

    def apply(self, decisions: Sequence[Mapping[str, float]]) -> TrustUpdated | None:
        """One request's decisions, each a mapping of member name to reward (0..1), applied
        in order under the lock. For each decision, Hedge runs over the members it names and
        the others keep their share. A decision with fewer than two members, or with equal
        rewards, moves nothing and is skipped. Returns the event, or None when nothing moved
        (a frozen trust moves nothing)."""
        moving = [d for d in decisions if len(d) > 1 and len(set(d.values())) > 1]
        steps = [
            ([self.names.index(n) for n in d], torch.tensor(list(d.values()), dtype=torch.float64))
            for d in moving
        ]
        if not steps:
            return None
        with self._lock:
            if not self.learn:
                return None
            weights = self._weights.clone()
            for index, rewards in steps:
                share = weights[index].sum()
                forget = min(self.lr * math.sqrt(1.0 / len(index)) / SPREAD, 1.0)
                kept = (weights[index] / share).pow(1.0 - forget)  # older decisions fade
                weights[index] = hedge(kept / kept.sum(), rewards, self.lr, 1) * share
                if bool((weights < MIN_WEIGHT).any()):
                    weights = weights.clamp_min(MIN_WEIGHT)
                    weights = weights / weights.sum()
            self._weights = weights
            self.updates += len(steps)
            named, total = self._named(weights), self.updates
        return TrustUpdated(total, len(steps), named, _mean_rewards(moving))

    def reset(self) -> None:
        """Equal weights again, no self-preference: every method then decides exactly as it
        does without trust."""
        with self._lock:
            self._weights = _uniform(len(self.names))
            self.self_preference = None
            self.updates = 0

    def save(self, path: str | os.PathLike) -> Path:
        """Write the weights as JSON. The file is written atomically (a temporary file in the
        same folder, then `os.replace`), so a reader never sees half of it."""
        path = Path(path)
        with self._lock:
            data = {
                "format": FILE_FORMAT,
                "weights": self._named(self._weights),
                "updates": self.updates,
            }
            if self.self_preference is not None:
                data["self_preference"] = self.self_preference.to_json()
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
        folder = path.parent if str(path.parent) else Path(".")
        if not folder.is_dir():
            raise InvalidConfigError(
                f"cannot save member weights to {str(path)!r}: folder {str(folder)!r} does not "
                "exist; create it first or pick another path."
            )
        handle, temp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        return path

    def load(self, path: str | os.PathLike, *, freeze: bool = True) -> None:
        """Read weights that `save` wrote, or that a user wrote in the same form. The file is
        checked whole before anything changes. It must name exactly this ensemble's members
        and give each a finite weight above 0. Weights that do not sum to 1 are normalised.
        `freeze=True` (the default) keeps them fixed from then on. `freeze=False` keeps the
        current mode, so a learning trust learns on from them."""
        freeze = check_bool("freeze", freeze)
        weights, preference = _read_weights(Path(path), self.names)
        with self._lock:
            self._weights = weights
            self.self_preference = preference
            self.updates = 0
            if freeze:
                self.learn = False

    def prefer(self, self_preference: SelfPreference | None) -> None:
        """Set the self-preference alone (the `self_preference="builtin"` option): the weights
        and whether they learn stay as they are."""
        with self._lock:
            self.self_preference = self_preference

    def fix(
        self, weights: Mapping[str, float], self_preference: SelfPreference | None = None
    ) -> None:
        """Set the weights (one finite weight above 0 per member, normalised) and the
        self-preference, and freeze them: what `Ensemble.calibrate` measured stays until the
        next calibration or load."""
        if sorted(weights) != sorted(self.names):
            raise InvalidConfigError(
                f"weights name {sorted(weights)}; give one per member: {self.names}."
            )
        values = torch.tensor([float(weights[n]) for n in self.names], dtype=torch.float64)
        if not bool(torch.isfinite(values).all()) or bool((values <= 0).any()):
            raise InvalidConfigError(f"every weight must be finite and above 0, got {weights}.")
        with self._lock:
            self._weights = values / values.sum()
            self.self_preference = self_preference
            self.updates = 0
            self.learn = False

    # --- helpers ---------------------------------------------------------------------------

    def _named(self, weights: torch.Tensor) -> dict[str, float]:
        return {n: float(w) for n, w in zip(self.names, weights.tolist(), strict=True)}


def _mean_rewards(decisions: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each member's mean reward over the decisions that named it."""
    sums: dict[str, list[float]] = {}
    for decision in decisions:
        for name, reward in decision.items():
            sums.setdefault(name, []).append(reward)
    return {name: sum(values) / len(values) for name, values in sums.items()}


def _uniform(k: int) -> torch.Tensor:
    return torch.full((k,), 1.0 / k, dtype=torch.float64)


def _read_weights(path: Path, names: list[str]) -> tuple[torch.Tensor, SelfPreference | None]:
    """The weights in a file, in `names` order and normalised, and its self-preference if it
    has one. Any problem raises InvalidConfigError naming the file and the problem."""

    def fail(problem: str) -> NoReturn:
        raise InvalidConfigError(f"member weights file {str(path)!r}: {problem}")

    if not path.is_file():
        fail("no such file; pass the path that save_weights wrote.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, UnicodeDecodeError) as error:
        fail(f"not valid JSON ({error}); pass a file that save_weights wrote.")
    if not isinstance(data, dict) or not isinstance(data.get("weights"), dict):
        fail('expected a JSON object with "weights": {member name: weight, ...}.')
    values = _per_member(data["weights"], names, "weight", fail)
    weights = torch.tensor(values, dtype=torch.float64)
    if abs(float(weights.sum()) - 1.0) > 1e-9:  # what save wrote is kept bit for bit
        weights = weights / weights.sum()
    return weights, read_self_preference(data.get("self_preference"), names, fail)


def read_self_preference(
    given: object, names: list[str], fail: Callable[[str], NoReturn]
) -> SelfPreference | None:
    """A self-preference as `SelfPreference.to_json` writes it (in a weights file, or kept by
    `core.preference_store`): {"score": "logprob" | "min", "margins": {member name: nats above
    0}}, one per member of this ensemble; None stays None. `fail` is called with the problem."""
    if given is None:
        return None
    example = '"self_preference": {"score": "logprob", "margins": {member name: nats, ...}}'
    if not isinstance(given, dict) or not isinstance(given.get("margins"), dict):
        fail(f"expected {example}, or no self_preference.")
    if given.get("score") not in PREFERENCE_SCORES:
        fail(f"self_preference score is {given.get('score')!r}; use one of {PREFERENCE_SCORES}.")
    values = _per_member(given["margins"], names, "self_preference margin", fail)
    return SelfPreference(given["score"], dict(zip(names, values, strict=True)))


def _per_member(
    given: dict, names: list[str], what: str, fail: Callable[[str], NoReturn]
) -> list[float]:
    """One finite number above 0 per member (`what`: a weight, a self-preference margin), in
    `names` order; anything else fails naming the problem."""
    if len(given) != len(names):
        fail(
            f"it has {len(given)} {what}s for {len(names)} members; give one per member "
            f"({', '.join(names)})."
        )
    unknown = [n for n in given if n not in names]
    missing = [n for n in names if n not in given]
    if unknown or missing:
        fail(
            f"its member names do not match this ensemble: unknown {unknown}, missing {missing}; "
            f"the members are {names}."
        )
    values = []
    for name in names:
        value = given[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(f"the {what} of {name!r} is {value!r}, not a number.")
        if not math.isfinite(value) or value <= 0:
            fail(f"the {what} of {name!r} is {value!r}; every {what} must be finite and above 0.")
        values.append(float(value))
    return values


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"a key is given twice: {', '.join(repeated)}")
    return dict(pairs)
