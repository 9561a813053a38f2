"""What runs inside one cell's process: the core every launcher calls (`core`), the measured window,
its meters (memory, allocator, load, GPU), MFU and the `threads` knob. Imports nothing else of bench/."""
