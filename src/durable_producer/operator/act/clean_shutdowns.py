"""Marking a volume empty when its pod's agent stopped with nothing left (see
decide/clean_shutdown.py for when the record can speak for the volume).

Called for every event of an opted-in pod (handlers.record_clean_shutdown); only a pod that
stopped for good with a clean record costs an API call: a LIST of the pool (the operator has
no ``get`` on PVCs) and one guarded patch. A claim between the two makes the patch fail with
409, and the next read sees the new claim.
"""

from __future__ import annotations

import kopf
from kubernetes.client.exceptions import ApiException

from durable_producer.operator.act.api_access import POOL_USER_AGENT
from durable_producer.operator.act.cluster import cluster
from durable_producer.operator.decide import clean_shutdown, pod_mutation
from durable_producer.operator.decide.kube_objects import Object, name_of

MARK_ATTEMPTS = 3


def record_clean_shutdown(pod: Object, logger: kopf.Logger) -> bool:
    """Mark the volume of a pod whose agent stopped with it empty; whether it was marked."""
    emptied = clean_shutdown.emptied_volume(pod)
    producer = pod_mutation.producer_name(pod)
    namespace = (pod.get("metadata") or {}).get("namespace")
    if emptied is None or not producer or not namespace:
        return False
    api = cluster(POOL_USER_AGENT)
    for _ in range(MARK_ATTEMPTS):
        volume = next(
            (v for v in api.pool_volumes(namespace, producer) if name_of(v) == emptied.volume),
            None,
        )
        if volume is None or not clean_shutdown.needs_marking(volume, emptied.claim_token):
            return False
        try:
            api.patch_volume(namespace, emptied.volume, clean_shutdown.empty_patch(volume))
        except ApiException as error:
            if error.status == 409:
                continue  # changed meanwhile (a claim?): read again
            if error.status == 404:
                return False
            raise
        logger.info(
            "volume %s is empty: the agent of pod %s stopped with nothing left",
            emptied.volume,
            name_of(pod),
        )
        return True
    return False
