"""Reservation records (bookings and their segments) and the work a partner's answer, or its
silence, or a passing deadline, puts on a worklist."""
