"""picker.telemetry."""
