"""Run settings as dataclass fields: each setting is stated once.

A setting is one field of one config dataclass: its default, its type, its
docstring (the attribute docstring under it, read from the source as tyro
and simple-parsing read CleanRL-style `Args`) and, where they matter, a few
facts in its metadata (`setting`): its command-line name, its bounds or
choices, whether a resumed run may change it. Everything else is derived
from that: `pipelines.config_flags` makes the absl flags, gin binds the
same fields by class and field name, `resume` reads what may change, and
`build` applies the one order of precedence (given > gin > defaults >
the field's own default).

    @dataclasses.dataclass(kw_only=True)
    class RunConfig:
      eval_interval: int = setting(10_000, lower=1, may_change=True)
      \"\"\"Steps between evaluations.\"\"\"
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from typing import Any, Iterator, Mapping, Optional, Sequence

import gin

# Metadata keys of `setting`.
_FLAG, _PREFIX, _MAY_CHANGE = 'flag', 'flag_prefix', 'may_change'
_LOWER, _UPPER, _CHOICES = 'lower', 'upper', 'choices'
_SWITCH = 'switch'
NO_FLAG = ''


def setting(default: Any = dataclasses.MISSING, *,
            default_factory: Any = dataclasses.MISSING,
            flag: Optional[str] = None, flag_prefix: Optional[str] = None,
            may_change: bool = False, lower: Optional[float] = None,
            upper: Optional[float] = None,
            choices: Optional[Sequence[str]] = None,
            switch: bool = False) -> Any:
  """A config field with the facts the flags and resume need.

  Args:
    default: The default (or `default_factory`); neither: required.
    default_factory: As `dataclasses.field`'s.
    flag: Its command-line name when not the field's own; `NO_FLAG` for a
      field the runner fills in (another setting decides it).
    flag_prefix: A nested config: prefix of its fields' flag names.
    may_change: A resumed run may give it another value (budgets,
      schedules, where the data is found).
    lower: Smallest value allowed.
    upper: Largest value allowed.
    choices: The values a string setting takes.
    switch: Giving it turns its optional nested config on (HER's
      strategy): its flag has no default.
  """
  metadata = {key: value for key, value in (
      (_FLAG, flag), (_PREFIX, flag_prefix), (_LOWER, lower),
      (_UPPER, upper), (_CHOICES, tuple(choices) if choices else None))
              if value is not None}
  if may_change:
    metadata[_MAY_CHANGE] = True
  if switch:
    metadata[_SWITCH] = True
  return dataclasses.field(default=default, default_factory=default_factory,
                           metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Setting:
  """One leaf field of a config class, nested configs flattened."""
  path: str
  """Dotted from the top config: 'per_config.alpha'."""
  owner: type
  """The dataclass that declares the field (gin binds `Owner.name`)."""
  name: str
  flag: str
  """Command-line name; NO_FLAG: none."""
  help: str
  default: Any
  """The field's default; dataclasses.MISSING when required."""
  type: Any
  """The field's type with Optional taken off."""
  optional: bool
  """None is a value it takes."""
  may_change: bool
  switch: bool
  """Giving it turns its optional nested config on."""
  lower: Optional[float]
  upper: Optional[float]
  choices: Optional[tuple[str, ...]]


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
  args = typing.get_args(annotation)
  origin = typing.get_origin(annotation)
  if origin in (typing.Union, types.UnionType) and type(None) in args:
    rest = [a for a in args if a is not type(None)]
    return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
  return annotation, False


def nested_class(cls: type, field: dataclasses.Field) -> Optional[type]:
  """The config dataclass a field holds (Optional or not), else None."""
  annotation, _ = _unwrap_optional(_hints(cls)[field.name])
  return annotation if dataclasses.is_dataclass(annotation) else None


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def _own_docstrings(cls: type) -> dict[str, str]:
  """{field: the string literal right under its annotation} of one class."""
  try:
    source = textwrap.dedent(inspect.getsource(cls))
  except (OSError, TypeError):
    return {}
  node = ast.parse(source).body[0]
  found, body = {}, getattr(node, 'body', [])
  for statement, following in zip(body, body[1:]):
    if (isinstance(statement, ast.AnnAssign) and
        isinstance(statement.target, ast.Name) and
        isinstance(following, ast.Expr) and
        isinstance(following.value, ast.Constant) and
        isinstance(following.value.value, str)):
      found[statement.target.id] = ' '.join(following.value.value.split())
  return found


def docstring(cls: type, name: str) -> str:
  """A field's docstring, from the nearest class in the MRO that has one."""
  for klass in cls.__mro__:
    text = _own_docstrings(klass).get(name) if dataclasses.is_dataclass(
        klass) else None
    if text:
      return text
  return ''


def fields(cls: type, prefix: str = '', flag_prefix: str = ''
           ) -> Iterator[Setting]:
  """The leaf settings of a config class, nested configs flattened."""
  for field in dataclasses.fields(cls):
    nested = nested_class(cls, field)
    if nested is not None:
      yield from fields(nested, f'{prefix}{field.name}.',
                        field.metadata.get(_PREFIX, flag_prefix))
      continue
    annotation, optional = _unwrap_optional(_hints(cls)[field.name])
    default = field.default
    if field.default_factory is not dataclasses.MISSING:
      default = field.default_factory()
    flag = field.metadata.get(_FLAG)
    yield Setting(
        path=f'{prefix}{field.name}', owner=cls, name=field.name,
        flag=flag_prefix + field.name if flag is None else flag,
        help=docstring(cls, field.name), default=default, type=annotation,
        optional=optional, may_change=field.metadata.get(_MAY_CHANGE, False),
        switch=field.metadata.get(_SWITCH, False),
        lower=field.metadata.get(_LOWER), upper=field.metadata.get(_UPPER),
        choices=field.metadata.get(_CHOICES))


def may_change_on_resume(cls: type) -> frozenset[str]:
  """The dotted paths a resumed run may change (field metadata)."""
  return frozenset(s.path for s in fields(cls) if s.may_change)


def check_bounds(config: Any) -> None:
  """Raises ValueError naming the first field outside its bounds/choices."""
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if value is None:
      continue
    if nested_class(type(config), field) is not None:
      check_bounds(value)
      continue
    lower, upper = field.metadata.get(_LOWER), field.metadata.get(_UPPER)
    choices = field.metadata.get(_CHOICES)
    if lower is not None and value < lower:
      raise ValueError(f'{field.name} must be >= {lower}, got {value!r}')
    if upper is not None and value > upper:
      raise ValueError(f'{field.name} must be <= {upper}, got {value!r}')
    if choices and value not in choices:
      raise ValueError(f'{field.name} must be one of {", ".join(choices)}, '
                       f'got {value!r}')


def gin_bound(cls: type, name: str) -> bool:
  """Whether gin binds `cls.name`."""
  try:
    gin.query_parameter(f'{cls.__name__}.{name}')
  except ValueError:  # Unbound, or a class gin does not know.
    return False
  return True


def build(cls: type, given: Mapping[str, Any],
          defaults: Mapping[str, Any] = types.MappingProxyType({})) -> Any:
  """`cls(...)`, each field from `given`, else gin's binding, else
  `defaults`, else the field's own default (top-level fields only)."""
  values = dict(given)
  for name, value in defaults.items():
    if name not in values and not gin_bound(cls, name):
      values[name] = value
  return cls(**values)


def split(paths: Mapping[str, Any], field: str) -> dict[str, Any]:
  """The entries of `paths` under `field.`, with that prefix taken off."""
  start = f'{field}.'
  return {path[len(start):]: value for path, value in paths.items()
          if path.startswith(start)}


def top(paths: Mapping[str, Any]) -> dict[str, Any]:
  """The entries of `paths` that name a top-level field."""
  return {path: value for path, value in paths.items() if '.' not in path}
