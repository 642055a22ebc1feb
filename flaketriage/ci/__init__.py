"""What runs inside the user's CI job or training process: capture, redaction, probes.

Light: imports only the core.
"""
