"""A Destination's ``spec.worker``: its worker pod's resources, node placement and tolerations,
as the API declares them. Pure data, part of :mod:`inturn.worker.spec.schema`.
"""

from __future__ import annotations

from inturn.worker.spec.openapi import DNS_SUBDOMAIN as _DNS_SUBDOMAIN
from inturn.worker.spec.openapi import Schema
from inturn.worker.spec.openapi import integer as _int
from inturn.worker.spec.openapi import obj as _obj
from inturn.worker.spec.openapi import str_map as _str_map
from inturn.worker.spec.openapi import string as _str


def toleration_schema() -> Schema:
    return _obj(
        {
            "key": _str("Taint key.", max_length=317),
            "operator": _str("Exists or Equal.", max_length=16, enum=("Exists", "Equal")),
            "value": _str("Taint value.", max_length=63),
            "effect": _str(
                "Taint effect.",
                max_length=16,
                enum=("NoSchedule", "PreferNoSchedule", "NoExecute"),
            ),
            "tolerationSeconds": _int(
                "How long a NoExecute taint is tolerated.",
                minimum=0,
                maximum=2**31,
                fmt="int64",
            ),
        },
        description="A core/v1 Toleration.",
    )


def quantities_schema(description: str) -> Schema:
    return {
        "type": "object",
        "description": description,
        "maxProperties": 16,
        "additionalProperties": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": (
                r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
                r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
            ),
        },
    }


def worker_schema() -> Schema:
    return _obj(
        {
            "resources": _obj(
                {
                    "requests": quantities_schema(
                        "Minimum resources, e.g. cpu: 10m, memory: 64Mi."
                    ),
                    "limits": quantities_schema("Maximum resources, e.g. memory: 256Mi."),
                },
                description="Compute resources of the worker container (core/v1).",
            ),
            "nodeSelector": _str_map(
                "Node labels the worker pod must be scheduled on.",
                max_properties=32,
                max_value=63,
            ),
            "tolerations": {
                "type": "array",
                "description": "Taints the worker pod tolerates.",
                "maxItems": 32,
                "items": toleration_schema(),
            },
            "affinity": {
                "type": "object",
                "description": "A core/v1 Affinity, passed to the pod as it is.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "priorityClassName": _str(
                "PriorityClass of the worker pod.", max_length=253, pattern=_DNS_SUBDOMAIN
            ),
        },
        description="Scheduling and resources of the worker pod.",
    )
