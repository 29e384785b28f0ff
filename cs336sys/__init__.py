"""cs336sys: a lab bench for LLM-systems work.

Measure where a Transformer LM's training step spends time and memory, store every measured
point as a row in SQLite tagged with GPU, commit and settings, and compare runs in reports.

This file is also where the layers are wired together (docs/architecture.md): lower layers
look up what a higher one provides through registries in bench/, and only the package root,
which sits above every layer, fills them. Nothing imported here imports torch.
"""

__version__ = "0.2.0"


def _wire() -> None:
    # The model (models/) runs attention kernels (attention/) by name: importing the
    # attention registry fills bench.registry.ATTENTION.
    import cs336sys.attention.registry  # noqa: F401
    from cs336sys.bench import declaration

    def experiments():
        # The store's views and the report's tables come from each experiment's declaration
        # (experiments/catalog.py), imported when first needed.
        from cs336sys.experiments.catalog import EXPERIMENTS

        return EXPERIMENTS

    declaration.provide(experiments)


_wire()
