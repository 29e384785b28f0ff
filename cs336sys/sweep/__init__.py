"""The sweep contract, the same for every experiment kind (docs/architecture.md):

- declaration.py: what an experiment declares about itself once (`Experiment`: its Spec,
  `run`, metrics, tables, report section), from which the store's views, the tables, the
  report and the comparison are derived;
- points.py: list options into points (the cartesian product), point keys, and the
  validators that turn a bad option into a SpecError;
- runner.py: `run_sweep`, the one loop over the points of a sweep, and its executors (here,
  or on every rank of a process group);
- ranks.py: what a distributed experiment's ranks do (serve the points, gather, summarise);
- result.py: the Result of a point, and the guard that turns an exception into one.
"""
