"""How long a learner's first call takes to trace, with and without autograph.

The learner compiles its step loop with autograph but calls the feed and
`agent.train` unconverted (`learners.loop`): none of TF-Agents' or this
toolkit's train code branches in Python on a tensor, and converting it was
most of a short run's start-up. This measures, per agent, the trace of
`tf.function(agent.train)` for a [64, 2] HalfCheetah batch both ways (a fresh
agent each, order alternated; a first trace warms TensorFlow up) and checks
that the two graphs hold the same ops, so the step itself is unchanged.
The reference is the autograph trace of the same agent, same run.

Prints one JSON line.

  taskset -c 0 python bench/trace_time.py [--agents td3_bc,cql_sac,...]
"""

import argparse
import collections
import json
import os
import platform
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf

from rlds_reverb.acting import envs
from rlds_reverb.learners import agents
# pylint: enable=g-import-not-at-top,wrong-import-position


def op_counts(graph: tf.Graph) -> collections.Counter:
  """Op types of `graph` and of the functions it calls (loop bodies, conds)."""
  counts = collections.Counter(op.type for op in graph.get_operations())
  for function in graph._functions.values():  # pylint: disable=protected-access
    counts.update(node.op for node in function.definition.node_def)
  return counts


def cpu_model() -> str:
  try:
    with open('/proc/cpuinfo') as cpuinfo:
      for line in cpuinfo:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def trace(kind: str, specs, autograph: bool) -> tuple[float, collections.Counter]:
  agent = agents.make_agent(kind, specs.time_step_spec, specs.action_spec,
                            agents.AgentConfig(cql_bc_steps=0, seed=0))
  batch = tf.nest.map_structure(
      lambda spec: tf.TensorSpec([64, 2] + spec.shape, spec.dtype),
      agent.training_data_spec)
  start = time.perf_counter()
  graph = tf.function(agent.train, autograph=autograph).get_concrete_function(
      batch).graph
  return time.perf_counter() - start, op_counts(graph)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--agents', default='td3_bc,cql_sac,iql,rebrac,edac',
                      help='Comma-separated offline agents (pipelines.train '
                      '--agent names).')
  args = parser.parse_args()
  specs = envs.env_specs('HalfCheetah-v5')
  trace('bc', specs, autograph=True)  # Warm-up: TF's own first-use costs.
  rows = {}
  for i, kind in enumerate(args.agents.split(',')):
    order = (True, False) if i % 2 == 0 else (False, True)
    seen = {autograph: trace(kind, specs, autograph) for autograph in order}
    (with_s, with_ops), (without_s, without_ops) = seen[True], seen[False]
    rows[kind] = {'trace_s_autograph': round(with_s, 2),
                  'trace_s_without': round(without_s, 2),
                  'vs_autograph': round(without_s / with_s, 2),
                  'ops': sum(without_ops.values()),
                  'same_ops': with_ops == without_ops}
  print(json.dumps({'bench': 'trace_time', 'agents': rows,
                    'machine': cpu_model(),
                    'cpus': len(os.sched_getaffinity(0)),
                    'tensorflow': tf.__version__}))


if __name__ == '__main__':
  main()
