"""Predicted training memory of a cell on a card: `predict_cell(config, card_or_gib) -> Prediction`.
The traced step (trace.py) is replayed through the CUDA caching allocator (allocator.py) with the
card's memory as the limit, plus the CUDA context; a CPU cell through the CPU allocator (no rounding).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ditbench.core.errors import UnsupportedError, UserError, shorten
from ditbench.hardware.cards import Card, check_gib, find_card
from ditbench.plan import cache
from ditbench.plan.allocator import Replay, live_at, raw_peak, replay
from ditbench.plan.emulation import CPU, Target, cuda_target, optimizer_impl, policy_for, traced_on
from ditbench.plan.parallel import per_rank, world
from ditbench.plan.speed import DEFAULT_TARGET_STEPS
from ditbench.plan.trace import STATE_LABELS, SeriesTrace, trace_series
from ditbench.records.metrics import finite
from ditbench.spec.knobs import KNOBS, Knobs, PartialKnobs

GiB = 1 << 30
# The CUDA context and what the driver and libraries hold outside PyTorch's allocator (module images,
# cuBLAS/cuDNN handles): 0.3-0.6 GiB with CUDA 12's lazy module loading, driver dependent.
DEFAULT_CONTEXT_GIB = 0.5
COMPONENTS = (*STATE_LABELS, "vae", "activations", "workspace", "buffers")  # buffers: DDP's or FSDP's

# Knobs the trace leaves at their defaults: they do not change what a one-GPU step allocates (data
# parallelism is applied to the trace: parallel.py), or are not modeled (compile_mode); the batch size
# is the series' axis. Accumulation is traced at 1 or 2 micro-batches: from the second on, each holds
# the gradients through its forward, so 2 is every K >= 2's steady state.
_UNTRACED = (
    "batch_size", "gpus", "nodes", "strategy", "compile_mode", "optimizer",
    "seed", "lr", "weight_decay", "ema_decay",
)  # fmt: skip


@dataclass
class Prediction:
    """One cell's predicted (or, with `measured`, measured) memory. Sizes in GiB (2**30 bytes)."""

    model: str
    precision: str
    grad_ckpt: str
    batch_size: int
    device: str  # "cuda" or "cpu"
    card: str | None
    memory_gib: float | None  # the card's usable memory (None: no card given)
    status: str  # fits | oom | unsupported | error | predicted (no card to fit) | ok (measured)
    reason: str | None = None
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    device_gib: float | None = None  # reserved + context: what nvidia-smi shows for the process
    components: dict[str, float] = field(default_factory=dict)  # at the allocated peak, + context
    notes: list[str] = field(default_factory=list)
    measured: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    # The time model (speed.py), on a card with a datasheet; per GPU of `gpus` data-parallel GPUs.
    predicted_steps_per_s: float | None = None
    predicted_images_per_s: float | None = None
    predicted_speed_band_pct: float | None = None
    step_split_pct: dict[str, float] = field(default_factory=dict)  # speed.SPLIT shares of a step
    gpus: int = 1
    time_to_target: dict[str, float] | None = None  # steps, days, gpu_hours

    @property
    def fits(self) -> bool | None:
        return {"fits": True, "oom": False}.get(self.status)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def normalize(config: Mapping[str, Any]) -> dict[str, Any]:
    """A cell config's knobs (validated and normalised by ditbench.spec.knobs) and its device ("cuda" by
    default); keys that are not knobs (steps, smoke_steps, ...) are accepted and ignored."""
    if not isinstance(config, Mapping):
        raise UserError(f"a cell config must be a mapping of knobs, got {shorten(config)}")
    device = config.get("device", "cuda")
    if device not in ("cuda", "cpu"):
        raise UserError(f"device must be cuda or cpu to plan a cell, got {shorten(device)}")
    return {**dict(Knobs(**{k: v for k, v in config.items() if k in KNOBS})), "device": device}


def trace_knobs(cell: Mapping[str, Any], target: Target) -> Knobs:
    """The knobs the planner traces for `cell` on `target`: the untraced ones at their defaults, the
    `auto` AdamW kernel resolved, synthetic data (a latent file's batch reaches the device as one)."""
    knobs = {k: v for k, v in cell.items() if k in KNOBS and k not in _UNTRACED}
    impl = optimizer_impl(cell["optimizer_impl"], target)
    images = isinstance(cell["data"], dict) and "images" in cell["data"]
    data = IMAGES if images else "synthetic"
    return Knobs(**{**knobs, "optimizer_impl": impl, "data": data, "grad_accum": traced_accum(cell)})


IMAGES = {"images": "(traced)", "vae": "random"}  # any folder, any weights: the VAE in the loop


def traced_accum(cell: Mapping[str, Any]) -> int:
    return min(cell.get("grad_accum", 1), 2)


@dataclass(frozen=True)
class SpeedOptions:
    """How to predict speed: the calibration (None: the shipped one), data-parallel GPUs and the
    target a time is given for (`target_images` wins over `target_steps`)."""

    calibration: Any = None
    gpus: int = 1
    target_steps: int = DEFAULT_TARGET_STEPS
    target_images: int | None = None
    sheet: Any = None  # a card outside the table (--tflops, --mem-bw); None: the card's datasheet


@dataclass(frozen=True)
class Budget:
    """Where a cell must fit: a card (or a bare size), its usable GiB, the context outside the allocator."""

    card: str | None
    memory_gib: float | None
    context_gib: float
    target: Target

    @property
    def capacity(self) -> int | None:
        """Bytes the caching allocator may reserve."""
        if self.memory_gib is None:
            return None
        return max(0, int((self.memory_gib - self.context_gib) * GiB))


def budget(
    card_or_gib: str | Card | float | int | None,
    context_gib: float = DEFAULT_CONTEXT_GIB,
    device: str = "cuda",
) -> Budget:
    """A Budget from a card name, a Card, usable GiB or None (no limit); device "cpu" has no card."""
    context = finite(context_gib)
    if context is None or context < 0:
        raise UserError(f"the CUDA context must be a finite number of GiB >= 0, got {shorten(context_gib)}")
    if device == "cpu":
        return Budget(None, None, 0.0, CPU)
    if isinstance(card_or_gib, str):
        card_or_gib = find_card(card_or_gib)
    if card_or_gib is None:
        card, gib = None, None
    elif isinstance(card_or_gib, Card):
        card, gib = card_or_gib.name, card_or_gib.usable_gib
    else:
        card, gib = None, check_gib(card_or_gib, "the card memory")
    return Budget(card, gib, context, cuda_target(card))


_CACHE: OrderedDict[tuple, SeriesTrace] = OrderedDict()
_CACHE_SIZE = 64  # the default answer searches 48 series


def trace_key(knobs: Knobs, target: Target) -> tuple:
    """What a trace depends on: fp32 and tf32 share a key (tf32 changes only the matmul math mode).
    UnsupportedError when the target cannot run the policy (bf16 before sm80, fp16 on a CPU)."""
    policy = policy_for(knobs.precision, target)
    shape = {
        k: repr(v) if isinstance(v, dict) else v for k, v in knobs.non_defaults().items() if k != "precision"
    }
    return (tuple(sorted(shape.items())), str(policy.autocast_dtype), policy.use_scaler, target.device)


def series_trace(knobs: Knobs, target: Target, disk: bool = False) -> SeriesTrace:
    """The traced series: from this process's memory, else (disk=True) the shipped traces or the on-disk
    cache, else traced. One trace serves every GPU (workspaces are sized at replay)."""
    key = trace_key(knobs, target)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    series = None
    if disk:
        name = cache.key(key)
        series = cache.shipped(key) or cache.load(name)
    if series is None:
        series = trace_series(knobs, target)
        if disk:
            cache.save(name, series)
    _CACHE[key] = series
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return series


def predict_cell(
    config: dict[str, Any],
    card_or_gib: str | Card | float | int | None = None,
    *,
    context_gib: float = DEFAULT_CONTEXT_GIB,
    disk: bool = False,
) -> Prediction:
    """Predict one cell. `card_or_gib`: a card name ("RTX 4090"), a Card, usable GiB, or None; disk:
    the shipped traces and the trace cache serve it (as `ditbench plan`)."""
    cell = normalize(config)
    return predict_series(cell, [cell["batch_size"]], card_or_gib, context_gib=context_gib, disk=disk)[0]


def predict_series(
    config: dict[str, Any],
    batch_sizes: list[int],
    card_or_gib: str | Card | float | int | None = None,
    *,
    context_gib: float = DEFAULT_CONTEXT_GIB,
    disk: bool = False,
) -> list[Prediction]:
    """Predict the cells that differ from `config` only in batch size: one trace for all of them."""
    cell = normalize(config)
    return predict_budgets(cell, batch_sizes, [budget(card_or_gib, context_gib, cell["device"])], disk)[0]


def predict_budgets(
    config: dict[str, Any],
    batch_sizes: list[int],
    budgets: list[Budget],
    disk_cache: bool = False,
    speed: SpeedOptions | None = None,
) -> list[list[Prediction]]:
    """Predictions of a series at each batch size, for each budget (one trace, one replay per GPU kind)."""
    cell = normalize(config)
    for batch in batch_sizes:
        PartialKnobs(batch_size=batch)  # UserError if not valid
    status, reason, series = "unsupported", None, None
    if world(cell) > 1 and cell["strategy"] == "fsdp" and cell["impl"] != "ditbench":  # said, not guessed
        reason = "strategy fsdp shards ditbench's DiT block by block; the diffusers DiT has no such blocks"
    else:
        # One trace serves every GPU; a card that cannot run the cell's policy is told so per budget below.
        first = traced_on(budgets[0].target)
        try:
            series = series_trace(trace_knobs(cell, first), first, disk=disk_cache)
        except UnsupportedError as err:
            reason = str(err)
        except UserError:
            raise
        except Exception as err:  # a step the fake tensors cannot follow: say so for this cell
            status, reason = "error", f"the planner could not trace this cell: {type(err).__name__}: {err}"
    unlimited: dict[tuple, Replay] = {}
    named = (cell["model"], cell["precision"], cell["grad_ckpt"])
    out = []
    for bud in budgets:
        row = []
        for batch in batch_sizes:
            pred = Prediction(*named, batch, bud.target.device, bud.card, bud.memory_gib, "predicted")
            pred.config = {**cell, "batch_size": batch}
            why = reason or _policy_refused(cell["precision"], bud.target)
            if why is not None:
                pred.status = status if reason else "unsupported"
                pred.reason = shorten(why, 400, quote=False)
            elif bud.target.device == "cpu":
                _fill_cpu(pred, series, batch)
            else:
                _fill_cuda(pred, series, batch, bud, unlimited)
            if series is not None and why is None:
                pred.notes = list(series.trace.notes)
                fill_speed(pred, series, speed or SpeedOptions())
            row.append(pred)
        out.append(row)
    return out


def fill_speed(pred: Prediction, series: SeriesTrace, options: SpeedOptions) -> None:
    """The time model's figures for a predicted cell on a card with a datasheet (else left None)."""
    from ditbench.plan import speed

    sheet = options.sheet or speed.datasheet(pred.card)
    if sheet is None or pred.device != "cuda":
        return
    cal = options.calibration or speed.shipped()
    cell = {**pred.config, "model": pred.model, "precision": pred.precision, "grad_ckpt": pred.grad_ckpt,
            "batch_size": pred.batch_size}  # fmt: skip
    gpus = world(cell) if world(cell) > 1 else options.gpus
    t = step_time_of(series, cell, sheet, cal, gpus)
    accum = cell.get("grad_accum", 1)
    pred.gpus = gpus
    pred.predicted_steps_per_s = t.steps_per_s
    pred.predicted_images_per_s = t.steps_per_s * pred.batch_size * accum * gpus
    pred.predicted_speed_band_pct = cal.band_pct
    pred.step_split_pct = speed.split_shares(t.split)
    pred.time_to_target = speed.time_to_target(
        t.steps_per_s, pred.batch_size * accum, gpus, options.target_steps, options.target_images
    )


def step_time_of(series: SeriesTrace, cell: Mapping[str, Any], sheet, cal, gpus: int = 1):
    """The time model's optimizer step of `cell` (its batch size, accumulation and knobs) from its trace."""
    from ditbench.plan import speed

    depth, ckpt_blocks = speed.blocks(cell["model"], cell["grad_ckpt"])
    return speed.step_time(
        series.trace.kernels, cell["batch_size"], sheet, cell["precision"], cal.params,
        compiled=bool(cell.get("compile")), gpus=gpus, grad_bytes=4 * series.trace.params,
        blocks=depth, ckpt_blocks=ckpt_blocks, accum=cell.get("grad_accum", 1),
        traced_accum=traced_accum(cell), fsdp=cell.get("strategy") == "fsdp",
    )  # fmt: skip


def _policy_refused(precision: str, target: Target) -> str | None:
    """Why this particular GPU cannot run a policy the traced one could (bf16 before sm80), else None."""
    try:
        policy_for(precision, target)
    except UnsupportedError as err:
        return str(err)
    return None


def _components(rank, live_sizes: dict[int, int]) -> dict[str, float]:
    comp = dict.fromkeys(COMPONENTS, 0.0)
    for aid, size in live_sizes.items():
        comp[rank.labels.get(aid, "activations")] += size / GiB
    return comp


def _fill_cpu(pred: Prediction, series: SeriesTrace, batch: int) -> None:
    rank = per_rank(series.trace, series.sizes(batch), pred.config)
    peak, at = raw_peak(rank.events, rank.sizes, rank.window)
    pred.peak_allocated_gib = peak / GiB
    pred.components = _components(rank, {a: rank.sizes[a] for a in live_at(rank.events, at)})


def _fill_cuda(
    pred: Prediction, series: SeriesTrace, batch: int, bud: Budget, unlimited: dict[tuple, Replay]
) -> None:
    rank = per_rank(series.trace, series.sizes(batch, bud.target), pred.config)
    events, sizes = rank.events, rank.sizes
    key = (batch, bud.target.family)
    if key not in unlimited:
        unlimited[key] = replay(events, sizes, rank.window, None)
    result = unlimited[key]
    capacity = bud.capacity
    if capacity is not None:
        # Exact shortcuts: a run that never reserves more than the card has replays the same with the
        # limit; one whose live blocks alone exceed it cannot fit. In between, replay with the limit
        # (the allocator then frees its cached segments and retries, as on the card).
        if result.max_reserved <= capacity:
            pred.status = "fits"
        elif result.max_allocated > capacity:
            pred.status = "oom"
        else:
            limited = replay(events, sizes, rank.window, capacity)
            pred.status = "oom" if limited.oom else "fits"
            if not limited.oom:
                result = limited
        if pred.status == "oom":
            pred.reason = (
                f"needs {result.max_allocated / GiB:.2f} GiB allocated ({result.max_reserved / GiB:.2f} "
                f"reserved) + {bud.context_gib:g} GiB context; the card has {bud.memory_gib:.2f} GiB"
            )
    pred.peak_allocated_gib = result.peak_allocated / GiB
    pred.peak_reserved_gib = result.peak_reserved / GiB
    pred.device_gib = pred.peak_reserved_gib + bud.context_gib
    comp = _components(rank, {a: result.block_sizes[a] for a in live_at(events, result.peak_event)})
    comp["context"] = bud.context_gib
    pred.components = comp
