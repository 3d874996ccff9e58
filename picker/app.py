"""Composition root: wiring, TaskGroup, gRPC servers, graceful stop (``picker serve``)."""
