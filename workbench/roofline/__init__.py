"""A measured roofline: this device's ceilings, each engine step's FLOPs and bytes, and real steps placed on it.

``peaks`` measures peak matrix FLOP/s (at the model's dtype) and memory bandwidth on the device itself;
``counts`` counts a step's FLOPs and bytes from a ``ModelSpec`` and the step's batch; ``steps`` times real
prefill and decode steps of the engine and places them under the roof. Torch and pandas only, so it runs from
the source tree on a GPU machine: chapter 4's notebook (`workbench.lab.ch04`) draws it.
"""

from workbench.roofline.counts import SeqWork, StepCount, attended_pairs, count_step, decode_work, prefill_work
from workbench.roofline.peaks import DevicePeaks, measure_peaks
from workbench.roofline.steps import measure_decode_steps, measure_prefill_steps, place_on_roofline

__all__ = ["DevicePeaks", "SeqWork", "StepCount", "attended_pairs", "count_step", "decode_work", "measure_decode_steps",
           "measure_peaks", "measure_prefill_steps", "place_on_roofline", "prefill_work"]
