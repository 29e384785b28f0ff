"""One module per experiment kind. Each exposes a frozen Spec dataclass (one sweep point)
and `run(spec) -> Result`, a pure function of the spec plus the device."""
