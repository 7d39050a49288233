"""``pending-actions bench``: run the benchmark harness (``bench/``) and print one table, with
``results.json`` and ``latency.png`` written to ``--out``. Also runnable on its own as
``python -m pending_actions_harness.bench``.

Benchmarks are not tests: the exit status says whether the harness ran, never whether a target
was met (the table and the JSON say that)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--quick", is_flag=True,
              help="Small sizes, to prove the harness works (CI); the figures mean little.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("bench-results"), show_default=True,
              help="Where results.json, latency.png and the workers' logs go.")
@click.option("--skip-rabbitmq", is_flag=True, help="Do not try the RabbitMQ baseline.")
@click.option("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/%2F",
              show_default=True, help="RabbitMQ for the stock dramatiq baseline, if reachable.")
@click.option("--skip-langgraph", is_flag=True,
              help="Do not try the LangGraph-on-Postgres baseline.")
@click.option("--postgres-url", default=None,
              help="PostgreSQL for the LangGraph baseline (default: "
              "$PENDING_ACTIONS_BENCH_POSTGRES, else postgresql://postgres@127.0.0.1:5432/"
              "postgres); the run uses a database of its own on that server.")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="dramatiq worker processes, for ours and for stock dramatiq alike (the "
              "worker-layout rows run 1, 2 and 4 whatever this says).")
@click.option("--threads", type=click.IntRange(min=1), default=8, show_default=True,
              help="Threads per dramatiq worker process, for ours and stock alike.")
@click.option("--fsync", type=click.Choice(["always", "everysec", "no"]), default="always",
              show_default=True,
              help="appendfsync of the private redis-server (always: as docker-compose.yml).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--no-cluster", is_flag=True,
              help="Skip the figures on a private 3-master Redis Cluster.")
def bench(quick: bool, out: Path, skip_rabbitmq: bool, rabbitmq_url: str,
          skip_langgraph: bool, postgres_url: str | None, processes: int, threads: int,
          fsync: str, no_progress: bool, no_cluster: bool) -> None:
    """Measure resolve latency and throughput, staging, memory, scaling (stack depth, sessions,
    worker processes) and idle cost, each beside baselines measured in the same run (raw Redis,
    stock dramatiq on RedisBroker and, when reachable, RabbitMQ; LangGraph's human-in-the-loop
    on Postgres when its packages and a PostgreSQL are there), then where an idle resolve's
    time goes step by step. Starts its own redis-server and worker processes."""
    from pending_actions_harness.bench import langgraph, report, runner

    out.mkdir(parents=True, exist_ok=True)
    options = runner.Options(out=out, quick=quick, skip_rabbitmq=skip_rabbitmq,
                             rabbitmq_url=rabbitmq_url, skip_langgraph=skip_langgraph,
                             postgres_url=postgres_url or langgraph.POSTGRES_URL,
                             processes=processes, threads=threads, fsync=fsync,
                             progress=not no_progress, cluster=not no_cluster)
    run = runner.run(options)
    rows = report.rows(run)
    png = out / "latency.png"
    why_no_plot = report.plot(run, png)
    if why_no_plot:
        click.echo(f"no plot: {why_no_plot}", err=True)
    report.write_json(run, rows, out / "results.json", None if why_no_plot else png.name)
    click.echo(report.table(run, rows))
    click.echo(f"\nwrote {out / 'results.json'}" + ("" if why_no_plot else f" and {png}"))


if __name__ == "__main__":
    bench(prog_name="pending-actions bench")
