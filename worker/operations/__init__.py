"""The operations layer: what a person or a robot can do, one rule each, whoever calls.

Front ends (the command line, the console, the sweeper's command) call this layer and only
parse, authenticate and format; the rules of an action (what it needs, what it refuses, what
it returns) live here once. This layer uses the feature packages (worklists, reservations),
the store and the domain cores below it; nothing below imports it.

:mod:`.packs` lists the sweeper's rule packs (``inturn sweep``).
"""
