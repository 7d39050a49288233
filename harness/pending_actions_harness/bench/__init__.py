"""Benchmark harness: ``pending-actions bench`` (or ``python -m pending_actions_harness.bench``).

Every figure is printed beside baselines measured in the same run, on the same redis-server and
with the same worker processes and threads: raw Redis round trips, stock dramatiq (RedisBroker,
and RabbitMQ when reachable) and ours. Benchmarks are not tests: nothing here asserts timing.
"""
