"""Memory sizes as a person reads them (ditbench.core.units)."""

from ditbench.core.units import memory_text


def test_below_one_gib_reads_in_mib_with_the_digits_that_matter():
    assert memory_text(12.4213) == "12.42 GiB"
    assert memory_text(1.0) == "1.00 GiB"
    assert memory_text(0.5) == "512 MiB"
    assert memory_text(0.0098) == "10.0 MiB"
    assert memory_text(0.0079) == "8.09 MiB"
    assert memory_text(0.0) == "0.00 MiB"
    assert memory_text(None) == "-" and memory_text(None, "n/a") == "n/a"


def test_a_cpu_cells_line_and_summary_name_the_allocator_peak_in_mib():
    from synthetic_records import CPU_ENV, make_record

    from ditbench.bench.summary import format_line, summary_table

    r = make_record("DiT-S/8", "fp32", "none", 8, env=CPU_ENV, device="cpu")
    r["metrics"].update(cpu_peak_rss_gib=0.69, cpu_peak_alloc_gib=0.0079, predicted_peak_gib=0.0078)
    assert "8.09 MiB CPU allocator peak (predicted 7.99 MiB)" in format_line(r)
    assert "| 8.09 MiB CPU allocator peak (predicted 7.99 MiB) |" in summary_table([r])
    r["metrics"].update(cpu_peak_alloc_gib=None, predicted_peak_gib=None)  # an older record: RSS, named
    assert "707 MiB CPU peak RSS" in format_line(r)


def test_raw_byte_counts_in_a_message_read_in_gib():
    from ditbench.core.units import bytes_as_gib

    cpu = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 60129542144 bytes. Error code 12"
    assert bytes_as_gib(cpu) == (
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 56.00 GiB. Error code 12"
    )
    assert bytes_as_gib("1048576 bytes, 512 bytes, 2.00 GiB") == "1.00 MiB, 512 bytes, 2.00 GiB"


def test_an_out_of_memory_is_one_paragraph_in_gib(monkeypatch, capsys):
    """`ditbench train` (or sample, fid) out of memory: no traceback, no byte counts, what to change."""
    from ditbench.cli import main
    from ditbench.cli import train as train_cli

    def oom(args):
        raise RuntimeError(
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 60129542144 bytes."
        )

    monkeypatch.setattr(train_cli, "run", oom)
    assert main(["train", "--device", "cpu"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("ditbench: error: out of memory: DefaultCPUAllocator") and "56.00 GiB" in err
    assert "bytes" not in err and "--batch-size" in err and "ditbench plan" in err
