"""The argparse scripts (tools/, bench/) explain every flag in --help, as
the absl pipelines do (tests/test_config_flags.py checks theirs). Read from
the source: the bench scripts import their peers' libraries, which only the
peer interpreter has."""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for folder in ('tools', 'bench')
                 for p in (REPO / folder).glob('*.py')
                 if 'add_argument(' in p.read_text())


def _arguments(path: pathlib.Path) -> list[ast.Call]:
  return [node for node in ast.walk(ast.parse(path.read_text()))
          if isinstance(node, ast.Call)
          and getattr(node.func, 'attr', '') == 'add_argument']


def _flag(call: ast.Call) -> str:
  names = [a.value for a in call.args if isinstance(a, ast.Constant)]
  return names[0] if names else f'line {call.lineno}'


def test_the_scripts_are_found():
  names = {p.name for p in SCRIPTS}
  assert {'onpolicy_table.py', 'offline_table.py', 'pixels.py',
          'sample.py'} <= names, names


@pytest.mark.parametrize('path', SCRIPTS, ids=lambda p: f'{p.parent.name}/'
                         f'{p.name}')
def test_every_flag_has_a_help_text(path):
  calls = _arguments(path)
  assert calls
  missing = []
  for call in calls:
    help_ = next((k.value for k in call.keywords if k.arg == 'help'), None)
    text = help_.value if isinstance(help_, ast.Constant) else (
        '(an expression)' if help_ is not None else '')
    if not isinstance(text, str) or len(text.strip()) < 10:
      missing.append(_flag(call))
    elif '%' in text.replace('%%', '').replace('%(default)s', ''):
      missing.append(f'{_flag(call)} (a bare %: argparse formats help)')
  assert not missing, f'{path.name}: no help for {missing}'
