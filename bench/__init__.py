"""Benchmarks: each starts the real server, drives it with real clients over loopback, and prints
a JSON result. Run them as modules from the repository root (see BENCHMARKS.md)."""
