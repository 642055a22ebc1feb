"""The quarantine as the workers write it: the JSON file, and the service's records."""
