"""rlds_reverb.data.tfds_writer: the output directory of a dataset write."""

import pytest

from rlds_reverb.data import tfds_writer


def test_output_dir_cleans_up_a_failed_write(tmp_path):
  out = tmp_path / 'out'
  with pytest.raises(KeyboardInterrupt):
    with tfds_writer.output_dir(str(out)):
      (out / 'partial').mkdir()
      raise KeyboardInterrupt
  assert not out.exists()  # It did not exist before.
  out.mkdir()
  with pytest.raises(RuntimeError):
    with tfds_writer.output_dir(str(out)):
      (out / 'partial').mkdir()
      raise RuntimeError('write failed')
  assert out.is_dir() and not any(out.iterdir())  # Empty, as it was.
  with tfds_writer.output_dir(str(out)):
    (out / 'data').write_text('x')
  assert sorted(p.name for p in out.iterdir()) == ['.complete', 'data']


def test_output_dir_must_not_be_a_file(tmp_path):
  (tmp_path / 'file').write_text('x')
  with pytest.raises(FileExistsError, match='is not a directory'):
    with tfds_writer.output_dir(str(tmp_path / 'file'), overwrite=True):
      pass
  assert (tmp_path / 'file').read_text() == 'x'
