"""Scheduling: profile handler → filters → weighted scorers → picker."""
