"""keras.distribution on JAX: data and model parallel training give the single-device result.

JAX fixes its device count when it starts, so each check runs in a subprocess
with two CPU devices (``--xla_force_host_platform_device_count=2``). Matching
weights is the claim; the step time over fake devices of one CPU is not a
performance figure.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import _cluster
import _turns

# keras.distribution is JAX-only in Keras 3, and JAX fixes its device count when it starts: each check is a JAX
# process of its own, whichever backend runs this file.
pytest.importorskip("jax")
pytestmark = _turns.own_processes("JAX processes of their own")


def _jax_env():
    """This process's environment for a JAX subprocess, with the flags the suite compiles JAX with (scripts/test.sh
    exports them as TEST_JAX_XLA_FLAGS; the caller's XLA_FLAGS otherwise)."""
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    env["XLA_FLAGS"] = os.environ.get("TEST_JAX_XLA_FLAGS", env.get("XLA_FLAGS", ""))
    return env


SCRIPT = textwrap.dedent(
    """
    import os
    # Two CPU devices; the compile flags the suite runs JAX with (scripts/test.sh), if any, are kept.
    os.environ["XLA_FLAGS"] = " ".join(os.environ.get("XLA_FLAGS", "").split()
                                       + ["--xla_force_host_platform_device_count=2"])
    os.environ["KERAS_BACKEND"] = "jax"
    import keras
    import numpy as np
    from keras_group_lasso import Proximal, SparsityBudget, add_group_sparsity, sparsity_report

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    devices = keras.distribution.list_devices("cpu")
    assert len(devices) == 2, devices


    def train(distribution, optimizer, factor=0.005, callbacks=()):
        keras.distribution.set_distribution(distribution)
        try:
            keras.utils.set_random_seed(0)
            model = add_group_sparsity(keras.Sequential([
                keras.Input((16,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                keras.layers.Dense(2, activation="softmax", name="out")]), factor)
            model.compile(optimizer(), "sparse_categorical_crossentropy")
            history = model.fit(x, y, epochs=4, batch_size=32, shuffle=False, verbose=0, callbacks=list(callbacks))
            weights = [np.asarray(keras.ops.convert_to_numpy(w)) for w in model.get_weights()]
            return model, weights, history.history
        finally:
            keras.distribution.set_distribution(None)


    def same(reference, other, what):
        gap = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, other))
        assert gap <= 1e-5, (what, gap)
        assert all(np.array_equal(a == 0, b == 0) for a, b in zip(reference, other)), what  # the same exact zeros


    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout[".*hidden/kernel"] = (None, "model")  # each group (a kernel row) split over the two devices
    layout[".*out/kernel"] = ("model", None)  # the groups themselves split
    parallel = {
        "DataParallel": lambda: keras.distribution.DataParallel(devices=devices),
        "ModelParallel": lambda: keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch"),
    }
    optimizers = {
        "Proximal(SGD)": lambda: Proximal(keras.optimizers.SGD(0.1, momentum=0.9)),
        "Adam": lambda: keras.optimizers.Adam(0.01),
    }
    for opt_name, optimizer in optimizers.items():
        _, single, _ = train(None, optimizer)
        for name, distribution in parallel.items():
            model, weights, _ = train(distribution(), optimizer)
            if name == "ModelParallel":
                assert "model" in str(model.layers[0].kernel.value.sharding.spec)
            same(single, weights, (opt_name, name))
        if opt_name.startswith("Proximal"):  # the check covers exact zeros, and live weights
            assert 0 < sum(int((w == 0).sum()) for w in single) < sum(w.size for w in single)

    # A budget (its multiplier and the cut's constraints, traced again mid-fit) under DataParallel.
    def budgeted(distribution):
        return train(distribution, lambda: keras.optimizers.Adam(0.01), 1e-6,
                     [SparsityBudget(max_features=5, settle=0.5)])

    one, one_weights, one_history = budgeted(None)
    dp, dp_weights, dp_history = budgeted(parallel["DataParallel"]())
    assert dp_history["budget_cut"] == one_history["budget_cut"] and one_history["budget_cut"][1] > 0
    assert sparsity_report(dp, 1e-3).n_selected_features == 5
    same(one_weights, dp_weights, "budget")
    print("OK")
    """
)


# A KerasHub Backbone sharded by its own layout map (GemmaBackbone.get_layout_map: embeddings, q/k/v/o and the
# gated feed-forward kernels split over the "model" axis), its CausalLM penalised, trained with Proximal and a
# FLOP budget: the weights, exact zeros, cuts and report of one device, and surgery exact.
SHARDED_GEMMA = textwrap.dedent(
    """
    import os
    os.environ["XLA_FLAGS"] = " ".join(os.environ.get("XLA_FLAGS", "").split()
                                       + ["--xla_force_host_platform_device_count=2"])
    os.environ["KERAS_BACKEND"] = "jax"
    import keras
    import keras_hub
    import numpy as np
    from keras_group_lasso import (Proximal, SparsityBudget, add_group_sparsity, apply_threshold, prune_model,
                                   sparsity_report)

    devices = keras.distribution.list_devices("cpu")
    assert len(devices) == 2, devices
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices)
    layout = keras_hub.models.GemmaBackbone.get_layout_map(mesh)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 64, size=(48, 17)).astype("int32")
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((48, 16), "int32")}
    y = tokens[:, 1:]


    def train(distribution):
        keras.distribution.set_distribution(distribution)
        try:
            keras.utils.set_random_seed(0)
            backbone = keras_hub.models.GemmaBackbone(vocabulary_size=64, num_layers=2, num_query_heads=4,
                                                      num_key_value_heads=2, hidden_dim=16, intermediate_dim=64,
                                                      head_dim=8)
            lm = add_group_sparsity(keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None), 1e-3)
            lm.compile(Proximal(keras.optimizers.Adam(0.01)),
                       keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            history = lm.fit(x, y, epochs=4, batch_size=16, shuffle=False, verbose=0,
                             callbacks=[SparsityBudget(max_flops=0.5)])
            weights = [np.asarray(keras.ops.convert_to_numpy(w)) for w in lm.get_weights()]
            return lm, weights, history.history["budget_cut"], sparsity_report(lm)
        finally:
            keras.distribution.set_distribution(None)


    one, one_weights, one_cuts, one_report = train(None)
    lm, weights, cuts, report = train(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch"))
    query = next(w for w in lm.weights if w.path.endswith("decoder_block_0/attention/query/kernel"))
    assert tuple(query.value.sharding.spec) == ("model", "batch", None), query.value.sharding
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(one_weights, weights))
    assert gap <= 1e-5, gap
    assert all(np.array_equal(a == 0, b == 0) for a, b in zip(one_weights, weights))
    assert cuts == one_cuts and sum(cuts) > 0, (cuts, one_cuts)
    assert report.flops_after == one_report.flops_after <= 0.5 * report.flops_before
    assert report.layer_sizes == one_report.layer_sizes and report.live_neurons == one_report.live_neurons
    small = prune_model(lm)
    apply_threshold(lm)
    outputs = keras.ops.convert_to_numpy(lm.predict(x, verbose=0))
    assert np.max(np.abs(keras.ops.convert_to_numpy(small.predict(x, verbose=0)) - outputs)) <= 1e-5
    print("OK")
    """
)


# One process of a JAX cluster on localhost (keras.distribution.initialize, gloo collectives on CPU), or the
# single-process reference with the same global batches. Each process feeds its half of every global batch
# (auto-sharding needs a tf.data pipeline), trains with Proximal and a SparsityMonitor writing TensorBoard,
# and exports the pruned model where is_chief().
PROCESS = textwrap.dedent(
    """
    import json, os, sys
    os.environ["KERAS_BACKEND"] = "jax"
    process, count, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    import jax
    import keras
    if count > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        keras.distribution.initialize(job_addresses=f"localhost:{port}", num_processes=count, process_id=process)
    import numpy as np
    from keras_group_lasso import Proximal, SparsityMonitor, add_group_sparsity, export_pruned, is_chief

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    local = 32 // count
    rows = np.concatenate([np.arange(start, start + 32)[process * local:(process + 1) * local]
                           for start in range(0, 256, 32)])
    if count > 1:
        distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices("cpu"))
        distribution.auto_shard_dataset = False
        keras.distribution.set_distribution(distribution)
    keras.utils.set_random_seed(0)
    model = add_group_sparsity(keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(2, activation="softmax")]), 0.005)
    model.compile(Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), "sparse_categorical_crossentropy")
    history = model.fit(x[rows], y[rows], epochs=4, batch_size=local, shuffle=False, verbose=0,
                        callbacks=[SparsityMonitor(log_dir=os.path.join(out, "logs"))])
    assert len(history.history["sparsity"]) == 4
    np.savez(os.path.join(out, f"weights{process}.npz"), *[np.asarray(w) for w in model.get_weights()])
    result = export_pruned(model, os.path.join(out, "export"), formats=["keras"])  # every process prunes
    with open(os.path.join(out, f"manifest{process}.json"), "w") as f:
        json.dump(result.manifest, f)
    if count > 1:  # the others wait for the chief's files (JAX's shutdown barrier has a deadline)
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("exported")
    assert is_chief() == (process == 0)
    print("OK", process)
    """
)


def test_two_jax_processes_train_to_the_single_process_weights_and_only_the_chief_writes(tmp_path):
    script = tmp_path / "process.py"
    script.write_text(PROCESS)
    env = _jax_env()
    # One device per process, compiled with the flags the suite runs JAX with (scripts/test.sh).
    env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split() if "device_count" not in flag)
    single, cluster = _cluster.run_single_and_cluster(script, tmp_path, env)
    _cluster.assert_cluster_matches_single(single, cluster)


def test_data_and_model_parallel_training_match_one_device(tmp_path):
    script = tmp_path / "distributed.py"
    script.write_text(SCRIPT)
    env = _jax_env()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


def test_a_keras_hub_backbone_sharded_by_its_own_layout_map_trains_to_the_one_device_result(tmp_path):
    pytest.importorskip("keras_hub")
    script = tmp_path / "sharded_gemma.py"
    script.write_text(SHARDED_GEMMA)
    env = _jax_env()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]
