"""The local SQLite store and the deployment records (instances, ranks, events) kept in it.
Bench and eval runs keep their own tables through the same store (``bench.store``, ``evals.store``)."""
