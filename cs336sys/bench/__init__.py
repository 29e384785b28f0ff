"""Measuring machinery shared by all experiments: timing stats, device probes, OOM capture,
sweep expansion and provenance. Modules here import torch only inside functions."""
