r"""Trains a TF-Agents agent from Reverb: offline, online or on-policy.

  python -m pipelines.train --agent sac --env HalfCheetah-v5 --steps 300000
  python -m pipelines.train --agent td3_bc --dataset DIR [--online_finetune_steps N]
  python -m pipelines.train --agent bc --reverb_address localhost:8000
  python -m pipelines.train --agent dqn --env CartPole-v1 --replay prioritized
  python -m pipelines.train --agent td3 --env FetchReach-v4 --her future
  python -m pipelines.train --agent ppo --env HalfCheetah-v5
  python -m pipelines.train --agent td3_bc --dataset DIR \
      --gin_file configs/td3_bc_d4rl.gin --gin_bindings 'AgentConfig.gamma = 0.98'

The mode follows from the agent and the data: --dataset or --reverb_address
is offline, ppo and a2c are on-policy, the rest online. Every setting flag
is a field of the mode's config (`rlds_reverb.experiments.configs`), made
from it (`config_flags`); a flag beats a gin binding of its field, which
beats the agent's own default, which beats the field's. Everything of a run
goes to --root_dir; running the same command again resumes it, and one
whose settings differ from the recorded ones is refused. The last stdout
line is a JSON summary; bad input ends with one line on stderr, exit code 1
(2 for bad flags, 130 for Ctrl-C). docs/training.md says more.
"""

# Before anything imports tensorflow: quiets the C++ start-up logs.
from pipelines import cli  # pylint: disable=g-bad-import-order

import dataclasses  # pylint: disable=g-import-not-at-top,wrong-import-order
import json

from absl import app
from absl import flags
import tensorflow as tf

from pipelines import common_flags
from pipelines import config_flags
from rlds_reverb.acting import envs
from rlds_reverb.agents import registry
from rlds_reverb.agents.onpolicy import ppo
from rlds_reverb.data import datasets
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import offline
from rlds_reverb.experiments import online
from rlds_reverb.experiments import onpolicy
from rlds_reverb.experiments import run

_PROG = 'train'
_AGENT = flags.DEFINE_enum(
    'agent', None, list(registry.AGENTS), 'Agent to train (required); '
    'docs/agents.md lists each with its modes. Offline (--dataset or '
    '--reverb_address): ' + ', '.join(registry.names(registry.OFFLINE)) +
    '; online: ' + ', '.join(registry.names(registry.ONLINE)) +
    '; on-policy: ' + ', '.join(registry.names(registry.ONPOLICY)) + '.')
_PUSH = common_flags.define_push_flags()
flags.adopt_module_key_flags(common_flags)
flags.DEFINE_string(
    'root_dir', None, 'Run directory (checkpoints, TensorBoard, eval.jsonl, '
    'curves, policies, config.json); an existing run there is resumed. '
    'Default: runs/<agent>[_per][_her_<strategy>]_<env or dataset>_seed<seed>.')
_RECONNECT = flags.DEFINE_bool(
    'reconnect', False, 'With --reverb_address: wait for a lost server to '
    'come back, up to --reconnect_timeout_s (300 unless given), instead of '
    'failing within seconds.')
_GIN_FILE = flags.DEFINE_multi_string(
    'gin_file', [], 'Gin file of config bindings (configs/*.gin); repeat for '
    'several, later files win. Bindings name the config dataclasses by '
    'class and field: OfflineConfig.batch_size, AgentConfig.actor_layers, '
    'PerConfig.alpha, IqlConfig.expectile. An unknown one is an error.')
_GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], 'One gin binding, e.g. "AgentConfig.actor_layers = '
    '(64, 64)"; repeat for several. Applied after --gin_file.')
# After the pipeline's own flags: the rest are made from the config fields.
_SETTINGS = config_flags.define()
flags.adopt_module_key_flags(config_flags)
_RECONNECT_S = 300.0


def _usage_error(message: str) -> None:
  cli.fail(_PROG, ValueError(message), code=2)


def _flag_list(names) -> str:
  return ', '.join(f'--{name}' for name in sorted(names))


def _mode(agent: registry.AgentRecord, data: bool) -> str:
  """The run's mode, or a usage error saying why the agent cannot run."""
  given = config_flags.present()
  if agent.trains(registry.ONPOLICY):
    remote = flags.FLAGS['num_actors'].value == 0
    if common_flags.DATASET.value or (data and not remote):
      _usage_error(f'--agent {agent.name} learns from its own rollouts in '
                   '--env; drop --dataset / --reverb_address (or learn '
                   'from actor processes: --num_actors 0)')
    if remote and not data:
      _usage_error('--num_actors 0 learns from actor processes: pass '
                   '--reverb_address of their server (pipelines.serve '
                   '--env ENV --rollouts)')
    return registry.ONPOLICY
  onpolicy_only = (given & config_flags.flags_of(configs.OnPolicyConfig)) - (
      config_flags.flags_of(configs.OnlineConfig) |
      config_flags.flags_of(configs.OfflineConfig))
  if onpolicy_only:
    _usage_error(f'{_flag_list(onpolicy_only)}: for --agent '
                 f'{" or ".join(registry.names(registry.ONPOLICY))} only')
  her_run = flags.FLAGS['her'].present
  if data and flags.FLAGS['num_actors'].value != 0:
    if not agent.trains(registry.OFFLINE, her=her_run):
      _usage_error(
          f'--agent {agent.name} does not train offline with --her; pick one '
          f'of: {", ".join(registry.names(registry.OFFLINE, her=True))}'
          if her_run else f'--agent {agent.name} trains online; drop '
          '--dataset / --reverb_address, or pick one of: '
          + ', '.join(registry.names(registry.OFFLINE)))
    return registry.OFFLINE
  if agent.trains(registry.OFFLINE) and not agent.trains(registry.ONLINE):
    finetune = (f' ({agent.name} trains online only as fine-tuning after the '
                'offline phase: --online_finetune_steps)'
                if agent.trains(registry.FINETUNE) else '')
    _usage_error(f'--agent {agent.name} needs offline data: pass --dataset '
                 f'or --reverb_address{finetune}')
  if flags.FLAGS['num_actors'].value == 0 and (
      common_flags.DATASET.value or not _PUSH.reverb_address.value):
    _usage_error('--num_actors 0 learns from actor processes: pass '
                 '--reverb_address of their server (pipelines.serve --env), '
                 'and no --dataset')
  return registry.ONLINE


def _check_flags(mode: str, agent: registry.AgentRecord) -> None:
  """Flags that set nothing in this mode are refused, not ignored."""
  cls, given = configs.MODES[mode], config_flags.present()
  others = (given & set(_SETTINGS)) - config_flags.flags_of(cls)
  if mode == registry.ONPOLICY and others:
    _usage_error(f'--agent {agent.name} is on-policy: {_flag_list(others)} '
                 'are for the off-policy agents')
  if others:
    _usage_error(f'{_flag_list(others)}: not a setting of {mode} runs')
  if mode == registry.ONPOLICY and not agent.minibatch_epochs:
    ppo_only = given & set(ppo.PPO_ONLY)
    if ppo_only:
      epochs = [a for a in registry.names(registry.ONPOLICY)
                if registry.get(a).minibatch_epochs]
      _usage_error(f'{_flag_list(ppo_only)}: for --agent {", ".join(epochs)} '
                   f'only ({agent.name} takes one step per rollout)')
  gail = {f for f in given if f.startswith('gail_')}
  if gail and 'gail_dataset' not in gail:
    _usage_error(f'{_flag_list(gail)}: GAIL needs its demonstrations: pass '
                 '--gail_dataset')
  remote = bool(_PUSH.reverb_address.value)
  if (_RECONNECT.value or 'reconnect_timeout_s' in given) and not remote:
    _usage_error('--reconnect and --reconnect_timeout_s are for a remote '
                 'table: pass --reverb_address')
  if mode == registry.ONLINE and _RECONNECT.value:
    _usage_error('--reconnect is for offline learners on a remote table; a '
                 'learner of actor processes (--num_actors 0) fails within '
                 'its deadline and resumes from its checkpoint when rerun')
  if 'publish_every' in given and flags.FLAGS['num_actors'].value != 0:
    _usage_error('--publish_every is for --num_actors 0')


def _config(mode: str, agent: str) -> configs.RunConfig:
  cls = configs.MODES[mode]
  given = config_flags.given(cls)
  if mode == registry.OFFLINE:
    given['dataset'] = common_flags.DATASET.value or _PUSH.reverb_address.value
    if _RECONNECT.value:
      given.setdefault('reconnect_timeout_s', _RECONNECT_S)
  given.setdefault('root_dir', '')
  config = configs.make(cls, agent, given)
  if mode == registry.ONPOLICY:
    onpolicy.check_env(envs.env_specs(config.env))
  if not config.root_dir:
    config = dataclasses.replace(config,
                                 root_dir=configs.default_root_dir(config))
  return config


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _usage_error(f'unexpected arguments: {" ".join(argv[1:])}')
  if _AGENT.value is None:
    _usage_error('--agent is required')
  if common_flags.DATASET.value and _PUSH.reverb_address.value:
    _usage_error('pass --dataset or --reverb_address, not both')
  cli.quiet_logging()
  cli.parse_gin(_PROG, _GIN_FILE.value, _GIN_BINDINGS.value)
  agent = registry.get(_AGENT.value)
  mode = _mode(agent, bool(common_flags.DATASET.value or
                           _PUSH.reverb_address.value))
  _check_flags(mode, agent)
  try:
    config = _config(mode, agent.name)
  except ValueError as e:  # A config field's own check, e.g. a bound value.
    _usage_error(str(e))
  interrupted = (f'interrupted; rerun the same command to resume from '
                 f'{config.root_dir}')
  guard = cli.InterruptGuard(_PROG, interrupted)
  try:
    if mode == registry.OFFLINE:
      summary = offline.train_offline(config, on_server_lost=lambda e: (
          cli.exit_now(f'{_PROG}: error: {cli.one_line(e)}', 1,
                       fresh_line=True)))
    else:
      train = (onpolicy.train_onpolicy if mode == registry.ONPOLICY
               else online.train_online)
      summary = {'agent': config.agent, 'env': config.env,
                 'seed': config.seed, **train(config)}
  except (datasets.DatasetNotFoundError,
          datasets.DatasetNotAvailableError) as e:
    cli.fail(_PROG, e)
  except tf.errors.OpError as e:  # Before training (in it: TrainingError).
    cli.fail(_PROG, RuntimeError(f'{config_flags.MODE_WORDS[type(config)]} '
                                 'run failed before training: '
                                 f'{run.op_error_summary(e)}'))
  except cli.USER_ERRORS as e:
    cli.fail(_PROG, e)
  except KeyboardInterrupt:
    guard.handled = True
    cli.fail(_PROG, RuntimeError(interrupted), code=130)
  summary['root_dir'] = config.root_dir
  print(json.dumps(summary), flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(_PROG))
