"""picker.bench."""
