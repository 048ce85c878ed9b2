r"""An actor process: acts with the learner's newest weights, writes episodes.

One Reverb server holds the episode table and the weights table; one
learner reads the episodes and publishes its weights; any number of these
actors step envs and write whole episodes (docs/distributed.md):

  python -m pipelines.act --reverb_address localhost:8000 \
      --env HalfCheetah-v5 --run_dir runs/dist --seed 1
  python -m pipelines.act --reverb_address localhost:8000 \
      --env HalfCheetah-v5 --run_dir runs/dist --seed 2

Each actor acts uniformly at random for its first --initial_random_steps,
then with the newest weights in --variables_table (waiting up to
--weights_timeout_s for a first publish), fetched again every
--policy_refresh_steps env steps. It writes an episode only while fewer
than --max_unread_episodes episodes in --table wait for the learner, and
holds still when its own finished episodes wait on a full table, so it
stays a few episodes ahead of the learner at most. Episode returns go to
--run_dir/actor_<seed>/ (episodes.jsonl and TensorBoard); the bar shows env
steps/s.

With --agent ppo, a2c or acktr it is an on-policy actor
(acting/rollout_actor.py) of a learner run with --num_actors 0 and a
server started with `pipelines.serve --env ENV --rollouts`: it takes the
learner's rollout settings, weights and normalisation statistics,
collects one rollout at a time while fewer than --max_unread_rollouts wait
in the queue, and writes it there; it logs each finished episode the same way.

SIGTERM or Ctrl-C ends it cleanly: the episode write in flight gets
--timeout_s, episodes still running are dropped, and the last stdout line
is a JSON summary (exit 0). A server that stops answering ends it with one
line on stderr (exit 1) within about twice --timeout_s of its next call on
the server (at each finished episode and weights refresh); bad flags exit
2.
"""

import json
import os
import signal
import threading

# TensorFlow's C++ start-up chatter would bury the errors and the summary.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf
import tqdm

from pipelines import cli
from pipelines import config_flags
from rlds_reverb import settings
from rlds_reverb.storage import tables
from rlds_reverb.acting import remote
from rlds_reverb.acting import rollout_actor
from rlds_reverb.agents import registry
from rlds_reverb.experiments import online
from rlds_reverb.experiments import onpolicy

_PROG = 'act'
_REVERB_ADDRESS = flags.DEFINE_string(
    'reverb_address', None, 'host:port of the Reverb server that holds '
    '--table and --variables_table (pipelines.serve). Required.')
_RUN_DIR = flags.DEFINE_string(
    'run_dir', None, 'Directory of the distributed run; this actor logs to '
    'run_dir/actor_<seed>/: episodes.jsonl (one line per finished '
    'episode), TensorBoard summaries (collect/return over env steps) and '
    'config.json. Required.')
_AGENT = flags.DEFINE_enum(
    'agent', 'sac',
    [name for name in registry.AGENTS if registry.get(name).head or
     registry.get(name).trains(registry.ONPOLICY)],
    "The learner's agent: published "
    'weights of another kind are refused. sac samples its policy; td3 adds '
    '--exploration_noise; dqn is epsilon-greedy with --epsilon; ppo, a2c '
    'and acktr sample theirs and write rollouts into the rollout queue.')
# The actor's settings: flags made from the fields of `remote.ActorConfig`
# (off-policy agents) and `rollout_actor.RolloutActorConfig` (ppo, a2c).
_CONFIGS = (remote.ActorConfig, rollout_actor.RolloutActorConfig)
config_flags.define(_CONFIGS)
flags.adopt_module_key_flags(config_flags)
_PROGRESS = flags.DEFINE_bool(
    'progress', True, 'Show a progress bar (env steps, env steps/s, last '
    'return, policy version) on stderr.')


class _EpisodeLog:
  """episodes.jsonl and TensorBoard scalars of one actor."""

  def __init__(self, log_dir: str):
    os.makedirs(log_dir, exist_ok=True)
    self._file = open(os.path.join(log_dir, 'episodes.jsonl'), 'a')
    self._writer = tf.summary.create_file_writer(log_dir)

  def __call__(self, episode: int, env_steps: int, episode_return: float,
               length: int, version, terminated=None) -> None:
    record = {'episode': episode, 'env_steps': env_steps,
              'return': round(float(episode_return), 3), 'length': length,
              'terminated': terminated, 'policy_version': version}
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()
    with self._writer.as_default():
      tf.summary.scalar('collect/return', episode_return, step=env_steps)

  def close(self) -> None:
    self._file.close()
    self._writer.close()


def _stop_on_signals() -> tuple[threading.Event, dict]:
  """SIGTERM / SIGINT set the event; a second one interrupts at once."""
  stop, received = threading.Event(), {}

  def handle(signum, frame):
    del frame
    if stop.is_set():
      raise KeyboardInterrupt
    received['signal'] = signal.Signals(signum).name
    stop.set()

  # SIGINT too: a process started in the background by a script inherits
  # SIGINT ignored.
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, handle)
  return stop, received


def _config_class() -> type:
  on_policy = registry.get(_AGENT.value).trains(registry.ONPOLICY)
  return _CONFIGS[1] if on_policy else _CONFIGS[0]


def _config() -> remote.ActorConfig | rollout_actor.RolloutActorConfig:
  """The actor's config; flags of the other kind of actor are refused."""
  cls = _config_class()
  others = (config_flags.present() & config_flags.flags_of(
      _CONFIGS[0] if cls is _CONFIGS[1] else _CONFIGS[1])) - (
          config_flags.flags_of(cls))
  if others:
    raise ValueError(
        f'{", ".join("--" + name for name in sorted(others))}: not a setting '
        f'of --agent {_AGENT.value} actors')
  return settings.build(cls, config_flags.given(cls))


def _log_and_bar(config) -> tuple[str, _EpisodeLog, tqdm.tqdm]:
  """run_dir/actor_<seed>/ with its config.json, the episode log, the
  bar."""
  log_dir = os.path.join(_RUN_DIR.value, f'actor_{config.seed}')
  log = _EpisodeLog(log_dir)
  with open(os.path.join(log_dir, 'config.json'), 'w') as f:
    json.dump({'reverb_address': _REVERB_ADDRESS.value,
               'agent': _AGENT.value, **vars(config)}, f, indent=2)
  bar = tqdm.tqdm(total=config.max_env_steps or None, unit='env step',
                  desc=f'actor {config.seed} {config.env}', smoothing=0.05,
                  disable=not _PROGRESS.value)
  return log_dir, log, bar


def _summary(actor, config, log_dir: str, log: _EpisodeLog, bar: tqdm.tqdm,
             **run_kwargs) -> dict:
  """Runs the actor to its end; its summary line, whatever stopped it."""
  try:
    stats = actor.run(**run_kwargs)
  finally:
    bar.close()
    log.close()
    actor.close()
  return {'actor': config.seed, 'env': config.env, **stats.to_dict(),
          'log_dir': log_dir}


def _act_rollouts(config: rollout_actor.RolloutActorConfig,
                  stop: threading.Event) -> dict:
  """An on-policy actor's loop, log and summary."""
  client = tables.connect(_REVERB_ADDRESS.value, timeout_s=config.timeout_s)
  actor = onpolicy.make_actor(_AGENT.value, config, client)
  log_dir, log, bar = _log_and_bar(config)

  def on_rollout(returns, lengths):
    stats = actor.stats
    bar.update(stats.env_steps - bar.n)
    for i, (episode_return, length) in enumerate(zip(returns, lengths)):
      log(stats.episodes - len(returns) + i + 1, stats.env_steps,
          episode_return, length, stats.policy_version)
    bar.set_postfix(ret=f'{returns[-1]:.0f}' if returns else '-',
                    policy=stats.policy_version)

  def on_wait(kind, value):
    bar.set_postfix_str({'unread': 'queue full, learner behind',
                         'weights': f'no weights yet ({value:.0f}s)'}[kind])

  return _summary(actor, config, log_dir, log, bar, should_stop=stop.is_set,
                  on_rollout=on_rollout, on_wait=on_wait)


def _act(config: remote.ActorConfig, stop: threading.Event) -> dict:
  if isinstance(config, rollout_actor.RolloutActorConfig):
    return _act_rollouts(config, stop)
  client = tables.connect(_REVERB_ADDRESS.value, timeout_s=config.timeout_s)
  actor = online.make_actor(_AGENT.value, config, client)
  log_dir, log, bar = _log_and_bar(config)
  state = {'wait': ''}

  def on_episode(episode, version):
    stats = actor.stats
    log(stats.episodes, stats.env_steps, episode.episode_return,
        episode.num_steps, version, episode.terminated)
    state['wait'] = ''
    bar.set_postfix(ret=f'{episode.episode_return:.0f}',
                    policy='random' if version is None else version)

  def on_wait(kind, value):
    text = {'unread': f'{value:.0f} unread, learner behind',
            'pace': 'paced: learner behind',
            'weights': f'no weights yet ({value:.0f}s)',
            'write': f'write pending {value:.0f}s'}[kind]
    if text != state['wait']:
      state['wait'] = text
      bar.set_postfix_str(text)

  return _summary(actor, config, log_dir, log, bar, should_stop=stop.is_set,
                  on_episode=on_episode, on_wait=on_wait,
                  on_steps=bar.update)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(_PROG, ValueError(f'unexpected arguments: {" ".join(argv[1:])}'),
             code=2)
  for flag in (_REVERB_ADDRESS, _RUN_DIR):
    if not flag.value:
      cli.fail(_PROG, ValueError(f'--{flag.name} is required'), code=2)
  cli.quiet_logging()
  stop, received = _stop_on_signals()
  try:
    config = _config()
    config.check()
  except ValueError as e:
    cli.fail(_PROG, e, code=2)
  try:
    summary = _act(config, stop)
  except tables.ServerUnavailableError as e:
    cli.fail_now(_PROG, e)  # Its client threads may not tear down cleanly.
  except tables.TableNotFoundError as e:
    cli.fail(_PROG, e)
  except cli.USER_ERRORS as e:
    cli.fail(_PROG, e)
  except KeyboardInterrupt:
    cli.fail(_PROG, RuntimeError('interrupted twice: stopped without waiting '
                                 'for episode writes'), code=130)
  if received:
    summary['stopped'] = received['signal']
  print(json.dumps(summary), flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(_PROG))
