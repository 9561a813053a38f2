"""report/gate/env.py checked function by function (issue 27, mutation testing).

The fingerprint is env.py's stated key list: GPU model and count, driver, CUDA, torch, torch's thread
count, and the CPU model only for a CPU-only run (whose torch is compared without its +local build and
without CUDA); the expected dictionaries and messages are written out here in full.
"""

from __future__ import annotations

from ditbench.report.gate.env import (
    THREADS_HINT,
    EnvMismatchError,
    _build,
    _values,
    differences,
    fingerprint,
    named_differences,
)
from ditbench.report.gate.inputs import GateRefusal, Row

GPU_ENV = {
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "gpu_count": 8,
    "driver": "550.54",
    "cuda": "12.4",
    "torch": "2.5.0+cu124",
    "torch_threads": 1,
    "cpu": "AMD EPYC 9654",
    "hostname": "runner-7",
    "python": "3.11.9",
}
CPU_ENV = {
    "gpu_name": None,
    "gpu_count": 0,
    "driver": None,
    "cuda": "13.0",
    "torch": "2.14.1+cu130",
    "torch_threads": 4,
    "cpu": "AMD EPYC 7B13",
    "hostname": "laptop",
}


def test_a_gpu_fingerprint_has_the_stack_and_not_the_host_or_cpu():
    assert fingerprint({"env": GPU_ENV}) == {
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "gpu_count": "8",
        "driver": "550.54",
        "cuda": "12.4",
        "torch": "2.5.0+cu124",
        "torch_threads": "1",
    }


def test_a_cpu_fingerprint_has_the_cpu_and_torchs_release_without_its_build_or_cuda():
    assert fingerprint({"env": CPU_ENV}) == {
        "gpu_name": "None",
        "gpu_count": "0",
        "driver": "None",
        "torch": "2.14.1",
        "torch_threads": "4",
        "cpu": "AMD EPYC 7B13",
    }


def test_a_record_without_env_has_every_key_unset():
    unset = {k: "None" for k in ("gpu_name", "gpu_count", "driver", "torch", "torch_threads", "cpu")}
    assert fingerprint({}) == unset
    assert fingerprint({"env": None}) == unset
    assert fingerprint({"env": {"gpu_name": ""}}) == {**unset, "gpu_name": ""}


def test_long_values_are_cut_at_120_characters():
    got = fingerprint({"env": {**GPU_ENV, "gpu_name": "G" * 200, "driver": "d" * 120}})
    assert got["gpu_name"] == "G" * 119 + "… (200 characters)"
    assert got["driver"] == "d" * 120


def test_the_torch_build_is_named_only_for_cpu_records():
    assert _build({"env": GPU_ENV}) == {}
    assert _build({"env": CPU_ENV}) == {"torch build": "cu130", "cuda": "13.0"}
    assert _build({"env": {**CPU_ENV, "torch": "2.14.1", "cuda": None}}) == {
        "torch build": "none named",
        "cuda": "None",
    }
    assert _build({}) == {"torch build": "none named", "cuda": "None"}
    long = _build({"env": {**CPU_ENV, "torch": "2.14.1+" + "b" * 50, "cuda": "c" * 41}})
    assert long == {"torch build": "b" * 39 + "… (50 characters)", "cuda": "c" * 39 + "… (41 characters)"}
    assert _build({"env": {**CPU_ENV, "torch": "2.14.1+" + "b" * 40, "cuda": "c" * 40}}) == {
        "torch build": "b" * 40,
        "cuda": "c" * 40,
    }


def pair(base_env, new_env, i=0):
    return (
        Row("BASE", f"b line {i}", {"cell_id": f"c{i}", "env": base_env}),
        Row("NEW", f"n line {i}", {"cell_id": f"c{i}", "env": new_env}),
    )


def test_the_same_stack_has_no_differences():
    assert differences([pair(GPU_ENV, {**GPU_ENV, "hostname": "other", "cpu": "Intel"})]) == {}
    assert differences([]) == {}


def test_differences_list_each_keys_distinct_values_per_side_in_key_order():
    pairs = [
        pair(GPU_ENV, {**GPU_ENV, "driver": "560.1", "torch": "2.6.0+cu124"}, 0),
        pair(GPU_ENV, {**GPU_ENV, "driver": "560.2", "torch": "2.6.0+cu124"}, 1),
        pair({**GPU_ENV, "driver": "550.9"}, {**GPU_ENV, "driver": "560.1"}, 2),
        pair(GPU_ENV, GPU_ENV, 3),
    ]
    diffs = differences(pairs)
    assert diffs == {
        "driver": (["550.54", "550.9"], ["560.1", "560.2"]),
        "torch": (["2.5.0+cu124"], ["2.6.0+cu124"]),
    }
    assert list(diffs) == ["driver", "torch"]


def test_a_key_on_one_side_only_is_compared_with_none():
    diffs = differences([pair(GPU_ENV, CPU_ENV)])
    assert diffs == {
        "cpu": (["None"], ["AMD EPYC 7B13"]),
        "cuda": (["12.4"], ["None"]),
        "driver": (["550.54"], ["None"]),
        "gpu_count": (["8"], ["0"]),
        "gpu_name": (["NVIDIA H100 80GB HBM3"], ["None"]),
        "torch": (["2.5.0+cu124"], ["2.14.1"]),
        "torch_threads": (["1"], ["4"]),
    }
    assert list(diffs) == sorted(diffs)


def test_differences_can_use_another_fingerprint():
    pairs = [pair({"k": "a"}, {"k": "b"}), pair({"k": "a"}, {"k": "c"})]
    assert differences(pairs, of=lambda r: dict(r["env"])) == {"k": (["a"], ["b", "c"])}


def test_named_differences_are_the_cpu_torch_builds():
    cpu_wheel = {**CPU_ENV, "torch": "2.14.1+cpu", "cuda": None}
    assert named_differences([pair(CPU_ENV, cpu_wheel)]) == {
        "cuda": (["13.0"], ["None"]),
        "torch build": (["cu130"], ["cpu"]),
    }
    assert differences([pair(CPU_ENV, cpu_wheel)]) == {}  # never gated
    assert named_differences([pair(GPU_ENV, {**GPU_ENV, "torch": "2.5.0+cu121"})]) == {}


def test_at_most_four_values_are_listed_and_the_rest_counted():
    assert _values(["a"]) == "a"
    assert _values(["a", "b", "c", "d"]) == "a, b, c, d"
    assert _values(["a", "b", "c", "d", "e"]) == "a, b, c, d (+1 more)"
    assert _values(list("abcdefg")) == "a, b, c, d (+3 more)"


REFUSAL = (
    "Speed and memory from different stacks are not comparable, so the gate refuses. Re-measure the baseline "
    "on this machine (docs/gate-in-ci.md says how to refresh a baseline), or pass --allow-env-mismatch to "
    "compare anyway (or, in a policy that gates only what does not depend on the machine, "
    "`environment: may_differ`)."
)


def test_the_refusal_names_both_files_and_every_difference():
    diffs = {"driver": (["550.54"], ["560.1", "560.2"]), "cuda": (["12.4"], ["12.6"])}
    err = EnvMismatchError("base/results.jsonl", "new/results.jsonl", diffs)
    assert isinstance(err, GateRefusal) and err.exit_code == 2
    assert (err.differences, err.base_path, err.new_path) == (
        diffs,
        "base/results.jsonl",
        "new/results.jsonl",
    )
    assert err.title == "refused, environments differ"
    assert str(err) == (
        "base/results.jsonl and new/results.jsonl were measured on different hardware or software (driver: "
        "550.54 (base) vs 560.1, 560.2 (new); cuda: 12.4 (base) vs 12.6 (new)). " + REFUSAL
    )
    assert err.markdown() == (
        "## ⛔ ditbench compare: refused, environments differ\n"
        "\n"
        "`base/results.jsonl` and `new/results.jsonl` were measured on different hardware or software, so "
        "their speed and memory are not comparable. Refresh the baseline on this runner, or pass "
        "`--allow-env-mismatch`.\n"
        "\n"
        "| key | base | new |\n"
        "|---|---|---|\n"
        "| driver | 550.54 | 560.1, 560.2 |\n"
        "| cuda | 12.4 | 12.6 |\n"
    )


def test_different_thread_counts_add_the_threads_hint():
    assert THREADS_HINT == (
        " The torch thread counts differ: set the `threads` knob (or OMP_NUM_THREADS with threads: auto) "
        "alike on both sides."
    )
    err = EnvMismatchError("b", "n", {"torch_threads": (["1"], ["4"])})
    assert str(err) == (
        "b and n were measured on different hardware or software (torch_threads: 1 (base) vs 4 (new)). "
        + REFUSAL
        + THREADS_HINT
    )
    assert err.markdown() == (
        "## ⛔ ditbench compare: refused, environments differ\n\n`b` and `n` were measured on different "
        "hardware or software, so their speed and memory are not comparable. Refresh the baseline on this "
        "runner, or pass `--allow-env-mismatch`." + THREADS_HINT + "\n\n| key | base | new |\n|---|---|---|\n"
        "| torch_threads | 1 | 4 |\n"
    )
