"""inturn's worker side: everything but the operator, in layers (import-linter holds them).

From the top down; a layer uses only those below it:

1. front ends: ``cli`` (the command line), ``local``, ``console``, and the long-running
   processes ``drain`` (the worker) and ``ingest``;
2. ``operations``: every action a person or a robot takes, one rule each, and the sweeper's
   rule-pack registry;
3. feature packages, the rule packs: ``reservations``, ``feeds``, ``orders`` (independent of
   each other);
4. ``worklist``: worklists, publishers, the sweep and the delivery rules;
5. ``store``: the only layer that speaks SQL;
6. cores: ``spec`` (the Destination API) and ``senders`` (the only code that talks to
   receivers);
7. ``hl7``: pure protocol code; below it ``errors`` and ``text``, which every layer may use.
"""
