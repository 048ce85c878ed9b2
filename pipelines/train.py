r"""Trains a TF-Agents agent from Reverb: offline, online or on-policy.

  python -m pipelines.train --agent sac --env HalfCheetah-v5 --steps 300000
  python -m pipelines.train --agent td3_bc --dataset DIR [--online_finetune_steps N]
  python -m pipelines.train --agent bc --reverb_address localhost:8000
  python -m pipelines.train --agent dqn --env CartPole-v1 --replay prioritized
  python -m pipelines.train --agent td3 --env FetchReach-v4 --her future
  python -m pipelines.train --agent ppo --env HalfCheetah-v5
  python -m pipelines.train --agent ppo --env HalfCheetah-v5 \
      --reverb_address localhost:8002 --num_actors 0  # actor processes
  python -m pipelines.train --agent td3_bc --dataset DIR \
      --gin_file configs/td3_bc_d4rl.gin --gin_bindings 'AgentConfig.gamma = 0.98'

The mode follows from the agent and the data: --dataset or --reverb_address
is offline, ppo and a2c are on-policy, the rest online; --num_actors 0
learns from actor processes (docs/distributed.md). Every setting flag
is a field of the mode's config (`rlds_reverb.experiments.configs`), made
from it (`config_flags`; `train_flags` resolves the mode); a flag beats a gin binding of its field, which
beats the agent's own default, which beats the field's. Everything of a run
goes to --root_dir; running the same command again resumes it, and one
whose settings differ from the recorded ones is refused. The last stdout
line is a JSON summary; bad input ends with one line on stderr, exit code 1
(2 for bad flags, 130 for Ctrl-C). docs/training.md says more.
"""

# Before anything imports tensorflow: quiets the C++ start-up logs.
from pipelines import cli  # pylint: disable=g-bad-import-order

import json  # pylint: disable=g-import-not-at-top,wrong-import-order

from absl import app
from absl import flags
import tensorflow as tf

from pipelines import config_flags
from pipelines import train_flags
from rlds_reverb.agents import registry
from rlds_reverb.data import datasets
from rlds_reverb.experiments import offline
from rlds_reverb.experiments import online
from rlds_reverb.experiments import onpolicy
from rlds_reverb.experiments import run


flags.adopt_module_key_flags(train_flags)
PROG = train_flags.PROG


def main(argv: list[str]) -> None:
  cli.quiet_logging()
  mode, config = train_flags.resolve(argv)
  interrupted = (f'interrupted; rerun the same command to resume from '
                 f'{config.root_dir}')
  guard = cli.InterruptGuard(PROG, interrupted)
  try:
    if mode == registry.OFFLINE:
      summary = offline.train_offline(config, on_server_lost=lambda e: (
          cli.exit_now(f'{PROG}: error: {cli.one_line(e)}', 1,
                       fresh_line=True)))
    else:
      train = (onpolicy.train_onpolicy if mode == registry.ONPOLICY
               else online.train_online)
      summary = {'agent': config.agent, 'env': config.env,
                 'seed': config.seed, **train(config)}
  except (datasets.DatasetNotFoundError,
          datasets.DatasetNotAvailableError) as e:
    cli.fail(PROG, e)
  except tf.errors.OpError as e:  # Before training (in it: TrainingError).
    cli.fail(PROG, RuntimeError(f'{config_flags.MODE_WORDS[type(config)]} '
                                'run failed before training: '
                                f'{run.op_error_summary(e)}'))
  except cli.USER_ERRORS as e:
    cli.fail(PROG, e)
  except KeyboardInterrupt:
    guard.handled = True
    cli.fail(PROG, RuntimeError(interrupted), code=130)
  summary['root_dir'] = config.root_dir
  print(json.dumps(summary), flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(PROG))
