"""Reports: stored runs -> tables, plots and comparisons -> HTML and markdown (templates/)."""
