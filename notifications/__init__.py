"""Notifications: telling people something happened, by e-mail and an outgoing webhook.

One service for every feature that needs it (approvals today; alerts and budget warnings reuse
it): `notification_send` records what to say to whom, and a worker delivers it after the
transaction that decided it commits (docs/approvals.md#notifications).
"""
