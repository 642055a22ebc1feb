"""Capture: run a command or record a failure where it happens, and write its bundle.

Called alike by ``flaketriage capture``, the pytest plugin and the numeric guards."""
