import pytest

from ditbench.models.flops import forward_macs, train_flops_per_image

# Forward GMACs per image from the paper / the reference note's table (256 px and 512 px).
PAPER_GMACS = [
    ("DiT-XL/2", 256, 118.62),
    ("DiT-XL/2", 512, 524.54),
    ("DiT-XL/4", 256, 29.04),
    ("DiT-L/2", 256, 80.70),
    ("DiT-L/4", 256, 19.70),
    ("DiT-B/4", 256, 5.57),
    ("DiT-B/2", 512, 106.38),
    ("DiT-S/8", 256, 0.36),
    ("DiT-S/2", 256, 6.06),
]


@pytest.mark.parametrize("name,size,gmacs", PAPER_GMACS)
def test_forward_macs_match_paper(name, size, gmacs):
    assert forward_macs(name, size) / 1e9 == pytest.approx(gmacs, abs=0.006)


def test_training_flops_xl2():
    assert train_flops_per_image("DiT-XL/2") / 1e9 == pytest.approx(712, rel=0.002)
