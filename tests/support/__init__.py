"""Helpers of the tests: real processes, fault injection, the in-memory model and the handlers
the test workers load (``tests.support.handlers``)."""
