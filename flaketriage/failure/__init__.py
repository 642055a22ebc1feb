"""Failures: how a run failed (fingerprints), read out of its output, its metrics and its test
runner's results."""
