"""flaketriage: capture failing CI tests and training runs, replay them, minimize and report them."""

__version__ = "0.1.0"
