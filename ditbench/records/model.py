"""The result record as a model, validated once where it is made or read back, then passed to every
reader: typed where a reader reads it, any other key kept as written (older records load). `check` says
why a value is not a record, naming the key path."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from ditbench.core.errors import UserError, shorten
from ditbench.core.validation import refuse, where
from ditbench.records.metrics import IMAGES_PER_S, RECORD_METRICS, STEP_MS, STEPS_PER_S, finite
from ditbench.spec.cell import CellSpec, cell_id
from ditbench.spec.suite import REPEATS_MAX

SCHEMA = "ditbench.result/1"
SCHEMA_PREFIX = "ditbench.result/"
STATUSES = ("ok", "oom", "timeout", "nan_loss", "error", "skipped", "unsupported")
Finite = Annotated[float | None, Field(allow_inf_nan=False)]
RATE_TOLERANCE = 0.10  # relative; a halved rate with unchanged samples is 50% off
FUTURE_SLACK = dt.timedelta(hours=1)


class Part(BaseModel):
    """A section of a record: typed where a reader reads it, any other key kept as it was written.

    Strict (a number is never text, a count never true/false); `part[key]` and `part.get(key)` give a
    key's value as JSON."""

    model_config = ConfigDict(extra="allow", strict=True, protected_namespaces=(), populate_by_name=True)

    def __getitem__(self, key: str) -> Any:
        found = self._json(key)
        if key not in found:
            raise KeyError(key)
        return found[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self._json(key).get(key)
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        return key in self._json(key)

    def _json(self, key: str) -> dict[str, Any]:
        name = next((n for n, f in type(self).model_fields.items() if f.alias == key), key)
        return self.model_dump(mode="json", include={name}, by_alias=True, exclude_unset=True)

    def dump(self) -> dict[str, Any]:
        """The section as JSON holds it: the keys it was given, extras included."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


Number, Count, Text, Flag = float | None, int | None, str | None, bool | None
Numbers = list[Number] | None


def section(name: str, texts: str = "", numbers: str = "", counts: str = "", flags: str = "", **more: Any):
    """A record section's model: optional fields of each kind; `more`: other fields as (type, default)."""
    kinds = ((texts, Text), (numbers, Number), (counts, Count), (flags, Flag))
    fields = {n: (kind, None) for names, kind in kinds for n in names.split()}
    return create_model(name, __base__=Part, **fields, **more)


StepMs = section("StepMs", numbers="median p10 p90", samples=(Numbers, None))  # samples: every step's ms
Mfu = section("Mfu", numbers="value peak_tflops", texts="peak_basis")
Emulation = section(
    "Emulation", texts="card real_gpu", numbers="budget_gib context_gib allocator_cap_gib real_total_gib"
)
Noise = section(
    "Noise",
    numbers="step_spread throughput_gap spread_bound gap_bound other_cpu_share load_bound",
    gpu_throttle=(list[str] | None, None),
)
# The per-repeat figures of images/s and the step time, under the metrics' own keys.
Repeats = section(
    "Repeats",
    counts="count of",
    failed=(dict[str, Text] | None, None),
    run_ids=(list[Text] | None, None),
    **{key: (Numbers, None) for m in (IMAGES_PER_S, STEP_MS) for key in (m.key, f"{m.key}_ci")},
)
# The section: a number for each metric of the table at metrics.<key>, the objects some hold, then
# what a reader reads of the rest.
Metrics = section(
    "Metrics",
    numbers=" ".join(m.key for m in RECORD_METRICS if m.path == f"metrics.{m.key}")
    + " model_flops_per_image scaling_efficiency window_s loss_last",
    counts="params measured_steps world_size",
    texts="attention_kernel optimizer_kernel",
    flags="noisy fits_budget",
    step_ms=(StepMs | None, None),
    mfu=(Mfu | None, None),
    repeats=(Repeats | None, None),
    emulation=(Emulation | None, None),
    noise=(Noise | None, None),
    per_rank=(list[dict[str, Any]] | None, None),
)


class RecordError(UserError):
    """A value that is not a result record (a process's result of another ditbench, an edited line)."""


Smoke = section(
    "Smoke",
    counts="steps nonfinite_steps first_nonfinite_step scaler_skips",
    texts="status reason",
    loss=(Numbers, None),
    first_mean=(Finite, None),
    last_mean=(Finite, None),
)
Env = section(
    "Env",
    texts="host platform cpu gpu_name driver nvml cuda torch python ditbench git_sha",
    counts="cpu_count torch_threads gpu_count",
    numbers="gpu_memory_gib",
)
Figures = dict[str, Number] | None
# One quality evaluation (ditbench.quality): the figures over seeds at a training step.
Evaluation = section(
    "Evaluation",
    texts="grid",
    numbers="train_wall_s train_gpu_s sample_s score_s",
    step=(Annotated[int, Field(ge=0)], ...),
    metrics=(dict[str, Number], ...),
    spread=(Figures, None),
    bootstrap_se=(Figures, None),
    interval=(dict[str, Numbers] | None, None),
    per_seed=(list[dict[str, Any]] | None, None),
    seeds=(list[int] | None, None),
)
Quality = section(
    "Quality",
    texts="status reason banner",
    counts="samples train_steps",
    reference=(section("Reference", texts="path digest file", counts="count") | None, None),
    inception=(section("Inception", texts="name sha256", flags="official") | None, None),
    sampler=(dict[str, Any] | None, None),  # compared as a whole
    seeds=(list[int] | None, None),
    at=(list[int] | str | None, None),  # the steps, or "smoke_end"
    metrics=(list[str] | None, None),
    skipped=(dict[str, Text] | None, None),
    warnings=(list[str] | None, None),
    train_loss=(list[Numbers] | None, None),  # [step, mean loss] pairs
    evaluations=(list[Evaluation] | None, None),
)


class Record(Part):
    schema_: str = Field(alias="schema")
    suite: Text = None
    run_id: Text = None
    cell_id: Annotated[str, Field(min_length=1)]
    cell_name: str
    suite_baseline: dict[str, Any] | None = None
    suite_overrides: dict[str, Any] | None = None  # the run's command-line `key=value`s
    config: CellSpec
    status: Literal[STATUSES]  # type: ignore[valid-type]
    reason: Text = None
    metrics: Metrics | None = None  # type: ignore[valid-type]
    smoke: Smoke | None = None
    env: Env | None = None
    quality: Quality | None = None
    started_at: Text = None
    duration_s: Number = None
    repeat: Count = None  # which repeat of `repeats` (a run with repeats writes both)
    repeats: Count = None
    label: Text = None  # `run --label`
    adopted_by: Text = None  # the run that appended it after the run that measured it was killed
    traceback: Text = None

    @model_validator(mode="before")
    @classmethod
    def _schema_and_repeat(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        schema = raw.get("schema")
        if isinstance(schema, str) and schema != SCHEMA:
            known = schema.startswith(SCHEMA_PREFIX)
            why = f"which this ditbench does not know (it reads {SCHEMA}); upgrade it" if known else ""
            raise refuse(f"schema is {shorten(schema)}, {why or f'not {SCHEMA!r}'}")
        if "repeat" in raw or "repeats" in raw:  # combined repeats (bench.repeats.combine): `repeats` alone
            repeat, repeats = raw.get("repeat", 1), raw.get("repeats")
            whole = all(
                isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= REPEATS_MAX
                for v in (repeat, repeats)
            )
            if not whole or repeat > repeats:
                raise refuse(
                    f"repeat {shorten(repeat)} of repeats {shorten(repeats)} is not a repeat index from 1 to "
                    f"repeats (at most {REPEATS_MAX})"
                )
        return raw

    @property
    def repeat_index(self) -> int:
        """Its repeat (1-based); 1 for a record of a run without repeats."""
        return self.repeat or 1

    @property
    def repeat_count(self) -> int:
        """K of the run that wrote it; 1 without repeats."""
        return self.repeats or 1

    def contradiction(self, now: dt.datetime | None = None) -> tuple[str, str] | None:
        """(field, what is wrong) where the record contradicts itself, or None: its cell_id is its config's
        (else it would be compared as another cell); images/s agrees with steps/s x the global batch and
        with its per-step samples (within RATE_TOLERANCE; the runner's agree within 0.3%); it did not start
        in the future (beyond FUTURE_SLACK: a record dated 2999 would shadow every real one)."""
        if self.cell_id != (expected := cell_id(self.config)):
            return "cell_id", (
                f"is {shorten(self.cell_id)}, which is not the id of the record's config (that config's id "
                f"is {expected}); a record with another cell's id would be compared as that cell"
            )
        if (rates := self._rates()) is not None:
            return rates
        try:
            when = dt.datetime.fromisoformat((self.started_at or "").replace("Z", "+00:00"))
        except ValueError:
            return None
        now = now or dt.datetime.now(dt.timezone.utc)
        if (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)) > now + FUTURE_SLACK:
            return "started_at", (
                f"is {shorten(self.started_at)}, in the future (now is "
                f"{now.isoformat(timespec='seconds').replace('+00:00', 'Z')}); a record states when it ran"
            )
        return None

    def _rates(self) -> tuple[str, str] | None:
        rate, per_step = _positive(IMAGES_PER_S.of(self)), float(self.config.global_batch)
        if self.status != "ok" or rate is None:
            return None
        steps_per_s = _positive(STEPS_PER_S.of(self))
        if steps_per_s is not None and abs(rate / (steps_per_s * per_step) - 1) > RATE_TOLERANCE:
            return IMAGES_PER_S.path, (
                f"is {rate:.4g}, but steps_per_s {steps_per_s:.4g} x {per_step:g} images a step is "
                f"{steps_per_s * per_step:.4g}"
            )
        step = self.metrics.step_ms
        values = [_positive(s) for s in (step.samples if step else None) or []]
        if values and all(v is not None for v in values):
            mean = sum(values) / len(values)  # type: ignore[arg-type]
            if abs(rate / (per_step * 1000.0 / mean) - 1) > RATE_TOLERANCE:
                return IMAGES_PER_S.path, (
                    f"is {rate:.4g}, but its {len(values)} per-step samples (mean {mean:.4g} ms for "
                    f"{per_step:g} images a step) give {per_step * 1000.0 / mean:.4g} images/s"
                )
        return None

    def unfinished(self) -> str | None:
        """Why an ok record is not a finished measurement (a resumed run runs its cell again), or None:
        an ok record states its images/s and median step time as finite numbers."""
        if self.status != "ok":
            return None
        if self.metrics is None:
            return 'status "ok" without metrics'
        for metric in (IMAGES_PER_S, STEP_MS):
            if finite(metric.of(self)) is None:
                return f'status "ok" but "{metric.path}" is not a finite number'
        return None


# What a value of the wrong type should have been, by pydantic's error type.
_EXPECTED = {
    "float_type": "a number",
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "finite_number": "a finite number",
    "greater_than_equal": "a number >= {ge}",
    "string_too_short": "a non-empty string",
}


def _positive(value: Any) -> float | None:
    v = finite(value)
    return v if v is not None and v > 0 else None


def check(raw: Any) -> tuple[Record | None, str | None]:
    """(the record, None), or (None, why `raw` is not one, naming the key path). Never raises."""
    if not isinstance(raw, dict):
        return None, f"a JSON {type(raw).__name__}, not a result record (a JSON object)"
    try:
        return Record.model_validate(raw), None
    except ValidationError as err:
        return None, explain(err.errors()[0])
    except RecursionError:  # deeper than any record: the reader's bound (jsonl.MAX_DEPTH) comes first
        return None, "nested too deeply to read"


def explain(error: dict[str, Any]) -> str:
    """One pydantic error as `key.path is <value>, not <what is valid>`, or a validator's own words as
    `field key.path: <words>`."""
    loc, kind = tuple(error["loc"]), error["type"]
    if loc[:1] == ("config",):
        loc = tuple(p for p in loc if p != "knobs")  # a config is flat: its knobs sit at the top
    key, value = where(loc), error.get("input")
    if kind == "ditbench":  # a validator's own words (the config's: the cell spec's), about `at` if named
        at, text = error["ctx"]["at"], error["ctx"]["text"]
        if loc[:1] == ("config",):
            return f"field {where((*loc, at) if at else loc)}: {text}"
        return f"{key} {text}".strip()
    if kind == "missing":
        return f"{key} is missing"
    if kind == "string_unicode":  # a key holding a lone surrogate (values may: they are kept)
        return f"{key} has a key {shorten(value)} that is not text"
    if kind == "literal_error":
        return f"{key} is {shorten(value)}, not one of {', '.join(STATUSES)}"
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return f"{key} is an integer too large for a number"
    expected = _EXPECTED.get(kind, "a valid value").format(**error.get("ctx", {}))
    return f"{key} is {shorten(value)}, not {expected}"
