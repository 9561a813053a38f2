"""Every YAML file a user hands us is read through files/yamlio.py: bounded, UTF-8, no duplicate keys."""

import pytest

from ditbench.core.errors import UserError, shorten
from ditbench.files.yamlio import MAX_NODES, load_yaml_file
from ditbench.hardware.cards import check_gib, find_card

DEEP_MAP = "".join("  " * i + f"k{i}:\n" for i in range(70)) + "  " * 70 + "v: 1\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdef", "bcdefg", strict=True)
)


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


@pytest.mark.parametrize(
    "name, data, expected",
    [
        ("bomb.yaml", BOMB, f"more than {MAX_NODES:,} values"),
        ("dup.yaml", "name: a\nmatrix: {}\nname: b\n", "duplicate key 'name' (first at line 1)"),
        ("deep.yaml", "[" * 20000 + "]" * 20000, "nested too deeply"),
        (
            "deep_map.yaml",
            "".join("  " * i + f"k{i}:\n" for i in range(70)) + "  " * 70 + "v: 1\n",
            "nested more",
        ),
        ("utf16.yaml", "name: a\n".encode("utf-16"), "UTF-16 or binary"),
        ("latin1.yaml", b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 9)"),
        ("binary.yaml", b"\x00\x01\x02\x03", "UTF-16 or binary"),
        ("recursive.yaml", "a: &x [1, *x]\n", "recursive alias"),
        ("bad.yaml", "a: [1, 2\n", "is not valid YAML"),
        ("listkey.yaml", "? [1, 2]\n: 3\n", "mapping key must be a plain value"),
    ],
)
def test_hostile_yaml_is_one_clear_error(tmp_path, name, data, expected):
    path = _write(tmp_path, name, data)
    with pytest.raises(UserError) as err:
        load_yaml_file(path, "suite")
    message = str(err.value)
    assert expected in message
    assert str(path) in message
    assert len(message) < 2000


def test_a_directory_and_a_missing_file_are_named_as_such(tmp_path):
    with pytest.raises(UserError, match="is a directory"):
        load_yaml_file(tmp_path, "policy")
    with pytest.raises(UserError, match="does not exist"):
        load_yaml_file(tmp_path / "nope.yaml", "policy")


def test_valid_yaml_with_merge_keys_and_a_bom_reads_normally(tmp_path):
    path = _write(tmp_path, "ok.yaml", "\ufeffa: &x {p: 1}\nb:\n  <<: *x\n  q: 2\n")
    assert load_yaml_file(path, "suite") == {"a": {"p": 1}, "b": {"p": 1, "q": 2}}


def test_shorten_bounds_any_value():
    huge = [["x" * 100] * 1000] * 1000  # a repr of 100 MB if built whole
    assert len(shorten(huge)) <= 81
    assert shorten("abc") == "'abc'"
    assert shorten("y" * 500).endswith("… (500 characters)")


def test_cards_resolve_by_name_and_refuse_bad_sizes():
    assert find_card("rtx-4090").usable_gib == 23.99
    assert find_card("NVIDIA GeForce RTX 4090").name == "RTX 4090"
    assert find_card("a100 40gb").usable_gib == 39.39
    with pytest.raises(UserError, match="Did you mean 'RTX 4090'"):
        find_card("RTX 4091")
    for bad in (float("nan"), float("inf"), 0, -1, True, "24"):
        with pytest.raises(UserError, match="finite number of GiB"):
            check_gib(bad, "gpu_memory_gib")
    assert check_gib(22.5, "x") == 22.5
