"""Run one training script as a single process and as a cluster of processes on localhost, and compare them.

A script takes ``process count ports out`` (``ports``: comma-separated, one per process) and writes
``weights{process}.npz``, ``manifest{process}.json`` (what ``export_pruned`` returned) and, on the chief,
``logs/`` (TensorBoard) and ``export/`` into ``out``; it prints ``OK`` when it ends well. With
``export_per_process``, each process asks ``export_pruned`` for ``export{process}/`` instead, so that a process
other than the chief that writes is seen: only ``export0/`` may exist.
"""

import glob
import json
import os
import socket
import subprocess
import sys

import numpy as np


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_single_and_cluster(script, tmp_path, env, count=2, ports_per_cluster=1, timeout=300):
    """``(single, cluster)`` directories after the single-process reference and a ``count``-process cluster."""
    single, cluster = tmp_path / "single", tmp_path / "cluster"
    single.mkdir()
    cluster.mkdir()
    ports = ",".join(str(p) for p in free_ports(ports_per_cluster))
    workers = [
        subprocess.Popen([sys.executable, str(script), str(i), str(count), ports, str(cluster)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(count)
    ]
    try:
        reference = subprocess.run([sys.executable, str(script), "0", "1", "0", str(single)], env=env,
                                   capture_output=True, text=True, timeout=timeout)
        outputs = [worker.communicate(timeout=timeout) for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert reference.returncode == 0 and "OK" in reference.stdout, reference.stdout[-2000:] + reference.stderr[-3000:]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0 and "OK" in out, out[-2000:] + err[-3000:]
    return single, cluster


def assert_cluster_matches_single(single, cluster, count=2, atol=1e-5, export_per_process=False):
    """Every process ends with the single process's weights and exact zeros; only the chief wrote files."""
    expected = np.load(single / "weights0.npz")
    for process in range(count):
        got = np.load(cluster / f"weights{process}.npz")
        for key in expected:
            np.testing.assert_allclose(got[key], expected[key], atol=atol)
            np.testing.assert_array_equal(got[key] == 0, expected[key] == 0)  # the same exact zeros
    zeros = sum(int((expected[key] == 0).sum()) for key in expected)
    assert 0 < zeros < sum(expected[key].size for key in expected)  # some exact zeros, not all
    assert len(glob.glob(str(cluster / "logs" / "**" / "events.out.tfevents.*"), recursive=True)) == 1  # the chief's
    export = cluster / ("export0" if export_per_process else "export")
    if export_per_process:
        exports = sorted(p.name for p in cluster.iterdir() if p.name.startswith("export"))
        assert exports == ["export0"], f"only the chief (process 0) may write its export; found {exports}"
    assert sorted(os.listdir(export)) == ["manifest.json", "model.keras"]
    with open(export / "manifest.json") as f:
        written = json.load(f)
    for process in range(count):  # a process that did not write got the chief's result
        with open(cluster / f"manifest{process}.json") as f:
            got = json.load(f)
        # the sizes of the files are known to the process that wrote them
        assert {k: v for k, v in got.items() if k != "file_sizes"} == {
            k: v for k, v in written.items() if k != "file_sizes"}
