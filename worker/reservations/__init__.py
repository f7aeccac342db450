"""Reservation records (bookings and their segments) and the work a partner's answer, or its
silence, or a passing deadline, puts on a worklist.

Layer: feature package (a rule pack, independent of the other packs). It may use worklists,
the store, the Destination API and hl7; its SQL runs from ``store/bookings.py`` and
``store/reservation_rules.py``.
"""
