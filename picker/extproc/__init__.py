"""picker.extproc."""
