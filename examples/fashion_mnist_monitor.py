"""Watch a network thin out while it trains: SparsityMonitor on Fashion-MNIST, with TensorBoard.

784-400-300-100-10 with the sparse group Lasso (added to a plain model by
``add_group_sparsity``). Every epoch the monitor adds ``sparsity``,
``selected_features`` and ``live_neurons`` to the Keras logs and writes them,
per-layer group-norm histograms and the selected-pixels image to TensorBoard:

    python examples/fashion_mnist_monitor.py            # 10 epochs on all 60,000 images
    python examples/fashion_mnist_monitor.py --quick    # 2 epochs on 3,000 images
    tensorboard --logdir logs/fashion_sgl

Needs the Fashion-MNIST files (Debian package ``dataset-fashion-mnist``, or see
``keras_group_lasso.datasets.load_dataset``) and TensorFlow for the event files.
"""

import argparse

import keras

from keras_group_lasso import SparsityMonitor, add_group_sparsity
from keras_group_lasso.datasets import load_dataset


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 epochs on 3,000 images")
    parser.add_argument("--log-dir", default="logs/fashion_sgl", help="TensorBoard directory")
    args = parser.parse_args()

    data = load_dataset("fashion-mnist")
    x, y = data.x_train, data.y_train
    epochs = 10
    if args.quick:
        x, y, epochs = x[:3000], y[:3000], 2

    keras.utils.set_random_seed(0)
    plain = keras.Sequential(
        [keras.Input((784,))]
        + [keras.layers.Dense(n, activation="relu") for n in (400, 300, 100)]
        + [keras.layers.Dense(10, activation="softmax")]
    )
    model = add_group_sparsity(plain, 1e-4)  # a copy with input, hidden and bias groups (SGL)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])

    monitor = SparsityMonitor(threshold=1e-3, log_dir=args.log_dir)
    history = model.fit(x, y, epochs=epochs, batch_size=400, validation_data=(data.x_test, data.y_test),
                        callbacks=[monitor], verbose=2)
    for epoch, (s, f, n) in enumerate(zip(history.history["sparsity"], history.history["selected_features"],
                                          history.history["live_neurons"]), start=1):
        print(f"epoch {epoch}: sparsity {100 * s:.1f}%, selected features {int(f)}, live neurons {int(n)}")
    print(monitor.last_report)
    print(f"TensorBoard: tensorboard --logdir {args.log_dir}")


if __name__ == "__main__":
    main()
