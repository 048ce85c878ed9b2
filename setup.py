"""rlds_reverb: RLDS datasets -> TF-Agents trajectories -> Reverb tables, fast.

The pins below are the known-good set, and pip resolves them on its own, so
`pip install .` (or `pip install rlds_reverb-*.whl`) is the whole install:
TensorFlow 2.15 needs protobuf 3.20, which rules out tensorflow-metadata > 1.14
and numpy >= 2; tf-agents 0.19.0 pins typing-extensions==4.5.0, which rules
out gymnasium >= 1.4 (the first release to require typing-extensions >= 4.12;
1.0 to 1.3 accept >= 4.3, and gymnasium-robotics 1.4 needs gymnasium >= 1.2).
minari is pinned to 0.5.3, the last release that accepts numpy < 2 (0.5.4
requires numpy >= 2); its hdf5 extra is h5py, which TensorFlow already brings.
"""
import setuptools

INSTALL_REQUIRES = [
    'tensorflow==2.15.1',
    'tf-keras==2.15.1',
    'dm-reverb==0.14.0',
    'tensorflow-probability==0.23.0',
    'rlds==0.1.8',
    'tensorflow-datasets==4.9.4',
    'tensorflow-metadata==1.14.0',
    'numpy<2',
    'tf-agents==0.19.0',  # Brings gym 0.23.0, pygame, gin-config, pillow.
    # <1.4: gymnasium 1.4 needs typing-extensions >= 4.12, tf-agents pins 4.5.0.
    'gymnasium>=1.2,<1.4',
    'mujoco<3.4',
    'gymnasium-robotics>=1.4,<1.5',
    'dm-tree',
    'tqdm',
    'absl-py',
    'gin-config==0.5.0',  # configs/*.gin, pipelines.train --gin_file
    'matplotlib',
    # datasets.load('minari:ID'); 0.5.4 needs numpy >= 2. Downloading also
    # needs the hf extra (huggingface_hub), left out: see docs/datasets.md.
    'minari[hdf5]==0.5.3',
    # Atari (pipelines.generate --env ALE/Pong-v5): ale-py's wheel ships the
    # ROMs; gymnasium's AtariPreprocessing needs OpenCV, and 4.11+ wants
    # numpy >= 2.
    'ale-py==0.12.1',
    'opencv-python-headless<4.11',
]

setuptools.setup(
    name='rlds_reverb',
    version='0.1.0',
    description='Fast RLDS -> TF-Agents -> Reverb conversion and training.',
    packages=setuptools.find_packages(include=['rlds_reverb', 'rlds_reverb.*', 'pipelines', 'pipelines.*']),
    package_data={'rlds_reverb': ['policies/*/*.npz', 'policies/*/*/*.npz',
                                  'policies/*/*/*.json']},
    python_requires='>=3.10,<3.12',
    install_requires=INSTALL_REQUIRES,
    extras_require={'test': ['pytest', 'pytest-xdist', 'pytest-timeout', 'hypothesis']},
)
