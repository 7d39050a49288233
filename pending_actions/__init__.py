"""The ``pending-actions`` command line: composes broker, producers and workers."""
