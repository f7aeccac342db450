"""The worker process: one drain loop per destination (:mod:`.runner`), its entry point
(:mod:`.main`), probes and metrics, and the pure retry and backoff decisions it follows.
"""
