"""What every part of ditbench uses: its errors, units, plain-text helpers, progress and faults."""
