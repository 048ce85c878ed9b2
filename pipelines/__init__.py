"""The command-line tools (python -m pipelines.NAME).

Acting runs small numpy forward passes per env step (a policy's MLP or
CNN on a batch of a few observations) while TensorFlow's learner keeps the
cores busy; OpenBLAS then spends its time waking its own threads, an order
of magnitude on a Nature-CNN step (docs/agents.md#image-observations). So
the tools use one BLAS thread unless the user says otherwise; it must be
set before numpy loads.
"""

import os

os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
