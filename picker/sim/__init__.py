"""picker.sim."""
