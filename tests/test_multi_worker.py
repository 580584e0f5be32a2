"""tf.distribute.MultiWorkerMirroredStrategy: two TensorFlow workers on localhost give one worker's result.

Keras 3's ``fit`` fails under MultiWorkerMirroredStrategy by itself, for any
model ("Attempt to convert a value (PerReplica...)", keras-team/keras#20585),
so the workers train with the custom loop TensorFlow documents for this
strategy: ``strategy.run`` of a step that takes the gradient of the data loss
plus ``sum(model.losses)`` and calls the optimizer, here ``Proximal``. A
``SparsityMonitor`` driven through ``keras.callbacks.CallbackList`` writes
TensorBoard from the chief only, and ``export_pruned`` is called on every
worker, each with a directory of its own, and only the chief's is written.
"""

import os
import textwrap

import _cluster
import _turns

# The workers are TensorFlow processes of their own, whichever backend runs this file.
pytestmark = _turns.own_processes("TensorFlow processes of their own")

WORKER = textwrap.dedent(
    """
    import json, os, sys
    index, count, ports, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
    if count > 1:
        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                              "task": {"type": "worker", "index": index}})
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import numpy as np
    import tensorflow as tf
    import keras
    from keras_group_lasso import Proximal, SparsityMonitor, add_group_sparsity, export_pruned, is_chief

    strategy = tf.distribute.MultiWorkerMirroredStrategy() if count > 1 else tf.distribute.get_strategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    GLOBAL = 32
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = add_group_sparsity(keras.Sequential([
            keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(2, activation="softmax")]), 0.005)
        optimizer = Proximal(keras.optimizers.SGD(0.1, momentum=0.9))
        optimizer.build(model.trainable_variables)
    data_loss = keras.losses.SparseCategoricalCrossentropy(reduction="sum")

    @tf.function
    def train_step(xb, yb):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                # Each replica's share: its rows of the global mean, and 1/replicas of the penalties.
                loss = data_loss(yb, model(xb, training=True)) / GLOBAL
                loss += tf.add_n(model.losses) / strategy.num_replicas_in_sync
            optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        strategy.run(replica_step, args=(xb, yb))

    monitor = SparsityMonitor(log_dir=os.path.join(out, "logs"))
    callbacks = keras.callbacks.CallbackList([monitor], model=model)
    callbacks.on_train_begin()
    local = GLOBAL // count
    for epoch in range(4):
        for start in range(0, len(x), GLOBAL):
            rows = slice(start + index * local, start + (index + 1) * local)  # this worker's part of the batch
            train_step(tf.constant(x[rows]), tf.constant(y[rows]))
        callbacks.on_epoch_end(epoch, {})
        assert monitor.last_report is not None
    callbacks.on_train_end()
    np.savez(os.path.join(out, f"weights{index}.npz"), *[np.asarray(w) for w in model.get_weights()])
    # Every worker prunes, each asking for its own directory: only the chief's may exist afterwards (in
    # one shared directory a second writer would go unnoticed).
    result = export_pruned(model, os.path.join(out, f"export{index}"), formats=["keras"])
    with open(os.path.join(out, f"manifest{index}.json"), "w") as f:
        json.dump(result.manifest, f)
    assert is_chief() == (index == 0)
    print("OK", index)
    """
)


def test_two_tensorflow_workers_train_to_the_single_worker_weights_and_only_the_chief_writes(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    single, cluster = _cluster.run_single_and_cluster(script, tmp_path, env, ports_per_cluster=2)
    _cluster.assert_cluster_matches_single(single, cluster, export_per_process=True)
