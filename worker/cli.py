"""The ``inturn`` command line (click)."""

import click


@click.group()
def main() -> None:
    """inturn: durable, in-order, per-destination HL7 v2 delivery queues."""
