"""The attention knob: what each backend computes, which kernel runs, and what cannot run here."""

import pytest
import torch

from ditbench.core.errors import UnsupportedError
from ditbench.models import build_model
from ditbench.models.attention import attend, refused, resolve_kernel, torch_reasons


def _qkv(dtype=torch.float32, tokens=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, tokens, 32, generator=g).to(dtype).requires_grad_(True) for _ in range(3)]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_backends_agree_with_the_written_out_math(backend, dtype, tol):
    q, k, v = _qkv(dtype)
    ref = attend(q, k, v, "math")
    ref.float().square().sum().backward()
    ref_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out = attend(q, k, v, backend)
    out.float().square().sum().backward()
    assert out.dtype == dtype
    # within the dtype's rounding, on the scale of the values (bf16 keeps 8 bits of mantissa)
    for a, b in zip((out, q.grad, k.grad, v.grad), (ref, *ref_grads), strict=True):
        assert (a.float() - b.float()).abs().max() <= tol * b.float().abs().max()


def test_math_is_softmax_of_scaled_scores_times_v():
    q, k, v = (t.detach().double() for t in _qkv(tokens=5))
    scores = torch.einsum("nhqd,nhkd->nhqk", q, k) / 32**0.5
    expected = torch.einsum("nhqk,nhkd->nhqd", torch.softmax(scores, dim=-1), v)
    torch.testing.assert_close(attend(q, k, v, "math"), expected)


def test_dit_outputs_agree_across_backends():
    torch.manual_seed(0)
    models = {a: build_model("DiT-T/2", image_size=64, attention=a).eval() for a in ("math", "sdpa", "flash")}
    with torch.no_grad():  # adaLN-Zero starts every block as the identity: give attention a say
        for p in models["math"].parameters():
            p.add_(0.05 * torch.randn_like(p))
    for m in models.values():
        m.load_state_dict(models["math"].state_dict())
    x, t, y = torch.randn(2, 4, 8, 8), torch.tensor([3, 700]), torch.tensor([1, 2])
    outs = {a: m(x, t, y) for a, m in models.items()}
    assert outs["math"].abs().max() > 0.1
    for a in ("sdpa", "flash"):
        torch.testing.assert_close(outs[a], outs["math"], rtol=1e-4, atol=1e-5)


def test_kernel_names_on_a_cpu():
    for dtype in (torch.float32, torch.bfloat16):
        assert resolve_kernel("math", "cpu", dtype, 6, 64, 16) == "math"
        assert resolve_kernel("sdpa", "cpu", dtype, 6, 64, 16) == "flash"  # torch's CPU flash kernel
        assert resolve_kernel("flash", "cpu", dtype, 6, 64, 16) == "flash"
    for backend, name in (("efficient", "memory-efficient"), ("cudnn", "cuDNN")):
        with pytest.raises(UnsupportedError, match=f"{name} attention kernel for CUDA devices only"):
            resolve_kernel(backend, "cpu", torch.float32, 6, 64, 16)


def test_torch_reasons_keep_the_forced_kernels_own_lines():
    messages = [
        "Memory efficient kernel not used because:",
        "Memory Efficient attention has been runtime disabled.",
        "Flash attention kernel not used because:",
        "Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float",
        "cuDNN attention kernel not used because:",
        "cuDNN attention has been runtime disabled.",
    ]
    assert torch_reasons(messages, "flash") == [messages[3]]
    assert torch_reasons(["something else"], "cudnn") == ["something else"]


def test_a_refused_kernel_is_unsupported_not_an_error():
    err = RuntimeError("No available kernel. Aborting execution.")
    refusal = refused(err, "flash", "inputs (1, 2, 3, 4) of torch.float32 on cuda")
    assert isinstance(refusal, UnsupportedError) and "No available kernel" in str(refusal)
    assert refused(RuntimeError("shape mismatch"), "flash", "x") is None
    assert refused(err, "sdpa", "x") is None  # only a forced kernel is refused by torch this way


def test_diffusers_impl_runs_the_math_and_forced_backends():
    torch.manual_seed(0)
    models = {
        a: build_model("DiT-T/4", image_size=64, impl="diffusers", attention=a) for a in ("math", "flash")
    }
    with torch.no_grad():
        for p in models["math"].parameters():
            p.add_(0.05 * torch.randn_like(p))
    models["flash"].load_state_dict(models["math"].state_dict())
    x, t, y = torch.randn(2, 4, 8, 8), torch.tensor([3, 700]), torch.tensor([1, 2])
    with torch.no_grad():
        a, b = (m.eval()(x, t, y) for m in models.values())
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(UnsupportedError, match="memory-efficient"):
        from ditbench.spec.knobs import Knobs
        from ditbench.train.step import Trainer

        Trainer(Knobs(model="DiT-T/4", image_size=64, batch_size=2, impl="diffusers", attention="efficient"))


def test_a_cell_records_the_kernel_or_is_unsupported(tmp_path):
    from ditbench.bench.cell import core as cell_core
    from ditbench.hardware.dist import DistContext
    from ditbench.spec.cell import CellSpec, Steps
    from ditbench.spec.knobs import Knobs

    def run(attention):
        knobs = Knobs(model="DiT-T/8", image_size=64, batch_size=2, attention=attention)
        spec = CellSpec(knobs, "cpu", Steps(warmup=1, measure=2, min_seconds=0.0))
        return cell_core.measure(spec, f"DiT-T/8 {attention}", lambda: DistContext()).result

    ok = run("sdpa")
    assert ok["status"] == "ok", ok["reason"]
    assert ok["metrics"]["attention_kernel"] == "flash" and ok["metrics"]["optimizer_kernel"] == "fused"
    assert run("math")["metrics"]["attention_kernel"] == "math"
    refused_cell = run("cudnn")
    assert refused_cell["status"] == "unsupported" and "CUDA devices only" in refused_cell["reason"]
