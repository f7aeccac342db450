"""The worker process: one drain loop per destination (:mod:`.runner`), its entry point
(:mod:`.main`), probes and metrics, and the pure retry and backoff decisions it follows.

Layer: front end (a long-running process). It may use the feature packages, worklists, the
store, senders, the Destination API and hl7; only front ends import it.
"""
