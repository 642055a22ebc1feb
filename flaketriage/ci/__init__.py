"""What runs inside the user's CI job: capture, environment probes, the pytest plugin, quarantine
enforcement, signed notification and its outbox, the Sentry tag.

Light: imports only the core, never torch, the service or the workers.
"""
