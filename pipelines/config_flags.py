"""absl flags made from the run configs' fields, and the settings they give.

One flag per command-line name of the fields of `configs.MODES`' classes
(nested configs flattened, `rlds_reverb.settings`): its type, default,
bounds or choices and help all come from the field, so the command line,
gin files and the library cannot disagree. A name that several modes share
with other defaults or meanings (--steps: gradient steps offline, env steps
online) gets one flag whose help says each; an agent's own defaults
(registry) are listed in the help. Optional booleans take auto/true/false
(auto: None), tuples take comma-separated lists. Names a pipeline module
defines itself (`common_flags`: --dataset, --table, ...) are left to it.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Sequence

from absl import flags

from rlds_reverb import settings
from rlds_reverb.agents import registry
from rlds_reverb.experiments import configs

MODE_WORDS = {configs.OfflineConfig: 'offline',
              configs.OnlineConfig: 'online',
              configs.OnPolicyConfig: 'on-policy'}
_AUTO = {'auto': None, 'true': True, 'false': False}


def _flag_settings(classes: Sequence[type]
                   ) -> dict[str, list[tuple[type, settings.Setting]]]:
  found: dict[str, list[tuple[type, settings.Setting]]] = {}
  for cls in classes:
    for setting in settings.fields(cls):
      if setting.flag:
        found.setdefault(setting.flag, []).append((cls, setting))
  return found


def _is_sequence(kind: Any) -> bool:
  return typing.get_origin(kind) in (tuple, list, Sequence,
                                     typing.get_origin(Sequence[int]))


def shown(value: Any) -> str:
  if isinstance(value, (tuple, list)):
    return ','.join(str(v) for v in value)
  return repr(value) if isinstance(value, str) else str(value)


def agent_defaults(cls: type, setting: settings.Setting) -> list[str]:
  """'dqn 64'-style notes where an agent's runs start elsewhere."""
  mode = next((m for m, c in configs.MODES.items() if c is cls), None)
  if mode is None:
    return []  # Not a run config: no agent has defaults of its own.
  notes = []
  for agent in registry.names(mode):
    continuous = configs.defaults(cls, agent).get(setting.path,
                                                  setting.default)
    discrete = configs.defaults(cls, agent, discrete=True).get(
        setting.path, setting.default)
    if continuous != setting.default:
      notes.append(f'{agent} {shown(continuous)}')
    if discrete != continuous:
      notes.append(f'{agent} on discrete actions {shown(discrete)}')
    image = configs.defaults(cls, agent, discrete=True, image=True).get(
        setting.path, setting.default)
    if image != discrete:
      notes.append(f'{agent} on Atari {shown(image)}')
  if cls is configs.OnlineConfig and setting.path in configs.ONLINE_HER_DEFAULTS:
    notes.append(f'online HER {configs.ONLINE_HER_DEFAULTS[setting.path]}')
  return notes


def words(cls: type) -> str:
  """What the help calls a config class: its mode, or its `KIND`."""
  return MODE_WORDS.get(cls) or getattr(cls, 'KIND', cls.__name__)


def help_text(entries: list[tuple[type, settings.Setting]]) -> str:
  """The flag's help: the field's docstring (per mode where they differ),
  the modes' defaults where they differ, and the agents' own defaults."""
  helps: dict[str, list[str]] = {}
  for cls, setting in entries:
    helps.setdefault(setting.help or setting.name, []).append(
        words(cls))
  if len(helps) == 1:
    text = next(iter(helps))
  else:
    text = ' '.join(f'{" and ".join(modes).capitalize()}: {help_}'
                    for help_, modes in helps.items())
  if len({repr(s.default) for _, s in entries}) > 1:
    text += ' Default: ' + ', '.join(
        f'{words(cls)} {shown(s.default)}'
        for cls, s in entries) + '.'
  notes: list[str] = []
  for cls, setting in entries:
    notes += [n for n in agent_defaults(cls, setting) if n not in notes]
  if notes:
    text += f" Agents' own defaults: {'; '.join(notes)}."
  return text


def _default(entries: list[tuple[type, settings.Setting]]) -> Any:
  if any(s.switch for _, s in entries):
    return None
  values = {repr(s.default) for _, s in entries}
  if len(values) > 1:
    return None
  default = entries[0][1].default
  return None if default is dataclasses.MISSING else default


def define(classes: Sequence[type] = tuple(configs.MODES.values()),
           flag_values: flags.FlagValues = flags.FLAGS) -> dict[str, Any]:
  """Defines the flags of `classes`' settings that are not defined yet;
  returns {flag name: [(class, Setting), ...]} of every settable name."""
  grouped = _flag_settings(classes)
  for name, entries in grouped.items():
    if name in flag_values:
      continue  # A pipeline's own (common_flags), checked by the tests.
    setting = entries[0][1]
    kinds = {(s.type, s.optional) for _, s in entries}
    if len(kinds) > 1:
      raise TypeError(f'flag --{name} would set fields of other types: '
                      f'{", ".join(s.path for _, s in entries)}')
    default, text = _default(entries), help_text(entries)
    kind = setting.type
    if kind is bool and setting.optional:
      flags.DEFINE_enum(name, 'auto' if default is None else
                        str(default).lower(), list(_AUTO), text,
                        flag_values=flag_values)
    elif kind is bool:
      flags.DEFINE_bool(name, default, text, flag_values=flag_values)
    elif kind is int:
      flags.DEFINE_integer(name, default, text, lower_bound=setting.lower,
                           upper_bound=setting.upper, flag_values=flag_values)
    elif kind is float:
      flags.DEFINE_float(name, default, text, lower_bound=setting.lower,
                         upper_bound=setting.upper, flag_values=flag_values)
    elif kind is str and setting.choices:
      flags.DEFINE_enum(name, default, list(setting.choices), text,
                        flag_values=flag_values)
    elif kind is str:
      flags.DEFINE_string(name, default, text, flag_values=flag_values)
    elif _is_sequence(kind):
      flags.DEFINE_list(name, None if default is None else
                        [str(v) for v in default], text,
                        flag_values=flag_values)
    else:
      raise TypeError(f'no flag type for {setting.path}: {kind!r}')
  return grouped


def value(setting: settings.Setting, raw: Any) -> Any:
  """A flag's value as the field takes it."""
  if setting.type is bool and setting.optional:
    return _AUTO[raw] if isinstance(raw, str) else raw
  if _is_sequence(setting.type) and raw is not None:
    try:
      return tuple(int(v) for v in raw)
    except ValueError as e:
      raise ValueError(f'--{setting.flag}: a comma-separated list of '
                       f'integers, got {",".join(raw)!r}') from e
  return raw


def present(flag_values: flags.FlagValues = flags.FLAGS) -> set[str]:
  """The names of the flags given on the command line."""
  return {name for name in flag_values if flag_values[name].present}


def given(cls: type, flag_values: flags.FlagValues = flags.FLAGS
          ) -> dict[str, Any]:
  """{field path: value} of `cls`'s settings whose flag is on the command
  line."""
  found = {}
  for setting in settings.fields(cls):
    if (setting.flag and setting.flag in flag_values and
        flag_values[setting.flag].present):
      found[setting.path] = value(setting, flag_values[setting.flag].value)
  return found


def flags_of(cls: type) -> set[str]:
  """The command-line names that set a field of `cls`."""
  return {s.flag for s in settings.fields(cls) if s.flag}
