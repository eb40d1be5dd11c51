"""Running Stepwise and watching it run: how this process is deployed (`deployment`, read by
the settings before Django starts), the broker transports and the cache backend the settings
name (`broker`, `redis_cache`), log lines and what they carry (`logs`, `logcontext`), traces
(`tracing`), metrics (`metrics`), health checks (`health`), queue depths (`queues`) and what
the operations page shows (`overview`).

The engine and the web use it to log, trace and count. It may import the models, the engine's
vocabulary and permission rules (`states`, `clock`, `errors`, `authz`) and the Celery app
(`health` asks the workers); never a service, an executor or `web/`.
"""
