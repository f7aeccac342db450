"""Pure HL7 v2 and MLLP protocol code: bytes in, events out, no I/O (modelled on h11)."""
