"""The measuring machinery every experiment uses: timers and statistics, devices and memory
probes, the clock, NVTX ranges, the precision-to-dtype map, provenance, significance tests,
the correctness check against a reference, what every Triton kernel module shares, and how
every package gives its names on first use (lazy.py). Modules here import torch only inside
functions, and no other cs336sys package."""
