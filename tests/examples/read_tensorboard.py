#!/usr/bin/env python3
"""Prints every scalar of the TensorBoard event files in DIR as JSON {tag: [[step, value], ...]}, read by
TensorBoard's own EventAccumulator (the oracle for train/tensorboard.h).

    read_tensorboard.py DIR
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

accumulator = EventAccumulator(sys.argv[1])
accumulator.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in accumulator.Scalars(tag)]
                  for tag in accumulator.Tags()["scalars"]}))
