"""The quality loop: sample-quality metrics for trained cells (`evaluation`, and `loop`, a cell's phase)."""
