"""More of the planner pinned by value (issue 27, mutation testing of ditbench/plan/): the dispatch
memo, the rendering of plans and the search bounds, each expected value worked out here from the
rule it checks, without tracing a model. reports/mutation/plan.md lists the mutants each test was
added for.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo  # noqa: F401  (FakeTensorMode imports it on first use: seconds, paid here once)
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ditbench.hardware.cards import find_card
from ditbench.plan import grid, kernels, memo, predict, trace

aten = torch.ops.aten


# ---- trace.py: the probe batch's prime search -----------------------------------------------------


@pytest.mark.parametrize(
    "n, prime",
    [(0, False), (1, False), (2, True), (3, True), (4, False), (9, False), (25, False), (49, False),
     (97, True), (4099, True), (4101, False)],
)  # fmt: skip
def test_is_prime_by_trial_division(n, prime):
    assert trace._is_prime(n) is prime


def test_the_probe_search_stops_at_twice_its_start_with_a_clear_error(monkeypatch):
    """Bertrand's postulate puts a prime below 2n: a search that finds none fails instead of hanging."""
    tried = []
    monkeypatch.setattr(trace, "_is_prime", lambda n: tried.append(n) and False)
    with pytest.raises(
        RuntimeError, match=r"^no prime found in \[5000, 10000\): ditbench\.plan\.trace\._is_prime is wrong$"
    ):
        trace.probe_batch(SimpleNamespace(num_classes=4998, image_size=256))
    assert tried == list(range(5000, 10000))


# ---- memo.py: the dispatch memo, on fake tensors made by hand ----------------------------------


@pytest.fixture
def fake(monkeypatch):
    """A fresh fake mode, a memo on an empty entry table, and two (2, 3) float tensors of the mode."""
    monkeypatch.setattr(memo, "_ENTRIES", {})
    mode = FakeTensorMode()
    with mode:
        x, y = torch.empty(2, 3), torch.empty(2, 3)
    return mode, memo.DispatchMemo(mode), x, y


class _Op:
    """A stand-in for an aten overload: what the memo reads of one (its tags and whether it is a view)."""

    def __init__(self, is_view=False, tags=()):
        self.is_view, self.tags = is_view, list(tags)


def _meta(t):
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.fake_device, t.requires_grad)


def _same_storage(a, b):
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def test_a_key_is_the_op_and_every_arguments_metadata_or_value(fake):
    mode, m, x, y = fake
    with mode:
        z = torch.empty(4, 6, dtype=torch.float16)[1:, ::2]  # strides (12, 2), offset 6
    tx = (torch.float32, torch.device("cpu"), torch.Size([2, 3]), (3, 1), 0)
    tz = (torch.float16, torch.device("cpu"), torch.Size([3, 3]), (6, 2), 6)
    assert m.key(aten.add.Tensor, (x, z), {}) == (aten.add.Tensor, (tx, tz), ())
    # Keyword arguments sorted by name; lists become tuples; scalars, dtypes and None are their value.
    key = m.key(aten.add.Tensor, (x, [y, 2.5, None]), {"b": torch.int8, "a": 1})
    assert key == (aten.add.Tensor, (tx, (tx, 2.5, None)), (("a", 1), ("b", torch.int8)))


def test_what_cannot_be_keyed_goes_to_the_fake_mode(fake):
    mode, m, x, _ = fake
    with FakeTensorMode():
        other = torch.empty(2, 3)  # another mode's tensor
    assert m.key(aten.add.Tensor, (x, other), {}) is None
    assert m.key(aten.add.Tensor, (x,), {"other": other}) is None
    assert m.key(aten.add.Tensor, (torch.ones(2),), {}) is None  # a real tensor
    assert m.key(aten.add.Tensor, ([x, object()],), {}) is None
    x.constant = torch.ones(2, 3)  # a constant the fake mode follows
    assert m.key(aten.add.Tensor, (x,), {}) is None


def test_a_fresh_output_is_remembered_by_its_metadata_and_rebuilt_on_a_hit(fake):
    mode, m, x, y = fake
    key = m.key(aten.add.Tensor, (x, y), {})
    assert m.lookup(key, (x, y)) is memo.MISS and (m.hits, m.misses) == (0, 0)
    out = aten.add.Tensor(x, y)
    m.learn(key, aten.add.Tensor, (x, y), out)
    assert m.entries[key] == ("new", None, (2, 3), (3, 1), 0, torch.float32, torch.device("cpu"), False)
    assert memo._ENTRIES[key] == m.entries[key]  # the table every memo of the process shares
    assert (m.hits, m.misses) == (0, 1)
    built = m.lookup(key, (x, y))
    assert type(built) is FakeTensor and built.fake_mode is mode and _meta(built) == _meta(out)
    assert not _same_storage(built, out) and not _same_storage(built, x)
    assert (m.hits, m.misses) == (1, 1)


def test_a_view_is_rebuilt_on_its_arguments_storage_at_its_offset(fake):
    mode, m, x, _ = fake
    with mode:
        w = torch.empty(2, 3)
    key = m.key(aten.slice.Tensor, (x, 1, 1, 3), {})
    out = aten.slice.Tensor(x, 1, 1, 3)
    m.learn(key, aten.slice.Tensor, (x, 1, 1, 3), out)
    assert m.entries[key] == ("view", 0, (2, 2), (3, 1), 1, torch.float32, torch.device("cpu"), False)
    built = m.lookup(key, (w, 1, 1, 3))  # the same call on another tensor of the same metadata
    assert _same_storage(built, w)
    assert _meta(built) == ((2, 2), (3, 1), 1, torch.float32, torch.device("cpu"), False)
    # The view of the second argument names that argument.
    op = _Op(is_view=True)
    assert m._entry(op, (1, x), x[0]) == ("view", 1, (3,), (1,), 0, torch.float32, torch.device("cpu"), False)


def test_an_in_place_result_is_its_argument(fake):
    mode, m, x, y = fake
    key = m.key(aten.add_.Tensor, (x, y), {})
    m.learn(key, aten.add_.Tensor, (x, y), aten.add_.Tensor(x, y))
    assert m.entries[key] == ("arg", 0)
    assert m.lookup(key, (y, x)) is y
    assert m._entry(_Op(), (x, y), y) == ("arg", 1)


def test_sequences_and_none_are_rebuilt_as_they_came(fake):
    mode, m, x, _ = fake
    out = aten.var_mean.correction(x, [1])
    m.learn("vm", aten.var_mean.correction, (x, [1]), out)
    new = ("new", None, (2,), (1,), 0, torch.float32, torch.device("cpu"), False)
    assert m.entries["vm"] == ("seq", tuple, [new, new])
    built = m.lookup("vm", (x, [1]))
    assert type(built) is tuple and [_meta(b) for b in built] == [_meta(o) for o in out]
    assert not _same_storage(built[0], built[1])
    parts = aten.split.Tensor(x, 1)
    m.learn("split", aten.split.Tensor, (x, 1), parts)
    built = m.lookup("split", (x, 1))
    assert type(built) is list and [b.storage_offset() for b in built] == [0, 3]
    assert all(_same_storage(b, x) for b in built)
    m.learn("none", _Op(), (x,), None)
    assert m.entries["none"] is None and m.lookup("none", (x,)) is None and m.hits == 3
    assert m._entry(_Op(), (x,), [None, x]) == ("seq", list, [None, ("arg", 0)])


def test_outputs_the_memo_cannot_rebuild_are_always_recomputed(fake):
    mode, m, x, y = fake
    un = memo._UNMEMOIZABLE
    for tag in (torch.Tag.inplace_view, torch.Tag.out, torch.Tag.dynamic_output_shape):
        assert m._entry(_Op(tags=[tag]), (x,), aten.add.Tensor(x, y)) is un
    fresh = aten.add.Tensor(x, y)
    assert m._entry(_Op(), (x,), ()) is un  # an empty sequence
    assert m._entry(_Op(), (x,), (fresh, 3)) is un  # a part that is no tensor
    assert m._entry(_Op(), (x,), (fresh, fresh[0])) is un  # two outputs on one new storage
    assert m._entry(_Op(), (x,), (x, x[0])) is un  # one part that cannot be rebuilt spoils the rest
    assert m._entry(_Op(is_view=True), (x,), fresh) is un  # a view of no argument
    assert m._entry(_Op(), (x,), x[1]) is un  # a new output at an offset
    assert m._entry(_Op(), (y, x), x.view(3, 2)) is un  # a new output on an argument's storage
    with mode:
        bigger = torch.empty(8)[:6].view(2, 3)  # storage of 8 floats behind 6
    assert m._entry(_Op(), (x,), bigger) is un
    with mode:
        c = torch.empty(2, dtype=torch.complex64)
    assert m._entry(_Op(), (c,), aten.conj.default(c)) is un
    assert m._entry(_Op(), (x,), aten.neg.default(x)) != un  # an ordinary negation is a new tensor
    assert m._entry(_Op(), (x,), torch.ones(2)) is un  # a real tensor
    fresh.constant = torch.ones(2, 3)
    assert m._entry(_Op(), (x,), fresh) is un
    key = m.key(aten.nonzero.default, (x,), {})
    m.learn(key, aten.nonzero.default, (x,), fresh)
    assert m.lookup(key, (x,)) is memo.MISS and m.hits == 0 and m.misses == 1


def test_a_rebuilt_tensor_is_a_fake_of_its_device_like_one_the_mode_makes(fake):
    mode, m, x, _ = fake
    cuda = torch.device("cuda:0")
    for device in (torch.device("cpu"), cuda, torch.device("cpu")):
        entry = ("new", None, (2, 3), (1, 2), 0, torch.bfloat16, device, True)
        t = m._build(entry, (x,))
        assert type(t) is FakeTensor and t.fake_mode is mode and t.fake_device == device
        assert _meta(t) == ((2, 3), (1, 2), 0, torch.bfloat16, device, True)
        with torch._C._DisableTorchDispatch():
            probe = torch.empty(0, device="meta")
        ref = FakeTensor(mode, probe, device)
        assert t.__dict__ == ref.__dict__
        # Dispatched as a tensor of its device (CUDA keys, autocast), and reporting that device.
        assert torch._C._dispatch_keys(t) == torch._C._dispatch_keys(ref)
        assert (t.device, t.is_cuda) == (device, device.type == "cuda")
    assert set(m._templates) == {torch.device("cpu"), cuda}
    assert m._build(None, (x,)) is None
    # data_ptr() follows the mode: allowed (the default) or refused, as on the mode's own tensors.
    for t in (x, m._build(("new", None, (2,), (1,), 0, torch.float32, cuda, False), ())):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns once per process that this is deprecated
            t.data_ptr()
    strict = FakeTensorMode()
    strict._allow_unsafe_data_ptr_access = False
    t = memo.DispatchMemo(strict)._build(("new", None, (2,), (1,), 0, torch.float32, cuda, False), ())
    with pytest.raises(RuntimeError, match="Cannot access data pointer"):
        t.data_ptr()


def test_the_shared_table_is_cleared_only_once_it_holds_more_than_200000_entries(monkeypatch):
    mode = FakeTensorMode()
    full = dict.fromkeys(range(200_000))
    monkeypatch.setattr(memo, "_ENTRIES", full)
    assert memo.DispatchMemo(mode).entries is full and len(full) == 200_000
    full[-1] = None
    assert memo.DispatchMemo(mode).entries is full and full == {}


# ---- grid.py: ties, the speed key, the image size the models are ordered at -------------


def _p(model, precision, ckpt, batch, status="fits", ips=None, **config):
    return predict.Prediction(model, precision, ckpt, batch, "cuda", None, None, status,
                              predicted_images_per_s=ips, config=config)  # fmt: skip


def test_of_equal_fitting_batches_the_first_prediction_is_kept():
    a, b = _p("DiT-S/2", "fp32", "none", 32), _p("DiT-S/2", "fp32", "none", 32)
    assert grid.largest_batches([a, b])[("DiT-S/2", "fp32", "none")] is a
    fast, faster = _p("DiT-S/2", "bf16", "none", 32, ips=10.0), _p("DiT-S/2", "bf16", "none", 32, ips=20.0)
    (advice,) = grid.decision_tree({80: [fast, faster]}, [(80, find_card("A100-80GB"))])
    assert advice.setting is fast and advice.alternatives == 0


def test_the_speed_key_is_the_predicted_speed_else_the_anchors_order():
    # fp32 is precision 3 of (bf16, fp16, tf32, fp32), full checkpointing 2 of (none, every_2, full);
    # fp32 is no low precision, so its rank is (1, precision, checkpointing).
    assert grid._speed_key(_p("DiT-S/2", "fp32", "full", 8)) == (1, 1, 3, 2)
    # bf16 is low precision: (0, checkpointing, precision).
    assert grid._speed_key(_p("DiT-S/2", "bf16", "every_2", 8)) == (1, 0, 1, 0)
    assert grid._speed_key(_p("DiT-S/2", "fp32", "full", 8, ips=123.5)) == (0, -123.5)


def test_the_models_are_ordered_by_their_gflops_at_the_predictions_image_size(monkeypatch):
    seen = []
    # Made-up Gflops that order S/2 above B/2 at 512 px only: the order must be taken at 512.
    gflops = {("DiT-S/2", 512): 9.0, ("DiT-B/2", 512): 5.0, ("DiT-S/2", 256): 1.0, ("DiT-B/2", 256): 5.0}
    monkeypatch.setattr(grid, "_gflops", lambda m, size: seen.append(size) or gflops[m, size])
    preds = [
        _p("DiT-B/2", "bf16", "none", 8, image_size=512),
        _p("DiT-S/2", "bf16", "none", 8, image_size=512),
    ]
    (advice,) = grid.decision_tree({80: preds}, [(80, find_card("A100-80GB"))])
    assert set(seen) == {512} and advice.model == "DiT-S/2" and advice.setting is preds[1]


class _Pool:
    """A stand-in for ProcessPoolExecutor that runs each job at once, here, and records its size."""

    made: list = []

    def __init__(self, max_workers, mp_context):
        self.made.append((max_workers, mp_context.get_start_method()))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        from concurrent.futures import Future

        future = Future()
        future.set_result(fn(*args))
        return future


@pytest.mark.parametrize("models, jobs, pool", [
    (4, None, []),  # the default: one process
    (3, 8, []),  # fewer than 4 groups: not worth a worker's imports
    (4, 0, []),  # at least one
    (4, 3, [(3, "spawn")]),
    (5, 8, [(5, "spawn")]),  # no more workers than groups
])  # fmt: skip
def test_evaluate_uses_a_spawned_pool_of_at_most_one_worker_per_group(monkeypatch, models, jobs, pool):
    import concurrent.futures

    work = []

    def fake_work(group, budgets, disk_cache, speed):
        work.append((len(group), budgets, disk_cache, speed))
        return [[[_p(s.config["model"], "fp32", "none", 8)]] for s in group]

    monkeypatch.setattr(grid, "_work", fake_work)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _Pool)
    monkeypatch.setattr(_Pool, "made", [])
    names = ["DiT-S/2", "DiT-B/2", "DiT-L/2", "DiT-XL/2", "DiT-S/4"][:models]
    series = grid.grid(names, ["fp32"], ["none"], [8])
    budgets = [predict.budget(None)]
    # The defaults: no disk cache, no speed options; else what is given is passed to every group.
    kwargs = {} if jobs is None else {"jobs": jobs, "disk_cache": True, "speed": "opts"}
    out = grid.evaluate(series, budgets, **kwargs)
    assert _Pool.made == pool
    assert [r[0][0].model for r in out] == names
    passed = (False, None) if jobs is None else (True, "opts")
    assert work == [(1, budgets, *passed)] * models  # one series a group


def test_default_jobs_is_the_usable_cpus_up_to_2(monkeypatch):
    import os

    for cpus, jobs in (({0}, 1), ({0, 1}, 2), (set(range(8)), 2)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cpus=cpus: cpus, raising=False)
        assert grid.default_jobs() == jobs
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS has none: one process
    assert grid.default_jobs() == 1


def test_work_predicts_the_groups_first_series_on_the_budgets_and_hides_only_torchs_data_pointer_warning(
    monkeypatch,
):
    seen = []

    def fake(config, batch_sizes, budgets, disk_cache, speed):
        seen.append((config["model"], batch_sizes, budgets, disk_cache, speed))
        return [[_p(config["model"], config["precision"], "none", b) for b in batch_sizes]]

    monkeypatch.setattr(grid, "predict_budgets", fake)
    budgets = [predict.budget("H200")]
    (series,) = grid.grid(["DiT-S/2"], ["bf16"], ["none"], [16, 8])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (rows,) = grid._work([series], budgets, False, None)
        warnings.warn("Accessing the data pointer of FakeTensor is deprecated", UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]
    assert seen == [("DiT-S/2", [8, 16], budgets, False, None)]
    assert [p.batch_size for p in rows[0]] == [8, 16]


def test_a_group_predicted_short_of_its_series_fails_instead_of_leaving_a_series_empty(monkeypatch):
    monkeypatch.setattr(grid, "_work", lambda group, budgets, disk, speed: [])
    with pytest.raises(ValueError, match="zip"):
        grid.evaluate(grid.grid(["DiT-S/2"], ["fp32"], ["none"], [8]), [predict.budget(None)])


# ---- kernels.py and grid.py: FLOP formulas fed every argument ---------------------------------------


def test_a_forward_attention_with_its_dropout_and_causal_flags_counts_q_k_v():
    fwd = aten._scaled_dot_product_flash_attention_for_cpu.default
    q = torch.ones(2, 3, 5, 4)
    args = (q, q, q, 0.0, False)
    # 2 * 2 * B * H * T^2 * D = 4 * 2 * 3 * 25 * 4 = 2400.
    assert kernels._flops(fwd._schema.name.split("::")[1], fwd, args, {}, fwd(*args)) == 2400


def test_a_convolutions_flops_come_from_its_output_shape():
    conv = aten.convolution.default
    x, w = torch.ones(2, 3, 8, 8), torch.ones(4, 3, 3, 3)
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    out = conv(*args)  # (2, 4, 6, 6)
    # 2 FLOPs per multiply-add: each of the 2 * 4 * 6 * 6 outputs sums 3 * 3 * 3 products.
    assert kernels._flops("convolution", conv, args, {}, out) == 2 * (2 * 4 * 6 * 6) * (3 * 3 * 3)


def test_gflops_are_the_forward_macs_over_1e9(monkeypatch):
    from ditbench.models import flops

    monkeypatch.setattr(flops, "forward_macs", lambda model, size: 3 * 10**9 if size == 256 else 0)
    assert grid._gflops("DiT-S/2", 256) == 3.0


def test_cudnn_attention_is_attention_and_a_split_needs_a_batch_above_1():
    assert kernels.category("_scaled_dot_product_cudnn_attention") == "attention"
    assert kernels.category("_scaled_dot_product_cudnn_attention_backward") == "attention"
    # At batch 2 a value of 4 bytes carries the batch: all per sample, a whole number of bytes.
    const, per = kernels._split(4, 2)
    assert (const, per) == (0, 2) and type(per) is int
    assert (
        kernels._split(4, 1) == (4, 0) and kernels._split(0, 7) == (0, 0) and kernels._split(15, 7) == (15, 0)
    )


def test_an_out_variant_writes_its_out_argument_and_a_factory_writes_its_output():
    x, y, z = torch.ones(7), torch.ones(7), torch.empty(7)
    # Every tensor argument counts as read (x, y and the out= tensor z) and the output z as written:
    # 4 * 28 bytes, all per sample at batch 7.
    row = kernels.op_row(aten.add.out, (x, y), {"out": z}, z, 7, False)
    assert row == ("elementwise", "fp32", False, 0, 0, 0, 4 * 4)
    out = torch.zeros(2, 3)
    assert kernels.op_row(aten.zeros.default, ([2, 3],), {}, out, 7, False) == (
        "elementwise", "fp32", False, 0, 0, 24, 0)  # fmt: skip
    # A foreach op whose keyword argument (alpha) is left out still writes back its list.
    xs, ys = [torch.ones(7)], [torch.ones(7)]
    assert kernels.op_row(aten._foreach_add_.List, (xs, ys), {}, None, 7, False) == (
        "optimizer", "fp32", False, 0, 0, 0, 3 * 4)  # fmt: skip


def test_a_floating_dtype_without_a_name_is_counted_as_fp32_and_a_conv_row_has_its_flops():
    x8 = torch.empty(4, dtype=torch.float8_e4m3fn)
    assert kernels.op_row(aten.clone.default, (x8,), {}, torch.empty_like(x8), 7, False)[1] == "fp32"
    conv = aten.convolution.default
    x, w = torch.ones(7, 3, 8, 8), torch.ones(4, 3, 3, 3)
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    row = kernels.op_row(conv, args, {}, conv(*args), 7, False)
    # Per sample: 2 * (4 * 6 * 6) outputs * 27 products.
    assert row[:5] == ("matmul", "fp32", False, 0, 2 * (4 * 6 * 6) * 27)


def test_each_output_of_a_sequence_must_own_its_new_storage_and_each_miss_is_counted(fake):
    mode, m, x, y = fake
    fresh = aten.add.Tensor(x, y)
    # Two whole views of one new storage: each alone is a new tensor, together they cannot be rebuilt.
    assert m._entry(_Op(), (x,), (fresh, fresh.view(2, 3))) is memo._UNMEMOIZABLE
    # A conjugate or negative view that shares no argument's storage is not rebuilt either.
    with mode:
        c = torch.empty(2, dtype=torch.complex64)
    assert m._entry(_Op(), (), aten.conj.default(c)) is memo._UNMEMOIZABLE
    assert m._entry(_Op(), (), aten._neg_view.default(c)) is memo._UNMEMOIZABLE
    # A half-precision output and a 4 TiB one are new tensors (the size check runs on the meta device).
    with mode:
        half, huge = torch.empty(2, 3, dtype=torch.float16), torch.empty(2**40)
    assert m._entry(_Op(), (x,), half) == (
        "new",
        None,
        (2, 3),
        (3, 1),
        0,
        torch.float16,
        torch.device("cpu"),
        False,
    )
    assert m._entry(_Op(), (x,), huge)[:3] == ("new", None, (2**40,))
    # A keyword argument of the memo's own mode is keyed by its metadata.
    tx = (torch.float32, torch.device("cpu"), torch.Size([2, 3]), (3, 1), 0)
    assert m.key(aten.add.Tensor, (x,), {"other": y}) == (aten.add.Tensor, (tx,), (("other", tx),))
    m.learn("a", _Op(), (x,), None)
    m.learn("b", _Op(), (x,), None)
    assert m.misses == 2
