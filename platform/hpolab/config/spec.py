"""Study spec: YAML + `key=value` overrides -> one frozen, validated StudySpec.

Every problem is collected and reported at once with its field path (`trainer.lr: ...`), so a user
fixes a spec in one go. Nothing here trains or touches a store.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from hpolab.config.controls import ConvergedStop, NoImprovementStop, NoiseProbe, Promotion, check_enqueue, seconds_of
from hpolab.config.messages import validation_messages
from hpolab.config.notify import NotifyTarget
from hpolab.config.experiment import load_experiment, project_root_of, shape_problems
from hpolab.config.training_loop import loop_problems
from hpolab.config.overrides import apply_overrides, parse_overrides  # noqa: F401  (tests import it from here)
from hpolab.config.objectives import Constraint, Objective, Pruning, WarmStart, declared_costs, fill_primary, measured_metrics
from hpolab.config.samplers import check_named
from hpolab.config.trial_scheduler import Budget, TrialSchedulerSpec, default_pruner_under_scheduler, trial_scheduler_problems
from hpolab.errors import SpecError
from hpolab.train.config import TrainConfig

STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FloatDist(_Frozen):
    type: Literal["float"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    # Bounds from the study's LR range test (rule: hpolab.train.lr_range_test.bounds_from_lr_range_test); omit low/high.
    from_lr_range_test: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> "FloatDist":
        if self.from_lr_range_test:
            if self.low is not None or self.high is not None:
                raise ValueError("give either low/high or from_lr_range_test: true, not both")
            if self.step is not None:
                raise ValueError("step cannot be combined with from_lr_range_test")
            return self
        if self.low is None or self.high is None:
            raise ValueError("float needs low and high (or from_lr_range_test: true)")
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0, got {self.low}")
        if self.log and self.step is not None:
            raise ValueError("step cannot be combined with log: true")
        return self


class IntDist(_Frozen):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = 1

    @model_validator(mode="after")
    def _bounds(self) -> "IntDist":
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("log: true needs low >= 1 and step 1")
        return self


class CategoricalDist(_Frozen):
    type: Literal["categorical"]
    choices: list[Any] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _plain(cls, v: list[Any]) -> list[Any]:
        for c in v:
            if not (c is None or isinstance(c, (bool, int, float, str))):
                raise ValueError(f"choices must be null, bool, int, float or str; got {c!r}")
        return v


Distribution = Annotated[Union[FloatDist, IntDist, CategoricalDist], Field(discriminator="type")]


class Named(_Frozen):
    """A sampler or pruner: a type name and its keyword arguments."""

    type: str
    kwargs: dict[str, Any] = Field(default_factory=dict)


class LRRangeTestSpec(_Frozen):
    enabled: bool = Field(default=False, description="run an LR range test before the first trial (its bounds may set a float search range)")
    min_lr: float = Field(default=1e-7, description="the sweep's first LR")
    max_lr: float = Field(default=10.0, description="the sweep's last LR")
    num_steps: int = Field(default=100, ge=5, description="optimizer steps of the sweep, one LR each")
    mode: Literal["exp", "linear"] = Field(default="exp", description="how the LR grows from min_lr to max_lr")
    smoothing: float = Field(default=0.05, gt=0, lt=1)  # EMA weight of the newest loss
    diverge_factor: float = Field(default=4.0, gt=1)  # stop once smoothed loss > this x its best

    @model_validator(mode="after")
    def _range(self) -> "LRRangeTestSpec":
        if not 0 < self.min_lr < self.max_lr:
            raise ValueError(f"need 0 < min_lr < max_lr, got min_lr={self.min_lr}, max_lr={self.max_lr}")
        return self


class TopK(_Frozen):
    """Keep only the N best finished trials' files (by the study metric)."""

    top_k: int = Field(ge=1)


RETENTION_WORDS = {"log_models": ("all", "complete", "none"), "keep_checkpoints": ("all",)}


class StudySpec(_Frozen):
    name: str = Field(description="the study's name: its Optuna study and MLflow experiment")
    experiment: str = Field(description="the experiment module: a name in experiments/ or a dotted import path")
    metric: str = Field(default="val_acc", description="the metric the study optimises (one objective)")
    direction: Literal["maximize", "minimize"] = Field(default="maximize", description="whether larger or smaller values of metric are better")
    # Several objectives, the one pruned on, constraints (config/objectives.py); metric/direction
    # are then the pruning metric's, filled in from these.
    objectives: list[Objective] | None = Field(default=None, description="several objectives (a Pareto front); replaces metric/direction")
    pruning: Pruning | None = Field(default=None, description="several objectives: the one reported each epoch and pruned on")
    constraints: list[Constraint] = Field(default_factory=list, description="bounds on metrics; only feasible trials can be best")
    n_trials: int = Field(default=20, ge=1)  # total budget of finished trials, not "n more"
    timeout: float | None = Field(default=None, gt=0)  # seconds for this driver's session (or 30m, 2h, ...)
    trial_timeout: float | None = Field(default=None, gt=0)  # seconds per trial, then FAIL (or 30m, 2h, ...)
    parallel: int = Field(default=1, ge=1, description="trials this driver runs at once, each in its own process")
    max_retries: int = Field(default=1, ge=0)  # retries after a trial's own failure (OOM, trial_timeout)
    max_interrupts: int = Field(default=10, ge=0)  # retries after interrupts, dead drivers, reaps (per configuration)
    max_failures: int | None = Field(default=5, ge=1)  # stop after this many failed trials in a row (null: never)
    seed: int = Field(default=0, description="the study's seed: the sampler's and each trial's training seed are derived from it")
    data_seed: int | None = Field(default=None, description="the seed of the data split (load_data, raw_test); fixed, so other training seeds and the promotion gate see the same splits (default: seed)")
    sampler: Named = Field(default=Named(type="tpe"), description="the Optuna sampler")
    pruner: Named = Field(default=Named(type="median"), description="the Optuna pruner (none under a trial_scheduler)")
    trial_scheduler: TrialSchedulerSpec | None = Field(default=None, description="pause and resume trials: {type: asha, ...} or {type: pbt, ...} (config/trial_scheduler.py)")
    budget: Budget = Field(default=Budget(), description="resource budget: {epochs: N} trained over all trials")
    trainer: TrainConfig = Field(default=TrainConfig(), description="the training routine's options")
    model: dict[str, Any] = Field(default_factory=dict, description="values for the experiment's MODEL_DEFAULTS keys")
    data: dict[str, Any] = Field(default_factory=dict, description="values for the experiment's DATA_DEFAULTS keys")
    search_space: dict[str, Distribution] = Field(default_factory=dict, description="what the sampler chooses: trainer.<key>, model.<key> or data.<key> -> a distribution")
    lr_range_test: LRRangeTestSpec = Field(default=LRRangeTestSpec(), description="the LR range test before the first trial")
    # Run controls (config/controls.py): known-good configurations evaluated first, and when to stop.
    enqueue: list[dict[str, Any]] = Field(default_factory=list, description="known-good configurations (search_space path -> value) evaluated first")
    warm_start: WarmStart | None = Field(default=None, description="begin from an earlier study in the same store")  # begin from an earlier study (study/sampling/warm_start.py)
    stop_after_no_improvement: NoImprovementStop | None = Field(default=None, description="stop once this many finished trials in a row brought no improvement")
    stop_when_converged: ConvergedStop | None = Field(default=None, description="stop once an unseen configuration is unlikely to beat the best by more than the noise floor")
    noise_probe: NoiseProbe | None = Field(default=None, description="train the best trial again on new seeds every so often: the study's noise floor")
    promotion: Promotion = Field(default=Promotion(), description="`hpolab promote`'s defaults: its race of the leaders on fresh seeds")
    # Retention (like Ray Tune's num_to_keep, Determined's checkpoint GC): which trials log a model
    # (all = COMPLETE + PRUNED; complete = COMPLETE only; none; {top_k: N} = the N best COMPLETE), and
    # whose last.pt/best.pt (trial folder + uploaded checkpoints/) survive once the trial has finished.
    # Default {top_k: 5}: a study of thousands of trials keeps a bounded store.
    log_models: Union[Literal["all", "complete", "none"], TopK] = Field(default=TopK(top_k=5), description="which trials log a model: all (COMPLETE + PRUNED), complete, none, or {top_k: N} (the N best COMPLETE)")
    keep_checkpoints: Union[Literal["all"], TopK] = Field(default=TopK(top_k=5), description="which trials keep last.pt/best.pt once finished (all, or {top_k: N})")
    # Seconds between uploads of a running trial's last.pt to its run's checkpoints/ (latest only),
    # so a retry on any worker can resume it; 0 = after every epoch; null = only when it is retried.
    checkpoint_upload_every: float | None = Field(default=30.0, ge=0)
    # Seconds the driver keeps retrying while a database store is unreachable (a PostgreSQL restart),
    # counted from the outage's start; running trials keep training. Then it stops, trials resumable.
    storage_outage_grace: float = Field(default=120.0, ge=0)
    notify: list[NotifyTarget] = Field(default_factory=list, description="where study events go: web hooks (json, slack) or programs (how-to: notifications)")
    system_metrics: bool = Field(default=True, description="sample each trial's processes (CPU, memory, threads, GPU memory) into its run's system/ metrics")
    # Set by load_spec: the folder holding the experiments/ the experiment came from (the spec's
    # project). Not a field: it is where this spec was found, not part of the study's definition.
    _project_dir: Path | None = PrivateAttr(default=None)
    _trainer_keys: frozenset = PrivateAttr(default=frozenset())  # the trainer: keys the spec (and overrides) set

    @model_validator(mode="before")
    @classmethod
    def _primary(cls, data: Any) -> Any:
        return default_pruner_under_scheduler(fill_primary(data))

    @property
    def is_multi_objective(self) -> bool:
        return self.objectives is not None and len(self.objectives) > 1

    @property
    def objective_list(self) -> list[Objective]:
        return list(self.objectives) if self.objectives else [Objective(metric=self.metric, direction=self.direction)]

    @field_validator("trainer", mode="before")
    @classmethod
    def _amp_off_is_a_word(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false: `amp: off` and `trainer.amp=off` mean the mode "off".
        if isinstance(v, dict) and v.get("amp") is False:
            return {**v, "amp": "off"}
        return v

    @property
    def project_dir(self) -> Path | None:
        """The project the experiment was found in (trial processes import it from there); None if unknown."""
        return self._project_dir

    @field_validator("timeout", "trial_timeout", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return seconds_of(v)  # seconds, or "90s", "30m", "2h", "1h30m"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not STUDY_NAME.match(v):
            raise ValueError("use letters, digits, '.', '_' or '-' (it names the Optuna study and the MLflow experiment)")
        return v

    @field_validator("log_models", "keep_checkpoints", mode="before")
    @classmethod
    def _retention(cls, v: Any, info) -> Any:
        words = RETENTION_WORDS[info.field_name]
        if isinstance(v, str) and v in words:
            return v
        n = v.get("top_k") if isinstance(v, dict) and set(v) == {"top_k"} else None
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            return v
        raise ValueError(f"use {' | '.join(words)} or {{top_k: N}} with N >= 1, got {v!r}")

    def resolved_config(self, experiment: ModuleType, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The full config a trial runs with: experiment defaults < spec < sampled params."""
        cfg = {
            "seed": self.seed,  # the training seed: initial weights, data order, dropout, augmentation
            "data_seed": self.seed if self.data_seed is None else self.data_seed,  # the split (train/data.py data_seed_of)
            "metric": self.metric,
            "direction": self.direction,
            "trainer": self.trainer_dict(),
            # (an own training loop may declare no defaults: then the spec's keys pass as given)
            "model": {**getattr(experiment, "MODEL_DEFAULTS", {}), **self.model},
            "data": {**getattr(experiment, "DATA_DEFAULTS", {}), **self.data},
        }
        if self.objectives or self.constraints:  # (a one-metric study's config stays as it always was)
            cfg["objectives"] = [o.metric for o in self.objective_list]
            cfg["cost_metrics"] = measured_metrics(self, declared_costs(experiment))
        for path, value in (params or {}).items():
            section, key = path.split(".", 1)
            cfg[section][key] = value
        return cfg

    def trainer_dict(self) -> dict[str, Any]:
        import dataclasses

        return dataclasses.asdict(self.trainer)


# --------------------------------------------------------------------------------------------
# Loading


def _check_experiment(spec: StudySpec, search_from: Path | None = None) -> tuple[ModuleType | None, list[str]]:
    """The experiment (None: it did not import) and the problems of its names, the spec's
    model/data/search_space keys, the metric against its task."""
    try:
        exp = load_experiment(spec.experiment, search_from=search_from)
    except ModuleNotFoundError as e:
        return None, [f"experiment: {e.args[0]}; put a module in experiments/ or give a dotted import path"]
    except Exception as e:  # an experiment that fails to import is a spec problem the user must see
        return None, [f"experiment: importing {spec.experiment!r} failed: {type(e).__name__}: {e}"]
    spec._project_dir = project_root_of(exp)
    problems = shape_problems(exp, spec.experiment)
    if problems:
        return exp, problems
    # None: any key (an own loop without MODEL_DEFAULTS / DATA_DEFAULTS takes the spec's as given)
    declared = {"model": getattr(exp, "MODEL_DEFAULTS", None), "data": getattr(exp, "DATA_DEFAULTS", None)}
    for section, defaults in declared.items():
        for key in getattr(spec, section) if defaults is not None else ():
            if key not in defaults:
                problems.append(f"{section}.{key}: unknown key for experiment {spec.experiment} (known: {', '.join(sorted(defaults)) or 'none'})")
    trainer_keys = set(spec.trainer_dict())
    for path, dist in spec.search_space.items():
        section, _, key = path.partition(".")
        known = {"trainer": trainer_keys, **{k: set(v) if v is not None else None for k, v in declared.items()}}.get(section, ())
        if known == () or not key:
            problems.append(f"search_space.{path}: must be trainer.<key>, model.<key> or data.<key>")
        elif known is not None and key not in known:
            problems.append(f"search_space.{path}: {section} has no key {key!r} (known: {', '.join(sorted(known))})")
        if isinstance(dist, FloatDist) and dist.from_lr_range_test and not spec.lr_range_test.enabled:
            problems.append(
                f"search_space.{path}: from_lr_range_test needs the range test; set lr_range_test.enabled: true "
                "(or give low/high)"
            )
    return exp, problems + loop_problems(spec, exp)


def load_spec(path: str | Path, overrides: list[str] | None = None) -> StudySpec:
    source = str(path)
    p = Path(path)
    if not p.is_file():
        raise SpecError(source, [f"file not found: {p} (study specs live in studies/, e.g. studies/digits_cnn.yaml)"])
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError(source, [f"not valid YAML: {e}"]) from None
    return spec_from_mapping(raw, source, parse_overrides(overrides or []), search_from=p.resolve().parent)


def spec_from_mapping(raw: Any, source: str, overrides: dict[str, Any] | None = None, search_from: Path | None = None) -> StudySpec:
    """A spec from a mapping (a spec file's YAML, or a dict given in Python) with the same checks and
    SpecErrors as a file. `overrides`: dotted key -> value; `search_from`: where its project is looked
    for (the spec file's folder; None: the working directory only)."""
    if not isinstance(raw, dict):
        raise SpecError(source, ["the top level must be a mapping of keys (name:, experiment:, ...)"])
    raw = apply_overrides(raw, overrides or {})
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(source, validation_messages(e)) from None
    spec._trainer_keys = frozenset(raw.get("trainer") or {})  # (an own loop's runs record only these: training_loop.py)
    exp, problems = _check_experiment(spec, search_from=search_from)
    problems += check_named(spec)
    problems += check_enqueue(spec.search_space, spec.enqueue)
    problems += [] if problems or not (spec.trial_scheduler or spec.budget.epochs) else trial_scheduler_problems(spec, exp)
    if problems:
        raise SpecError(source, problems)
    return spec


SPEC_SUFFIXES = (".yaml", ".yml")


def study_name_from(arg: str, *, full: bool = False) -> str:
    """A study named on the command line: `NAME`, or a spec file whose `name:` is used.

    Only an existing file ending .yaml/.yml counts as a spec; anything else is taken as a name.
    By default only the spec's `name:` is read (reading a study back needs no experiment, nor
    torch); `full=True` loads and checks the whole spec, which also imports its experiment from the
    spec's project (for commands that rebuild the model, e.g. promote).
    """
    p = Path(arg)
    if not (p.suffix.lower() in SPEC_SUFFIXES and p.is_file()):
        return arg
    if full:
        return load_spec(p).name
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise SpecError(arg, [f"not valid YAML: {e}"]) from None
    name = raw.get("name") if isinstance(raw, dict) else None
    if not isinstance(name, str) or not STUDY_NAME.match(name):
        raise SpecError(arg, [f"name: missing or not a study name ({name!r}); the spec's name: is the study's"])
    return name


def spec_to_yaml(spec: StudySpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
