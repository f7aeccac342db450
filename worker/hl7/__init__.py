"""Pure HL7 v2 and MLLP protocol code: bytes in, events out, no I/O (modelled on h11).

Layer: the bottom core. It may use only ``errors`` and ``text``; every layer may use it.
"""
