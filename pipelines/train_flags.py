"""The train command's flags and what they ask for together.

`pipelines.train` is the shell; this module holds its flags (its own, the
push flags for --dataset, and one flag per config field, `config_flags`),
the mode a command line asks for (offline, online, on-policy, with or
without actor processes), the flags that set nothing in that mode (refused,
never ignored), and the run config they make.
"""

import dataclasses

from absl import flags

from pipelines import cli
from pipelines import common_flags
from pipelines import config_flags
from rlds_reverb.acting import envs
from rlds_reverb.agents import registry
from rlds_reverb.agents.onpolicy import ppo
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import onpolicy

PROG = 'train'
AGENT = flags.DEFINE_enum(
    'agent', None, list(registry.AGENTS), 'Agent to train (required); '
    'docs/agents.md lists each with its modes. Offline (--dataset or '
    '--reverb_address): ' + ', '.join(registry.names(registry.OFFLINE)) +
    '; online: ' + ', '.join(registry.names(registry.ONLINE)) +
    '; on-policy: ' + ', '.join(registry.names(registry.ONPOLICY)) + '.')
PUSH = common_flags.define_push_flags()
flags.adopt_module_key_flags(common_flags)
flags.DEFINE_string(
    'root_dir', None, 'Run directory (checkpoints, TensorBoard, eval.jsonl, '
    'curves, policies, config.json); an existing run there is resumed. '
    'Default: runs/<agent>[_per][_her_<strategy>]_<env or dataset>_seed<seed>.')
RECONNECT = flags.DEFINE_bool(
    'reconnect', False, 'With --reverb_address: wait for a lost server to '
    'come back, up to --reconnect_timeout_s (300 unless given), instead of '
    'failing within seconds.')
GIN_FILE = flags.DEFINE_multi_string(
    'gin_file', [], 'Gin file of config bindings (configs/*.gin); repeat for '
    'several, later files win. Bindings name the config dataclasses by '
    'class and field: OfflineConfig.batch_size, AgentConfig.actor_layers, '
    'PerConfig.alpha, IqlConfig.expectile. An unknown one is an error.')
GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], 'One gin binding, e.g. "AgentConfig.actor_layers = '
    '(64, 64)"; repeat for several. Applied after --gin_file.')
# After the pipeline's own flags: the rest are made from the config fields.
_SETTINGS = config_flags.define()
flags.adopt_module_key_flags(config_flags)
_RECONNECT_S = 300.0


def usage_error(message: str) -> None:
  cli.fail(PROG, ValueError(message), code=2)


def _flag_list(names) -> str:
  return ', '.join(f'--{name}' for name in sorted(names))


def mode(agent: registry.AgentRecord, data: bool) -> str:
  """The run's mode, or a usage error saying why the agent cannot run."""
  given = config_flags.present()
  if agent.trains(registry.ONPOLICY):
    remote = flags.FLAGS['num_actors'].value == 0
    if common_flags.DATASET.value or (data and not remote):
      usage_error(f'--agent {agent.name} learns from its own rollouts in '
                   '--env; drop --dataset / --reverb_address (or learn '
                   'from actor processes: --num_actors 0)')
    if remote and not data:
      usage_error('--num_actors 0 learns from actor processes: pass '
                   '--reverb_address of their server (pipelines.serve '
                   '--env ENV --rollouts)')
    return registry.ONPOLICY
  onpolicy_only = (given & config_flags.flags_of(configs.OnPolicyConfig)) - (
      config_flags.flags_of(configs.OnlineConfig) |
      config_flags.flags_of(configs.OfflineConfig))
  if onpolicy_only:
    usage_error(f'{_flag_list(onpolicy_only)}: for the on-policy agents '
                 f'({", ".join(registry.names(registry.ONPOLICY))}) only')
  her_run = flags.FLAGS['her'].present
  if data and flags.FLAGS['num_actors'].value != 0:
    if not agent.trains(registry.OFFLINE, her=her_run):
      usage_error(
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
    usage_error(f'--agent {agent.name} needs offline data: pass --dataset '
                 f'or --reverb_address{finetune}')
  if flags.FLAGS['num_actors'].value == 0 and (
      common_flags.DATASET.value or not PUSH.reverb_address.value):
    usage_error('--num_actors 0 learns from actor processes: pass '
                 '--reverb_address of their server (pipelines.serve --env), '
                 'and no --dataset')
  return registry.ONLINE


def check(mode: str, agent: registry.AgentRecord) -> None:
  """Flags that set nothing in this mode are refused, not ignored."""
  cls, given = configs.MODES[mode], config_flags.present()
  others = (given & set(_SETTINGS)) - config_flags.flags_of(cls)
  if mode == registry.ONPOLICY and others:
    usage_error(f'--agent {agent.name} is on-policy: {_flag_list(others)} '
                 'are for the off-policy agents')
  if others:
    usage_error(f'{_flag_list(others)}: not a setting of {mode} runs')
  if mode == registry.ONPOLICY and not agent.minibatch_epochs:
    ppo_only = given & set(ppo.PPO_ONLY)
    if ppo_only:
      epochs = [a for a in registry.names(registry.ONPOLICY)
                if registry.get(a).minibatch_epochs]
      usage_error(f'{_flag_list(ppo_only)}: for --agent {", ".join(epochs)} '
                   f'only ({agent.name} takes one step per rollout)')
  kfac_only = given & set(ppo.KFAC_ONLY)
  if mode == registry.ONPOLICY and not agent.kfac_step and kfac_only:
    kfac_agents = [a for a in registry.names(registry.ONPOLICY)
                   if registry.get(a).kfac_step]
    usage_error(f'{_flag_list(kfac_only)}: for --agent '
                 f'{", ".join(kfac_agents)} only ({agent.name} does not '
                 'step with K-FAC)')
  gail = {f for f in given if f.startswith('gail_')}
  if gail and 'gail_dataset' not in gail:
    usage_error(f'{_flag_list(gail)}: GAIL needs its demonstrations: pass '
                 '--gail_dataset')
  remote = bool(PUSH.reverb_address.value)
  if (RECONNECT.value or 'reconnect_timeout_s' in given) and not remote:
    usage_error('--reconnect and --reconnect_timeout_s are for a remote '
                 'table: pass --reverb_address')
  if mode == registry.ONLINE and RECONNECT.value:
    usage_error('--reconnect is for offline learners on a remote table; a '
                 'learner of actor processes (--num_actors 0) fails within '
                 'its deadline and resumes from its checkpoint when rerun')
  for name in ('publish_every', 'actor_wait_s'):
    if name in given and flags.FLAGS['num_actors'].value != 0:
      usage_error(f'--{name} is for --num_actors 0')


def config(mode: str, agent: str) -> configs.RunConfig:
  cls = configs.MODES[mode]
  given = config_flags.given(cls)
  if mode == registry.OFFLINE:
    given['dataset'] = common_flags.DATASET.value or PUSH.reverb_address.value
    if RECONNECT.value:
      given.setdefault('reconnect_timeout_s', _RECONNECT_S)
  given.setdefault('root_dir', '')
  config = configs.make(cls, agent, given)
  if mode == registry.ONPOLICY:
    onpolicy.check_env(envs.env_specs(config.env, config.frame_stack),
                       config.ppo_config)
  if not config.root_dir:
    config = dataclasses.replace(config,
                                 root_dir=configs.default_root_dir(config))
  return config


def resolve(argv: list[str]) -> tuple[str, configs.RunConfig]:
  """The mode and the run config of the command line, or a usage error
  (exit 2) that says which flag is wrong and why."""
  if len(argv) > 1:
    usage_error(f'unexpected arguments: {" ".join(argv[1:])}')
  if AGENT.value is None:
    usage_error('--agent is required')
  if common_flags.DATASET.value and PUSH.reverb_address.value:
    usage_error('pass --dataset or --reverb_address, not both')
  cli.parse_gin(PROG, GIN_FILE.value, GIN_BINDINGS.value)
  agent = registry.get(AGENT.value)
  run_mode = mode(agent, bool(common_flags.DATASET.value or
                              PUSH.reverb_address.value))
  check(run_mode, agent)
  try:
    return run_mode, config(run_mode, agent.name)
  except ValueError as e:  # A config field's own check, e.g. a bound value.
    usage_error(str(e))
