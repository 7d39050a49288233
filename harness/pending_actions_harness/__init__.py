"""What runs around the service, not in it: the benchmark (``bench``), the fault soak
(``soak``), ``pending-actions worker`` as a child process (``supervise``) and a private Redis
Cluster (``embedded_cluster``). A distribution of its own, so the wheel every worker installs
ships the service only; ``pending-actions bench`` and ``soak`` come from here."""
