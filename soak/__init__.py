"""The soak: a mixed workload on a private PostgreSQL + Redis while faults are injected at random,
then every invariant checked (docs/failure-semantics.md, "The soak").

`manage.py stepwise_soak --minutes N --seed S` (or `make soak`) runs it. It never touches a
shared server: it starts its own PostgreSQL cluster (initdb in a temporary directory, on a free
port) and its own redis-server, so it may kill and restart them at will.

- cluster.py — the private servers and the Stepwise processes (workers, beats, web);
- proxy.py — the TCP proxy between the workers and the database (latency, resets, partitions);
- sink.py — the local HTTP remote that counts effects per idempotency key and checks fencing tokens;
- workload.py — the workflows, the runs and their expected outcomes, the simulated reviewer;
- invariants.py — the checks at the end (pure over what was collected);
- driver.py — the faults (each returns whether it really happened) and the loop that ties
  everything together and reports the totals.
"""
