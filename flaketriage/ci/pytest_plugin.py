"""The flaketriage pytest plugin (registered under ``pytest11``; off unless enabled)."""
