"""Trial schedulers (ASHA, PBT) and the epoch budget in a spec: `trial_scheduler:` and `budget:`.

A trial scheduler pauses trials at epochs it chooses and resumes them later from their checkpoints
(Ray Tune's name for the idea; `trainer.scheduler` is the LR schedule, `pruner:` stays stop-only).
Under a trial scheduler the default pruner is `none`: a pruner would kill what the scheduler pauses.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpolab.config.pbt_checks import pbt_problems


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AshaSpec(_Frozen):
    """Promotion-based successive halving (asynchronous: a trial pauses at each rung until promoted)."""

    type: Literal["asha"]  # promotion-based successive halving
    min_epochs: int = Field(default=1, ge=1, description="the first rung: epochs every trial trains")
    max_epochs: int | None = Field(default=None, ge=1, description="the top rung (null: trainer.max_epochs)")
    reduction_factor: int = Field(default=3, ge=2, description="eta: the top 1/eta of a rung is promoted to the next")
    brackets: int = Field(default=1, ge=1, description="brackets (trial number mod brackets picks one); bracket s starts at min_epochs*eta^s")


class Factor(_Frozen):
    factor: tuple[float, float] = Field(description="multiply the value by one of these two factors")


class Choices(_Frozen):
    choices: list[Any] = Field(min_length=1, description="pick one of these values")


class Range(_Frozen):
    range: tuple[float, float] = Field(description="resample uniformly in [lo, hi]")

    @model_validator(mode="after")
    def _order(self) -> "Range":
        if self.range[0] > self.range[1]:
            raise ValueError(f"range: lo ({self.range[0]}) must be <= hi ({self.range[1]})")
        return self


Mutation = Union[Factor, Choices, Range]
MUTATION_KINDS = {"factor": (Factor, "two numbers [a, b], e.g. {factor: [0.8, 1.25]}"),
                  "choices": (Choices, "a non-empty list of values, e.g. {choices: [32, 64, 128]}"),
                  "range": (Range, "two numbers [lo, hi] with lo <= hi, e.g. {range: [1.0e-5, 0.1]}")}


def mutation_of(key: str, m: Any) -> Mutation:
    """One mutation, by its one key; ValueError in one line naming the key and the fix."""
    kinds = [k for k in MUTATION_KINDS if isinstance(m, dict) and k in m]
    if len(kinds) != 1 or len(m) != 1:
        raise ValueError(f"{key}: give one of {{factor: [a, b]}}, {{choices: [...]}}, {{range: [lo, hi]}} (got {m!r})")
    model, fix = MUTATION_KINDS[kinds[0]]
    try:
        return model.model_validate(m)
    except ValidationError:
        raise ValueError(f"{key}.{kinds[0]}: give {fix} (got {m[kinds[0]]!r})") from None


class PbtSpec(_Frozen):
    """Population based training: members pause every interval; the worst copy the best and mutate."""

    type: Literal["pbt"]  # population based training
    population: int = Field(default=8, ge=2, description="members trained at once (configurations ever sampled)")
    interval_epochs: int = Field(default=2, ge=1, description="epochs between exploit/explore steps")
    quantile: float = Field(default=0.25, gt=0, le=0.5, description="the bottom quantile copies the top quantile")
    mutations: dict[str, Mutation] = Field(default_factory=dict, description="dotted config key -> {factor: [a, b]} | {choices: [...]} | {range: [lo, hi]}")
    resample_probability: float = Field(default=0.25, ge=0, le=1, description="chance a mutation resamples instead of perturbing")

    @field_validator("mutations", mode="before")
    @classmethod
    def _one_kind_each(cls, value: Any) -> Any:
        """Each mutation by its one key (not pydantic's try-every-kind union: one line, not five)."""
        return {k: mutation_of(k, m) for k, m in value.items()} if isinstance(value, dict) else value


TrialSchedulerSpec = Annotated[Union[AshaSpec, PbtSpec], Field(discriminator="type")]


class Budget(_Frozen):
    epochs: int | None = Field(default=None, ge=1, description="epochs trained over all trials; no trial starts or resumes once used")


def default_pruner_under_scheduler(data: Any) -> Any:
    """Before validation: under a trial scheduler the pruner defaults to none; one set explicitly
    (other than none) is refused, it would kill the trials the scheduler pauses."""
    if not isinstance(data, dict) or not isinstance(data.get("trial_scheduler"), dict):
        return data
    data = n_trials_from_population(data)
    pruner = data.get("pruner")
    if pruner is None:
        return {**data, "pruner": {"type": "none"}}
    kind = pruner.get("type") if isinstance(pruner, dict) else pruner
    if kind != "none":
        raise ValueError(f"pruner: {kind!r} cannot be combined with trial_scheduler (it pauses and promotes trials itself); "
                         "remove pruner: or set pruner: {type: none}")
    return data


def n_trials_from_population(data: dict) -> dict:
    """PBT: one trial per member, so n_trials is the population (one set explicitly must agree)."""
    ts = data["trial_scheduler"]
    if ts.get("type") != "pbt":
        return data
    population = ts.get("population", PbtSpec.model_fields["population"].default)
    if isinstance(population, str) and population.strip().isdigit():
        population = int(population)
    if not isinstance(population, int) or isinstance(population, bool):
        return data  # (trial_scheduler.population's own check says what is wrong with it; n_trials is not to blame)
    if "n_trials" in data and data["n_trials"] != population:
        raise ValueError(f"n_trials: {data['n_trials']} differs from trial_scheduler.population ({population}): PBT runs one trial "
                         f"per member; remove n_trials or set it to {population}")
    return {**data, "n_trials": population}


FIXED_DURING_TRAINING = ("trainer.max_epochs", "trainer.optimizer", "trainer.scheduler", "trainer.devices")  # a checkpoint holds them


def trial_scheduler_problems(spec, experiment=None) -> list[str]:
    """Checks needing the whole spec: the top rung against trainer.max_epochs, searched keys, DDP.
    `experiment`: its MODEL_DEFAULTS / DATA_DEFAULTS keys count as config keys for PBT mutations."""
    ts = spec.trial_scheduler
    problems = []
    if spec.budget.epochs is not None and spec.is_multi_objective:  # (its epochs are reported to a companion study)
        problems.append("budget.epochs: needs one objective (epochs are counted from the study metric's reports); use n_trials")
    if ts is None:
        return problems
    if "trainer.max_epochs" in spec.search_space:
        problems.append("search_space.trainer.max_epochs: a trial scheduler decides the epochs; remove it from search_space")
    if spec.is_multi_objective:
        problems.append("trial_scheduler: needs one objective (its rungs compare the study metric per epoch); drop objectives: or trial_scheduler:")
    if spec.trainer.devices > 1:
        problems.append(f"trainer.devices: {spec.trainer.devices} processes per trial cannot pause; use devices: 1 with trial_scheduler")
    if isinstance(ts, AshaSpec):
        top = ts.max_epochs or spec.trainer.max_epochs
        if ts.min_epochs >= top:
            problems.append(f"trial_scheduler.min_epochs: must be < max_epochs ({ts.min_epochs} >= {top}, trainer.max_epochs when unset)")
        # A rung promotes its top floor(n/eta): a bracket with fewer than eta trials never promotes one.
        if spec.n_trials < ts.reduction_factor * ts.brackets:
            problems.append(f"n_trials: {spec.n_trials} is fewer than trial_scheduler.reduction_factor x brackets "
                            f"({ts.reduction_factor * ts.brackets}): no trial would ever be promoted; use n_trials >= {ts.reduction_factor * ts.brackets}")
    if isinstance(ts, PbtSpec):
        problems += pbt_problems(spec, experiment)
        known = set(spec.search_space) | {f"trainer.{k}" for k in spec.trainer_dict()}
        for section in ("model", "data"):
            defaults = getattr(experiment, f"{section.upper()}_DEFAULTS", None) or {}
            known |= {f"{section}.{k}" for k in {**defaults, **getattr(spec, section)}}
        for key in ts.mutations:
            if key in FIXED_DURING_TRAINING:
                problems.append(f"trial_scheduler.mutations.{key}: cannot change during training (the checkpoint a member resumes holds it)")
            elif key not in known:
                problems.append(f"trial_scheduler.mutations.{key}: not a searched or config key (use a search_space key or trainer.<key>)")
    return problems
