"""Which process writes files when training spans several processes."""

import json
import os

import keras

__all__ = ["is_chief"]


def is_chief():
    """Whether this process is the one that writes files when training spans several processes.

    JAX over several processes (``keras.distribution.initialize``): process 0.
    TensorFlow with a ``TF_CONFIG`` cluster: the task ``"chief"``, or worker 0
    when the cluster has no chief. Any other run: ``True``.

    Example:
        >>> is_chief()   # one process, no cluster
        True
    """
    if keras.backend.backend() == "jax":
        import jax

        if jax.process_count() > 1:
            return jax.process_index() == 0
    config = os.environ.get("TF_CONFIG")
    if config:
        try:
            config = json.loads(config)
            cluster, task = config.get("cluster", {}), config.get("task", {})
        except (ValueError, AttributeError):
            return True  # not a cluster description TensorFlow would accept either
        if "chief" in cluster:
            return task.get("type") == "chief"
        return task.get("type") in (None, "worker") and int(task.get("index", 0)) == 0
    return True
