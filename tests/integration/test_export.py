"""`ditbench export`: each cell as a TensorBoard, MLflow or W&B run, read back with each tool's own reader.

The records are the committed CPU runs (reports/cpu_smoke: smoke losses, an unsupported cell;
reports/cpu_quality: quality scores and grids), copied so the grids resolve beside them. The
TensorBoard side is read with tensorboard's EventAccumulator, the MLflow side with MlflowClient on
MLflow 3's default sqlite store and on a file store in tmp_path (neither with an environment variable
set by hand), the W&B side (offline) with `wandb leet inspect --json`, the client's own reader of
its run log. The trackers are extras: without one the command is one paragraph naming
`pip install 'ditbench[...]'`, exit 2, and nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ditbench.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMOKE_CELL = "DiT-T/4 fp32 ckpt=none bs=4"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Path]:
    """Two results files: one ok cell with a smoke run plus one unsupported cell; the quality run."""
    root = tmp_path_factory.mktemp("results")
    smoke = [json.loads(line) for line in (ROOT / "reports/cpu_smoke/results.jsonl").read_text().splitlines()]
    keep = [r for r in smoke if r["cell_name"] == SMOKE_CELL][-1:]
    keep += [r for r in smoke if r["status"] == "unsupported"][:1]
    (root / "smoke").mkdir()
    (root / "smoke/results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keep))
    shutil.copytree(ROOT / "reports/cpu_quality", root / "quality")
    return {"smoke": root / "smoke/results.jsonl", "quality": root / "quality/results.jsonl"}


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _accumulator(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def _hparams(acc) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    return {k: v.ListFields()[0][1] for k, v in start.session_start_info.hparams.items()}


@pytest.mark.slow
def test_tensorboard_holds_each_cell_as_a_run(results, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    target = tmp_path / "tb"
    assert (
        main(["export", str(results["smoke"]), str(results["quality"]), "--to", "tensorboard", str(target)])
        == 0
    )
    assert "4 run(s) written" in capsys.readouterr().out  # 3 cells + the report
    folders = {p.name: p for p in target.iterdir()}
    ok, unsupported = _records(results["smoke"])
    (quality,) = _records(results["quality"])

    acc = _accumulator(folders[f"DiT-T_4_fp32_ckpt=none_bs=4-{ok['cell_id']}-{ok['run_id']}"])
    (point,) = acc.Scalars("speed/images_per_s")
    assert point.step == 0 and point.value == pytest.approx(ok["metrics"]["images_per_s"], rel=1e-6)
    (point,) = acc.Scalars("memory/cpu_peak_alloc_gib")
    assert point.value == pytest.approx(ok["metrics"]["cpu_peak_alloc_gib"], rel=1e-6)
    assert acc.Scalars("speed/step_ms.p90")[0].value == pytest.approx(
        ok["metrics"]["step_ms"]["p90"], rel=1e-6
    )
    loss = acc.Scalars("smoke/loss")
    assert [p.step for p in loss] == list(range(1, ok["smoke"]["steps"] + 1))
    assert [p.value for p in loss] == pytest.approx(ok["smoke"]["loss"], rel=1e-6)
    hp = _hparams(acc)
    assert hp["model"] == "DiT-T/4" and hp["batch_size"] == 4 and hp["precision"] == "fp32"
    assert hp["steps.measure"] == ok["config"]["steps"]["measure"] and hp["tag.status"] == "ok"

    acc = _accumulator(folders[next(k for k in folders if unsupported["cell_id"] in k)])
    assert acc.Tags()["scalars"] == []  # nothing was measured, and nothing is made up
    assert _hparams(acc)["tag.status"] == "unsupported"

    acc = _accumulator(folders[next(k for k in folders if quality["cell_id"] in k)])
    evaluations = quality["quality"]["evaluations"]
    fid = acc.Scalars("quality/fid")
    assert [(p.step, p.value) for p in fid] == [
        (e["step"], pytest.approx(e["metrics"]["fid"], rel=1e-6)) for e in evaluations
    ]
    assert [i.step for i in acc.Images("quality/grid")] == [e["step"] for e in evaluations]
    assert len(acc.Scalars("quality/train_loss")) == len(quality["quality"]["train_loss"])

    (report,) = [p for name, p in folders.items() if name.startswith("report-")]
    acc = _accumulator(report)
    assert "report/report.md/text_summary" in acc.Tags()["tensors"]
    text = acc.Tensors("report/report.md/text_summary")[0].tensor_proto.string_val[0].decode()
    assert SMOKE_CELL in text
    assert "report/speed_memory" in acc.Tags()["images"]

    # exporting again writes nothing twice
    before = sorted(p.name for p in target.rglob("events.out.tfevents.*"))
    assert (
        main(["export", str(results["smoke"]), str(results["quality"]), "--to", "tensorboard", str(target)])
        == 0
    )
    assert "0 run(s) written" in capsys.readouterr().out
    assert sorted(p.name for p in target.rglob("events.out.tfevents.*")) == before


@pytest.mark.slow
def test_mlflow_holds_each_cell_as_a_run(results, tmp_path, monkeypatch, capsys):
    """MLflow's own default store (sqlite:///mlflow.db in the working folder), no URI, no variable."""
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    argv = ["export", str(results["smoke"]), "--to", "mlflow", "--experiment", "smoke"]
    assert main(argv) == 0
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert f"3 run(s) written to {uri}" in capsys.readouterr().out
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("smoke")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    ok, unsupported = _records(results["smoke"])
    assert set(runs) == {
        SMOKE_CELL,
        unsupported["cell_name"],
        next(n for n in runs if n.startswith("report ")),
    }

    run = runs[SMOKE_CELL]
    assert run.data.params["model"] == "DiT-T/4" and run.data.params["batch_size"] == "4"
    assert run.data.params["steps.warmup"] == str(ok["config"]["steps"]["warmup"])
    assert run.data.tags["status"] == "ok" and run.data.tags["run_id"] == ok["run_id"]
    assert run.data.metrics["speed/images_per_s"] == ok["metrics"]["images_per_s"]
    assert run.data.metrics["memory/cpu_peak_rss_gib"] == ok["metrics"]["cpu_peak_rss_gib"]
    assert run.data.metrics["smoke/last_mean"] == ok["smoke"]["last_mean"]
    history = sorted(client.get_metric_history(run.info.run_id, "smoke/loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == list(enumerate(ok["smoke"]["loss"], start=1))

    assert (
        json.loads(Path(client.download_artifacts(run.info.run_id, "record.json", str(tmp_path))).read_text())
        == ok
    )

    run = runs[unsupported["cell_name"]]
    assert run.data.metrics == {} and run.data.tags["reason"] == unsupported["reason"]

    report = next(r for n, r in runs.items() if n.startswith("report "))
    files = {f.path for f in client.list_artifacts(report.info.run_id, "report")}
    assert {"report/report.md", "report/report.html", "report/results.csv"} <= files

    # the quality run's grids are artifacts; the smoke records are not exported twice
    assert main(["export", str(results["smoke"]), str(results["quality"]), "--to", "mlflow", uri,
                 "--experiment", "smoke"]) == 0  # fmt: skip
    assert not os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    assert "2 run(s) written" in capsys.readouterr().out  # the quality cell and this export's report
    (quality,) = _records(results["quality"])
    (run,) = client.search_runs([experiment.experiment_id], f"tags.cell_id = '{quality['cell_id']}'")
    grids = {f.path for f in client.list_artifacts(run.info.run_id, "grids")}
    assert grids == {"grids/" + Path(e["grid"]).name for e in quality["quality"]["evaluations"]}
    fid = client.get_metric_history(run.info.run_id, "quality/fid")
    assert sorted((m.step, m.value) for m in fid) == [
        (e["step"], e["metrics"]["fid"]) for e in quality["quality"]["evaluations"]
    ]


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow", "wandb"])
def test_a_missing_extra_is_one_paragraph_and_writes_nothing(results, tmp_path, monkeypatch, capsys, tracker):
    monkeypatch.setitem(sys.modules, tracker, None)  # import tracker -> ImportError
    target = tmp_path / "out"
    where = target.as_uri() if tracker == "mlflow" else str(target)
    assert main(["export", str(results["smoke"]), "--to", tracker, where]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the paragraph is wrapped at 100 columns
    assert f"pip install 'ditbench[{tracker}]'" in err and err.count("ditbench: error:") == 1
    assert not target.exists()


def test_bad_targets_are_one_paragraph(results, tmp_path, capsys):
    def error(*argv: str) -> str:
        assert main(["export", str(results["smoke"]), *argv]) == 2
        return " ".join(capsys.readouterr().err.split())

    assert "--to mlflow [URI] or --to wandb [DIR]" in error("--to", "neptune", "x")
    assert "is not a tracker" in error("--to", "wandb", "a", "b")
    afile = tmp_path / "afile"
    afile.write_text("")
    assert "that is a file" in error("--to", "tensorboard", str(afile))
    assert "that is a file" in error("--to", "wandb", str(afile))
    assert "not apply to --to tensorboard" in error("--to", "tensorboard", str(tmp_path), "--experiment", "x")


@pytest.mark.slow
def test_mlflow_file_store_needs_no_switch(results, tmp_path, monkeypatch, capsys):
    """A file store the user names is written without MLFLOW_ALLOW_FILE_STORE (MLflow 3 refuses it
    otherwise), and the switch is not left set in the process."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = (tmp_path / "m").as_uri()
    assert main(["export", str(results["smoke"]), "--to", "mlflow", uri, "--no-report"]) == 0
    assert "2 run(s) written" in capsys.readouterr().out
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read it back with MLflow 3's client
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("cpu_smoke").experiment_id])
    assert sorted(r.data.tags["cell_id"] for r in runs) == sorted(
        r["cell_id"] for r in _records(results["smoke"])
    )


def _wandb_log(folder: Path) -> list[dict]:
    """The records of one offline run's log, as the W&B client reads them."""
    (log,) = folder.glob("*.wandb")
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_wandb_holds_each_cell_as_an_offline_run(results, tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    from ditbench.export.trackers import run_id

    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is the default, with no key and no network
    monkeypatch.setenv("WANDB_API_KEY", "")
    target = tmp_path / "wb"
    argv = ["export", str(results["smoke"]), str(results["quality"]), "--to", "wandb", str(target)]
    assert main(argv) == 0
    assert "4 run(s) written" in capsys.readouterr().out  # 3 cells + the report
    ok, unsupported = _records(results["smoke"])
    (quality,) = _records(results["quality"])
    folders = {p.name.rsplit("-", 1)[1]: p for p in (target / "wandb").glob("offline-run-*")}
    assert len(folders) == 4

    log = _wandb_log(folders[run_id(f"{ok['run_id']}/{ok['cell_id']}")])
    (run,) = [r["run"] for r in log if r["type"] == "run"]
    assert run["display_name"] == SMOKE_CELL and run["project"] == "ditbench" and run["tags"] == ["ok"]
    config = run["config"]["update"]
    assert config["model"] == "DiT-T/4" and config["batch_size"] == 4
    assert config["steps.warmup"] == ok["config"]["steps"]["warmup"] and config["tag.run_id"] == ok["run_id"]
    history = {
        r["history"]["step"].get("num", 0): r["history"]["item"] for r in log if r["type"] == "history"
    }
    assert history[0]["speed/images_per_s"] == ok["metrics"]["images_per_s"]
    assert history[0]["memory/cpu_peak_alloc_gib"] == ok["metrics"]["cpu_peak_alloc_gib"]
    assert history[0]["speed/step_ms.p90"] == ok["metrics"]["step_ms"]["p90"]
    assert [history[s]["smoke/loss"] for s in range(1, ok["smoke"]["steps"] + 1)] == ok["smoke"]["loss"]
    files = folders[run_id(f"{ok['run_id']}/{ok['cell_id']}")] / "files"
    assert json.loads((files / "record.json").read_text()) == ok

    log = _wandb_log(folders[run_id(f"{unsupported['run_id']}/{unsupported['cell_id']}")])
    assert [r for r in log if r["type"] == "history"] == []  # nothing was measured, and nothing is made up
    (run,) = [r["run"] for r in log if r["type"] == "run"]
    assert run["config"]["update"]["tag.reason"] == unsupported["reason"]

    log = _wandb_log(folders[run_id(f"{quality['run_id']}/{quality['cell_id']}")])
    history = {
        r["history"]["step"].get("num", 0): r["history"]["item"] for r in log if r["type"] == "history"
    }
    evaluations = quality["quality"]["evaluations"]
    assert [history[e["step"]]["quality/fid"] for e in evaluations] == [
        e["metrics"]["fid"] for e in evaluations
    ]
    assert all(history[e["step"]]["quality/grid._type"] == "image-file" for e in evaluations)

    (report,) = [p for p in folders.values() if (p / "files/report").is_dir()]
    assert {"report.md", "report.html", "results.csv"} <= {
        p.name for p in (report / "files/report").iterdir()
    }

    assert main(argv) == 0  # exporting again writes nothing twice
    assert "0 run(s) written" in capsys.readouterr().out
    assert len(list((target / "wandb").glob("offline-run-*"))) == 4


@pytest.mark.slow
def test_default_paths_never_import_a_tracker(results, tmp_path):
    """report and compare (and export's --help) run without importing tensorboard or mlflow."""
    probe = (
        "import json, runpy, sys\n"
        "sys.argv = ['ditbench', *json.loads(sys.argv[1])]\n"
        "try:\n    runpy.run_module('ditbench', run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorboard', 'mlflow', 'wandb') or m == 'torch.utils.tensorboard')]), file=sys.stderr)\n"
    )
    smoke = str(results["smoke"])
    for argv in (
        ["report", smoke, "--out", str(tmp_path / "r")],
        ["compare", smoke, smoke],
        ["export", "--help"],
    ):
        done = subprocess.run([sys.executable, "-c", probe, json.dumps(argv)], capture_output=True, text=True)
        code, trackers = json.loads(done.stderr.strip().splitlines()[-1])
        # compare of a run with itself is exit 3 (one run per side is inconclusive); it ran to the end
        assert code in (0, 3, None) and trackers == [], (argv, done.stderr[-2000:])


def test_each_kept_record_is_its_own_run_named_with_its_label(results, tmp_path):
    """--keep all: a cell run twice is two runs (the key holds the run id), a label names the run."""
    from ditbench.export.runs import tracker_runs
    from ditbench.report.load import load_results

    ok = _records(results["smoke"])[0]
    again = {
        **ok,
        "run_id": "20261201T180000Z-abcdef",
        "label": "after-fix",
        "started_at": "2026-12-01T18:00:00Z",
    }
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(ok) + "\n" + json.dumps(again) + "\n")
    runs = tracker_runs(load_results([path], keep="all"))
    assert [r.name for r in runs] == [SMOKE_CELL, f"{SMOKE_CELL} [after-fix]"]
    assert len({r.key for r in runs}) == 2 and all(r.tags["cell_id"] == ok["cell_id"] for r in runs)
    assert runs[1].tags["label"] == "after-fix" and runs[1].key.endswith(again["run_id"])
    (latest,) = tracker_runs(load_results([path]))
    assert latest.tags["run_id"] == again["run_id"]
