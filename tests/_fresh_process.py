"""Whether pruned models load and compute in a Python process where this package cannot be imported."""

import subprocess
import sys
import textwrap

import keras
import numpy as np


def assert_loads_without_this_package(models, tmp_path):
    """``models``: ``{name: (model, x)}``, ``x`` an array or a dict of arrays (named inputs). Each model is saved as
    ``.keras`` with its first output on ``x``; a fresh process, where importing ``keras_group_lasso`` fails, loads
    each and gives the same output (to 1e-5)."""
    for name, (model, x) in models.items():
        model.save(tmp_path / f"{name}.keras")
        np.savez(tmp_path / f"{name}_x.npz", **(x if isinstance(x, dict) else {"": x}))
        np.save(tmp_path / f"{name}.npy", keras.ops.convert_to_numpy(keras.tree.flatten(model(x))[0]))
    script = textwrap.dedent(f"""
        import sys
        sys.modules["keras_group_lasso"] = None  # importing this package fails
        import keras, numpy as np
        for name in {sorted(models)!r}:
            saved = dict(np.load({str(tmp_path)!r} + f"/{{name}}_x.npz"))
            x = saved[""] if list(saved) == [""] else saved
            model = keras.saving.load_model({str(tmp_path)!r} + f"/{{name}}.keras")
            got = keras.ops.convert_to_numpy(keras.tree.flatten(model(x, training=False))[0])
            np.testing.assert_allclose(got, np.load({str(tmp_path)!r} + f"/{{name}}.npy"), rtol=0, atol=1e-5)
        print("loaded")
    """)
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "loaded" in result.stdout
