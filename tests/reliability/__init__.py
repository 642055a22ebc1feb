"""The reliability proof (issue 23): hostile requests never break the receiver, and planted secrets
never reach a stored bundle, a report or an API answer. ``bench/reliability.py`` runs the long form."""
