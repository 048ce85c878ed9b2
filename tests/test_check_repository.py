"""tools/check_repository.py: run outputs stay out of git."""

import os
import shutil

import pytest

from conftest import tools_module  # pylint: disable=g-bad-import-order

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which('git') is None or
                    not os.path.isdir(os.path.join(_REPO, '.git')),
                    reason='not a git checkout')
def test_the_repository_tracks_no_run_outputs():
  check = tools_module('check_repository')
  sizes = check.tracked_sizes(_REPO)
  assert 'tools/check_repository.py' in sizes  # The listing is real.
  assert check.problems(sizes) == []


def test_each_kind_of_run_output_is_refused():
  check = tools_module('check_repository')
  inflight = 'runs/inflight/medium_1m/td3_bc_seed1/checkpoints'
  fine = {f'{inflight}/checkpoint': 100,
          f'{inflight}/ckpt-700000.index': 100,
          f'{inflight}/ckpt-700000.data-00000-of-00001': 20 * 2**20,
          'runs/inflight/medium_1m/td3_bc_seed1/eval.jsonl': 100,
          'rlds_reverb/policies/halfcheetah_v5/expert.npz': 20 * 2**20,
          'docs/results/runs/offline_rl/x/eval.jsonl': 100}
  assert check.problems(fine) == []
  bad = {
      'runs/x/tensorboard/events.out.tfevents.1.vm.2.0.v2': 1,
      'docs/results/reverb/chunks.tfrecord': 1,
      'docs/results/runs/x/checkpoints/ckpt-5.index': 1,
      'runs/offline_rl/x/eval.jsonl': 1,
      f'{inflight}/ckpt-650000.index': 1,
  }
  found = check.problems({**fine, **bad})
  # One line each; the second checkpoint in one run as that run's line.
  assert len(found) == len(bad)
  assert any('TensorBoard' in line for line in found)
  assert any('Reverb' in line for line in found)
  assert any('ckpt-650000, ckpt-700000' in line for line in found)
  assert any(line.startswith('runs/offline_rl/x/eval.jsonl')
             for line in found)
  [too_big] = check.problems({'docs/big.png': 16 * 2**20})
  assert 'over 15 MiB' in too_big
