"""Runnable examples; a package only so that tests can import the apps (and mypy name them once)."""
