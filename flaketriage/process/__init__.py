"""Processes: running a child command and ending all it started, interrupts, hangs, git, the
machine's GPUs, and the environment a replay runs under."""
