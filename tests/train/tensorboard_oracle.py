#!/usr/bin/env python3
"""TensorBoard's own reader on bottle's event files (tests/train/test_train.cpp).

    .venv/bin/python tests/train/tensorboard_oracle.py DIR

Loads DIR as TensorBoard does (EventAccumulator, orphaned data purged as the TensorBoard
server does) and prints one JSON object: {"tag": [[step, value], ...], ...} for every scalar
tag, each in step order. Runs with the Python of .venv (scripts/setup.sh pins tensorboard).
"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    if len(sys.argv) != 2:
        print("usage: tensorboard_oracle.py DIR", file=sys.stderr)
        sys.exit(2)
    accumulator = event_accumulator.EventAccumulator(sys.argv[1], purge_orphaned_data=True)
    accumulator.Reload()
    scalars = {
        tag: [[e.step, e.value] for e in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }
    print(json.dumps(scalars))


if __name__ == "__main__":
    main()
