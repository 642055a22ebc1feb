"""``python -m flaketriage``."""

from flaketriage.cli import main

main()
