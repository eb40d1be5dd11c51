"""The queue-event consumer: its own process (`manage.py stepwise_consume`), one thread per
enabled queue trigger, reading RabbitMQ (kombu) or a Redis stream.

For every message a thread calls `triggers.services.events.event_receive`, which commits the run
(or the held firing, or the dead letter), and only then acknowledges the message. A consumer
killed between the commit and the ack leaves the message unacknowledged: the broker delivers it
again (RabbitMQ when the connection drops; Redis from the consumer's pending list when it
restarts, or to another consumer after STEPWISE_CONSUMER_CLAIM_IDLE_S), and the message id, the
firing's key, makes the second delivery return the run of the first. Entry points only: no
business logic here.
"""
