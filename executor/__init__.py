"""Making plans real: partitioning, executor daemons, the dispatcher, supervision, rollback."""
