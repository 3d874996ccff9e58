"""picker.admission."""
