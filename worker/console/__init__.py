"""The web console and its JSON API: ``inturn console`` (see :mod:`.app`).

Layer: front end. It authenticates, formats and calls ``operations`` for every action (one
rule per action, whoever calls); it reads through the store's functions. Nothing below it
imports it.
"""
