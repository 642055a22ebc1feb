"""The service: webhook receivers, cases and their history, scheduling, quarantine API."""
