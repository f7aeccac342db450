"""Feeds: channels expected to be busy, and the sweeper's ``feeds`` pack (``feed-silent``).

Declarations (:mod:`.declare`) come from a YAML file given to ``inturn ingest --feeds`` and
``inturn local --feeds`` (the chart's ``ingest.feeds``); ingest records when each feed last
received a message through the pack's ``record`` hook (:mod:`.recorder`, which ingest reaches
through the registry); the sweeper places a silent feed on the ``feeds`` worklist
(:mod:`.rules`).

Layer: feature package (a rule pack, independent of the other packs). It may use worklists,
the store, the Destination API and hl7; its SQL runs from ``store/feeds.py``.
"""
