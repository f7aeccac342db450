"""The Destination API: the schema that generates the CRD and its CEL rules
(:mod:`.schema`, :mod:`.openapi`), the parsed spec (:mod:`.destination`) and the worker's
configuration (:mod:`.config`). Pure: no I/O library.
"""
