"""picker.discovery."""
