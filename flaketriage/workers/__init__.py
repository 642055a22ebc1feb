"""Replay, verdict, minimization and reporting: the work done on GPU/CPU runners."""
