"""picker.scrape."""
