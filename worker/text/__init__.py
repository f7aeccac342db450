"""Text helpers every layer may use: printable rendering of outside text
(:mod:`.display`) and durations (:mod:`.durations`). Pure.
"""
