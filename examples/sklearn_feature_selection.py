"""Feature selection the scikit-learn way: a group-sparse MLP in a Pipeline, then the regularization path.

1. ``make_pipeline(MinMaxScaler(), GroupSparseMLPClassifier(...))`` on DIGITS:
   accuracy, the selected pixels (``get_support``), ``transform``, and the
   physically smaller Keras model (``pruned_model_``).
2. ``clf.path(...)``: warm-started fits from a dense network to no pixel at
   all; the best point with at most 30 pixels, scored on the test set, and
   the pixels that survive the strongest penalty (``feature_importances_``).

    python examples/sklearn_feature_selection.py            # about a minute on 2 CPU cores
    python examples/sklearn_feature_selection.py --quick    # a smoke run
    python examples/sklearn_feature_selection.py --plot path.png   # also save score vs. features
"""

import argparse

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler

from keras_group_lasso.sklearn import GroupSparseMLPClassifier


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short training, coarse path")
    parser.add_argument("--plot", metavar="PNG", help="save the path's score vs. number of features here")
    args = parser.parse_args(argv)
    epochs = 30 if args.quick else 200

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)

    # 1. A selector and a classifier in one estimator.
    clf = GroupSparseMLPClassifier(hidden_layer_sizes=(40, 20), alpha=1e-3, penalty="sgl", epochs=epochs, random_state=0)
    pipe = make_pipeline(MinMaxScaler(), clf).fit(x_train, y_train)
    print(f"pipeline test accuracy: {pipe.score(x_test, y_test):.3f}")
    print(f"selected pixels: {clf.get_support().sum()} of {clf.n_features_in_}")
    print("selected mask (8x8, # = kept):")
    for row in clf.get_support().reshape(8, 8):
        print("  " + "".join("#" if kept else "." for kept in row))
    scaled_test = pipe[:-1].transform(x_test)
    print(f"transform: {scaled_test.shape} -> {clf.transform(scaled_test).shape}")
    small = clf.pruned_model_
    print(f"pruned model: {small.count_params()} parameters instead of {clf.model_.count_params()}, "
          f"layer sizes {clf.sparsity_report_.layer_sizes}")
    gap = np.abs(np.asarray(small.predict(scaled_test, verbose=0)) - clf.predict_proba(scaled_test)).max()
    print(f"pruned model vs. estimator: max |difference| of probabilities {gap:.1e}")

    # 2. The regularization path (on the scaled training data; it holds out 20 % to score the points).
    scaler = MinMaxScaler().fit(x_train)
    searcher = GroupSparseMLPClassifier(hidden_layer_sizes=(40, 20), alpha=1e-4, epochs=epochs,
                                        validation_fraction=0.2, random_state=0)
    path = searcher.path(scaler.transform(x_train), y_train, path_multiplier=1.5 if args.quick else 1.2)
    print(f"path: {len(path)} points from {path[0].n_features} to {path[-1].n_features} pixels "
          f"in {path.elapsed_s:.1f} s")
    for budget in (50, 30, 20, 10):
        if budget < path.n_selected.min():
            continue
        point = path.best(max_features=budget)
        test = path.estimator(point).score(scaler.transform(x_test), y_test)
        print(f"  <= {budget:2d} pixels: {point.n_features:2d} used, validation {point.score:.3f}, test {test:.3f}")
    order = np.argsort(-path.feature_importances_, kind="stable")
    print(f"the 10 pixels that stay longest: {order[:10].tolist()}")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        ax = path.plot()
        ax.figure.savefig(args.plot, dpi=120)
        print(f"saved {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
