"""The ``keras-group-lasso`` command line, built on the public API only.

Subcommands:
    demo   train a group-sparse MLP on the bundled DIGITS data and report it
"""

import argparse
import sys


def _add_demo(subparsers):
    p = subparsers.add_parser(
        "demo",
        help="train a sparse-group-Lasso MLP on DIGITS and print what it kept",
        description="Train a 64-40-20-10 MLP with the sparse group Lasso on scikit-learn's "
        "bundled DIGITS data (the paper's first experiment), then print test accuracy, "
        "sparsity, the selected input features and the live neurons.",
    )
    p.add_argument("--epochs", type=int, default=200, help="training epochs (default 200)")
    p.add_argument("--factor", type=float, default=1e-3, help="penalty strength lambda (default 1e-3)")
    p.add_argument("--threshold", type=float, default=1e-3, help="pruning threshold (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.set_defaults(func=_run_demo)


def _run_demo(args):
    from keras_group_lasso import demo

    return demo.run(epochs=args.epochs, factor=args.factor, threshold=args.threshold, seed=args.seed)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-group-lasso",
        description="Group sparse regularization for Keras 3: compact networks and selected features.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_demo(subparsers)
    return parser


def main(argv=None):
    """Entry point of the ``keras-group-lasso`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
