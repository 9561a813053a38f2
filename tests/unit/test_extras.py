"""diffusers is the `vae` extra: the paths that need it name the extra when it is missing, and the
default commands never import it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ditbench.core.errors import UnsupportedError


@pytest.fixture
def no_diffusers(monkeypatch):
    """diffusers as if not installed: a None entry in sys.modules makes `import diffusers` fail."""
    for name in [m for m in sys.modules if m == "diffusers" or m.startswith("diffusers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "diffusers", None)


def _one_paragraph(err) -> str:
    text = str(err)
    assert "\n" not in text
    return text


def test_the_vae_names_the_extra_when_diffusers_is_missing(no_diffusers):
    from ditbench.models.vae import build_vae

    with pytest.raises(UnsupportedError) as caught:
        build_vae("random", "cpu")
    text = _one_paragraph(caught.value)
    assert text.startswith("the VAE ('random') needs the diffusers package")
    assert 'pip install "ditbench[vae]"' in text


def test_a_pretrained_vae_names_the_extra_when_diffusers_is_missing(no_diffusers):
    from ditbench.files import pretrained

    with pytest.raises(UnsupportedError, match=r"the pretrained VAE `ema` needs the diffusers package"):
        pretrained.load_vae("ema")


def test_impl_diffusers_names_the_extra_when_diffusers_is_missing(no_diffusers):
    from ditbench.models import build_model

    with pytest.raises(UnsupportedError) as caught:
        build_model("DiT-T/4", image_size=64, impl="diffusers")
    text = _one_paragraph(caught.value)
    assert text.startswith("impl: diffusers needs the diffusers package")
    assert 'pip install "ditbench[vae]"' in text


# Refuses and records every attempt to import diffusers, then runs each command in-process.
PROBE = """
import json, sys
tried = []
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "diffusers" or name.startswith("diffusers."):
            tried.append(name)
            raise ImportError("blocked by the test")
        return None
sys.meta_path.insert(0, Refuse())
from ditbench.cli import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "tried": tried}), file=sys.stderr)
"""

SUITE = """name: nodiff
device: cpu
defaults:
  model: DiT-T/8
  image_size: 64
  data: synthetic
  steps: {warmup: 1, measure: 2, min_seconds: 0}
matrix: {batch_size: [2]}
"""


@pytest.mark.slow
def test_default_commands_never_import_diffusers(tmp_path):
    (tmp_path / "nodiff.yaml").write_text(SUITE)
    out = tmp_path / "out"
    argvs = [
        ["run", "cpu_smoke", "--dry-run"],
        ["run", str(tmp_path / "nodiff.yaml"), "--out", str(out), "--no-progress"],
        ["report", str(out / "results.jsonl"), "--out", str(tmp_path / "report")],
        ["compare", str(out / "results.jsonl"), str(out / "results.jsonl"), "--allow-env-mismatch"],
    ]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True, timeout=600
    )
    result = json.loads(done.stderr.strip().splitlines()[-1])
    assert result == {"codes": [0, 0, 0, 0], "tried": []}, done.stdout[-2000:] + done.stderr[-3000:]
