"""rlds_reverb: RLDS datasets -> TF-Agents trajectories -> Reverb tables.

The first four names are drop-ins for `tf_agents.replay_buffers.
rlds_to_reverb`; switching the import is all a user does.
"""

import contextlib as _contextlib
import io as _io

# tf-agents imports the retired `gym` package, which prints a three-line
# deprecation notice on stderr at import; every CLI of ours would show it.
with _contextlib.redirect_stderr(_io.StringIO()):
  import gym as _gym  # pylint: disable=g-import-not-at-top,unused-import

from rlds_reverb.data.convert import convert_rlds_to_episodes
from rlds_reverb.data.convert import convert_rlds_to_trajectories
from rlds_reverb.data.convert import create_trajectory_data_spec
from rlds_reverb.data.convert import EpisodeTrajectories
from rlds_reverb.data.convert import get_rlds_step_features
from rlds_reverb.storage.push import push_rlds_to_reverb
from rlds_reverb.storage.push import push_rlds_to_table
from rlds_reverb.storage.push import PushStats

__all__ = [
    'convert_rlds_to_episodes',
    'convert_rlds_to_trajectories',
    'create_trajectory_data_spec',
    'EpisodeTrajectories',
    'get_rlds_step_features',
    'push_rlds_to_reverb',
    'push_rlds_to_table',
    'PushStats',
]
