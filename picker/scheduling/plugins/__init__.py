"""picker.scheduling.plugins."""
