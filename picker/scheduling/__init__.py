"""Scheduling: profile handler → filters → weighted scorers → picker."""

from picker.scheduling.config import SchedulerConfig, load_config, load_config_file
from picker.scheduling.scheduler import Scheduler

__all__ = ["Scheduler", "SchedulerConfig", "load_config", "load_config_file"]
