"""The Postgres store: migrations, the delivery queue, the destination registry, the audit trail."""
