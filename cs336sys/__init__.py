"""cs336sys: a lab bench for LLM-systems work.

Measure where a Transformer LM's training step spends time and memory, store every measured
point as a row in SQLite tagged with GPU, commit and settings, and compare runs in reports.
How the packages depend on each other: docs/architecture.md. Importing this package imports
nothing else.
"""

__version__ = "0.2.0"
