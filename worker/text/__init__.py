"""Text helpers every layer may use: printable rendering of outside text
(:mod:`.display`) and durations (:mod:`.durations`). Pure.

Layer: the bottom, beside ``errors``: every layer may use it; it uses nothing of inturn.
"""
