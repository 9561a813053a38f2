"""The report's figures as a reader needs them: each speed point's p10-p90 spread as a bar with the
exact images/s of its p90 and p10 step times, noisy cells ringed, memory in MiB where every value is
below 1 GiB, and point labels that never cover one another or a point, placed the same way each time."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from report_support import noisy
from synthetic_records import CPU_ENV, make_matrix, make_record, write_jsonl

from ditbench.report.figures import NOISY_RING, place_labels
from ditbench.report.load import load_results
from ditbench.report.plots import memory_figure, speed_memory_figure, throughput_figure


def frame(tmp_path, records):
    write_jsonl(tmp_path / "results.jsonl", records)
    return load_results(tmp_path / "results.jsonl")


def _bars(ax) -> list[tuple[float, float, float]]:
    """(x, low, high) of every vertical error bar drawn on ax."""
    out = []
    for collection in ax.collections:
        for seg in getattr(collection, "get_segments", lambda: [])():
            if len(seg) == 2 and seg[0][0] == seg[1][0] and seg[0][1] != seg[1][1]:
                out.append(
                    (float(seg[0][0]), float(min(seg[0][1], seg[1][1])), float(max(seg[0][1], seg[1][1])))
                )
    return sorted(out)


def _expected_spread(record) -> tuple[float, float]:
    m = record["metrics"]
    median, p10, p90 = m["step_ms"]["median"], m["step_ms"]["p10"], m["step_ms"]["p90"]
    return m["images_per_s"] * median / p90, m["images_per_s"] * median / p10


def test_speed_points_carry_their_p10_p90_spread_exactly(tmp_path):
    records = make_matrix(models=("DiT-S/8",), precisions=("fp32",), batches=(2, 4), device="cpu")
    df = frame(tmp_path, records)
    expected = sorted(_expected_spread(r) for r in records)
    for fig in (speed_memory_figure(df), throughput_figure(df)):
        (ax,) = [a for a in fig.axes if a.get_visible()]
        bars = sorted((lo, hi) for _, lo, hi in _bars(ax))
        assert bars == [pytest.approx(e, rel=1e-12) for e in expected]
        for lo, hi in bars:  # the window's own rate lies inside its spread
            assert lo < hi
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "p10–p90 of step times" in labels


def test_noisy_cells_are_ringed_in_the_throughput_figure(tmp_path):
    records = make_matrix(models=("DiT-S/8",), precisions=("fp32",), batches=(2, 4), device="cpu")
    records[1] = noisy(records[1])
    df = frame(tmp_path, records)
    fig = throughput_figure(df)
    ax = fig.axes[0]
    rings = [
        c for c in ax.collections
        if len(c.get_edgecolors()) and np.allclose(c.get_edgecolors()[0][:3], _rgb(NOISY_RING))
    ]  # fmt: skip
    (ring,) = rings
    assert ring.get_offsets()[:, 1].tolist() == pytest.approx([records[1]["metrics"]["images_per_s"]])
    assert "noisy (unsteady step times)" in [t.get_text() for t in fig.legends[0].get_texts()]
    clean = throughput_figure(frame(tmp_path, make_matrix(models=("DiT-S/8",), batches=(2,), device="cpu")))
    assert "noisy (unsteady step times)" not in [t.get_text() for t in clean.legends[0].get_texts()]


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    return tuple(int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))


def test_memory_below_one_gib_reads_in_mib(tmp_path):
    record = make_record(model="DiT-S/8", batch_size=2, device="cpu", env=CPU_ENV, peak_alloc=0.0079)
    df = frame(tmp_path, [record])
    fig = memory_figure(df)
    ax = fig.axes[0]
    assert ax.get_ylabel().endswith("(MiB)")
    (line,) = [ln for ln in ax.get_lines() if len(ln.get_ydata())]
    assert line.get_ydata().tolist() == pytest.approx([0.0079 * 1024])
    fig = speed_memory_figure(df)
    assert fig.axes[0].get_xlabel().endswith("(MiB)")
    big = frame(
        tmp_path, [make_record(model="DiT-S/8", batch_size=2, device="cpu", env=CPU_ENV, peak_alloc=1.5)]
    )
    assert memory_figure(big).axes[0].get_ylabel().endswith("(GiB)")


def _placed(points):
    fig = Figure(figsize=(4, 3), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs, ys = zip(*[(x, y) for x, y, _ in points], strict=True)
    ax.scatter(xs, ys)
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    fig.draw_without_rendering()
    place_labels(ax, points)
    renderer = fig.canvas.get_renderer()
    texts = [t for t in ax.texts]
    return fig, ax, [(t.get_text(), t.get_window_extent(renderer)) for t in texts]


def test_labels_of_a_tight_cluster_do_not_overlap_each_other_or_the_points():
    # the cpu_smoke case: eight cells within a few pixels on both axes
    points = [(5.0 + 0.08 * (i % 3), 5.0 + 0.25 * i, str(2 ** (i % 4 + 1))) for i in range(8)]
    fig, ax, boxes = _placed(points)
    assert len(boxes) == 8
    for (_, a), (_, b) in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    to_px = ax.transData.transform
    for _, box in boxes:
        for x, y, _ in points:
            px, py = to_px((x, y))
            assert not (
                box.x0 + 1 < px < box.x1 - 1 and box.y0 + 1 < py < box.y1 - 1
            )  # no point under a label
    # deterministic: the same input places every label in the same spot
    assert [(t, b.bounds) for t, b in _placed(points)[2]] == [(t, b.bounds) for t, b in boxes]


def test_points_on_one_pixel_share_one_label():
    _, _, boxes = _placed([(5.0, 5.0, "8"), (5.0, 5.0, "4"), (2.0, 2.0, "4")])
    assert sorted(t for t, _ in boxes) == ["4", "8, 4"] or sorted(t for t, _ in boxes) == ["4", "4, 8"]
