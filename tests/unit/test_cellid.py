"""Cell ids: what they hash, and that they stay the same from one version to the next."""

from ditbench.spec.cell import CellSpec, Steps, cell_id
from ditbench.spec.knobs import Knobs


def test_an_id_hashes_what_differs_from_the_defaults_and_stays_put():
    plain = CellSpec(Knobs(model="DiT-T/8"), "cpu")
    assert plain.identity() == {"model": "DiT-T/8", "device": "cpu"}
    assert cell_id(plain) == "a630513b3229"  # the id every version since the knob table has given it
    # a knob at its default (zero_grad came later) leaves the id as it was; another value is another cell
    assert cell_id(CellSpec(Knobs(model="DiT-T/8", zero_grad="before_forward"), "cpu")) == "a630513b3229"
    assert cell_id(CellSpec(Knobs(model="DiT-T/8", zero_grad="after_forward"), "cpu")) != "a630513b3229"
    assert cell_id(CellSpec(Knobs(model="DiT-T/8"), "cpu", Steps(1, 2, 0.0))) != "a630513b3229"
